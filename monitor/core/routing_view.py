"""What routing knows of each peer, from the store's records (pure): the one source of the chat's
peer weights (``chat.feedback.StoreWeights``) and of the routing view that other petals clients
read (``GET /api/v1/routing/<prefix>``, ``swarm_monitor_client``).

Per peer: its health score (the score job's), how many seconds one token takes per block on it
(the newest evidence: the median of recent chat requests' spans, or the assessment's probes when
those are newer), the operator's policy (pinned / blocked), and what the stored assessments say of
it. A server whose outputs are wrong, that fails every step or that does not answer gets score
``UNUSABLE_SCORE``, so routing leaves it out wherever others cover its blocks: the verdict is the
one the dashboard and the alerts show, nobody draws their own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional

from monitor.core.assess import flagged, round_trip_speeds
from monitor.core.assessment import CAUSE_FAILING, CAUSE_SLOW, CAUSE_UNREACHABLE, CAUSE_WRONG, Assessment
from monitor.core.common import HOUR, finite
from monitor.core.probes import CORRECT
from monitor.core.snapshot import ONLINE, ChatOutcome, ServerRow

CHAT_OUTCOME_WINDOW = HOUR  # seconds of chat outcomes routing learns from
OUTCOME_SAMPLES = 20  # a peer's speed: the median of its newest this many timed chat spans
SPEED_SHIFT = 3.0  # a peer whose newer timed spans are this many times slower than an older one has slowed down since
UNUSABLE_SCORE = 0.0  # the routing score of a server whose outputs are wrong, or that fails or does not answer
VIEW_VERSION = 1  # the routing view's "version": a client refuses a view of a version it does not know


@dataclass(frozen=True)
class PeerRouting:
    """What routing knows of one peer. ``score`` None: the score job has not scored it yet."""

    score: Optional[float] = None
    seconds_per_token_per_block: Optional[float] = None  # measured, round trip included
    policy: Optional[str] = None  # "pinned" | "blocked" (the operator's, from the peer's page)
    failing: bool = False
    wrong: bool = False
    unreachable: bool = False
    slow: bool = False
    verified: bool = False  # its newest correctness probe in the window passed (``petals.verified_only``)


def outcome_speeds(outcomes: Iterable[ChatOutcome], *, now: float, window: float = CHAT_OUTCOME_WINDOW,
                   last: int = OUTCOME_SAMPLES) -> dict[str, float]:
    """peer -> the median seconds per token per block over its newest ``last`` successful timed
    chat spans within ``window`` seconds, since it last slowed down (``current_regime``): a server
    throttled a minute ago is priced by the requests it has served since, not outvoted by the fast
    ones before."""
    speeds: dict[str, list[float]] = {}
    for outcome in sorted(outcomes, key=lambda o: o.at):
        value = outcome.seconds_per_token_per_block
        if outcome.ok and value is not None and outcome.at >= now - window:
            speeds.setdefault(outcome.peer_id, []).append(value)
    return {peer: statistics.median(current_regime(values[-last:])) for peer, values in speeds.items()}


def current_regime(values: list[float], shift: float = SPEED_SHIFT) -> list[float]:
    """The newest of ``values`` (seconds, oldest first) since the peer slowed down: back from the
    newest, up to the first one more than ``shift`` times faster than most of those after it (their
    lower median).
    The newest evidence wins, as probes newer than any chat span do (``probe_speeds``): a peer
    slowed by a lone outlier is outvoted by its next span, or by the next probe once no longer
    chosen. Only slowing down ends a regime: a fast outlier (a prefill-only span, whose tokens
    cost less each) never speaks for a peer alone."""
    regime = [values[-1]]
    for value in reversed(values[:-1]):
        if value * shift < statistics.median_low(regime):
            break
        regime.append(value)
    return regime


def probe_speeds(assessments: Mapping[str, Assessment], outcomes: Iterable[ChatOutcome]) -> dict[str, float]:
    """peer -> seconds per token per block as the assessments' probes measured it, for every peer
    whose newest timed probe is newer than its newest chat outcome (the newest kind of evidence
    wins: a server throttled since the chat last used it is known slow before a chat tries it
    again). The value is the median of its newest probes' one-token steps, round trip included, per
    block: what a chat request measures on a span."""
    last_chat: dict[str, float] = {}
    for outcome in outcomes:
        if outcome.ok and outcome.seconds_per_token is not None:
            last_chat[outcome.peer_id] = max(outcome.at, last_chat.get(outcome.peer_id, 0.0))
    return {peer: seconds for peer, (seconds, at) in round_trip_speeds(assessments).items()
            if at > last_chat.get(peer, 0.0)}


def peer_routing(*, scores: Mapping[str, float], outcomes: list[ChatOutcome], assessments: Mapping[str, Assessment],
                 policies: Mapping[str, str], now: float, window: float = CHAT_OUTCOME_WINDOW) -> dict[str, PeerRouting]:
    """peer -> ``PeerRouting``, for every peer any of the records speaks of."""
    found = {peer: PeerRouting(score=score) for peer, score in scores.items()}
    speeds = {**outcome_speeds(outcomes, now=now, window=window), **probe_speeds(assessments, outcomes)}
    for peer, seconds in speeds.items():
        found[peer] = replace(found.get(peer, PeerRouting()), seconds_per_token_per_block=seconds)
    for cause, flag in ((CAUSE_WRONG, "wrong"), (CAUSE_FAILING, "failing"), (CAUSE_UNREACHABLE, "unreachable")):
        for peer in flagged(assessments, cause):
            marked: dict[str, Any] = {flag: True}
            found[peer] = replace(found.get(peer, PeerRouting()), score=UNUSABLE_SCORE, **marked)
    for assessment in assessments.values():
        for peer, server in assessment.servers.items():
            if server.cause == CAUSE_SLOW:
                found[peer] = replace(found.get(peer, PeerRouting()), slow=True)
            if server.verdict is not None and server.verdict.verdict == CORRECT and not server.wrong:
                found[peer] = replace(found.get(peer, PeerRouting()), verified=True)
    for peer, policy in policies.items():
        found[peer] = replace(found.get(peer, PeerRouting()), policy=policy)
    return found


def _number(value: Optional[float], digits: int) -> Optional[float]:
    """``value`` to ``digits`` significant digits (None: not a finite number)."""
    value = finite(value)
    return None if value is None else float(f"{value:.{digits}g}")


def routing_view(model: str, num_blocks: int, rows: Iterable[ServerRow], routing: Mapping[str, PeerRouting],
                 assessment: Optional[Assessment]) -> dict:
    """The routing view of one model: every ONLINE server row (its span) with what routing knows of
    its peer, and when the assessment it comes from was made. JSON-ready, compact."""
    peers = []
    for row in sorted(rows, key=lambda r: (r.start, r.peer_id)):
        if row.model != model or row.state != ONLINE or not 0 <= row.start < row.end <= num_blocks:
            continue
        known = routing.get(row.peer_id, PeerRouting())
        peers.append({
            "peer_id": row.peer_id, "start": row.start, "end": row.end,
            "seconds_per_token_per_block": _number(known.seconds_per_token_per_block, 4),
            "score": _number(known.score, 3),
            "failing": known.failing, "wrong": known.wrong, "unreachable": known.unreachable, "slow": known.slow,
            "verified": known.verified,
            "blocked": known.policy == "blocked", "pinned": known.policy == "pinned",
        })
    return {
        "version": VIEW_VERSION, "model": model, "num_blocks": num_blocks,
        "assessed_at": assessment.assessed_at if assessment is not None else None,
        "poll_at": assessment.poll_at if assessment is not None else None,
        "peers": peers,
    }
