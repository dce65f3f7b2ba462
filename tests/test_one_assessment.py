"""Spec: one stored assessment per model and poll, and every reader reads it (README: Assessment).

At the edge of the probe window a verdict drawn again from the raw probes at the reader's own
``now`` would differ from the stored one: a failing server whose failed probes have just aged out
of the window. The model page, the state API, /metrics, the alerts' view and the chat's routing
weights all say what the stored assessment says — failing until the poller assesses the poll
again, then not failing, together; /metrics and the alerts say alike whether the model's state
rests on confirmed verdicts, and a poller that just took over says what the leader says. Through a real store (SQLite), the real web app, the alert
job's reader, the chat's StoreWeights and the routing view other petals clients read.
"""

from __future__ import annotations

import re
import time

import pytest

from chat.feedback import UNUSABLE_SCORE, StoreWeights, store_assessment_check
from monitor.app import assessing
from monitor.app.alerter import WatchedPeers, read_view
from monitor.core.assessment import CAUSE_FAILING, CAUSE_SERVING, Assessment
from monitor.core.probes import SERVER_ERROR, ServerProbe, failing_servers, recent_window
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.web import create_app
from support import PEERS, TINY, poll_rows, sqlite_store, web_settings

PERIOD = 1.0  # speed_probe_period: a window of MAX_AGE_PERIODS seconds
OOM = "CUDA out of memory: tried to allocate 2.00 GiB"


@pytest.fixture
def store(tmp_path):
    store = sqlite_store(tmp_path)
    yield store
    store.close()


def failing_report(client) -> list[str]:
    report = next(r for r in client.get("/api/v1/state").get_json()["model_reports"] if r["dht_prefix"] == TINY.dht_prefix)
    return [reason for reason in report["reasons"] if "ONLINE but failing" in reason]


def readers_say_failing(store, settings, client) -> dict[str, bool]:
    """What each reader says of the full server: failing or not."""
    full = PEERS["full"]
    page = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    shown = dict(re.findall(r'data-peer-id="([^"]+)" data-state="[^"]*" data-cause="([^"]+)"', page))
    metrics = client.get("/metrics").get_data(as_text=True)
    view = read_view(store, settings, watching_since=0.0, now=time.time())
    taken_over = read_view(store, settings, watching_since=time.time(), now=time.time(), watched=WatchedPeers())
    weights = StoreWeights(store, period=3600).refresh()
    behind = [(cause.peer, cause.why, cause.confirmed) for view_ in (view, taken_over)
              for cause in next(m for m in view_.models if m.dht_prefix == TINY.dht_prefix).troubled]
    return {
        "state API": bool(failing_report(client)),
        "model page": shown.get(full) == "failing",
        "/metrics": bool(re.search(r"^swarm_monitor_servers_failing 1\.0$", metrics, re.M)),
        # the model's state rests on a confirmed verdict (told at once): /metrics and the alerts alike
        "/metrics confirmed": bool(re.search(rf'^swarm_monitor_model_confirmed{{model="{TINY.dht_prefix}"}} 1\.0$',
                                             metrics, re.M)),
        "alerts": next(p for p in view.peers if p.peer_id == full).failing is not None,
        "alerts confirmed": next(m for m in view.models if m.dht_prefix == TINY.dht_prefix).confirmed,
        # a poller that just took over (nothing of its own in memory) says what the leader says
        "alerts after a take-over": behind == [(full, CAUSE_FAILING, True)] * 2
        and next(m for m in taken_over.models if m.dht_prefix == TINY.dht_prefix).confirmed,
        "chat": full in weights and weights[full].score == UNUSABLE_SCORE,
        "routing view": any(entry["peer_id"] == full and entry["failing"] and entry["score"] == UNUSABLE_SCORE
                            for entry in client.get(f"/api/v1/routing/{TINY.dht_prefix}").get_json()["peers"]),
    }


def test_every_reader_says_what_the_stored_assessment_says_at_the_edge_of_the_probe_window(store):
    settings = web_settings(speed_probe_period=PERIOD)
    window = recent_window(PERIOD)
    now = time.time()
    store.record_reachability(ReachabilityBatch(taken_at=now - 1, duration=0.1, results=tuple(
        ReachabilityResult(PEERS[name], "server", True, rtt=0.004) for name in ("first", "second", "full"))))
    failed = [ServerProbe(PEERS["full"], TINY.dht_prefix, 0, 8, at=now - window + 0.6 + i * 0.1, ok=False, error=OOM,
                          error_kind=SERVER_ERROR) for i in range(2)]
    store.record_server_probes(failed)
    snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, store.latest_reachability(), now=now))
    stored: Assessment = store.latest_assessments()[TINY.dht_prefix]
    assert stored.servers[PEERS["full"]].cause == CAUSE_FAILING and stored.assessed_at == now
    assert stored.poll_at == snapshot.taken_at

    client = create_app(settings, store).test_client()
    assert all(readers_say_failing(store, settings, client).values())

    # past the window's edge: drawn again from the raw probes now, the verdict would be gone...
    while time.time() < now + 1.0:
        time.sleep(0.05)
    assert failing_servers(store.recent_server_probes(0), now=time.time(), max_age=window) == {}
    # ...but nobody draws it again: every reader still says what was stored, together
    said = readers_say_failing(store, settings, client)
    assert all(said.values()), said
    assert store_assessment_check(store)(TINY.dht_prefix) == (True, "")  # still served twice: not refused

    # the poller assesses the poll again (a later input): every reader follows at once
    assert assessing.assess_latest(store, settings)
    again = store.latest_assessments()[TINY.dht_prefix]
    assert again.servers[PEERS["full"]].cause == CAUSE_SERVING and again.poll_at == snapshot.taken_at
    said = readers_say_failing(store, settings, client)
    assert not any(said.values()), said


def test_a_poll_keeps_its_assessments_and_readers_take_the_newest_poll(store):
    settings = web_settings(speed_probe_period=PERIOD)
    now = time.time()
    for i, at in enumerate((now - 120, now - 60)):
        snapshot = Snapshot(taken_at=at, duration=0.5, models=(TINY,), servers=tuple(poll_rows(i)))
        store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=at))
    newest = store.latest_assessments()[TINY.dht_prefix]
    assert newest.poll_at == now - 60 and newest.state != "broken"  # poll 1 covers every block
    with store.db.read("counting") as conn:
        rows = conn.exec_driver_sql("SELECT poll_id, model FROM assessments ORDER BY poll_id").all()
    assert len(rows) == 2  # one per poll and model: the older poll's is kept, not overwritten
    # a later input of an older poll does not replace the newest poll's assessment
    older = Snapshot(taken_at=now - 120, duration=0.5, models=(TINY,), servers=tuple(poll_rows(0)))
    assert not store.record_assessments(assessing.assess_poll(store, settings, older, {}), taken_at=older.taken_at)
    assert store.latest_assessments()[TINY.dht_prefix].poll_at == now - 60
