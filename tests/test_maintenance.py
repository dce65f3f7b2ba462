"""Specs of maintenance windows: occurrences (one-off, weekly in a time zone across daylight saving
time, cron), the time they cover and the uptime that leaves it out, the alerts they hold, the
API (operators only, hostile input refused), the "maintenance" mark on the overview, model and
peer pages. The store on SQLite and PostgreSQL, and a real swarm (a window on a peer holds its
alerts and leaves the window out of its uptime): ``test_alerts.py``.
"""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from monitor.core import alert_rules as core
from monitor.core import maintenance as mnt
from monitor.core.alert_rules import FIRED, RESOLVED, PeerView, Rule, SwarmView
from monitor.core.maintenance import Recurrence
from monitor.core.muting import Mutes
from monitor.core.snapshot import Observation
from support import (PEERS, TINY, maintenance_window)

BERLIN = ZoneInfo("Europe/Berlin")
PEER_A = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"


def at(text: str, tz=BERLIN) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()


# ---- when a window is in force -----------------------------------------------------------------


def test_a_weekly_window_follows_its_time_zone_across_daylight_saving_time():
    weekly = maintenance_window(rec=Recurrence(duration=2 * 3600, timezone="Europe/Berlin", weekdays=(5, 6),
                                               at="03:30"))
    found = mnt.occurrences(weekly, at("2026-03-20T00:00"), at("2026-04-01T00:00"))
    # Sat 21, Sun 22, Sat 28, Sun 29 March at 03:30 Berlin: UTC+1 before the switch (29 March, 02:00), UTC+2 after
    assert [datetime.fromtimestamp(a, BERLIN).strftime("%a %d %H:%M") for a, _ in found] == [
        "Sat 21 03:30", "Sun 22 03:30", "Sat 28 03:30", "Sun 29 03:30"]
    assert all(b - a == 7200 for a, b in found)
    assert [datetime.utcfromtimestamp(a).strftime("%H:%M") for a, _ in found] == ["02:30", "02:30", "02:30", "01:30"]
    assert mnt.active([weekly], at("2026-03-21T04:00")) == [weekly]
    assert mnt.active([weekly], at("2026-03-21T05:31")) == []
    assert mnt.current_end(weekly, at("2026-03-21T04:00")) == at("2026-03-21T05:30")
    assert mnt.next_start(weekly, at("2026-03-23T12:00")) == at("2026-03-28T03:30")


def test_a_cron_window_and_the_bounds_of_a_recurring_window():
    cron = maintenance_window(rec=Recurrence(duration=3600, timezone="UTC", cron="0 2 * * sun"),
                              start=at("2026-03-01T00:00", ZoneInfo("UTC")),
                              end=at("2026-03-22T02:30", ZoneInfo("UTC")))
    found = mnt.occurrences(cron, at("2026-02-01T00:00", ZoneInfo("UTC")), at("2026-05-01T00:00", ZoneInfo("UTC")))
    starts = [datetime.utcfromtimestamp(a).strftime("%m-%d %H:%M") for a, _ in found]
    assert starts == ["03-01 02:00", "03-08 02:00", "03-15 02:00", "03-22 02:00"]
    assert found[-1][1] - found[-1][0] == 1800  # clipped at the window's end (an operator ended it then)
    # an occurrence that started before the range still counts from the range's start
    inside = mnt.occurrences(cron, at("2026-03-08T02:15", ZoneInfo("UTC")), at("2026-03-08T05:00", ZoneInfo("UTC")))
    assert inside == [(at("2026-03-08T02:15", ZoneInfo("UTC")), at("2026-03-08T03:00", ZoneInfo("UTC")))]


def test_covered_intervals_merge_what_windows_share_and_filter_by_what_they_cover():
    one = maintenance_window(start=100, end=300)
    two = maintenance_window(start=250, end=400, wid=2)
    other = maintenance_window(target="someone-else", start=1000, end=2000, wid=3)
    model = maintenance_window(scope="model", target="llama", start=500, end=600, wid=4)
    everything = maintenance_window(scope="global", target=None, start=700, end=800, wid=5)
    mine = [w for w in (one, two, other, model, everything) if w.covers(models=("llama",), peers=(PEER_A, "my-box"))]
    assert mine == [one, two, model, everything]
    assert mnt.covered_intervals(mine, 0, 750) == [(100, 400), (500, 600), (700, 750)]
    assert mnt.covered_seconds(mnt.covered_intervals(mine, 0, 10_000)) == 300 + 100 + 100
    assert mnt.overlap([(100, 400), (500, 600)], 350, 550) == 100
    assert mnt.covered_intervals([], 0, 100) == []


@pytest.mark.parametrize("rec, message", [
    (Recurrence(duration=3600, timezone="Mars/Olympus", weekdays=(0,), at="02:00"), "unknown time zone"),
    (Recurrence(duration=3600, timezone="../../etc/passwd", weekdays=(0,), at="02:00"), "not an IANA time zone"),
    (Recurrence(duration=3600, cron="*/10 * * * *"), "more often than once an hour"),
    (Recurrence(duration=3600, cron="61 * * * *"), "is not a cron expression"),
    (Recurrence(duration=3600, cron="0 0 31 2 *"), "never fires"),
    (Recurrence(duration=3600, cron="0 2 * * sun", weekdays=(0,), at="02:00"), "not both"),
    (Recurrence(duration=3600, weekdays=(0,), at="25:00"), "HH:MM"),
    (Recurrence(duration=3600, weekdays=(9,), at="02:00"), "Mon … Sun"),
    (Recurrence(duration=3600, weekdays=(), at="02:00"), "a weekly window needs `weekdays`"),
    (Recurrence(duration=30, weekdays=(0,), at="02:00"), "between 60 s and 7 d"),
    (Recurrence(duration=float("inf"), weekdays=(0,), at="02:00"), "between 60 s and 7 d"),
    (Recurrence(duration=float("nan"), weekdays=(0,), at="02:00"), "between 60 s and 7 d"),
])
def test_a_bad_recurrence_says_what_is_wrong(rec, message):
    with pytest.raises(ValueError, match=message):
        mnt.check_recurrence(rec)


# ---- uptime with the window left out -------------------------------------------------------------


def test_uptime_leaves_the_window_out_and_says_how_much():
    def obs(t, state="ONLINE", seen=True):
        return Observation(at=t, model="llama", state=state, start=0, end=4, seen=seen)

    # online 0-600, gone 600-900 (polls that did not see it), online again 900-1200
    history = [obs(t) for t in range(0, 600, 60)] + [obs(t, "OFFLINE", seen=False) for t in range(600, 900, 60)] + \
        [obs(t) for t in range(900, 1200, 60)]
    plain = mnt.uptime(history, 0, 1200)
    assert (plain.up_seconds, plain.observed_seconds, plain.maintenance_seconds) == (900, 1200, 0)
    assert plain.share == 0.75
    held = mnt.uptime(history, 0, 1200, mnt.covered_intervals([maintenance_window(start=550, end=950)], 0, 1200))
    assert (held.up_seconds, held.observed_seconds, held.maintenance_seconds) == (800, 800, 400)
    assert held.share == 1.0
    assert mnt.uptime([], 0, 100).share is None
    # a second model served at the same time counts once; the peer is up while any model sees it
    both = history + [Observation(at=t, model="bloom", state="ONLINE", start=0, end=2) for t in range(600, 900, 60)]
    assert mnt.uptime(both, 0, 1200).share == 1.0


# ---- held alerts ------------------------------------------------------------------------------------


def test_a_window_on_a_peer_holds_its_alerts_and_what_still_fires_after_it_is_told():
    rule = Rule("box", core.PEER_OFFLINE, for_seconds=0, peers=("my-box",))
    other = Rule("model-health", core.MODEL_DEGRADED, for_seconds=0)
    t0 = 1_700_000_000.0
    windows = (maintenance_window(start=t0, end=t0 + 600),)
    memory: dict = {}
    sent, held = [], []

    def run(t, peers):
        nonlocal memory
        result = core.evaluate([rule, other], SwarmView(at=t, scrape_period=60, last_ok_poll_at=t,
                                                        watching_since=t0 - 3600, peers=tuple(peers)),
                               memory, t, Mutes(windows=windows))
        memory = result.alerts
        sent.extend(result.notices)
        held.extend(result.held)

    online = PeerView(PEER_A, public_name="my-box", state="ONLINE", models=("llama",))
    run(t0, [online])
    run(t0 + 60, [])  # it goes away for its upgrade: held
    assert memory[("box", "my-box")].held == ("maintenance 1: upgrade",)
    run(t0 + 120, [online])  # back within the window: nobody ever hears of it
    run(t0 + 180, [])  # down again, and still down when the window ends
    assert sent == [] and [n.event for n in held] == [FIRED, RESOLVED, FIRED]
    run(t0 + 600, [])
    assert [(n.event, n.rule) for n in sent] == [(FIRED, "box")]


# ---- the web -------------------------------------------------------------------------------------------


def operator_headers(app) -> dict:
    return {"Authorization": f"Bearer {app.extensions['operator_token']}"}


HOSTILE = [
    ({"scope": "peer", "duration": "1h", "reason": "r"}, "needs `target`"),
    ({"scope": "model", "target": "not a prefix!", "duration": "1h", "reason": "r"}, "DHT prefix"),
    ({"scope": "room", "duration": "1h", "reason": "r"}, "`scope` must be one of global, model, peer"),
    ({"scope": "global", "duration": "1h"}, "`reason` is required"),
    ({"scope": "global", "duration": "99d", "reason": "r"}, "between 60 s and 30 d"),
    ({"scope": "global", "duration": -1, "reason": "r"}, "between 60 s and 30 d"),
    ({"scope": "global", "duration": "inf", "reason": "r"}, "must be a duration"),
    ({"scope": "global", "duration": 1e308, "reason": "r"}, "between 60 s and 30 d"),
    ({"scope": "global", "reason": "r"}, "needs either `duration`"),
    ({"scope": "global", "duration": "1h", "reason": "r" * 501}, "at most 500"),
    ({"scope": "global", "duration": "1h", "reason": "r", "timezone": "Nowhere/Land"}, "unknown time zone"),
    ({"scope": "global", "ends_at": "2020-01-01T00:00Z", "reason": "r"}, "within a year of now"),
    ({"scope": "global", "weekdays": ["Caturday"], "at": "02:00", "duration": "1h", "reason": "r"},
     "not a weekday"),
    ({"scope": "global", "weekdays": ["Sat"], "at": "02:00", "reason": "r"}, "needs `duration`"),
    ({"scope": "global", "weekdays": ["Sat"], "at": "02:00", "duration": "8d", "reason": "r"}, "7 d"),
    ({"scope": "global", "cron": "* * * * *", "duration": "1h", "reason": "r"}, "once an hour"),
    ({"scope": "global", "cron": "0 2 * * sun", "duration": "1h", "reason": "r", "weekdays": ["Sat"], "at": "1:00"},
     "not both"),
    ({"scope": "global", "weekdays": {"Sat": 1}, "at": "02:00", "duration": "1h", "reason": "r"}, "must be a list"),
]


@pytest.mark.parametrize("body, message", HOSTILE)
def test_hostile_windows_are_refused_and_anonymous_clients_change_nothing(populated, body, message):
    app, store, _, _ = populated
    client = app.test_client()
    assert client.post("/api/v1/maintenance", json={"scope": "global", "duration": "1h", "reason": "r"}
                       ).status_code == 401
    response = client.post("/api/v1/maintenance", json=body, headers=operator_headers(app))
    assert response.status_code == 400, response.get_json()
    assert message in response.get_json()["error"]
    assert store.maintenance_windows() == []


def test_the_pages_say_maintenance_and_the_peer_page_leaves_it_out_of_uptime(populated):
    app, store, _, now = populated
    client = app.test_client()
    headers = operator_headers(app)
    peer = PEERS["first"]
    assert "data-maintenance-now" not in client.get("/").get_data(as_text=True)
    before = client.get(f"/peers/{peer}?hours=24").get_data(as_text=True)
    assert "maintenance left out" not in before
    made = client.post("/api/v1/maintenance", headers=headers, json={
        "scope": "peer", "target": peer, "starts_at": time.time() - 7200, "duration": "3h",
        "reason": "moving the GPU box", "by": "alice"})
    assert made.status_code == 201, made.get_json()
    window_id = made.get_json()["maintenance"]["id"]
    assert made.get_json()["maintenance"]["status"] == "active"
    page = client.get(f"/peers/{peer}?hours=24").get_data(as_text=True)
    assert f'data-maintenance-now="{window_id}"' in page and "moving the GPU box" in page
    assert "maintenance left out: " in page
    assert "data-maintenance-now" not in client.get(f"/peers/{PEERS['second']}").get_data(as_text=True)
    model = client.post("/api/v1/maintenance", headers=headers, json={
        "scope": "model", "target": TINY.dht_prefix, "duration": "1h", "reason": "new release"}).get_json()
    overview = client.get("/").get_data(as_text=True)
    assert "new release" in overview and "moving the GPU box" in overview
    assert overview.count('<span class="badge maintenance">maintenance</span>') >= 2  # the callout and the model's row
    assert "new release" in client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    listed = client.get("/api/v1/maintenance").get_json()["maintenance"]  # anyone may read them
    assert {w["reason"] for w in listed} == {"moving the GPU box", "new release"}
    assert all("created_by" not in w for w in listed)
    assert client.post(f"/api/v1/maintenance/{model['maintenance']['id']}/end").status_code == 401
    ended = client.post(f"/api/v1/maintenance/{model['maintenance']['id']}/end", headers=headers,
                        json={"reason": "released"})
    assert ended.get_json()["maintenance"]["status"] == "expired"
    assert ended.get_json()["maintenance"]["changes"][-1]["why"] == "released"
    assert "new release" not in client.get("/").get_data(as_text=True)
    alerts_page = client.get("/alerts", headers=headers).get_data(as_text=True)
    assert f'data-maintenance="{window_id}" data-status="active"' in alerts_page


def test_an_operator_plans_weekly_maintenance_with_the_alerts_pages_form(populated):
    import re

    app, store, _, _ = populated
    client = app.test_client()
    form = {"scope": "peer", "target": "first-half", "timezone": "Europe/Berlin", "weekdays": ["Sat", "Sun"],
            "at": "03:00", "duration": "2h", "reason": "weekly upgrade", "by": "dana"}
    assert client.post("/alerts/maintenance", data=form).status_code in (400, 401, 403)  # no session, no CSRF
    assert client.get(f"/login?token={app.extensions['operator_token']}").status_code == 303
    assert client.post("/alerts/maintenance", data=form).status_code == 403  # a session without the CSRF token
    assert store.maintenance_windows() == []
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/alerts").get_data(as_text=True)).group(1)
    assert client.post("/alerts/maintenance", data={**form, "csrf_token": csrf}).status_code == 303
    [made] = store.maintenance_windows()
    assert (made.scope, made.target, made.recurrence.weekdays, made.recurrence.at, made.recurrence.timezone) == (
        "peer", "first-half", (5, 6), "03:00", "Europe/Berlin")
    assert made.created_by == "dana"
    assert store.mute_changes("maintenance", [made.id])[made.id][0].via == "browser session"
    bad = client.post("/alerts/maintenance", data={**form, "csrf_token": csrf, "at": "27:00"})
    assert bad.status_code == 400 and "HH:MM" in bad.get_data(as_text=True)
    assert client.post(f"/alerts/maintenance/{made.id}/end", data={"csrf_token": csrf}).status_code == 303
    assert store.maintenance_windows(ending_after=time.time()) == []
