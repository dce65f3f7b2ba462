"""Specs of the JSON API: health.petals.dev's /api/v1/state shape field by field, is_reachable,
history with time ranges, and 4xx JSON errors for bad ids and ranges."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from monitor.core.snapshot import ReachabilityResult
from monitor.web import create_app
from support import BOOTSTRAP_ADDR, MALICIOUS_NAME, PEERS, TINY, peer, poll_rows, web_settings

# health.petals.dev's /api/v1/state, as its health.py builds it and its consumers read it
TOP_LEVEL = {"bootstrap_states", "top_contributors", "model_reports", "reachability_issues", "last_updated",
             "update_period", "update_duration"}
MODEL_REPORT = {"name", "short_name", "state", "server_rows", "num_blocks", "repository", "dht_prefix", "official",
                "limited"}
SERVER_ROW = {"short_peer_id", "peer_id", "peer_ip_info", "show_public_name", "state", "span", "adapters",
              "pings_to_me"}
SPAN = {"peer_id", "start", "end", "server_info"}
SERVER_INFO = {"state", "throughput", "start_block", "end_block", "public_name", "version", "network_rps",
               "forward_rps", "inference_rps", "adapters", "torch_dtype", "quant_type", "using_relay",
               "cache_tokens_left", "next_pings"}


def test_state_has_health_petals_dev_shape_field_by_field(client):
    response = client.get("/api/v1/state")
    assert response.status_code == 200 and response.mimetype == "application/json"
    state = json.loads(response.get_data(as_text=True))  # strict JSON: no NaN/Infinity
    assert TOP_LEVEL <= set(state)
    assert state["bootstrap_states"] == ["online"]
    assert state["top_contributors"] == {"https://example.org/full": 8, "first-half": 4, "second-half": 4}
    assert state["update_period"] == 60
    assert state["update_duration"] == pytest.approx(3.25)
    assert isinstance(state["last_updated"], float)
    assert state["reachability_issues"] == [
        {"peer_id": PEERS["unreachable"], "err": "Failed to connect in 5 sec", "kind": "server"}]

    tiny, other = state["model_reports"]
    for report in (tiny, other):
        assert MODEL_REPORT <= set(report)
    assert (tiny["dht_prefix"], tiny["num_blocks"], tiny["name"], tiny["official"]) == ("tiny-llama", 8, "Tiny Llama", True)
    assert tiny["state"] == "healthy" and other["state"] == "broken"
    assert tiny["repository"] == "https://huggingface.co/test/tiny-llama"

    rows = {row["peer_id"]: row for row in tiny["server_rows"]}
    assert [row["peer_id"] for row in tiny["server_rows"]] == sorted(rows)  # health.petals.dev sorts by peer id
    for row in rows.values():
        assert SERVER_ROW <= set(row) and SPAN <= set(row["span"]) and SERVER_INFO <= set(row["span"]["server_info"])
        assert row["short_peer_id"] == "..." + row["peer_id"][-6:]
        assert row["span"]["peer_id"] == row["peer_id"]
    full = rows[PEERS["full"]]
    assert full["state"] == "online" and full["show_public_name"] is True
    assert (full["span"]["start"], full["span"]["end"]) == (0, 8)
    info = full["span"]["server_info"]
    assert info["state"] == "online" and info["throughput"] == 100.0 and info["version"] == "2.3.0.dev0"
    assert (info["start_block"], info["end_block"]) == (0, 8)
    assert info["adapters"] == ["artek0chumak/guanaco-7b"]
    assert full["adapters"] == [{"name": "artek0chumak/guanaco-7b", "short_name": "guanaco-7b"}]
    assert full["cache_tokens_left_per_block"] == 65536 // (8 * 2)
    assert full["pings_to_me"] == {PEERS["first"]: 0.01}
    assert info["next_pings"][PEERS["first"]] == 0.015
    assert info["next_pings"][PEERS["unreachable"]] is None  # an infinite RTT: JSON null, as simplejson writes it
    assert rows[PEERS["unreachable"]]["state"] == "unreachable"
    assert rows[PEERS["unreachable"]]["span"]["server_info"]["state"] == "online"  # what it announced
    assert rows[PEERS["joining"]]["state"] == "joining"
    assert rows[PEERS["joining"]]["span"]["server_info"]["public_name"] == MALICIOUS_NAME  # data, not HTML
    assert rows[PEERS["second"]]["span"]["server_info"]["using_relay"] is True


def test_state_carries_our_additions(client):
    state = client.get("/api/v1/state").get_json()
    tiny, other = state["model_reports"]
    assert tiny["monitor_state"] == "healthy" and tiny["degraded"] is False
    assert tiny["reasons"] and tiny["coverage_pct"] == 100.0 and tiny["min_redundancy"] == 2
    assert tiny["servers_online"] == 3 and tiny["est_tokens_per_s"] > 0
    assert other["reasons"] == ["blocks 2:4 have no serving server — clients cannot run this model"]
    assert other["recommendation"]["block_indices"] == "2:4"
    assert other["recommendation"]["argument"] == "--block_indices 2:4"
    assert state["recommendations"]["other-model"] == other["recommendation"]
    assert set(state["scores"]) == {PEERS[n] for n in ("first", "second", "full", "joining", "unreachable", "other")}
    assert all(0 <= s["score"] <= 100 and s["explanation"] for s in state["scores"].values())
    assert {row["peer_id"]: row["score"] for row in tiny["server_rows"]}[PEERS["full"]] == \
        state["scores"][PEERS["full"]]["score"]
    assert state["bootstrap_peers"] == [{"peer_id": PEERS["bootstrap"], "address": BOOTSTRAP_ADDR, "state": "online",
                                         "rtt": 0.001, "error": None}]


def test_is_reachable_answers_from_the_latest_reachability_check_without_a_live_check(client):
    ok = client.get(f"/api/v1/is_reachable/{PEERS['full']}")
    assert ok.status_code == 200
    assert ok.get_json() == {"success": True, "message": None, "your_ip": "127.0.0.1"}
    bad = client.get(f"/api/v1/is_reachable/{PEERS['unreachable']}").get_json()
    assert bad == {"success": False, "message": "Failed to connect in 5 sec", "your_ip": "127.0.0.1"}
    never = client.get(f"/api/v1/is_reachable/{peer('never')}").get_json()
    assert never["success"] is False and "not announced" in never["message"]
    invalid = client.get("/api/v1/is_reachable/not-a-peer")
    assert invalid.status_code == 400 and invalid.get_json()["success"] is False


def test_is_reachable_uses_the_injected_live_check(populated):
    _, store, settings, _ = populated
    asked = []

    def check(peer_id):
        asked.append(peer_id)
        return ReachabilityResult(peer_id, "server", False, error="connection refused")

    client = create_app(settings, store, reachability_check=check).test_client()
    answer = client.get(f"/api/v1/is_reachable/{PEERS['full']}").get_json()
    assert asked == [PEERS["full"]]
    assert answer == {"success": False, "message": "connection refused", "your_ip": "127.0.0.1"}
    # answers are reused for a minute: asking again does not dial the peer again
    assert client.get(f"/api/v1/is_reachable/{PEERS['full']}").get_json() == answer and len(asked) == 1
    # a peer the latest poll did not see is never dialled (visitors cannot aim the monitor at anyone)
    stranger = client.get(f"/api/v1/is_reachable/{peer('stranger')}").get_json()
    assert stranger["success"] is False and "not announced" in stranger["message"] and len(asked) == 1


def test_model_history_in_a_time_range(client, populated):
    now = populated[3]
    everything = client.get("/api/v1/models/tiny-llama/history").get_json()  # default: the last 24 h
    assert [s["state"] for s in everything["status"]] == ["broken", "healthy", "healthy"]
    assert [(c["from_state"], c["to_state"]) for c in everything["state_changes"]] == [(None, "broken"), ("broken", "healthy")]
    assert len(everything["outages"]) == 1 and everything["outages"][0]["end"] is not None
    coverage = everything["block_coverage"]
    assert len(coverage["times"]) == 3 and len(coverage["servers"]) == 8
    assert [column[7] for column in zip(*coverage["servers"])][:2] == [0, 2]  # block 7: nobody, then two

    iso = datetime.fromtimestamp(now - 5400, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    recent = client.get(f"/api/v1/models/tiny-llama/history?since={iso}&until={now}").get_json()
    assert [s["state"] for s in recent["status"]] == ["healthy", "healthy"]
    assert recent["since"] == pytest.approx(now - 5400, abs=1)


def test_peer_history_in_a_time_range(client, populated):
    now = populated[3]
    history = client.get(f"/api/v1/peers/{PEERS['first']}/history?since={now - 10000:.0f}").get_json()
    assert [o["state"] for o in history["observations"]] == ["ONLINE"] * 3
    assert len(history["probes"]) == 3 and all(p["ok"] for p in history["probes"])
    assert [(o["ok"], o["error"]) for o in history["chat_outcomes"]] == [(False, "timeout after 30 s")]
    later = client.get(f"/api/v1/peers/{PEERS['full']}/history?since={now - 3000:.0f}&until={now:.0f}").get_json()
    assert len(later["observations"]) == 1
    current = client.get(f"/api/v1/peers/{PEERS['full']}").get_json()
    assert current["spans"][0]["state"] == "online" and current["score"]["score"] > 0


@pytest.mark.parametrize("url, status, words", [
    ("/api/v1/models/tiny-llama/history?since=yesterday", 400, "neither unix seconds nor an ISO 8601"),
    ("/api/v1/models/tiny-llama/history?since=200&until=100", 400, "must be before until"),
    ("/api/v1/models/tiny-llama/history?since=-5", 400, "non-negative"),
    ("/api/v1/models/tiny-llama/history?since=0&until=99999999999", 400, "at most"),
    ("/api/v1/models/no-such-model/history", 404, "never seen"),
    ("/api/v1/models/bad%20prefix!/history", 400, "not a DHT prefix"),
    ("/api/v1/peers/not-a-peer-id/history", 400, "not a peer id"),
    (f"/api/v1/peers/{peer('never')}/history", 404, "never seen"),
    (f"/api/v1/peers/{peer('never')}", 404, "never seen"),
    ("/api/v1/models/no-such-model", 404, "no model"),
    ("/api/v1/no-such-endpoint", 404, "not found"),
])
def test_bad_ids_and_ranges_get_4xx_json_errors_that_say_why(client, url, status, words):
    response = client.get(url)
    assert response.status_code == status
    body = response.get_json()
    assert body["status"] == status and words in body["error"], body


def test_state_before_the_first_poll_is_503_json(tmp_path):
    from monitor.store import Store

    store = Store(f"sqlite:///{tmp_path / 'empty.db'}")
    store.migrate()
    response = create_app(web_settings(), store).test_client().get("/api/v1/state")
    assert response.status_code == 503 and "no poll has completed yet" in response.get_json()["error"]
    store.close()


def test_a_database_that_is_down_gives_503_with_the_reason(tmp_path):
    from monitor.store import Store

    (tmp_path / "db").mkdir()
    store = Store(f"sqlite:///{tmp_path / 'db' / 'monitor.db'}")
    store.migrate()
    app = create_app(web_settings(), store)
    store.engine.dispose()
    (tmp_path / "db").rename(tmp_path / "elsewhere")  # the file is gone: SQLite cannot open it
    try:
        response = app.test_client().get("/api/v1/state")
        page = app.test_client().get("/")
    finally:
        (tmp_path / "elsewhere").rename(tmp_path / "db")
    assert response.status_code == 503 and "unavailable" in response.get_json()["error"]
    assert page.status_code == 503 and "Database unavailable" in page.get_data(as_text=True)
    assert app.test_client().get("/api/v1/state").status_code == 503  # back, but no poll yet: says so
    store.close()


def test_healthz_says_whether_the_database_answers_and_the_poller_keeps_up(client, populated):
    body = client.get("/healthz").get_json()
    assert body["ok"] is True and body["last_poll_ok"] is True
    assert body["poller_stale"] is False  # the last poll was 60 s ago, the scrape period is 60 s


# ---- history is bounded: within retention, at most history_max_points points a series -----------


@pytest.fixture
def long_history(tmp_path):
    """(app, now): 45 polls a minute apart (one of them broken: only the first half is served),
    each with a reachability check of the first server (every 10th failing), and history_max_points = 10."""
    from monitor.app.jobs import Poller
    from monitor.core.snapshot import ReachabilityBatch, Snapshot
    from monitor.store import Store

    settings = web_settings(data_dir=tmp_path, history_max_points=10, rollup_retention_days=3)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    poller = Poller(settings, store, dht=None)
    now = time.time()
    for i in range(45):
        at = now - (45 - i) * 60
        store.record_reachability(ReachabilityBatch(taken_at=at - 1, duration=0.1, results=(
            ReachabilityResult(PEERS["first"], "server", i % 10 != 3, rtt=0.004 if i % 10 != 3 else None,
                        error=None if i % 10 != 3 else "Failed to connect in 5 sec"),)))
        snapshot = Snapshot(taken_at=at, duration=1.0, models=(TINY,), servers=tuple(poll_rows(0 if i == 17 else 1)))
        store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))
    yield create_app(settings, store), now
    store.close()


def test_history_is_downsampled_to_history_max_points_keeping_worst_states_and_counts(long_history):
    app, now = long_history
    client = app.test_client()
    model = client.get(f"/api/v1/models/tiny-llama/history?since={now - 3600:.0f}").get_json()

    status = model["status"]
    assert len(status) <= 10 and sum(point["samples"] for point in status) == 45
    assert sum(point["states"].get("broken", 0) for point in status) == 1  # the one broken poll is not lost
    assert [point["state"] for point in status].count("broken") == 1
    assert [point["at"] for point in status] == sorted(point["at"] for point in status)
    coverage = model["block_coverage"]
    assert len(coverage["times"]) <= 10 and all(len(row) == len(coverage["times"]) for row in coverage["servers"])
    block_7 = coverage["servers"][7]  # nobody in the broken poll, two servers otherwise: minimums keep the 0
    assert block_7.count(0) == 1 and set(block_7) == {0, 2}
    assert model["limits"]["downsampled"] == {"status": 45, "block_coverage": 45}
    assert any("merged" in note for note in model["limits"]["notes"])

    peer = client.get(f"/api/v1/peers/{PEERS['first']}/history?since={now - 3600:.0f}").get_json()
    assert len(peer["observations"]) <= 10 and sum(o["samples"] for o in peer["observations"]) == 45
    probes = peer["probes"]
    assert len(probes) <= 10 and sum(p["samples"] for p in probes) == 45
    assert sum(p["samples"] - p["ok_samples"] for p in probes) == 5  # every failure is counted
    assert sum(1 for p in probes if not p["ok"]) == 5 and all(p["error"] for p in probes if not p["ok"])

    short = client.get(f"/api/v1/models/tiny-llama/history?since={now - 330:.0f}").get_json()
    assert [point["samples"] for point in short["status"]] == [1] * 5  # few points: as recorded
    assert short["limits"]["downsampled"] == {} and short["limits"]["since_requested"] is None


def test_history_before_retention_is_clamped_and_says_so(long_history):
    app, now = long_history
    client = app.test_client()
    asked = now - 10 * 86400  # retention is 3 days
    before = time.time()
    body = client.get(f"/api/v1/models/tiny-llama/history?since={asked:.0f}").get_json()
    assert before - 3 * 86400 - 1 <= body["since"] <= time.time() - 3 * 86400 + 1  # retention: 3 days
    assert body["limits"]["since_requested"] == pytest.approx(asked, abs=1)
    assert any("clamped" in note for note in body["limits"]["notes"])
    assert sum(point["samples"] for point in body["status"]) == 45  # everything kept is still there

    too_old = client.get(f"/api/v1/peers/{PEERS['first']}/history?since={asked:.0f}&until={now - 5 * 86400:.0f}")
    assert too_old.status_code == 400 and "oldest history kept" in too_old.get_json()["error"]
