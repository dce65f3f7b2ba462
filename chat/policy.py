"""The chat's routing policy: ``swarm_monitor_client.policy`` (one implementation, shared with the
routing that other petals clients get from ``route_with``), re-exported here, with the monitor's
``RouteHop`` (one hop of a route, the chat's answers' too), plus what only the chat has: the peer
weights it learns from its own requests.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Optional

from swarm_monitor_client.policy import (
    DOUBLING_POINTS,
    EXPLORE_EVERY,
    GOOD_SCORE,
    NEUTRAL_SCORE,
    PETALS_DEFAULT_SECONDS_PER_BLOCK,
    Explorer,
    PeerWeight,
    RoutingSettings,
    ScoreSource,
    Spans,
    covers,
    measured_speed,
    peers_to_explore_around,
    peers_to_leave_out,
    penalty,
    relative_penalties,
)

from monitor.core.assessment import RouteHop
from monitor.core.routing_view import CHAT_OUTCOME_WINDOW, OUTCOME_SAMPLES, outcome_speeds
from monitor.core.snapshot import ChatOutcome

OutcomeSink = Callable[[ChatOutcome], None]  # told how each peer of each answer did

__all__ = [
    "DOUBLING_POINTS", "EXPLORE_EVERY", "GOOD_SCORE", "NEUTRAL_SCORE", "PETALS_DEFAULT_SECONDS_PER_BLOCK",
    "Explorer", "OutcomeSink", "PeerWeight", "RouteHop", "RoutingSettings", "ScoreSource", "Spans", "covers",
    "measured_speed", "peers_to_explore_around", "peers_to_leave_out", "penalty", "relative_penalties",
    "weights_from_outcomes",
]


def weights_from_outcomes(
    outcomes: Iterable[ChatOutcome],
    *,
    scores: Optional[Mapping[str, float]] = None,
    now: Optional[float] = None,
    window: float = CHAT_OUTCOME_WINDOW,
    last: int = OUTCOME_SAMPLES,
) -> dict[str, PeerWeight]:
    """PeerWeights from recent chat outcomes (``outcome_speeds``); the score from ``scores`` (e.g.
    monitor.core.scores) or neutral."""
    now = time.time() if now is None else now
    speeds = outcome_speeds(outcomes, now=now, window=window, last=last)
    scores = scores or {}
    return {peer: PeerWeight(score=scores.get(peer, NEUTRAL_SCORE), seconds_per_token_per_block=speeds.get(peer))
            for peer in set(speeds) | set(scores)}
