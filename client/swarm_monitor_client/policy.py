"""The routing policy, as pure functions on plain data: how much a peer's blocks cost, which
peers a route leaves out, and when it explores peers never measured. Standard library only: the
monitor's chat and ``route_with`` (``swarm_monitor_client.routing``) both route by it.

petals routes an inference session with Dijkstra over a graph whose compute edges cost the seconds
per block a server *announces*. A server that announces well but answers slowly (or keeps
failing) is still chosen. The policy here rescales each peer's compute edges by ``penalty`` (its
health score and the seconds per token measured on it) and leaves out peers below ``min_score``
while the others still cover every block.

Measurements only exist for peers that were used or probed, and petals' estimates cannot tell a
fast alternative from a slow one: it prices every block at the server's announcement (or a
default 3.3 ms) and every extra hop at a fixed 18 ms plus pings, which for small blocks outweighs a
slow server's measured time even when the alternative is several times faster. So while peers
never measured could serve the blocks of measured ones, the monitor's chat leaves the measured ones
out of one route in ``EXPLORE_EVERY`` (``peers_to_explore_around``); ``route_with`` never
explores (``RoutingSettings.explore``): it routes by what the monitor measured only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

PETALS_DEFAULT_SECONDS_PER_BLOCK = 1 / 300  # petals' default_inference_rps, for servers that announce none

NEUTRAL_SCORE = 50.0  # what monitor.core.scores gives a peer it knows nothing about
GOOD_SCORE = 90.0  # at or above: no health penalty
DOUBLING_POINTS = 20.0  # every this many points below GOOD_SCORE doubles the penalty
EXPLORE_EVERY = 4  # one route in this many tries peers never measured, while there are any

Spans = Mapping[str, tuple[int, int]]  # peer id -> the [start, end) blocks it serves


@dataclass(frozen=True)
class PeerWeight:
    """What routing knows about a peer: its health score (0–100) and, if measured, how many
    seconds one generated token took per block on it."""

    score: float = NEUTRAL_SCORE
    seconds_per_token_per_block: Optional[float] = None
    policy: Optional[str] = None  # "pinned" or "blocked", set by an operator from the peer's page
    verified: bool = False  # its newest correctness probe passed (a request's ``verified_only``)


ScoreSource = Callable[[], Mapping[str, PeerWeight]]  # peer id -> weight, asked at every route


@dataclass(frozen=True)
class RoutingSettings:
    """``mode`` "health" weighs peers by score; "default" routes like petals, but for two petals
    2.2 bugs fixed in both modes: a peer that just failed is not retried while others cover its
    blocks, and the first block's servers are pinged. Pinned peers (if any) are the only ones
    used; blocked peers are never used (in both modes). ``explore``: one route in
    ``EXPLORE_EVERY`` tries peers never measured (the chat's; ``route_with`` does not)."""

    mode: str = "health"
    min_score: float = 30.0
    pinned: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    explore: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("health", "default"):
            raise ValueError(f"routing mode must be 'health' or 'default', got {self.mode!r}")
        if not 0 <= self.min_score <= 100:
            raise ValueError(f"min_score must be between 0 and 100, got {self.min_score!r}")

    @classmethod
    def from_settings(cls, settings: Any) -> "RoutingSettings":
        """From the monitor's settings (``routing``, ``min_peer_score``, ``pinned_peers``,
        ``blocked_peers``)."""
        return cls(
            mode=settings.routing,
            min_score=settings.min_peer_score,
            pinned=tuple(settings.pinned_peers),
            blocked=tuple(settings.blocked_peers),
        )


# ---- what a peer's blocks cost ----------------------------------------------------------------


def measured_speed(weight: Optional[PeerWeight], announced_seconds_per_block: float) -> Optional[float]:
    """How many times slower than it announces we measured the peer (< 1: faster); None if we
    never measured it."""
    measured = weight.seconds_per_token_per_block if weight is not None else None
    if measured is None or measured <= 0 or announced_seconds_per_block <= 0:
        return None
    return measured / announced_seconds_per_block


def penalty(weight: Optional[PeerWeight], announced_seconds_per_block: float = PETALS_DEFAULT_SECONDS_PER_BLOCK) -> float:
    """Factor by which a peer's compute edges (seconds per block) are multiplied.

    - Health: 1 for a score of ``GOOD_SCORE`` or more, doubling every ``DOUBLING_POINTS`` below it
      (70 → 2, 50 → 4, 30 → 8, 10 → 16). An unknown peer counts as ``NEUTRAL_SCORE``.
    - Speed: once we measured the peer, its edges cost what we measured (factor measured /
      announced), faster or slower than announced; a peer never measured keeps its announcement.

    Only differences between peers matter (see ``relative_penalties``): with equal weights
    routing is exactly petals' own.
    """
    weight = weight or PeerWeight()
    score = min(100.0, max(0.0, float(weight.score)))
    health = 2.0 ** (max(0.0, GOOD_SCORE - score) / DOUBLING_POINTS)
    speed = measured_speed(weight, announced_seconds_per_block)
    return health * (speed if speed is not None else 1.0)


def relative_penalties(announced: Mapping[str, float], weights: Mapping[str, PeerWeight]) -> dict[str, float]:
    """peer id -> its ``penalty`` divided by the smallest among these peers (``announced``: peer
    id -> the seconds per block it announces)."""
    factors = {peer: penalty(weights.get(peer), seconds) for peer, seconds in announced.items()}
    smallest = min(factors.values(), default=1.0)
    return {peer: factor / smallest for peer, factor in factors.items()}


# ---- which peers a route leaves out -----------------------------------------------------------


def covers(spans: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Do these [start, end) spans together cover every block in [start, end)?"""
    covered: set[int] = set()
    for span_start, span_end in spans:
        covered.update(range(max(span_start, start), min(span_end, end)))
    return len(covered) == end - start


def peers_to_leave_out(spans: Spans, start: int, end: int, weights: Mapping[str, PeerWeight],
                       min_score: float) -> set[str]:
    """Peers (by id) scoring below ``min_score`` that routing may skip: the worst first, each
    only while the remaining peers still cover every block of [start, end). A peer without a
    score is never left out. Never leaves the route without a server for some block."""
    low = sorted(
        (peer for peer in spans if peer in weights and weights[peer].score < min_score),
        key=lambda peer: (weights[peer].score, peer),
    )
    left_out: set[str] = set()
    for peer in low:
        rest = [span for other, span in spans.items() if other not in left_out and other != peer]
        if covers(rest, start, end):
            left_out.add(peer)
    return left_out


def peers_to_explore_around(spans: Spans, start: int, end: int, speeds: Mapping[str, Optional[float]]) -> set[str]:
    """Measured peers (``speeds``: measured / announced; None or absent: never measured) that
    one route may skip so that peers never measured get tried on their blocks: the slowest
    first, each only while the others still cover [start, end) and some unmeasured peer serves
    one of its blocks."""
    measured = sorted((peer for peer in spans if speeds.get(peer) is not None),
                      key=lambda peer: (-speeds[peer], peer))
    unmeasured = [span for peer, span in spans.items() if speeds.get(peer) is None]
    skipped: set[str] = set()
    for peer in measured:
        peer_start, peer_end = max(spans[peer][0], start), min(spans[peer][1], end)
        tried_instead = any(s < peer_end and e > peer_start for s, e in unmeasured)
        rest = [span for other, span in spans.items() if other not in skipped and other != peer]
        if tried_instead and covers(rest, start, end):
            skipped.add(peer)
    return skipped


class Explorer:
    """Decides which routes explore: the first route that can, then none of the next
    ``every - 1`` routes (one sequence manager's routes, counted whether they could or not)."""

    def __init__(self, every: int = EXPLORE_EVERY):
        self.every = every
        self._since = every  # the first chance to explore is taken

    def around(self, spans: Spans, start: int, end: int, speeds: Mapping[str, Optional[float]], *,
               preview: bool = False) -> set[str]:
        """The measured peers this route skips (``peers_to_explore_around``), or none; a ``preview``
        (a route only shown, e.g. in a forecast) says the same and counts as no route."""
        names = peers_to_explore_around(spans, start, end, speeds)
        if not names or self._since < self.every - 1:
            self._since += 0 if preview else 1
            return set()
        if not preview:
            self._since = 0
        return names
