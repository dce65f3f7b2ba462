"""Specs of health-aware routing through the session swarm (the pure weighting: ``test_chat_policy.py``).

The session swarm serves the tiny Llama with first-half 0:4, second-half 4:8 and full 0:8. petals'
own routing prefers full (one hop); a low score must steer routes away from a peer whenever
other peers cover its blocks, and never leave a block without a server.
"""

from __future__ import annotations

import dijkstar
import pytest

from chat.engine import ChatEngine, Finished, GenerationParams
from chat.policy import EXPLORE_EVERY, PETALS_DEFAULT_SECONDS_PER_BLOCK, PeerWeight, RoutingSettings
from monitor.settings import ModelConfig
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from petals.client.routing.sequence_manager import RemoteSequenceManager


# ---- routes through the session swarm ------------------------------------------------------------


@pytest.fixture(scope="module")
def scores():
    """peer id -> PeerWeight, read by the engine at every route (tests set it)."""
    return {}


@pytest.fixture(scope="module")
def outcomes():
    return []


@pytest.fixture(scope="module")
def engine(swarm, tiny_model, scores, outcomes):
    return ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                      score_source=lambda: scores, outcome_sink=outcomes.append,
                      routing=RoutingSettings(mode="health", min_score=30))


def route_of(engine, n=4) -> list[tuple[str, int, int]]:
    ids = engine.encode(TINY_DHT_PREFIX, "Hello, world!")
    with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=n)) as answer:
        finished = [e for e in answer if isinstance(e, Finished)]
    return [(hop.peer_id, hop.start, hop.end) for hop in finished[0].route]


def _peer_id(base58: str):
    from hivemind import PeerID

    return PeerID.from_base58(base58)


def named_peer(swarm, peer) -> str:
    """The harness's name of a peer (base58 or PeerID)."""
    return {swarm.peer_id(n): n for n in ("first-half", "second-half", "full")}[str(peer)]


def named(swarm, route):
    return [(named_peer(swarm, peer), start, end) for peer, start, end in route]


def test_without_scores_routing_is_petals_own_graph_and_shortest_path(engine, swarm, scores):
    """No scores: every edge costs what petals makes it cost, and the route is petals' shortest
    path through its own graph: full's one hop on a quiet machine (on a loaded one the pings petals
    measured may make the two hops shorter; petals would take them too)."""
    scores.clear()
    route = named(swarm, route_of(engine))
    manager = engine.sequence_manager(TINY_DHT_PREFIX)
    ours = manager._build_inference_graph(0, 8, cache_tokens_needed=None)
    petals = RemoteSequenceManager._build_inference_graph(manager, 0, 8, cache_tokens_needed=None)
    assert ours.get_data() == petals.get_data()
    hops = [peer for peer, _ in dijkstar.find_path(petals, "start", "end").nodes[1:-1]]
    assert [peer for peer, _, _ in route] == [named_peer(swarm, peer) for peer in dict.fromkeys(hops)]
    assert route[0][1] == 0 and route[-1][2] == 8 and all(a[2] == b[1] for a, b in zip(route, route[1:]))


def test_a_low_score_peer_is_avoided_when_others_cover_its_blocks(engine, swarm, scores):
    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=10)
    for _ in range(2):
        assert named(swarm, route_of(engine)) == [("first-half", 0, 4), ("second-half", 4, 8)]


def test_a_lower_but_acceptable_score_is_weighed_not_excluded(engine, swarm, scores):
    """Above min_score a peer stays in petals' graph; only its compute edges cost more."""
    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=40)  # above min_score 30: penalty 2^2.5
    scores[swarm.peer_id("first-half")] = PeerWeight(score=95)
    scores[swarm.peer_id("second-half")] = PeerWeight(score=95)
    manager = engine.sequence_manager(TINY_DHT_PREFIX)
    ours = manager._build_inference_graph(0, 8, cache_tokens_needed=None)
    petals = RemoteSequenceManager._build_inference_graph(manager, 0, 8, cache_tokens_needed=None)
    full, half = _peer_id(swarm.peer_id("full")), _peer_id(swarm.peer_id("first-half"))
    for block in range(8):
        edge = ((full, block), (full, block + 1))
        assert ours.get_edge(*edge) == pytest.approx(petals.get_edge(*edge) * 2 ** 2.5)
    for block in range(4):
        edge = ((half, block), (half, block + 1))
        assert ours.get_edge(*edge) == pytest.approx(petals.get_edge(*edge))
    assert ours.get_edge("start", (full, 0)) == petals.get_edge("start", (full, 0))


def test_a_peer_measured_far_slower_than_it_announces_loses_the_route(engine, swarm, scores):
    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=95, seconds_per_token_per_block=0.5)  # 4 s per token
    assert named(swarm, route_of(engine)) == [("first-half", 0, 4), ("second-half", 4, 8)]


def test_a_measured_peer_is_routed_around_now_and_then_until_the_alternatives_are_measured(swarm, tiny_model):
    """full measured 1.3× slower than announced still looks cheaper than the extra hop of
    first-half → second-half; so that they get measured at all, one route in EXPLORE_EVERY
    (the first chance among them) goes around it. (The weights here never learn.)"""
    announced = PETALS_DEFAULT_SECONDS_PER_BLOCK  # the test servers announce no inference_rps
    weights = {swarm.peer_id("full"): PeerWeight(score=95, seconds_per_token_per_block=1.3 * announced),
               swarm.peer_id("first-half"): PeerWeight(score=95), swarm.peer_id("second-half"): PeerWeight(score=95)}
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        score_source=lambda: weights, routing=RoutingSettings(mode="health"))
    routes = [named(swarm, route_of(engine, n=2)) for _ in range(EXPLORE_EVERY + 1)]
    halves = [("first-half", 0, 4), ("second-half", 4, 8)]
    assert routes == [halves] + [[("full", 0, 8)]] * (EXPLORE_EVERY - 1) + [halves]


def test_a_low_peer_is_still_used_where_it_alone_serves_a_block(swarm, tiny_model):
    weights = {swarm.peer_id("first-half"): PeerWeight(score=5)}
    only_halves = ChatEngine(  # full is blocked: first-half alone serves blocks 0:4
        swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], score_source=lambda: weights,
        routing=RoutingSettings(min_score=30, blocked=(swarm.peer_id("full"),)),
    )
    assert only_halves.admission.status(TINY_DHT_PREFIX).served
    assert named(swarm, route_of(only_halves)) == [("first-half", 0, 4), ("second-half", 4, 8)]


def test_every_peer_below_min_score_still_gives_a_route(engine, swarm, scores):
    scores.clear()
    for name in ("first-half", "second-half", "full"):
        scores[swarm.peer_id(name)] = PeerWeight(score=1)
    route = route_of(engine)
    assert route[0][1] == 0 and route[-1][2] == 8


def test_default_mode_ignores_scores(swarm, tiny_model):
    weights = {swarm.peer_id("full"): PeerWeight(score=0)}
    plain = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                       score_source=lambda: weights, routing=RoutingSettings(mode="default"))
    assert named(swarm, route_of(plain)) == [("full", 0, 8)]


def test_each_answer_reports_every_peer_of_its_route_with_seconds_per_token(engine, swarm, scores, outcomes):
    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=10)
    outcomes.clear()
    route = route_of(engine, n=6)
    reported = [(o.peer_id, o.start, o.end) for o in outcomes]
    assert sorted(reported) == sorted(route)
    for outcome in outcomes:
        assert outcome.ok and outcome.model == TINY_DHT_PREFIX
        assert 0 < outcome.seconds_per_token < 5
        assert outcome.seconds_per_token_per_block == pytest.approx(outcome.seconds_per_token / 4)


def test_forward_pass_routes_leave_out_low_peers_too(engine, swarm, scores):
    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=10)
    manager = engine.sequence_manager(TINY_DHT_PREFIX)
    routes = {tuple((span.peer_id.to_base58(), span.start, span.end) for span in
                    manager.make_sequence(0, 8, mode="max_throughput")) for _ in range(20)}
    assert {tuple(named(swarm, route)) for route in routes} == {(("first-half", 0, 4), ("second-half", 4, 8))}


def test_peers_pinned_or_blocked_by_an_operator_apply_at_the_next_refresh(engine, swarm, scores):
    scores.clear()
    manager = engine.sequence_manager(TINY_DHT_PREFIX)
    scores[swarm.peer_id("full")] = PeerWeight(policy="blocked")
    manager.update(wait=True)
    assert named(swarm, route_of(engine)) == [("first-half", 0, 4), ("second-half", 4, 8)]

    scores.clear()
    scores[swarm.peer_id("full")] = PeerWeight(score=1, policy="pinned")  # only this one, even scored low
    manager.update(wait=True)
    assert named(swarm, route_of(engine)) == [("full", 0, 8)]

    scores.clear()
    manager.update(wait=True)
    assert named(swarm, route_of(engine)) == [("full", 0, 8)]


def test_every_server_of_the_first_block_is_pinged_at_each_refresh(swarm, tiny_model):
    """petals 2.2 drops the first block's servers from its ping sample (a route through an
    unpinged one starts at a 150 ms "unknown" hop); ours pings them. Fresh clients, so that
    petals' random middle sample misses first-half in most of them."""
    for _ in range(3):
        engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)])
        manager = engine.sequence_manager(TINY_DHT_PREFIX)
        assert manager.missing_blocks(refresh=True) == []  # starts its refresh thread, refreshes once
        pinged = {peer.to_base58() for peer in manager.ping_aggregator.to_dict()}
        engine.close()
        assert {swarm.peer_id("first-half"), swarm.peer_id("full")} <= pinged
