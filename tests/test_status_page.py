"""Spec: the status page (README: Dashboard, Status page) — per model, a bar of the last 90 UTC days
coloured by each day's worst state, with the day's uptime, outages and maintenance on hover and on
keyboard focus; uptime over 24 h, 7 d and 30 d with maintenance left out (and said so); the Atom
feed of state changes and notes.

The history is written through the store's own write path (``Store.record_poll`` with each poll's
diagnosis, then ``rollup_and_prune`` as the scheduler runs it, so older days are hourly rollups and
the last two are raw polls), with a known state per day; a maintenance window is made through the
store as the operators' API makes it (conftest's ``status_app``, ``support.STATUS_PLAN``). The page
is rendered by the real app; Chromium draws its bars in ``test_pages_in_chromium.py``.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import pytest

from monitor.core import uptime
from monitor.core.common import DAY, HOUR
from monitor.core.maintenance import MaintenanceWindow
from monitor.core.snapshot import Snapshot
from monitor.core.uptime import StatusPoint
from support import STATUS_EXPECTED, TINY, day_start, status_health


def test_uptime_spreads_each_point_over_its_time_and_leaves_maintenance_out():
    """The arithmetic, by hand: an hourly row half broken, two polls of a few minutes."""
    points = [StatusPoint(0, {"healthy": 60}, HOUR), StatusPoint(HOUR, {"broken": 30, "healthy": 30}, HOUR),
              StatusPoint(2 * HOUR, {"healthy": 1}, 180), StatusPoint(2 * HOUR + 60, {"broken": 1}, 180)]
    t = uptime.tally(points, 0, 2 * HOUR + 100)
    assert (t.up, t.observed, t.maintenance) == (3600 + 1800 + 60, 2 * HOUR + 100, 0)
    assert t.worst == "broken"
    held = uptime.tally(points, 0, 2 * HOUR + 100, maintenance=[(HOUR, HOUR + 1800)])
    assert (held.up, held.observed, held.maintenance) == (3600 + 900 + 60, 3600 + 1800 + 100, 1800)
    # a poll stands at most its hold: a poller down for an hour leaves a gap, not a stretched state
    gap = uptime.tally([StatusPoint(0, {"broken": 1}, 180), StatusPoint(HOUR, {"healthy": 1}, 180)], 0, HOUR + 180)
    assert (gap.up, gap.observed) == (180, 360)
    assert uptime.percent(0.99999) == "99.99%" and uptime.percent(1.0) == "100%" and uptime.percent(None) == "no data"


def test_compacted_points_give_the_same_days_and_uptimes():
    """``compact`` (a run of polls in one state as one point) changes no figure: random polls with
    gaps longer than their hold, hourly rows between, a maintenance window across them."""
    import random

    rng = random.Random(7)
    now = 40 * DAY + 1234.0
    points = [StatusPoint(h * HOUR, {"healthy": 50, rng.choice(["broken", "degraded", "unknown"]): 10}, HOUR)
              for h in range(0, 24 * 30, 3)]
    at = 30 * DAY
    while at < now:
        points.append(StatusPoint(at, {rng.choice(["healthy"] * 8 + ["degraded", "broken", "unknown"]): 1}, 180))
        at += rng.choice([60, 60, 60, 120, 400])
    held = [(31 * DAY + 500, 31 * DAY + 20_000), (5 * DAY, 6 * DAY)]
    compacted = uptime.compact(points)
    assert len(compacted) < 0.7 * len(points)
    for a, b in zip(uptime.days(points, now, maintenance=held), uptime.days(compacted, now, maintenance=held)):
        assert (a.start, a.state, a.outages) == (b.start, b.state, b.outages)
        assert a.up == pytest.approx(b.up) and a.observed == pytest.approx(b.observed)
        assert a.maintenance == pytest.approx(b.maintenance)
    for name, t in uptime.uptimes(points, now, held).items():
        c = uptime.uptimes(compacted, now, held)[name]
        assert (t.up, t.observed, t.maintenance) == pytest.approx((c.up, c.observed, c.maintenance)), name
        assert t.up == pytest.approx(uptime.tally(points, now - uptime.WINDOWS[name], now, held).up)


def test_each_day_says_its_worst_state_maintenance_or_no_data(status_app):
    app, store, now = status_app
    with app.app_context():
        from monitor.web import deps, queries, status

        d = deps()
        [row] = status.model_statuses(d, queries.current(d), now)
    assert len(row.days) == 90 and row.days[-1].end == pytest.approx((now // 60) * 60)
    by_age = {round((day_start(now, 0) - day.start) / DAY): day for day in row.days}
    assert {age: by_age[age].state for age in STATUS_EXPECTED} == STATUS_EXPECTED
    six = by_age[6]
    assert six.maintenance == pytest.approx(4 * HOUR) and six.observed == pytest.approx(4 * HOUR)
    # outages come from the state changes (polls every 3 h here: broken from 06:10 to 09:10), and
    # leave out what a maintenance window covers (day 6: broken until 12:10, the window until 12:00)
    seven = day_start(now, 7)
    assert by_age[7].outages == ((seven + 6 * HOUR + 600, seven + 9 * HOUR + 600),)
    assert by_age[7].states["broken"] == pytest.approx(HOUR)  # the hourly row of its one broken poll
    assert six.outages == ((day_start(now, 6) + 12 * HOUR, day_start(now, 6) + 12 * HOUR + 600),)
    assert row.uptimes["30d"].maintenance == pytest.approx(4 * HOUR)  # said on the page, below
    assert 0 < row.uptimes["30d"].share < 1 and row.uptimes["24h"].share == 1.0  # degraded counts as up


def test_the_status_page_shows_open_notes_and_maintenance_in_force(status_app):
    app, store, now = status_app
    store.post_note("model", TINY.dht_prefix, "server-7 is being upgraded, back at 14:00 <b>UTC</b>", author="ops",
                    via="api token")
    store.create_maintenance_window(MaintenanceWindow(
        id=0, scope="global", target=None, starts_at=now - 600, ends_at=now + 3600, reason="moving the bootstrap peer",
        created_at=now, created_by="spec"), via="api token")
    html = app.test_client().get("/status").get_data(as_text=True)
    assert "server-7 is being upgraded, back at 14:00 &lt;b&gt;UTC&lt;/b&gt;" in html and "<b>UTC</b>" not in html
    assert "moving the bootstrap peer" in html and 'data-state="maintenance"' in html


def test_the_atom_feed_lists_state_changes_and_notes_newest_first(status_app):
    app, store, now = status_app
    store.post_note("swarm", None, "We are moving the monitor to a new host & database", author="ops", via="api token")
    response = app.test_client().get("/status/feed.atom", headers={"Origin": "https://widgets.example"})
    assert response.status_code == 200 and response.mimetype == "application/atom+xml"
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    ns = {"a": "http://www.w3.org/2005/Atom"}
    feed = ET.fromstring(response.data)
    entries = feed.findall("a:entry", ns)
    titles = [e.findtext("a:title", namespaces=ns) for e in entries]
    updated = [e.findtext("a:updated", namespaces=ns) for e in entries]
    assert updated == sorted(updated, reverse=True)
    assert titles[0] == "Note posted on the swarm"
    assert entries[0].findtext("a:content", namespaces=ns) == "We are moving the monitor to a new host & database"
    assert "Tiny Llama: healthy → broken" in titles and "Tiny Llama: broken → healthy" in titles
    assert all(e.findtext("a:id", namespaces=ns) for e in entries)
    assert len({e.findtext("a:id", namespaces=ns) for e in entries}) == len(entries)


def test_a_new_poll_reaches_the_page_and_its_htmx_refresh_at_once_though_the_live_part_is_kept(status_app):
    """The live part is rendered once per store change (and 10 s) for every visitor: a poll that
    breaks the model is on the next request, full page and htmx refresh alike, not 10 s later."""
    app, store, now = status_app
    client = app.test_client()
    refresh = {"HX-Request": "true", "HX-Target": "status-live"}
    assert "1 of 1 model is degraded" in client.get("/status").get_data(as_text=True)
    assert "1 of 1 model is degraded" in client.get("/status", headers=refresh).get_data(as_text=True)
    store.record_poll(Snapshot(taken_at=time.time(), duration=0.5, models=(TINY,), servers=()), [status_health("broken")])
    page = client.get("/status").get_data(as_text=True)
    part = client.get("/status", headers=refresh).get_data(as_text=True)
    assert "1 of 1 model is down." in page and "1 of 1 model is down." in part
    assert "<html" in page and "<html" not in part  # the refresh gets only the live part
