"""Spec: the routing view (``GET /api/v1/routing/<prefix>``) and the client that reads it.

The view says, per ONLINE server of a model, its span, the measured seconds per token per block,
its score and what the stored assessment says of it (failing, wrong, slow, unreachable), and the
operator's pin or block; it comes with an ETag (304 when unchanged), to any origin, without login,
and stays small at 500 servers. ``swarm_monitor_client`` refuses a view it cannot trust — too
large, too slow, malformed, out of range — whole, with one warning, and keeps no weights from it
(petals' own routing). Real web app and store; the hostile views come from a real HTTP server on
127.0.0.1.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time

import pytest

from monitor.app import assessing
from monitor.core.assessment import CAUSE_FAILING
from monitor.core.probes import SERVER_ERROR, ServerProbe
from monitor.core.routing_view import UNUSABLE_SCORE, PeerRouting, routing_view
from monitor.core.snapshot import ONLINE, ChatOutcome, ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.web import create_app
from support import PEERS, TINY, poll_rows, sqlite_store, wait_until, web_settings
from swarm_monitor_client.policy import NEUTRAL_SCORE
from swarm_monitor_client.view import MAX_BYTES, MonitorView, ViewError, parse_view

OOM = "CUDA out of memory: tried to allocate 2.00 GiB"
MAX_VIEW_BYTES_AT_500 = 256 * 1024


@pytest.fixture
def store(tmp_path):
    store = sqlite_store(tmp_path)
    yield store
    store.close()


def polled(store, settings, now):
    """A poll of the three tiny-model servers; the full one fails every probe, the first has a
    chat-measured speed, the second is blocked by the operator."""
    store.record_reachability(ReachabilityBatch(taken_at=now - 1, duration=0.1, results=tuple(
        ReachabilityResult(PEERS[name], "server", True, rtt=0.004) for name in ("first", "second", "full"))))
    store.record_server_probes([ServerProbe(PEERS["full"], TINY.dht_prefix, 0, 8, at=now - 5 + i, ok=False, error=OOM,
                                            error_kind=SERVER_ERROR) for i in range(2)])
    store.record_chat_outcome(ChatOutcome(at=now - 2, peer_id=PEERS["first"], model=TINY.dht_prefix, start=0, end=4,
                                          ok=True, seconds_per_token=0.02))
    store.set_peer_policy(PEERS["second"], "blocked")
    snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, store.latest_reachability(), now=now))
    return snapshot


def test_the_view_says_what_routing_knows_of_each_serving_peer_with_an_etag_to_any_origin(store):
    settings = web_settings()
    now = time.time()
    snapshot = polled(store, settings, now)
    assert store.latest_assessments()[TINY.dht_prefix].servers[PEERS["full"]].cause == CAUSE_FAILING
    client = create_app(settings, store).test_client()

    response = client.get(f"/api/v1/routing/{TINY.dht_prefix}", headers={"Origin": "https://elsewhere.example"})
    assert response.status_code == 200 and response.mimetype == "application/json"
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in response.headers
    view = response.get_json()
    assert view["version"] == 1 and view["model"] == TINY.dht_prefix and view["num_blocks"] == TINY.num_blocks
    assert view["poll_at"] == snapshot.taken_at and view["assessed_at"] == pytest.approx(now)
    online = {row.peer_id: (row.start, row.end) for row in snapshot.servers
              if row.state == ONLINE and row.model == TINY.dht_prefix}
    by_peer = {entry["peer_id"]: entry for entry in view["peers"]}
    assert {peer: (e["start"], e["end"]) for peer, e in by_peer.items()} == online  # every ONLINE span, nothing else
    full, first, second = by_peer[PEERS["full"]], by_peer[PEERS["first"]], by_peer[PEERS["second"]]
    assert full["failing"] and full["score"] == UNUSABLE_SCORE and not full["wrong"]
    assert first["seconds_per_token_per_block"] == pytest.approx(0.02 / 4) and not first["failing"]
    assert second["blocked"] and not second["pinned"]

    # what the client makes of it: the failing server unusable, the measured speed, the block
    weights = parse_view(response.get_data(), TINY.dht_prefix)
    assert weights[PEERS["full"]].score == 0.0 and weights[PEERS["second"]].policy == "blocked"
    assert weights[PEERS["first"]].seconds_per_token_per_block == pytest.approx(0.005)
    assert weights[PEERS["first"]].score == NEUTRAL_SCORE  # not scored yet: neutral, as the chat takes it

    again = client.get(f"/api/v1/routing/{TINY.dht_prefix}", headers={"If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304 and not again.get_data()

    missing = client.get("/api/v1/routing/no-such-model")
    assert missing.status_code == 404 and TINY.dht_prefix in missing.get_json()["error"]


def test_the_view_is_refused_before_the_first_poll(store):
    response = create_app(web_settings(), store).test_client().get(f"/api/v1/routing/{TINY.dht_prefix}")
    assert response.status_code == 503 and "no poll" in response.get_json()["error"]


def test_the_view_of_500_servers_stays_within_256_kb():
    model = ModelInfo("big-model", 80)
    rows = [ServerRow(f"Qm{i:044d}".replace("0", "A"), model.dht_prefix, (i * 7) % 70, (i * 7) % 70 + 10, ONLINE)
            for i in range(500)]
    known = {row.peer_id: PeerRouting(score=87.123456, seconds_per_token_per_block=0.0123456789, failing=i % 50 == 0,
                                      slow=i % 7 == 0, policy="pinned" if i % 100 == 0 else None)
             for i, row in enumerate(rows)}
    body = json.dumps(routing_view(model.dht_prefix, model.num_blocks, rows, known, None), separators=(",", ":"))
    assert len(json.loads(body)["peers"]) == 500
    assert len(body.encode()) <= MAX_VIEW_BYTES_AT_500, len(body)


# ---- the client refuses what it cannot trust ----------------------------------------------------

GOOD_PEER = "QmZDFkEVapz2ebJq8iTbQESb2zMRnEJo46AosoPWPqMi4T"


def view_of(peers, **top) -> bytes:
    return json.dumps({"version": 1, "model": "m", "num_blocks": 8, "peers": peers, **top}).encode()


def entry(**fields) -> dict:
    return {"peer_id": GOOD_PEER, "start": 0, "end": 8, "score": 90.0, "seconds_per_token_per_block": 0.01, **fields}


@pytest.mark.parametrize("body, why", [
    (b"<html>not json</html>", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (view_of([entry()], version=2), "version"),
    (view_of([entry()], model="other"), "not of"),
    (view_of({"a": 1}), "peers must be a list"),
    (view_of([entry(peer_id="../../etc")]), "not a peer id"),
    (view_of([entry(score=1e308 * 10)]).replace(b"Infinity", b"1e999"), "score out of range"),
    (view_of([entry(score=-5)]), "score out of range"),
    (view_of([entry(score=101)]), "score out of range"),
    (view_of([entry(seconds_per_token_per_block=-0.01)]), "out of range"),
    (view_of([entry(seconds_per_token_per_block=0)]), "out of range"),
    (view_of([entry(seconds_per_token_per_block="fast")]), "out of range"),
    (view_of([entry(failing="yes")]), "flag"),
    (b" " * (MAX_BYTES + 1), "larger than"),
])
def test_a_view_out_of_its_bounds_is_refused_whole(body, why):
    with pytest.raises(ViewError, match=why):
        parse_view(body, "m")


def test_a_valid_view_of_unknown_peers_gives_their_weights_and_nothing_else():
    other = "QmPqMrsCfecZUBcQibhvRc1oMvTT6DWnZLSQLMh3GXKJgp"
    weights = parse_view(view_of([entry(), entry(peer_id=other, score=None, seconds_per_token_per_block=None,
                                                 wrong=True)]), "m")
    assert set(weights) == {GOOD_PEER, other}
    assert weights[other].score == 0.0 and weights[other].seconds_per_token_per_block is None
    assert weights[GOOD_PEER].score == 90.0


class Hostile(http.server.BaseHTTPRequestHandler):
    """Answers as ``self.server.mode`` says."""

    def do_GET(self):  # noqa: N802
        mode = self.server.mode
        self.server.hits += 1
        if mode == "trickle":  # headers, then a byte every 0.5 s
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(40):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.5)
            return
        body = {"huge": b"[" + b"1," * (MAX_BYTES // 2 + 10) + b"1]", "garbage": b"\x00\xffnot json",
                "nan": view_of([entry()]).replace(b"90.0", b"NaN"), "good": view_of([entry()]),
                "error": b"{}"}[mode]
        self.send_response(500 if mode == "error" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    server.mode, server.hits = "good", 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode", ["huge", "garbage", "nan", "error", "trickle"])
def test_a_hostile_monitor_is_refused_within_the_bound_with_one_warning(hostile, mode, caplog):
    hostile.mode = mode
    view = MonitorView(f"http://127.0.0.1:{hostile.server_address[1]}", "m", period=0.2, timeout=2.0)
    with caplog.at_level(logging.WARNING, logger="swarm_monitor_client"):
        started = time.monotonic()
        view.start(wait=2.0)
        waited = time.monotonic() - started
        assert waited <= 2.5  # route_with's first wait: never longer than its bound
        assert view.first.wait(5.0)  # the first fetch ended, refused (the trickle cut off at the timeout)
        wait_until(lambda: view.failures >= 2, 10, step=0.1)  # refused again at the next fetch
        view.close()
    assert view() == {}  # nothing from it: petals' own routing
    warnings = [r for r in caplog.records if r.name == "swarm_monitor_client" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_a_monitor_that_goes_away_leaves_the_last_good_view_a_while_then_petals_routing(hostile, caplog):
    clock = [0.0]
    view = MonitorView(f"http://127.0.0.1:{hostile.server_address[1]}", "m", period=3600, timeout=2.0,
                       stale_after=60, clock=lambda: clock[0])
    assert view.refresh() and GOOD_PEER in view()
    hostile.mode = "error"
    with caplog.at_level(logging.WARNING, logger="swarm_monitor_client"):
        assert not view.refresh() and not view.refresh()
    assert GOOD_PEER in view()  # the last good view, while fresh enough
    clock[0] = 61.0
    assert view() == {}  # too old: petals' own routing
    hostile.mode = "good"
    assert view.refresh() and GOOD_PEER in view()
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1
