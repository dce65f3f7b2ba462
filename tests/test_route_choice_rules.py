"""Spec: a request's own routing choices decided without a swarm (``monitor.core.route_choice``,
``chat.server_load``): every bad value refused naming its field, choices that narrow what the
operator allows and never widen it, the best route and what the swarm offers when a choice is
unmet, the load of requests in flight and directed requests bounded per server, a server's refusal
of a long session learned as its limit. Every choice honoured on the session swarm:
``test_route_choice.py``.
"""

from __future__ import annotations

import pytest

from chat.server_load import ServerLoad, cache_factor
from monitor.core.route_choice import (
    MAX_PEERS, ChoiceError, RouteChoice, allowed, missing, parse_choice, unmet,
)
from support import PEERS

A, B, C = PEERS["first"], PEERS["second"], PEERS["full"]
SPANS = {A: (0, 4), B: (4, 8), C: (0, 8)}


@pytest.mark.parametrize("value, field", [
    ({"sort": "fastest"}, "petals.sort"),
    ({"only": "QmNotAList"}, "petals.only"),
    ({"only": ["not a peer id!"]}, "petals.only"),
    ({"ignore": ["Qm" + "x" * 44] * (MAX_PEERS + 1)}, "petals.ignore"),
    ({"min_tokens_per_s": -1}, "petals.min_tokens_per_s"),
    ({"min_tokens_per_s": True}, "petals.min_tokens_per_s"),
    ({"max_time_to_first_token": 0}, "petals.max_time_to_first_token"),
    ({"verified_only": "yes"}, "petals.verified_only"),
    ({"allow_fallbacks": 1}, "petals.allow_fallbacks"),
    ({"speed": "max"}, "petals.speed"),
    ({"only": [A], "ignore": [A]}, "petals.ignore"),
    ("fast", "petals"),
])
def test_every_bad_value_is_refused_naming_its_field(value, field):
    with pytest.raises(ChoiceError) as e:
        parse_choice(value)
    assert e.value.field == field and field in str(e.value)


def test_choices_narrow_what_the_operator_allows_never_widen_it():
    choice = parse_choice({"only": [A, B, A], "sort": "speed", "min_tokens_per_s": 5, "verified_only": False})
    assert choice.only == (A, B) and choice.directed and not choice.empty
    assert parse_choice(None).empty and parse_choice({}).empty
    assert parse_choice(None, field="", fields={"type": "open_inference_session", "only": [C]}).only == (C,)
    assert allowed(choice, SPANS) == {A, B}
    assert allowed(choice, SPANS, blocked=[B]) == {A}  # the operator's block holds
    assert allowed(RouteChoice(ignore=(C,)), SPANS, pinned=[A, C]) == {A}  # and its pins
    assert allowed(RouteChoice(verified_only=True), SPANS, verified=[C]) == {C}
    assert missing(SPANS, 8, {A}) == [4, 5, 6, 7]


def chat_view(seconds: dict, announced: dict) -> list:
    """The chat's view of SPANS as petals' sequence manager holds it (``RemoteSpanInfo``)."""
    from hivemind import PeerID
    from petals.data_structures import RemoteSpanInfo, ServerInfo, ServerState

    return [RemoteSpanInfo(peer_id=PeerID.from_base58(peer), start=start, end=end,
                           server_info=ServerInfo(state=ServerState.ONLINE, throughput=1.0,
                                                  inference_rps=announced.get(peer)))
            for peer, (start, end) in SPANS.items()]


def test_the_best_route_and_what_the_swarm_offers_when_a_choice_is_unmet():
    """The chat prices the routes a choice allows with the assessment's one route estimator
    (``coverage.route_speed``, by petals' own routing): measured speeds in full, a route costs its
    measured seconds per block times its blocks (no pings known: no round trips added)."""
    from chat.admission import route_pricer, server_rows
    from chat.policy import PeerWeight
    from monitor.core.snapshot import ModelInfo
    from monitor.swarm.routing import route_speed

    seconds = {A: 0.01, B: 0.01, C: 0.05}
    weights = {peer: PeerWeight(seconds_per_token_per_block=value) for peer, value in seconds.items()}
    priced = route_pricer("m", 8, chat_view(seconds, {}), weights=weights, client_rtts={}, cache_tokens_needed=None)
    assert priced(frozenset(SPANS)) == pytest.approx(8 * 0.01)  # through A then B, as petals would route
    assert priced(frozenset({C})) == pytest.approx(8 * 0.05) and priced(frozenset({A})) is None
    same = route_speed(ModelInfo("m", 8), server_rows("m", chat_view(seconds, {})), measured=seconds)
    assert [hop.peer_id for hop in same.route] == [A, B] and same.source == "measured"  # the assessment's
    # not measured: priced as announced by petals' routing (its costs per hop included), and still a price
    announced = route_pricer("m", 8, chat_view({}, {A: 100.0, B: 100.0, C: 20.0}), weights={}, client_rtts={},
                             cache_tokens_needed=None)
    assert announced(frozenset({A, B})) > 8 / 100.0 and announced(frozenset({C})) > 8 / 20.0

    gap = unmet(RouteChoice(only=(A,)), spans=SPANS, num_blocks=8, route_seconds=priced, allowed_peers={A},
                all_peers=SPANS, time_to_first_token=None)
    assert gap.field == "petals.only" and "blocks 4:8" in gap.message
    slow = unmet(RouteChoice(only=(C,), min_tokens_per_s=5), spans=SPANS, num_blocks=8, route_seconds=priced,
                 allowed_peers={C}, all_peers=SPANS, time_to_first_token=None)
    assert slow.field == "petals.min_tokens_per_s" and "2.5 tokens/s" in slow.message  # 1 / (8 × 0.05)
    late = unmet(RouteChoice(only=(C,), max_time_to_first_token=1.0), spans=SPANS, num_blocks=8,
                 route_seconds=priced, allowed_peers={C}, all_peers=SPANS, time_to_first_token=0.3, wait=0.2)
    assert late.field == "petals.max_time_to_first_token" and "1.7 s" in late.message  # 0.2 + 0.3 × 0.4 / 0.08
    assert unmet(RouteChoice(max_time_to_first_token=1.0), spans=SPANS, num_blocks=8, route_seconds=priced,
                 allowed_peers=SPANS, all_peers=SPANS, time_to_first_token=0.3, wait=0.2) is None
    unknown = unmet(RouteChoice(only=(C,), min_tokens_per_s=5), spans=SPANS, num_blocks=8,
                    route_seconds=lambda peers: None, allowed_peers={C}, all_peers=SPANS, time_to_first_token=None)
    assert unknown is None  # the estimator cannot say: the request tries


def test_hostile_announcements_cost_the_chat_s_route_price_only_their_own_servers():
    """What the chat prices comes from peers' announcements as petals parsed them: a speed of 0,
    absurd speeds and pings, made-up peers in ``next_pings``, no cache at all, and pings of its own
    client that are out of range. Every price stays a number or "not known", never an error, and an
    honest route is still priced."""
    from hivemind import PeerID
    from petals.data_structures import RemoteSpanInfo, ServerInfo, ServerState

    from chat.admission import route_pricer
    from chat.policy import PeerWeight

    infos = {A: ServerInfo(state=ServerState.ONLINE, throughput=0.0, inference_rps=0.0,
                           next_pings={"not a peer": float("inf"), B: 1e300}),
             B: ServerInfo(state=ServerState.ONLINE, throughput=1e300, inference_rps=1e300, next_pings={A: 1e300}),
             C: ServerInfo(state=ServerState.ONLINE, throughput=1.0, inference_rps=50.0, cache_tokens_left=0)}
    view = [RemoteSpanInfo(peer_id=PeerID.from_base58(peer), start=start, end=end, server_info=infos[peer])
            for peer, (start, end) in SPANS.items()]
    for weights in ({}, {A: PeerWeight(seconds_per_token_per_block=1e300), B: PeerWeight(seconds_per_token_per_block=1e-300)}):
        for rtts in ({}, {A: 1e300, C: 0.0}):
            priced = route_pricer("m", 8, view, weights=weights, client_rtts=rtts, cache_tokens_needed=None)
            for peers in (frozenset(SPANS), frozenset({A, B}), frozenset({C})):
                value = priced(peers)
                assert value is not None and 0 < value < float("inf"), (weights, rtts, peers, value)
            assert priced(frozenset({A})) is None  # blocks 4:8 unserved
            assert priced(frozenset({C})) >= 8 / 50.0  # its 8 blocks at its announced 50 per second, hops beside


def test_the_load_of_requests_in_flight_makes_a_server_cost_more_and_directed_ones_are_bounded():
    load = ServerLoad(directed_limit=2)
    load.enter([A, B])
    load.enter([A], directed=True)
    assert load.in_flight() == {A: 2, B: 1}
    factors = load.factors({A: None, B: None, C: None}, 100)
    assert factors == {A: 3.0, B: 2.0, C: 1.0}
    assert not load.directed_full([A])
    load.enter([A], directed=True)
    assert load.directed_full([A]) and not load.directed_full([A, C])
    load.leave([A], directed=True)
    load.leave([A], directed=True)
    load.leave([A, B])
    assert load.in_flight() == {} and not load.directed_full([A])
    assert cache_factor(None, 100) == 1.0 and cache_factor(400, 100) == 1.0
    assert cache_factor(100, 100) == pytest.approx(1.75) and cache_factor(0, 100) == 2.0


# ---- the longest session each server accepts -------------------------------------------------------


def test_a_server_s_refusal_of_a_long_session_is_learned_as_its_limit():
    from chat.server_load import ServerLimits, refused_length

    assert refused_length(RuntimeError("rpc_inference failed: ValueError('Cannot allocate KV cache for 80 tokens, "
                                       "max = 48')")) == 48
    assert refused_length(RuntimeError("Broken input cache")) is None
    limits = ServerLimits()
    assert limits.longest(SPANS, 8) is None  # nobody refused: the servers' own limits
    limits.learn(C, 48)
    assert limits.longest(SPANS, 8) is None  # the halves never refused
    limits.learn(A, 1024)
    assert limits.longest(SPANS, 8) == 1024  # A+B (B never refused): A bounds that route
    limits.learn(B, 512)
    assert limits.longest(SPANS, 8) == 512 and limits.too_short(SPANS, 100) == {C}
