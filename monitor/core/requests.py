"""Statistics from real requests (pure): what each chat request got, and the figures per model and
per server over fixed windows — what OpenRouter shows per provider, from our own traffic.

A **request row** (``RequestRecord``) is written by the chat for every request it serves (the chat
page, chat.petals.dev's API and WebSocket turns, the OpenAI API; generation checks are the
monitor's, not users', and are not counted): its model, route, the time it waited for a slot, its
time to first token, tokens, decode tokens/s, how often it failed over, its outcome and error kind,
and which API. No prompt and no answer text.

Figures: the success rate over ``SUCCESS_WINDOWS`` (5 min, 30 min, 1 day) and time to first token,
decode tokens/s and slot wait at ``PERCENTILES`` (p50, p90, p99) over ``LATENCY_WINDOWS`` (30 min,
1 day) — exact, by nearest rank, over the stored rows (at most ``MAX_ROWS`` of the newest). A
request counts for a server when its route went through it.

Kept like the other raw data: rows ``raw_retention_days``, then an hourly rollup per model
(``hour_figures``: counts, that hour's exact percentiles, and histogram bins over
``FIRST_TOKEN_BUCKETS`` / ``SPEED_BUCKETS``, the buckets /metrics counts in too) for the rollup
retention.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from monitor.core.assessment import RouteHop
from monitor.core.calibration import Given
from monitor.core.common import DAY, MINUTE

OK, ERROR, CANCELLED = "ok", "error", "cancelled"
OUTCOMES = (OK, ERROR, CANCELLED)
APIS = ("page", "petals", "openai")  # the chat page, chat.petals.dev's API (HTTP and WebSocket), OpenAI's
SUCCESS_WINDOWS = (("5m", 5 * MINUTE), ("30m", 30 * MINUTE), ("1d", DAY))
LATENCY_WINDOWS = (("30m", 30 * MINUTE), ("1d", DAY))
PERCENTILES = (50, 90, 99)
MAX_ROWS = 50_000  # rows a figure reads at most (the newest)
MAX_HOPS = 32  # route hops kept per request
FIRST_TOKEN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds (histogram upper bounds)
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)  # decode tokens per second


@dataclass(frozen=True)
class RequestRecord:
    """One request the chat served."""

    at: float  # when it arrived (unix seconds)
    model: str
    api: str  # APIS
    outcome: str  # OUTCOMES: a request the client left before its end is "cancelled"
    route: tuple[RouteHop, ...] = ()  # its hops (peer, blocks; no measurements)
    waited: Optional[float] = None  # seconds waiting for a slot
    time_to_first_token: Optional[float] = None  # seconds from the start of the answer (after the wait)
    tokens: int = 0
    tokens_per_second: Optional[float] = None  # decode, after the first token
    failovers: int = 0  # servers replaced mid-answer
    error_kind: Optional[str] = None  # the ChatError's kind, e.g. "busy", "not_served", "failed"
    follow_up: bool = False  # it came with the handle of the answer it follows (a kept session's)
    continued: bool = False  # it continued that kept session: only its new tokens went through the swarm
    tokens_not_resent: int = 0  # tokens of its prompt the kept session already held
    forecast: Optional[Given] = None  # the forecast it was given at admission (``core/calibration.py``)

    @property
    def peers(self) -> frozenset[str]:
        return frozenset(peer for peer, _, _ in self.route)


def percentile(values: Sequence[Optional[float]], q: float) -> Optional[float]:
    """The ``q``-th percentile by nearest rank (a value that occurred); None for no values."""
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _quantiles(values: Sequence[Optional[float]]) -> dict[str, Optional[float]]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def stats(records: Iterable[RequestRecord], *, now: float, peer: Optional[str] = None) -> dict:
    """The figures over the windows, of every request given (of those through ``peer``, if given)."""
    rows = [r for r in records if peer is None or peer in r.peers]
    success = {}
    for name, seconds in SUCCESS_WINDOWS:
        judged = [r for r in rows if r.at >= now - seconds and r.outcome != CANCELLED]
        ok = sum(r.outcome == OK for r in judged)
        success[name] = {"requests": len(judged), "ok": ok, "rate": ok / len(judged) if judged else None}
    latency = {}
    for name, seconds in LATENCY_WINDOWS:
        done = [r for r in rows if r.at >= now - seconds and r.outcome == OK]
        latency[name] = {
            "requests": len(done),
            "time_to_first_token": _quantiles([r.time_to_first_token for r in done]),
            "tokens_per_second": _quantiles([r.tokens_per_second for r in done]),
            "waited": _quantiles([r.waited for r in done]),
            "failovers": sum(r.failovers for r in done),
            # follow-ups (they came with their previous answer's handle) and those that continued its
            # kept session (chat.kept): the hit rate, and the prompt tokens the swarm was spared
            "follow_ups": sum(r.follow_up for r in done),
            "continued": sum(r.continued for r in done),
            "tokens_not_resent": sum(r.tokens_not_resent for r in done),
        }
    return {"success": success, "latency": latency}


def stats_by_server(records: Iterable[RequestRecord], *, now: float, limit: int = 1000) -> dict[str, dict]:
    """peer -> ``stats`` of the requests through it, for the ``limit`` peers with the most requests."""
    through: dict[str, list[RequestRecord]] = {}
    for record in records:
        for peer in record.peers:
            through.setdefault(peer, []).append(record)
    busiest = sorted(through, key=lambda peer: (-len(through[peer]), peer))[:limit]
    return {peer: stats(through[peer], now=now) for peer in sorted(busiest)}


def bins(values: Iterable[Optional[float]], bounds: Sequence[float]) -> list[int]:
    """How many finite values fall at or below each bound (and above the last: the final count),
    one count per bucket (not cumulative)."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        if value is not None and math.isfinite(value):
            counts[bisect.bisect_left(bounds, value)] += 1
    return counts


def hour_figures(records: Sequence[RequestRecord]) -> dict:
    """What an hour's rollup keeps of its requests (of one model): counts by outcome, failovers and
    tokens; the exact p50/p90/p99 of the answered ones' time to first token, decode tokens/s and
    slot wait; and their histogram bins (``bins``)."""
    done = [r for r in records if r.outcome == OK]
    quantiles = {name: _quantiles([getattr(r, name) for r in done])
                 for name in ("time_to_first_token", "tokens_per_second", "waited")}
    return {"requests": len(records), "ok": len(done), "error": sum(r.outcome == ERROR for r in records),
            "cancelled": sum(r.outcome == CANCELLED for r in records), "failovers": sum(r.failovers for r in done),
            "tokens": sum(r.tokens for r in records), "quantiles": quantiles,
            "bins": {"time_to_first_token": bins((r.time_to_first_token for r in done), FIRST_TOKEN_BUCKETS),
                     "tokens_per_second": bins((r.tokens_per_second for r in done), SPEED_BUCKETS)}}
