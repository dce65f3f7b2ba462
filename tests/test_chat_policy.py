"""Specs of health-aware routing's pure weighting (``chat.policy``): a peer's penalty from its score
and what was measured of it, exploring around measured peers, leaving low peers out only while the
others cover every block, weights from recent outcomes, the routing settings. Routes through the
session swarm: ``test_chat_routing.py``.
"""

from __future__ import annotations

import pytest

from chat.policy import (
    PeerWeight,
    RoutingSettings,
    covers,
    penalty,
    peers_to_explore_around,
    peers_to_leave_out,
    weights_from_outcomes,
)
from monitor.core.snapshot import ChatOutcome


def test_penalty_is_one_for_a_healthy_peer_and_doubles_every_20_points_below_90():
    assert penalty(PeerWeight(score=100)) == penalty(PeerWeight(score=90)) == 1
    assert penalty(PeerWeight(score=70)) == pytest.approx(2)
    assert penalty(PeerWeight(score=50)) == pytest.approx(4)
    assert penalty(PeerWeight(score=10)) == pytest.approx(16)
    assert penalty(None) == penalty(PeerWeight()) == pytest.approx(4)  # unknown = neutral 50


def test_penalty_believes_what_was_measured_slower_or_faster_than_announced():
    announced = 0.01
    assert penalty(PeerWeight(score=95, seconds_per_token_per_block=0.05), announced) == pytest.approx(5)
    assert penalty(PeerWeight(score=95, seconds_per_token_per_block=0.002), announced) == pytest.approx(0.2)
    assert penalty(PeerWeight(score=70, seconds_per_token_per_block=0.03), announced) == pytest.approx(6)
    assert penalty(PeerWeight(score=95), announced) == 1  # never measured: its announcement


def test_measured_peers_are_explored_around_only_where_unmeasured_peers_serve_their_blocks():
    spans = {"C": (0, 8), "A": (0, 4), "B": (4, 8)}
    assert peers_to_explore_around(spans, 0, 8, {"C": 1.4}) == {"C"}
    assert peers_to_explore_around(spans, 0, 8, {"C": 0.7}) == {"C"}  # fast, but A and B are untried
    assert peers_to_explore_around(spans, 0, 8, {"C": 1.4, "A": 0.5}) == {"C"}  # B is still untried
    assert peers_to_explore_around(spans, 0, 8, {"C": 1.4, "A": 0.5, "B": 0.6}) == set()  # all measured
    assert peers_to_explore_around(spans, 0, 8, {}) == set()  # nothing measured: petals' own choice
    assert peers_to_explore_around({"C": (0, 8), "A": (0, 4)}, 0, 8, {"C": 9.0}) == set()  # 4:8 needs C
    # of two measured peers on the same blocks, only as many go as the others can replace
    both = {"C": (0, 8), "D": (0, 8), "A": (0, 8)}
    assert peers_to_explore_around(both, 0, 8, {"C": 3.0, "D": 2.0}) == {"C", "D"}
    assert peers_to_explore_around({"C": (0, 8), "D": (0, 8)}, 0, 8, {"C": 3.0}) == {"C"}


def test_low_peers_are_left_out_only_while_the_others_cover_every_block():
    spans = {"low-full": (0, 8), "a": (0, 4), "b": (4, 8)}
    assert peers_to_leave_out(spans, 0, 8, {"low-full": PeerWeight(10)}, 30) == {"low-full"}
    # b gone: low-full alone serves 4:8, so it stays
    assert peers_to_leave_out({"low-full": (0, 8), "a": (0, 4)}, 0, 8, {"low-full": PeerWeight(10)}, 30) == set()
    # two low peers on the same blocks: the worse one goes, the other must stay
    both_low = {"x": PeerWeight(5), "y": PeerWeight(20)}
    assert peers_to_leave_out({"x": (0, 8), "y": (0, 8)}, 0, 8, both_low, 30) == {"x"}
    # only the blocks asked for matter
    assert peers_to_leave_out({"low": (0, 8), "a": (0, 4)}, 0, 4, {"low": PeerWeight(0)}, 30) == {"low"}
    # a peer without a score is never left out
    assert peers_to_leave_out(spans, 0, 8, {}, 30) == set()


def test_covers():
    assert covers([(0, 4), (4, 8)], 0, 8)
    assert not covers([(0, 4), (5, 8)], 0, 8)
    assert covers([(0, 2)], 1, 2)


def test_weights_from_outcomes_take_the_median_speed_of_recent_successes():
    now = 1000.0

    def outcome(peer, sec, at=now - 1, ok=True, span=(0, 4)):
        return ChatOutcome(at=at, peer_id=peer, model="m", start=span[0], end=span[1], ok=ok, seconds_per_token=sec)

    weights = weights_from_outcomes(
        [outcome("a", 0.4, at=now - 3), outcome("a", 0.04, at=now - 2), outcome("a", 0.08), outcome("a", 9.0, ok=False),
         outcome("a", 100.0, at=now - 7200), outcome("b", 0.08, span=(0, 8))],
        scores={"a": 80.0, "c": 20.0}, now=now,
    )
    assert weights["a"] == PeerWeight(score=80.0, seconds_per_token_per_block=0.02)  # median 0.08 / 4 blocks
    assert weights["b"] == PeerWeight(score=50.0, seconds_per_token_per_block=0.01)
    assert weights["c"] == PeerWeight(score=20.0, seconds_per_token_per_block=None)


def test_a_peer_that_slowed_down_is_priced_by_its_spans_since():
    """The median of the newest spans would keep a server throttled a minute ago fast for as many
    requests as it had served before; its spans since it slowed down price it (a trap of the
    conversation benchmark: a kept session's server throttled mid-conversation)."""
    now = 1000.0

    def spans(*seconds):
        return [ChatOutcome(at=now - 100 + i, peer_id="a", model="m", start=0, end=1, ok=True, seconds_per_token=sec)
                for i, sec in enumerate(seconds)]

    def speed(*seconds):
        return weights_from_outcomes(spans(*seconds), now=now)["a"].seconds_per_token_per_block

    assert speed(*[0.1] * 10, 1.0) == 1.0  # one span ten times slower than ten before: slowed down
    assert speed(*[0.1] * 10, 1.0, 1.2) == pytest.approx(1.1)
    assert speed(*[0.1] * 10, 0.25) == 0.1  # 2.5 times: within the noise, the median
    assert speed(*[0.1] * 10, 1.0, 0.1) == 0.1  # a lone slow span is outvoted by the next
    assert speed(*[0.1] * 10, 0.01) == 0.1  # a fast outlier (a prefill-only span) never speaks alone


def test_routing_settings_refuse_unknown_modes():
    with pytest.raises(ValueError, match="routing mode"):
        RoutingSettings(mode="fastest")
