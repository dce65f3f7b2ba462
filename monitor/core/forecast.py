"""A forecast for a request before it starts (pure): how long it would wait for a slot, its time to
first token, its decode speed, its total time for the tokens it asks for, and whether the model's
servers have cache room for its length.

From what real requests got (``core/requests.py``: the medians of the model's answered requests over
``WINDOW``, when there are at least ``MIN_REQUESTS`` of them), else from the one stored assessment
(the speed probes' estimate of the model's route); the wait from the chat's own queue now.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from monitor.core.assessment import Assessment
from monitor.core.common import MINUTE
from monitor.core.requests import OK, RequestRecord, percentile

WINDOW = 30 * MINUTE
MIN_REQUESTS = 5  # answered requests in the window the figures rest on, at least; else the probes'
REQUESTS, PROBES, NONE = "requests", "probes", "none"


@dataclass(frozen=True)
class ForecastInputs:
    """What a forecast of one model rests on, read from the store once in a while."""

    model: str
    requests: int = 0  # answered requests in the window
    time_to_first_token: Optional[float] = None  # their median
    tokens_per_second: Optional[float] = None  # their median
    est_tokens_per_s: Optional[float] = None  # the assessment's estimate (probes)
    cache_tokens_left: Optional[int] = None  # the least, over the model's blocks, of what its servers announce
    recommendation: Optional[str] = None  # what a new server should serve, e.g. "--block_indices 4:8"
    recommendation_reason: Optional[str] = None


@dataclass(frozen=True)
class Forecast:
    wait: float  # seconds until a slot
    time_to_first_token: Optional[float]
    tokens_per_second: Optional[float]
    total: Optional[float]  # wait + first token + the rest of max_tokens at tokens_per_second
    cache_room: Optional[bool]  # None: the servers announce no cache figures
    source: str  # REQUESTS | PROBES | NONE: what the speed figures come from
    based_on: int  # answered requests behind them (REQUESTS)

    def to_dict(self) -> dict:
        return {key: (float(f"{value:.4g}") if isinstance(value, float) else value) for key, value in asdict(self).items()}


def inputs(model: str, records: Iterable[RequestRecord], assessment: Optional[Assessment], *,
           now: float) -> ForecastInputs:
    done = [r for r in records if r.model == model and r.outcome == OK and r.at >= now - WINDOW]
    cache = [b.cache_tokens_left for b in (assessment.blocks if assessment else ()) if b.cache_tokens_left is not None]
    return ForecastInputs(
        model=model, requests=len(done),
        time_to_first_token=percentile([r.time_to_first_token for r in done], 50),
        tokens_per_second=percentile([r.tokens_per_second for r in done], 50),
        est_tokens_per_s=assessment.est_tokens_per_s if assessment else None,
        cache_tokens_left=min(cache) if cache else None,
        recommendation=assessment.recommendation.argument if assessment and assessment.recommendation else None,
        recommendation_reason=assessment.recommendation.reason if assessment and assessment.recommendation else None)


def forecast(known: ForecastInputs, *, wait: float, prompt_tokens: int, max_tokens: int) -> Forecast:
    """The forecast of a request of ``prompt_tokens`` asking for ``max_tokens``, ``wait`` seconds
    from a slot."""
    if known.requests >= MIN_REQUESTS and known.tokens_per_second:
        source, ttft, speed = REQUESTS, known.time_to_first_token, known.tokens_per_second
    elif known.est_tokens_per_s:
        source, ttft, speed = PROBES, None, known.est_tokens_per_s
    else:
        source, ttft, speed = NONE, None, None
    if speed and ttft is None:  # the prompt's prefill, roughly a step
        ttft = 1.0 / speed
    total = wait + ttft + max(0, max_tokens - 1) / speed if speed else None
    room = None if known.cache_tokens_left is None else known.cache_tokens_left >= prompt_tokens + max_tokens
    return Forecast(wait=float(wait), time_to_first_token=ttft, tokens_per_second=speed, total=total,
                    cache_room=room, source=source, based_on=known.requests if source == REQUESTS else 0)
