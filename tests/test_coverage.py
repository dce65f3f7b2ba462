"""Specs of the per-model diagnosis: coverage, redundancy, route speed, and where to add a server.
(The recommendation against petals' own block selection on the live swarm: ``test_against_petals.py``.)"""

from __future__ import annotations

import json

import pytest

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.assessment import RouteHop
from monitor.core.coverage import (
    BROKEN,
    DEGRADED,
    HEALTHY,
    block_redundancy,
    format_ranges,
    ranges,
)
from monitor.swarm.routing import best_route, diagnose
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityResult, ServerRow

MODEL = ModelInfo("demo-model", 8)

# petals' routing constants (RemoteSequenceManager._build_inference_graph / _rtt_to_delay)
OVERHEAD, DEFAULT_DELAY = 0.018, 0.15


def row(peer: str, start: int, end: int, state: str = ONLINE, **fields) -> ServerRow:
    fields.setdefault("throughput", 100.0)
    fields.setdefault("inference_rps", 300.0)
    fields.setdefault("cache_tokens_left", 100_000)
    return ServerRow(peer_id=peer, model=MODEL.dht_prefix, start=start, end=end, state=state, **fields)


def failed(peer: str, error: str = "timed out") -> ReachabilityResult:
    return ReachabilityResult(peer_id=peer, kind="server", ok=False, error=error)


# ---- ranges ----------------------------------------------------------------------------------


def test_blocks_merge_into_end_exclusive_ranges():
    assert ranges([7, 0, 1, 2, 5, 8, 1]) == [(0, 3), (5, 6), (7, 9)]
    assert ranges([]) == []
    assert format_ranges(ranges([0, 1, 2, 5])) == "0:3, 5:6"


# ---- state -----------------------------------------------------------------------------------


def test_all_blocks_served_twice_by_online_servers_is_healthy():
    health = diagnose(MODEL, [row("peerA", 0, 8), row("peerB", 0, 4), row("peerC", 4, 8)])
    assert health.state == HEALTHY
    assert health.coverage_pct == 100.0
    assert health.servers_online == 3
    assert health.min_redundancy == 2
    assert health.missing_ranges == health.single_served_ranges == health.low_cache_ranges == ()
    assert [b.online for b in health.blocks] == [2] * 8
    assert health.est_tokens_per_s > 1.0
    assert len(health.reasons) == 1 and "at least 2" in health.reasons[0]


def test_a_missing_range_breaks_the_model_and_is_named_exactly():
    rows = [row("peerA", 0, 4), row("peerB", 0, 4), row("peerC", 6, 8), row("peerD", 6, 8)]
    health = diagnose(MODEL, rows)
    assert health.state == BROKEN
    assert health.missing_ranges == ((4, 6),)
    assert health.coverage_pct == 75.0
    assert health.min_redundancy == 0
    assert len(health.reasons) == 1
    assert "4:6" in health.reasons[0] and "0:4" not in health.reasons[0] and "6:8" not in health.reasons[0]
    assert health.est_tokens_per_s is None and health.route == ()


def test_a_block_with_a_single_server_degrades_the_model_and_names_block_and_peer():
    rows = [row("peerA", 0, 8, public_name="alpha"), row("peerB", 0, 3), row("peerC", 4, 8)]
    health = diagnose(MODEL, rows)
    assert health.state == DEGRADED
    assert health.single_served_ranges == ((3, 4),)
    assert health.min_redundancy == 1
    assert len(health.reasons) == 1
    assert "block 3:4" in health.reasons[0] and "alpha" in health.reasons[0]


def test_a_peer_without_public_name_is_named_by_its_short_id():
    health = diagnose(MODEL, [row("12D3KooWQjtmRaQ5pnVnfCWCmp", 0, 8)])
    assert "…fCWCmp" in health.reasons[0]


def test_a_server_whose_reachability_check_failed_does_not_count_as_serving():
    rows = [row("peerA", 0, 8, public_name="alpha"), row("peerB", 0, 8, public_name="beta")]
    health = diagnose(MODEL, rows, {"peerA": failed("peerA", "connection refused")})
    assert health.state == DEGRADED
    assert health.servers_online == 1
    assert health.single_served_ranges == ((0, 8),)
    assert "beta" in health.reasons[0]
    assert "connection refused" in health.excluded_peers["peerA"]
    assert [hop.peer_id for hop in health.route] == ["peerB"]

    both_down = diagnose(MODEL, rows, {"peerA": failed("peerA"), "peerB": failed("peerB")})
    assert both_down.state == BROKEN and both_down.missing_ranges == ((0, 8),)
    assert "alpha is ONLINE but unreachable" in both_down.reasons[0]


def test_a_check_that_answers_joining_or_no_check_yet_still_counts_as_reachable():
    rows = [row("peerA", 0, 8), row("peerB", 0, 8)]
    still_loading = ReachabilityResult(peer_id="peerA", kind="server", ok=False, joining=True, error="protocol not supported")
    ok = ReachabilityResult(peer_id="peerB", kind="server", ok=True, rtt=0.01)
    assert diagnose(MODEL, rows, {"peerA": still_loading, "peerB": ok}).state == HEALTHY
    assert diagnose(MODEL, rows, {"peerB": ok}).servers_online == 2


def test_joining_and_offline_servers_do_not_serve():
    rows = [row("peerA", 0, 8), row("peerB", 0, 8, state=JOINING), row("peerC", 0, 8, state=OFFLINE)]
    health = diagnose(MODEL, rows)
    assert health.state == DEGRADED
    assert health.servers_online == 1
    assert health.excluded_peers.keys() == {"peerB", "peerC"}

    only_joining = diagnose(MODEL, [row("peerB", 0, 8, state=JOINING)])
    assert only_joining.state == BROKEN
    assert "JOINING" in only_joining.reasons[0]


def test_low_cache_headroom_degrades_the_model():
    rows = [row("peerA", 0, 8, cache_tokens_left=300), row("peerB", 0, 4, cache_tokens_left=400),
            row("peerC", 4, 8, cache_tokens_left=5000)]
    health = diagnose(MODEL, rows, min_cache_tokens=1024)
    assert health.state == DEGRADED
    assert health.low_cache_ranges == ((0, 4),)
    assert [b.cache_tokens_left for b in health.blocks] == [700] * 4 + [5300] * 4
    # what one session may hold there: each server's room over its whole span (keys and values of
    # each block: 2 × blocks of what it announces), summed
    assert [b.session_room for b in health.blocks] == [300 // 16 + 400 // 8] * 4 + [300 // 16 + 5000 // 8] * 4
    assert len(health.reasons) == 1 and "0:4" in health.reasons[0] and "700" in health.reasons[0]
    assert diagnose(MODEL, rows, min_cache_tokens=500).state == HEALTHY


def test_a_slow_best_route_degrades_the_model():
    rows = [row("peerA", 0, 8, inference_rps=2.0), row("peerB", 0, 8, inference_rps=2.0)]
    health = diagnose(MODEL, rows, min_tokens_per_s=1.0)
    assert health.state == DEGRADED
    assert health.est_tokens_per_s < 0.3  # 8 blocks × 0.5 s
    assert "tokens/s" in health.reasons[0]
    assert diagnose(MODEL, rows, min_tokens_per_s=0.1).state == HEALTHY


# ---- the route -------------------------------------------------------------------------------


def test_best_route_speed_equals_the_hand_computation_for_two_servers():
    rows = [
        row("peerA", 0, 4, inference_rps=100.0, next_pings={"peerB": 0.040}),
        row("peerB", 4, 8, inference_rps=50.0),
    ]
    route, seconds = best_route(MODEL, rows)
    by_hand = (
        DEFAULT_DELAY + OVERHEAD  # client -> A (client RTT unknown)
        + 4 / 100.0  # blocks 0:4 on A
        + 0.040 / 2 + OVERHEAD  # A -> B, half of A's ping to B
        + 4 / 50.0  # blocks 4:8 on B
        + DEFAULT_DELAY  # B -> client
    )
    assert route == [RouteHop("peerA", 0, 4), RouteHop("peerB", 4, 8)]
    assert seconds == pytest.approx(by_hand, rel=1e-12)
    assert diagnose(MODEL, rows).est_tokens_per_s == pytest.approx(1 / by_hand, rel=1e-12)

    # the client's RTTs come from our reachability checks
    reachability = {"peerA": ReachabilityResult("peerA", "server", ok=True, rtt=0.010),
                    "peerB": ReachabilityResult("peerB", "server", ok=True, rtt=0.030)}
    faster = by_hand - 2 * DEFAULT_DELAY + 0.010 / 2 + 0.030 / 2
    assert diagnose(MODEL, rows, reachability).est_tokens_per_s == pytest.approx(1 / faster, rel=1e-12)


def test_best_route_skips_a_slow_server_when_a_hop_is_cheaper():
    rows = [
        row("peerA", 0, 8, inference_rps=10.0, next_pings={}),
        row("peerB", 0, 4, inference_rps=1000.0, next_pings={"peerC": 0.002}),
        row("peerC", 4, 8, inference_rps=1000.0),
    ]
    route, seconds = best_route(MODEL, rows)
    assert route == [RouteHop("peerB", 0, 4), RouteHop("peerC", 4, 8)]
    assert seconds < DEFAULT_DELAY * 2 + 8 / 10.0
    assert best_route(MODEL, rows[1:2]) == ([], float("inf"))  # 4:8 missing


def test_a_server_announcing_no_inference_speed_at_all_costs_only_itself():
    """petals divides by a server's announced inference_rps; one announcing 0 (our edge keeps it:
    non-negative) must not take the whole model's diagnosis down with it: it is priced as the
    slowest server there can be, routed around, and the model is still diagnosed."""
    rows = [
        row("peerA", 0, 8, inference_rps=0.0),
        row("peerB", 0, 4, inference_rps=100.0),
        row("peerC", 4, 8, inference_rps=100.0),
    ]
    route, seconds = best_route(MODEL, rows)
    assert [hop.peer_id for hop in route] == ["peerB", "peerC"] and seconds < 1.0
    alone, cost = best_route(MODEL, rows[:1])
    assert [hop.peer_id for hop in alone] == ["peerA"] and cost >= 8 * 1e9  # still a price, the worst
    assert diagnose(MODEL, rows).est_tokens_per_s == pytest.approx(1 / seconds)
    assert diagnose(MODEL, rows[:1]).state == DEGRADED  # slower than min_tokens_per_s, not undiagnosed


# ---- redundancy, bottlenecks, recommendation -------------------------------------------------


def test_block_redundancy_counts_online_reachable_servers_and_sums_their_throughput():
    rows = [row("peerA", 0, 8, throughput=10.0), row("peerB", 2, 5, throughput=5.0),
            row("peerC", 0, 8, state=JOINING), row("peerD", 6, 8, throughput=7.0)]
    assert block_redundancy(8, rows) == [(1, 10.0)] * 2 + [(2, 15.0)] * 3 + [(1, 10.0)] + [(2, 17.0)] * 2
    assert block_redundancy(8, rows, {"peerA": failed("peerA")})[0] == (0, 0.0)


def test_bottlenecks_are_blocks_below_half_the_median_total_throughput():
    rows = [row("peerA", 0, 8, throughput=10.0), row("peerB", 0, 6, throughput=100.0)]
    health = diagnose(MODEL, rows)
    assert health.bottleneck_ranges == ((6, 8),)  # 10 < 0.5 × median(110, …, 10, 10) = 55
    assert diagnose(MODEL, [row("peerA", 0, 8), row("peerB", 0, 8)]).bottleneck_ranges == ()


def test_the_recommendation_fills_the_weakest_range_with_the_median_span_length():
    rows = [row("peerA", 0, 8, throughput=10.0), row("peerB", 0, 4, throughput=10.0),
            row("peerC", 0, 4, throughput=10.0), row("peerD", 4, 6, throughput=10.0)]
    health = diagnose(MODEL, rows)
    # median span length is 4; blocks 4:6 have 20, blocks 6:8 only 10: the weakest 4-block window is 4:8
    assert health.recommendation.num_blocks == 4
    assert health.recommendation.argument == "--block_indices 4:8"
    assert diagnose(MODEL, rows, recommend_blocks=2).recommendation.argument == "--block_indices 6:8"
    assert diagnose(MODEL, [], recommend_blocks=None).recommendation.argument == "--block_indices 0:8"


def test_the_health_is_json_ready():
    health = diagnose(MODEL, [row("peerA", 0, 8), row("peerB", 0, 3, state=JOINING)], {"peerA": failed("peerA")})
    data = json.loads(json.dumps(health.to_dict()))
    assert data["state"] == BROKEN
    assert data["missing_ranges"] == [[0, 8]]
    assert data["recommendation"]["argument"].startswith("--block_indices ")


def test_rows_of_other_models_are_ignored():
    other = ServerRow(peer_id="peerZ", model="other", start=0, end=8, state=ONLINE, throughput=1.0)
    assert diagnose(MODEL, [row("peerA", 0, 8), other]).servers_online == 1
