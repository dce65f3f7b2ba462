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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from monitor.core.common import DAY, MINUTE

OK, ERROR, CANCELLED = "ok", "error", "cancelled"
OUTCOMES = (OK, ERROR, CANCELLED)
APIS = ("page", "petals", "openai")  # the chat page, chat.petals.dev's API (HTTP and WebSocket), OpenAI's
SUCCESS_WINDOWS = (("5m", 5 * MINUTE), ("30m", 30 * MINUTE), ("1d", DAY))
LATENCY_WINDOWS = (("30m", 30 * MINUTE), ("1d", DAY))
PERCENTILES = (50, 90, 99)
MAX_ROWS = 50_000  # rows a figure reads at most (the newest)
MAX_HOPS = 32  # route hops kept per request


@dataclass(frozen=True)
class RequestRecord:
    """One request the chat served."""

    at: float  # when it arrived (unix seconds)
    model: str
    api: str  # APIS
    outcome: str  # OUTCOMES: a request the client left before its end is "cancelled"
    route: tuple[tuple[str, int, int], ...] = ()  # (peer id, start, end) per hop
    waited: Optional[float] = None  # seconds waiting for a slot
    time_to_first_token: Optional[float] = None  # seconds from the start of the answer (after the wait)
    tokens: int = 0
    tokens_per_second: Optional[float] = None  # decode, after the first token
    failovers: int = 0  # servers replaced mid-answer
    error_kind: Optional[str] = None  # the ChatError's kind, e.g. "busy", "not_served", "failed"

    @property
    def peers(self) -> frozenset[str]:
        return frozenset(peer for peer, _, _ in self.route)


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile by nearest rank (a value that occurred); None for no values."""
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _quantiles(values: list[float]) -> dict[str, Optional[float]]:
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
