"""Spec: statistics from real requests (``core/requests.py``, ``store/requests.py``, the chat's
``RequestLog`` and ``StoreRequests``, ``GET /api/v1/models/<prefix>/stats``, the model page).

Every request the chat serves leaves one row without text: answered, failed, refused (but for the
client's own mistakes) or left by its client. The figures are the exact percentiles of the stored
rows, by nearest rank, over fixed windows. (On the session swarm, real answers through the chat's
engine and the OpenAI and chat.petals.dev APIs leave their rows: ``test_chat_requests.py``.)
"""

from __future__ import annotations

import math
import time

import pytest

from chat.engine import ChatEngine
from monitor.core.assessment import RouteHop
from monitor.core.requests import (CANCELLED, ERROR, FIRST_TOKEN_BUCKETS, OK, RequestRecord, hour_figures, percentile,
                                   stats, stats_by_server)
from monitor.settings import ModelConfig
from monitor.web import create_app
from support import PEERS, TINY, poll_rows, sqlite_store, web_settings

A, B = PEERS["first"], PEERS["second"]


def test_percentiles_are_exact_by_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [3.0, 5.0, 5.0, 5.0]
    assert percentile(list(range(1, 101)), 90) == 90 and percentile(list(range(1, 101)), 99) == 99
    assert percentile([], 50) is None and percentile([float("nan"), 2.0], 50) == 2.0


def rows_at(now: float) -> list[RequestRecord]:
    through_a = (RouteHop(A, 0, 4), RouteHop(B, 4, 8))
    return [
        RequestRecord(at=now - 60, model="m", api="openai", outcome=OK, route=through_a, time_to_first_token=0.2,
                      tokens=10, tokens_per_second=20.0, waited=0.0),
        RequestRecord(at=now - 120, model="m", api="page", outcome=OK, route=(RouteHop(B, 0, 8),), time_to_first_token=0.4,
                      tokens=10, tokens_per_second=10.0, waited=1.0),
        RequestRecord(at=now - 600, model="m", api="petals", outcome=ERROR, error_kind="failed", route=through_a),
        RequestRecord(at=now - 30, model="m", api="openai", outcome=CANCELLED, route=through_a, tokens=3),
        RequestRecord(at=now - 7200, model="m", api="openai", outcome=OK, route=through_a, time_to_first_token=3.0,
                      tokens=5, tokens_per_second=1.0),
    ]


def test_success_over_5_min_30_min_and_a_day_and_latency_over_30_min_and_a_day():
    now = 1_000_000.0
    found = stats(rows_at(now), now=now)
    assert found["success"]["5m"] == {"requests": 2, "ok": 2, "rate": 1.0}  # the cancelled one is not judged
    assert found["success"]["30m"] == {"requests": 3, "ok": 2, "rate": pytest.approx(2 / 3)}
    assert found["success"]["1d"]["requests"] == 4
    assert found["latency"]["30m"]["tokens_per_second"] == {"p50": 10.0, "p90": 20.0, "p99": 20.0}
    assert found["latency"]["1d"]["time_to_first_token"]["p50"] == 0.4 and found["latency"]["1d"]["requests"] == 3
    by_server = stats_by_server(rows_at(now), now=now)
    assert set(by_server) == {A, B}
    assert by_server[A]["success"]["30m"] == {"requests": 2, "ok": 1, "rate": 0.5}
    assert by_server[B]["latency"]["30m"]["requests"] == 2


@pytest.fixture
def store(tmp_path):
    store = sqlite_store(tmp_path)
    yield store
    store.close()


def test_rows_keep_no_text_and_one_bad_row_costs_only_itself(store):
    now = time.time()
    bad = [RequestRecord(at=now, model="m", api="smtp", outcome=OK),
           RequestRecord(at=now, model="m", api="openai", outcome="maybe"),
           RequestRecord(at=float("nan"), model="m", api="openai", outcome=OK),
           RequestRecord(at=now, model="m", api="openai", outcome=OK, time_to_first_token=-1.0)]
    assert store.record_requests(rows_at(now) + bad) == len(bad)
    back = store.requests_since(now - 86400, model="m")
    assert len(back) == 5 and back == sorted(back, key=lambda r: r.at)  # within a day, oldest first
    assert {r.api for r in back} == {"openai", "page", "petals"}
    assert back[-1].route == (RouteHop(A, 0, 4), RouteHop(B, 4, 8))
    from monitor.store.schema import RequestRow

    assert not set(RequestRow.__table__.c.keys()) & {"prompt", "text", "answer", "messages", "inputs"}


def test_the_api_and_the_model_page_show_the_exact_percentiles_of_the_stored_rows(store):
    settings = web_settings()
    from monitor.app import assessing
    from monitor.core.snapshot import Snapshot

    now = time.time()
    snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=now))
    records = [RequestRecord(at=now - i * 10, model=TINY.dht_prefix, api="openai", outcome=OK, route=(RouteHop(A, 0, 8),),
                             time_to_first_token=0.01 * (i + 1), tokens=8, tokens_per_second=float(100 - i))
               for i in range(37)]
    store.record_requests(records)
    client = create_app(settings, store).test_client()
    body = client.get(f"/api/v1/models/{TINY.dht_prefix}/stats").get_json()
    ttfts = sorted(r.time_to_first_token for r in records)
    for q in (50, 90, 99):
        exact = ttfts[math.ceil(q / 100 * len(ttfts)) - 1]
        assert body["latency"]["30m"]["time_to_first_token"][f"p{q}"] == pytest.approx(exact)
    assert body["success"]["5m"]["requests"] == 30 and body["success"]["1d"]["rate"] == 1.0
    assert body["servers"][A]["latency"]["1d"]["requests"] == 37
    assert client.get("/api/v1/models/no-such-model/stats").status_code == 404
    page = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    assert "Real requests" in page and "37 requests in the last 24 h" in page
    metrics = client.get("/metrics").get_data(as_text=True)
    p90 = ttfts[math.ceil(0.9 * len(ttfts)) - 1]
    line = f'swarm_monitor_request_first_token_seconds{{model="{TINY.dht_prefix}",quantile="0.9",window="30m"}}'
    assert any(l.startswith(line) and float(l.split()[-1]) == pytest.approx(p90) for l in metrics.splitlines()), line
    assert f'swarm_monitor_requests_success_ratio{{model="{TINY.dht_prefix}",window="1d"}} 1.0' in metrics
    # the server its requests went through: its own figures, by its hop rows, on its page and in the API
    through = client.get(f"/api/v1/peers/{A}/stats").get_json()
    assert through["rows"] == 37 and through["latency"]["30m"] == body["latency"]["30m"]
    assert client.get(f"/api/v1/peers/{B}/stats").get_json()["rows"] == 0
    peer_page = client.get(f"/peers/{A}").get_data(as_text=True)
    assert "Real requests through this server" in peer_page and "37 requests in the last 24 h" in peer_page


def test_rows_are_rolled_up_per_hour_and_the_hours_outlive_the_raw_rows(store):
    """Kept like the other raw data: every completed hour becomes a row per model with its counts,
    its exact percentiles and histogram bins; after the raw retention the hours are read from the
    rollup with the figures the raw rows had, and the model page charts them."""
    from monitor.app import assessing
    from monitor.core.snapshot import Snapshot

    settings = web_settings()
    now = time.time()
    hour = math.floor(now / 3600) * 3600
    records = [RequestRecord(at=hour - 3 * 3600 + 60 * i, model=TINY.dht_prefix, api="openai",
                             outcome=(OK, OK, OK, ERROR, CANCELLED)[i % 5], route=(RouteHop(A, 0, 8),), tokens=4,
                             time_to_first_token=0.05 * (i + 1), tokens_per_second=float(10 + i), failovers=i % 2)
               for i in range(40)]  # 40 minutes of the hour three hours ago
    records += [RequestRecord(at=hour - 3600 + 30, model=TINY.dht_prefix, api="page", outcome=OK,
                              time_to_first_token=2.0, tokens_per_second=5.0)]
    assert store.record_requests(records) == 0
    snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=now))
    raw = store.request_hours(TINY.dht_prefix, now - 7 * 86400, now)
    assert [r["hour"] for r in raw] == [hour - 3 * 3600, hour - 3600]
    assert raw[0] == {"hour": hour - 3 * 3600, **hour_figures(records[:40])}
    ok = [r for r in records[:40] if r.outcome == OK]
    assert raw[0]["ok"] == len(ok) == 24 and raw[0]["error"] == 8 and raw[0]["cancelled"] == 8
    assert raw[0]["quantiles"]["time_to_first_token"]["p90"] == percentile([r.time_to_first_token for r in ok], 90)
    assert sum(raw[0]["bins"]["time_to_first_token"]) == 24
    assert raw[0]["bins"]["time_to_first_token"][FIRST_TOKEN_BUCKETS.index(0.5) + 1] == sum(
        1 for r in ok if 0.5 < r.time_to_first_token <= 1.0)
    # the rollup, then the raw rows before the last hour pruned (a raw retention of one hour)
    store.rollup_and_prune(now, raw_retention_days=1 / 24, rollup_retention_days=90)
    assert store.requests_since(now - 86400, model=TINY.dht_prefix) == records[40:]
    assert store.request_hours(TINY.dht_prefix, now - 7 * 86400, now) == raw  # the same figures, from the rollup
    page = create_app(settings, store).test_client().get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    assert "requests per hour over the last 7 days" in page and "1 request in the last 24 h" in page
    # and the rollup is pruned with the others
    store.rollup_and_prune(now + 120 * 86400, raw_retention_days=1 / 24, rollup_retention_days=90)
    assert store.request_hours(TINY.dht_prefix, now - 7 * 86400, now) == []


# ---- the forecast -----------------------------------------------------------------------------


def test_the_forecast_carries_what_the_assessment_recommends_for_a_new_server():
    """What the chat page says would help a slow model: the stored assessment's recommendation."""
    from monitor.core.assessment import Assessment, Recommendation
    from monitor.core.forecast import inputs

    assessment = Assessment(model="llama", state="degraded", reasons=("blocks 4:8 have one server",),
                            coverage_pct=100.0, servers_online=2, min_redundancy=1, blocks=(), missing_ranges=(),
                            single_served_ranges=(), bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=2.0,
                            route=(), recommendation=Recommendation(4, 8, 4, "--block_indices 4:8", "blocks 4:8 have one server"))
    known = inputs("llama", [], assessment, now=time.time())
    assert known.recommendation == "--block_indices 4:8" and known.recommendation_reason == "blocks 4:8 have one server"
    engine = ChatEngine(None, [ModelConfig(dht_prefix="llama", repository="https://huggingface.co/org/llama-x")],
                        forecast_source=lambda: {"llama": known})
    assert engine.admission.recommendation("llama") == ("--block_indices 4:8", "blocks 4:8 have one server")
    assert engine.models.repository("llama") == "org/llama-x"
    assert ChatEngine(None, [ModelConfig(dht_prefix="other")]).admission.recommendation("other") is None
