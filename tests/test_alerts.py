"""Specs of alerts end to end, on what pure specs cannot stand in for: on SQLite and PostgreSQL,
nothing lost or repeated across a restart of the poller, and silences and maintenance windows
stored with every change logged; the Prometheus rules through promtool; a real swarm (a stopped
server is one notice, its return one recovery, a flap shorter than ``for`` none; a broken model one
notice, not one per server; a server down inside its maintenance window or under a silence sends
nothing) and the demo's chaos controls. The rules themselves: ``test_alert_rules.py``; silences,
maintenance windows and inhibition judged without I/O and on the pages: ``test_silences.py``,
``test_maintenance.py``, ``test_inhibition.py``; deliveries to a real receiver, the pages and
/metrics: ``test_alert_delivery.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from monitor.app.alerter import Alerter
from monitor.core import maintenance as mnt
from monitor.core.alert_rules import FIRING, RESOLVED
from monitor.core.maintenance import Recurrence
from monitor.core.muting import Silence, matcher, parse_matcher
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.harness.webhook_receiver import WebhookReceiver
from monitor.settings import Settings
from monitor.store import Store
from support import (DEGRADED_SPAN, DEGRADING, STORE_KINDS, alert_settings, alerting_settings, dashboard_url,
                     fire_degraded, keep_reading, maintenance_window, migrated_store, record_state, start_demo,
                     stop_process, store_url_of, swarm_processes, wait_until)


# ---- on SQLite and PostgreSQL ------------------------------------------------------------------


@pytest.fixture(params=STORE_KINDS)
def store_url(request, tmp_path) -> str:
    return store_url_of(request, tmp_path / "monitor.db")


@pytest.fixture(params=STORE_KINDS)
def store(request, tmp_path):
    with migrated_store(store_url_of(request, tmp_path / "monitor.db")) as s:
        yield s


def test_nothing_is_lost_or_repeated_across_a_restart_of_the_poller(store_url, receiver, tmp_path):
    """The first poller fires, cannot deliver (its webhook is down) and dies; the second one
    delivers that notice once, does not fire again, and sends the recovery once."""
    first = Store(store_url)
    first.migrate()
    settings = alert_settings(tmp_path, receiver.url)
    receiver.plan[:] = [503]
    now = time.time()
    alerter = fire_degraded(first, settings, now)
    alerter.deliver(now)
    first.close()

    second = Store(store_url)
    try:
        restarted = Alerter(settings, second, watching_since=now + 30)
        assert restarted.evaluate(now + 31).notices == ()  # its first evaluation, before its first poll
        assert restarted.deliver(now + 31) == {"delivered": 1, "retry": 0, "failed": 0}
        record_state(second, now + 40, "degraded")
        assert restarted.evaluate(now + 41).notices == ()
        record_state(second, now + 100, "healthy")
        assert [n.event for n in restarted.evaluate(now + 101).notices] == [RESOLVED]
        restarted.deliver(now + 101)
        assert [(r.status, r.body["event"]) for r in receiver.received] == [
            (503, "firing"), (200, "firing"), (200, "resolved")]
        events = second.alert_events(now - 1000, now + 1000)
        assert [e.notice.event for e in events] == ["resolved", "firing"]
        assert second.alerts() == {}
    finally:
        second.close()


def test_silences_are_stored_ended_and_every_change_is_logged(store):
    now = time.time()
    matchers = (matcher("model", "=", "llama"), parse_matcher('peer_name=~"gpu-.*"'))
    sid = store.create_silence(Silence(id=1, matchers=matchers, starts_at=now, ends_at=now + 3600,
                                       comment="upgrading petals", created_by="alice", created_at=now), via="api token")
    [stored] = store.silences(ending_after=now)
    assert stored.id == sid and [str(m) for m in stored.matchers] == ['model="llama"', 'peer_name=~"gpu-.*"']
    assert (stored.comment, stored.created_by, stored.active(now + 1)) == ("upgrading petals", "alice", True)
    ended = store.end_silence(sid, at=now + 60, by="bob", via="browser session", why="upgrade done")
    assert (ended.ends_at, ended.ended_at, ended.ended_by, ended.active(now + 61)) == (now + 60, now + 60, "bob", False)
    assert store.end_silence(sid, at=now + 120, by="eve", via="api token", why="again") == ended  # already over
    assert store.end_silence(sid + 100, at=now, by="eve", via="api token", why="none") is None
    assert store.silences(ending_after=now + 61) == []
    assert [s.id for s in store.silences(ending_after=now - 3600)] == [sid]
    changes = store.mute_changes("silence", [sid])[sid]
    assert [(c.action, c.by, c.via, c.why) for c in changes] == [
        ("created", "alice", "api token", "upgrading petals"), ("ended", "bob", "browser session", "upgrade done")]


def test_windows_are_stored_ended_for_good_and_logged(store):
    now = time.time()
    weekly = maintenance_window(rec=Recurrence(duration=3600, timezone="Europe/Berlin", weekdays=(5, 6), at="02:00"),
                                start=now)
    cron = maintenance_window(scope="model", target="llama",
                              rec=Recurrence(duration=1800, timezone="UTC", cron="0 3 * * *"), start=now, wid=0)
    once = maintenance_window(scope="global", target=None, start=now, end=now + 3600)
    ids = [store.create_maintenance_window(w, via="api token") for w in (weekly, cron, once)]
    stored = {w.id: w for w in store.maintenance_windows(ending_after=now)}
    assert stored[ids[0]].recurrence == weekly.recurrence and stored[ids[0]].ends_at is None
    assert stored[ids[1]].recurrence.cron == "0 3 * * *" and stored[ids[1]].target == "llama"
    assert (stored[ids[2]].scope, stored[ids[2]].ends_at) == ("global", now + 3600)
    ended = store.end_maintenance_window(ids[0], at=now + 10, by="bob", via="browser session", why="done")
    assert (ended.ends_at, ended.ended_by) == (now + 10, "bob")
    assert mnt.next_start(ended, now + 10) is None  # a recurring window ended for good
    assert {w.id for w in store.maintenance_windows(ending_after=now + 11)} == set(ids[1:])
    assert {w.id for w in store.maintenance_windows()} == set(ids)
    assert [(c.action, c.by, c.via) for c in store.mute_changes("maintenance", [ids[0]])[ids[0]]] == [
        ("created", "alice", "api token"), ("ended", "bob", "browser session")]


def test_the_new_tables_match_the_models(store):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from monitor.store import metadata

    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert [d for d in diffs if any(t in repr(d) for t in ("silences", "maintenance", "mute_changes", "alert"))] == []


# ---- Prometheus --------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: install Debian's prometheus package (scripts/system-deps does)",
                    pytrace=False)
    return path


def test_the_prometheus_rules_pass_promtool_check_and_their_unit_tests():
    from monitor.prometheus import rules_path, rules_test_path

    check = subprocess.run([promtool(), "check", "rules", str(rules_path())], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 12 rules found" in check.stdout
    tested = subprocess.run([promtool(), "test", "rules", str(rules_test_path())], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# ---- a real swarm ------------------------------------------------------------------------------


def model_state(store: Store):
    health = store.latest_assessments().get(TINY_DHT_PREFIX)
    return health.state if health else None


def evaluated_since(poller, runs_before: dict, *, scrapes: int = 0, evaluations: int = 2) -> bool:
    """Whether the poller has polled ``scrapes`` more times and evaluated its rules ``evaluations``
    more times (each evaluation after a poll reads it) since ``runs_before`` (its ``stats.runs``)."""
    runs = poller.stats.runs
    return (runs.get("scrape", 0) >= runs_before.get("scrape", 0) + scrapes
            and runs.get("alerts", 0) >= runs_before.get("alerts", 0) + evaluations)


def nothing_to_send(poller, store: Store, runs_before: dict, *, holding: dict | None = None) -> bool:
    """The rules were evaluated twice since ``runs_before``, no delivery is pending, and the
    alerts the store remembers are exactly ``holding`` ((rule, subject) -> (status, since)): from
    then on the alerter sends nothing until the swarm changes (what the pure specs above prove).
    A pending alert (one that would fire once its ``for`` has passed) keeps this false."""
    remembered = {key: (alert.status, alert.since) for key, alert in store.alerts().items()}
    return (evaluated_since(poller, runs_before) and not store.pending_alert_deliveries()
            and remembered == (holding or {}))


@pytest.mark.timeout(600)  # a loaded machine starts and restarts petals servers slowly
def test_a_stopped_server_is_one_notice_and_its_return_one_recovery_even_across_a_poller_restart(swarm, tmp_path):
    """The session swarm, laid out as the demo's (every block served twice). One rule waits 5 s:
    stopping a server is one "degraded" notice (its first delivery fails and is retried), a
    restart of the poller while the model is degraded repeats nothing, the server's return is one
    recovery. Another rule waits 10 minutes: that same outage, shorter than its ``for``, reaches
    nobody."""
    from monitor.app.jobs import Poller
    from monitor.settings import ModelConfig

    wait_for, check, scrape = 5, 1, 2  # the model-health rule's `for`, alerts.check_period, scrape_period
    with WebhookReceiver(plan=[503]) as ops, WebhookReceiver() as patient:
        settings = Settings(
            data_dir=tmp_path, initial_peers=swarm.initial_peers,
            models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS)],
            scrape_period=scrape, reachability_period=2, reachability_timeout=2, score_period=600,
            alerts={"check_period": check, "retry_backoff": 1,
                    "webhooks": [{"name": "ops", "url": ops.url}, {"name": "patient", "url": patient.url}],
                    "rules": [{"name": "model-health", "kind": "model_degraded", "for": wait_for, "webhooks": ["ops"]},
                              {"name": "patient", "kind": "model_degraded", "for": "10m", "webhooks": ["patient"]}]})
        store = Store(settings.resolved_database_url)
        store.migrate()
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: model_state(store) == "healthy", 60), store.latest_assessments()
            # a healthy swarm pages nobody: seen once the rules judged it with nothing pending, or
            # else after longer than `for` and two evaluations
            runs = dict(poller.stats.runs)
            wait_until(lambda: nothing_to_send(poller, store, runs), wait_for + 2 * check)
            assert ops.received == [] and patient.received == []

            swarm.stop(DEGRADING)  # blocks 0:4 are left with one server
            stopped = time.monotonic()
            [degraded] = ops.wait_for(1, 90)
            assert (degraded["event"], degraded["rule"], degraded["state"], degraded["subject"]) == (
                "firing", "model-health", "degraded", TINY_DHT_PREFIX)
            assert DEGRADED_SPAN in " ".join(degraded["details"])
            assert [r.status for r in ops.received] == [503, 200]  # retried, one notice
            assert len({r.body["id"] for r in ops.received}) == 1

            firing = {key: (alert.status, alert.since) for key, alert in store.alerts().items()}
            assert firing[("model-health", TINY_DHT_PREFIX)][0] == FIRING
            poller.shutdown()  # the poller restarts while the model is degraded
            poller = Poller(settings, store, swarm.dht)
            poller.start()
            # it repeats nothing: seen once it has polled twice and judged the same alerts to hold
            # since the same times (a forgotten one would be pending again, and fire after `for`),
            # or else after longer than `for` and two polls
            wait_until(lambda: evaluated_since(poller, {}, scrapes=2)
                       and nothing_to_send(poller, store, {}, holding=firing), wait_for + 2 * scrape)
            assert model_state(store) == "degraded"
            assert len(ops.accepted()) == 1

            swarm.restart(DEGRADING)
            [_, recovered] = ops.wait_for(2, 90)
            outage = time.monotonic() - stopped
            assert (recovered["event"], recovered["status"], recovered["summary"]) == (
                "resolved", "resolved", f"{TINY_DHT_PREFIX} is healthy again")
            runs = dict(poller.stats.runs)  # and then nothing more (as at the start)
            wait_until(lambda: nothing_to_send(poller, store, runs), wait_for + 2 * check)
            assert len(ops.accepted()) == 2
            assert outage < 600 and patient.received == []  # the outage was a flap to the 10-minute rule
            assert store.alerts() == {}
            notices = store.alert_events(0, time.time() + 1)
            assert [(e.notice.rule, e.notice.event) for e in notices] == [
                ("model-health", "resolved"), ("model-health", "firing")]
        finally:
            poller.shutdown()
            store.close()


@pytest.mark.timeout(600)
def test_a_broken_model_sends_one_notice_not_one_per_server(make_swarm, tmp_path):
    """Every server of the model stops: the model's alert is told, each server's own alert fires on
    the dashboard held by it (the default inhibition), and no per-server notice goes out."""
    from monitor.app.jobs import Poller
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS

    swarm = make_swarm(demo_layout(TINY_NUM_BLOCKS, 3))
    names = ("server-1", "server-2", "server-3")
    ids = {name: swarm.peer_id(name) for name in names}
    with WebhookReceiver() as ops:
        settings = alerting_settings(swarm, tmp_path, ops.url, [
            {"name": "model-health", "kind": "model_degraded", "for": 4}] + [
            {"name": name, "kind": kind, "peers": [ids[name]], "for": 4} for name in names for kind in ("peer_offline",)])
        store = Store(settings.resolved_database_url)
        store.migrate()
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: (h := store.latest_assessments().get(TINY_DHT_PREFIX)) and h.state == "healthy", 90)
            stops = [threading.Thread(target=swarm.stop, args=(name,)) for name in names]
            for thread in stops:
                thread.start()
            for thread in stops:
                thread.join(120)

            def all_firing():
                alerts = store.alerts()
                keys = [(name, ids[name]) for name in names] + [("model-health", TINY_DHT_PREFIX)]
                return all(k in alerts and alerts[k].status == FIRING for k in keys) and alerts

            alerts = wait_until(all_firing, 120)
            assert alerts, store.alerts()
            for name in names:
                assert alerts[(name, ids[name])].held == (f"inhibited by model-health/{TINY_DHT_PREFIX}",)
            # what was queued is all that can be sent: wait until it was
            assert wait_until(lambda: store.alert_deliveries() and not store.pending_alert_deliveries(), 60)
            assert {d.notice.rule for d in store.alert_deliveries()} == {"model-health"}
            told = [n for body in ops.accepted() for n in (body.get("notices") or [body])]
            assert {n["rule"] for n in told} == {"model-health"}, told
            assert [n["event"] for n in told].count("firing") == 1
            assert all(n["event"] in ("firing", "changed") for n in told)
            held = [e.notice for e in store.alert_events(0, time.time() + 1) if e.notice.held]
            assert sorted(n.rule for n in held) == sorted(names)
        finally:
            poller.shutdown()
            store.close()


@pytest.mark.timeout(600)
def test_a_window_on_a_peer_holds_its_alerts_and_leaves_the_window_out_of_its_uptime(swarm, tmp_path):
    """A server of the session swarm goes down inside its maintenance window: its offline alert
    fires on the dashboard, held by the window; the webhook hears nothing; the peer page's uptime
    leaves the window out. It comes back within the window: still nothing is sent."""
    from monitor.app.jobs import Poller
    from monitor.web import create_app

    peer = swarm.peer_id(DEGRADING)
    with WebhookReceiver() as ops:
        settings = alerting_settings(swarm, tmp_path, ops.url,
                                     [{"name": DEGRADING, "kind": "peer_offline", "peers": [peer], "for": 4}])
        store = Store(settings.resolved_database_url)
        store.migrate()
        client = create_app(settings, store).test_client()
        headers = {"Authorization": f"Bearer {client.application.extensions['operator_token']}"}
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: store.peer_record(peer) is not None, 90)
            time.sleep(4)  # some uptime before the window: two polls
            made = client.post("/api/v1/maintenance", headers=headers, json={
                "scope": "peer", "target": peer, "duration": "15m", "reason": "upgrading petals"})
            assert made.status_code == 201
            swarm.stop(DEGRADING)
            alert = wait_until(lambda: (a := store.alerts().get((DEGRADING, peer))) and a.status == "firing" and a,
                               120)
            assert alert and alert.held == (f"maintenance {made.get_json()['maintenance']['id']}: upgrading petals",)
            page = client.get(f"/peers/{peer}?hours=1").get_data(as_text=True)
            assert "maintenance left out: " in page and "upgrading petals" in page
            import re
            share = float(re.search(r'data-uptime="([0-9.]+)"', page).group(1))
            assert share > 0.99  # its downtime fell inside the window: not counted against it
            swarm.restart(DEGRADING)
            assert wait_until(lambda: (DEGRADING, peer) not in store.alerts(), 120), store.alerts()
            assert store.alert_deliveries() == [] and ops.received == []  # nothing queued: nothing to send
            events = store.alert_events(0, time.time() + 1)
            assert [(e.notice.event, bool(e.notice.held)) for e in events] == [("resolved", True), ("firing", True)]
        finally:
            poller.shutdown()
            store.close()


@pytest.mark.timeout(600)
def test_a_server_stopped_under_a_silence_sends_nothing_and_the_silence_is_shown(swarm, tmp_path):
    """An operator silences a server of the session swarm for 10 minutes and stops it: its offline
    alert and the model's degraded one (what the model lost is that server) fire on the dashboard,
    marked silenced, and the webhook stays quiet; when the operator ends the silence while the
    server is still down, the notices go out then."""
    from monitor.app.jobs import Poller
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
    from monitor.settings import ModelConfig
    from monitor.web import create_app

    peer = swarm.peer_id(DEGRADING)
    with WebhookReceiver() as ops:
        settings = Settings(
            data_dir=tmp_path, initial_peers=swarm.initial_peers,
            models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS)],
            scrape_period=2, reachability_period=2, reachability_timeout=2, score_period=600,
            alerts={"check_period": 1, "retry_backoff": 1, "default_inhibit": False,
                    "webhooks": [{"name": "ops", "url": ops.url}],
                    "rules": [{"name": "model-health", "kind": "model_degraded", "for": 4},
                              {"name": DEGRADING, "kind": "peer_offline", "peers": [peer], "for": 4}]})
        store = Store(settings.resolved_database_url)
        store.migrate()
        client = create_app(settings, store).test_client()
        token = client.application.extensions["operator_token"]
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: (store.latest_assessments().get(TINY_DHT_PREFIX) or
                                       type("x", (), {"state": None})).state == "healthy", 90)
            made = client.post("/api/v1/silences", headers={"Authorization": f"Bearer {token}"}, json={
                "peer": peer, "duration": "10m", "comment": f"upgrading petals on {DEGRADING}", "by": "operator"})
            assert made.status_code == 201
            swarm.stop(DEGRADING)

            def both_firing():
                alerts = store.alerts()
                keys = {(DEGRADING, peer), ("model-health", TINY_DHT_PREFIX)}
                return all(k in alerts and alerts[k].status == "firing" for k in keys) and alerts

            alerts = wait_until(both_firing, 120)
            assert alerts, store.alerts()
            assert alerts[(DEGRADING, peer)].held[0].startswith("silence ")
            assert alerts[(DEGRADING, peer)].models == (TINY_DHT_PREFIX,)
            name = store.peer_record(peer).public_name or peer
            assert alerts[("model-health", TINY_DHT_PREFIX)].held == (
                f"silence 1: upgrading petals on {DEGRADING} (what the model lost: {name})",)
            # the webhook stays quiet: nothing was ever queued for it, so nothing can reach it later
            assert store.alert_deliveries() == [] and ops.received == []
            page = client.get("/alerts", headers={"Authorization": f"Bearer {token}"}).get_data(as_text=True)
            assert f'data-alert="{DEGRADING}/{peer}" data-status="firing"' in page
            assert f"held, nothing is sent: silence 1: upgrading petals on {DEGRADING}" in page
            anonymous = client.get("/alerts").get_data(as_text=True)
            assert "held, nothing is sent: silence" in anonymous and "upgrading petals" not in anonymous
            api = {(a["rule"], a["subject"]): a for a in client.get("/api/v1/alerts").get_json()["active"]}
            assert api[(DEGRADING, peer)]["held"][0]["by"] == "silence"
            held = [e for e in client.get("/api/v1/alerts").get_json()["events"] if e["held"]]
            assert {e["rule"] for e in held} == {DEGRADING, "model-health"} and all(not e["deliveries"] for e in held)
            overview = client.get("/").get_data(as_text=True)
            assert "held: silence" in overview

            sid = made.get_json()["silence"]["id"]
            assert client.post(f"/api/v1/silences/{sid}/end", headers={"Authorization": f"Bearer {token}"},
                               json={"reason": "want to hear of it"}).status_code == 200
            assert wait_until(lambda: len(store.alert_deliveries()) == 2 and not store.pending_alert_deliveries(), 60), \
                store.alert_deliveries()
            told = [n for body in ops.accepted() for n in (body.get("notices") or [body])]
            assert sorted((n["rule"], n["event"]) for n in told) == sorted([("model-health", "firing"),
                                                                            (DEGRADING, "firing")])
            swarm.restart(DEGRADING)
        finally:
            poller.shutdown()
            store.close()


# ---- the demo ----------------------------------------------------------------------------------


@pytest.mark.swarm  # the demo starts a swarm of its own
@pytest.mark.timeout(900)
def test_the_demo_sends_exactly_the_notices_its_chaos_controls_call_for(data_dir, tmp_path):
    """`swarm-monitor demo --tiny --webhook URL` with the demo's settings, its scrape period and alert
    check shortened through the environment as an operator would (4 s and 2 s; the default rules
    then wait two scrape periods, 8 s); its chaos controls stop and start server-2: one "degraded"
    notice, one recovery, nothing else."""
    import urllib.request

    started = time.time()
    check = 2  # alerts.check_period: rules are evaluated at least this often
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir),
           "SWARM_MONITOR_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}",
           "SWARM_MONITOR_SCRAPE_PERIOD": "4", "SWARM_MONITOR_ALERTS": json.dumps({"check_period": check})}

    def chaos(action: str, base: str) -> None:
        """What the panel's buttons and `swarm-monitor chaos` call (with a longer wait than the
        CLI's 60 s: stopping and starting wait for the server, which a loaded 2-core machine may
        take longer than that)."""
        token = (data_dir / "admin_token").read_text().strip()
        request = urllib.request.Request(f"{base}/demo/servers/server-2/{action}", method="POST",
                                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            assert response.status == 200

    def state(base: str):
        with urllib.request.urlopen(f"{base}/api/v1/state", timeout=30) as response:
            reports = json.loads(response.read())["model_reports"]
        return reports[0]["monitor_state"] if reports else None

    def alerts(base: str) -> dict:
        with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=30) as response:
            return json.loads(response.read())

    def quiet(base: str) -> bool:
        """No alert pending or firing, no delivery pending: nothing is sent until the swarm changes."""
        now = alerts(base)
        return not now["active"] and not any(counts["pending"] for counts in now["deliveries"].values())

    with WebhookReceiver() as hook:
        demo = start_demo(["--tiny", "--port", "0", "--webhook", hook.url], env=env)
        output: list[str] = []
        reader = None
        try:
            base = dashboard_url(demo, output)
            while not output[-1].startswith("Alerts:"):
                output.append(demo.stdout.readline())
            assert "(1 webhook notified)" in output[-1]
            reader = keep_reading(demo, output)  # (the pipe kept drained)
            assert wait_until(lambda: state(base) == "healthy", 120)
            # a healthy swarm pages nobody: seen once nothing is pending (an alert left pending by
            # the start, before the servers were up, would be active), or else after longer than
            # the rules' `for` (two scrape periods: 8 s)
            wait_for = max(rule["for_seconds"] for rule in alerts(base)["rules"])
            assert wait_for == 8
            wait_until(lambda: quiet(base), wait_for + check)
            assert hook.received == []

            chaos("stop", base)
            [degraded] = hook.wait_for(1, 180)
            assert (degraded["event"], degraded["state"], degraded["rule"]) == ("firing", "degraded", "model-health")
            assert "0:4" in " ".join(degraded["details"])
            chaos("start", base)
            [_, recovered] = hook.wait_for(2, 180)
            assert recovered["event"] == "resolved" and recovered["summary"].endswith("is healthy again")
            time.sleep(check)  # and then nothing more: another evaluation, and nothing pending
            wait_until(lambda: quiet(base), wait_for)
            assert [(r.body["event"], r.body["rule"]) for r in hook.received] == [
                ("firing", "model-health"), ("resolved", "model-health")]
        finally:
            if not stop_process(demo, output, signum=signal.SIGINT, timeout=180, reader=reader):
                output.append("\n(the demo did not stop within 180 s of Ctrl-C: killed)\n")
            (tmp_path / "demo.log").write_text("".join(output))
    assert demo.returncode == 0, "".join(output)[-3000:]
    assert wait_until(lambda: not swarm_processes(since=started), 30)
