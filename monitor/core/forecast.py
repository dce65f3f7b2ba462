"""A forecast for a request before it starts (pure): how long it would wait for a slot, its time to
first token, its decode speed, its total time for the tokens it asks for, and whether the model's
servers have cache room for its length.

From what real requests got (``core/requests.py``: the model's answered requests over ``WINDOW``),
else from the one stored assessment (the speed probes' estimate of the model's route); the wait from
the chat's own queue now.

What a request gets depends on the route it takes and on how many requests share the servers with
it: with sixteen in flight, one route's requests may decode at a third of another's. So each answered
request is kept with its route and its **load** — the requests on the busiest server of its route
while it generated, itself included, averaged over its time, counted from the stored rows' own
intervals and routes (:func:`loads`; every chat process's rows, as the servers see them). A forecast
for a request that would take ``route`` beside the requests on its busiest server now rests on the
answered requests most like it, the first group with at least ``MIN_REQUESTS``: the same route at a
similar load (within ``LOAD_MARGIN``), a similar load on any route, the same route at any load, all
of them; the medians of that group are its figures, and what eight in ten of it got (``SPREAD``)
their ranges — as calibrated on how the forecasts' own ranges fared (``core/calibration.py``): each
request row keeps the forecast it was given (``Forecast.given``), and the model's recent answered
requests say how far outside (or inside) the requests alike's ranges the real figures fell, per load
band; the stated range is moved by that, so that eight in ten requests do fall within it. The wait
has a range too: the queue's figure, calibrated the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional, Sequence

from monitor.core import calibration
from monitor.core.assessment import Assessment
from monitor.core.calibration import Calibration, Given, Scored
from monitor.core.common import MINUTE
from monitor.core.requests import LATENCY_WINDOWS, OK, RequestRecord, percentile

WINDOW = 30 * MINUTE
MIN_REQUESTS = 5  # answered requests in the window the figures rest on, at least; else the probes'
REQUESTS, PROBES, NONE = "requests", "probes", "none"
LOAD_MARGIN = 0.25  # a load within this share of another (and at least one request apart) is similar
MAX_OBSERVED = 1000  # answered requests a forecast keeps per model (the newest)
RECENT = 20  # of the requests alike, the newest this many: what the swarm does now, not at warm-up


@dataclass(frozen=True)
class Observed:
    """One answered request as a forecast uses it."""

    route: tuple[str, ...]  # its servers' peer ids, in route order
    load: float  # requests on the busiest server of its route while it generated, itself included (``loads``)
    time_to_first_token: Optional[float]
    tokens_per_second: Optional[float]
    continued: bool = False  # it continued a kept session: only its new tokens went through the swarm


def loads(records: Sequence[RequestRecord]) -> list[float]:
    """For each record, the load it generated at: the requests on the busiest server of its route
    while it generated, itself included, averaged over its time (a server takes its sessions' steps
    one at a time, so these are what its steps waited behind — those that were there when it started
    and those that came while it ran). A record generates from the end of its wait until its last
    token (first token, then the rest at its decode speed); one without a first token generated
    nothing and counts for none but itself, at the moment it started. A record without a route
    shares a server with every other, and every other with it."""
    spans = []
    for r in records:
        start = r.at + (r.waited or 0.0)
        decode = (r.tokens - 1) / r.tokens_per_second if r.tokens > 1 and r.tokens_per_second else 0.0
        end = start + r.time_to_first_token + decode if r.time_to_first_token is not None else start
        spans.append((start, end, r.peers))
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    out = [1.0] * len(spans)
    active: list[int] = []  # started before the current one and not ended when it starts
    for position, i in enumerate(order):
        start, end, peers = spans[i]
        active = [j for j in active if spans[j][1] > start]
        beside = list(active)  # and those that start while it runs (or with it)
        for k in range(position + 1, len(order)):
            if spans[order[k]][0] > end:
                break
            beside.append(order[k])
        length = end - start
        per_server: dict[str, float] = {}
        for j in beside:
            other_start, other_end, other_peers = spans[j]
            if length > 0:
                shared = max(0.0, min(end, other_end) - max(start, other_start)) / length
            else:  # a moment: whether it was generating then
                shared = 1.0 if other_start <= start < other_end else 0.0
            if not shared:
                continue
            for peer in ((peers & other_peers if other_peers else peers) if peers else ("",)):
                per_server[peer] = per_server.get(peer, 0.0) + shared
        out[i] = 1.0 + max(per_server.values(), default=0.0)
        active.append(i)
    return out


def similar_load(a: float, b: float) -> bool:
    return abs(a - b) <= max(1.0, LOAD_MARGIN * max(a, b))

@dataclass(frozen=True)
class ForecastInputs:
    """What a forecast of one model rests on, read from the store once in a while."""

    model: str
    requests: int = 0  # answered requests in the window
    time_to_first_token: Optional[float] = None  # their median
    tokens_per_second: Optional[float] = None  # their median
    est_tokens_per_s: Optional[float] = None  # the assessment's estimate (probes)
    session_room: Optional[int] = None  # tokens of one session: the least, over the blocks, their servers hold
    recommendation: Optional[str] = None  # what a new server should serve, e.g. "--block_indices 4:8"
    recommendation_reason: Optional[str] = None
    observed: tuple[Observed, ...] = ()  # the answered requests, with their routes and loads (newest last)
    calibration: Calibration = Calibration()  # how the ranges move, from the forecasts' own record
    gone_wrong: tuple[str, ...] = ()  # the figures whose ranges held too rarely of late (``calibration.gone_wrong``)


@dataclass(frozen=True)
class Forecast:
    wait: float  # seconds until a slot
    time_to_first_token: Optional[float]
    tokens_per_second: Optional[float]
    total: Optional[float]  # wait + first token + the rest of max_tokens at tokens_per_second
    cache_room: Optional[bool]  # None: the servers announce no cache figures
    source: str  # REQUESTS | PROBES | NONE: what the speed figures come from
    based_on: int  # answered requests behind them (REQUESTS)
    # what eight in ten of those requests got (their 10th to 90th percentile; None without them):
    # under load one figure cannot say it all — requests alike scatter
    time_to_first_token_range: Optional[tuple[float, float]] = None
    tokens_per_second_range: Optional[tuple[float, float]] = None
    wait_range: Optional[tuple[float, float]] = None
    calibrated_on: int = 0  # answered requests whose forecasts' record moved the ranges (0: not calibrated yet)
    gone_wrong: tuple[str, ...] = ()  # figures whose ranges held for under 65 % of the newest requests
    given: Optional[Given] = None  # all of it as a request row keeps it (``core/calibration.py``)

    def to_dict(self) -> dict:
        short = lambda value: float(f"{value:.4g}") if isinstance(value, float) else value  # noqa: E731
        return {key: [short(v) for v in value] if isinstance(value, tuple) else short(value)
                for key, value in asdict(self).items() if key not in ("given", "gone_wrong")} \
            | {"gone_wrong": list(self.gone_wrong), "load": self.given.load if self.given else None}


SPREAD = (10, 90)  # the percentiles a forecast's ranges run between


def spread(values: Sequence[Optional[float]]) -> Optional[tuple[float, float]]:
    low, high = (percentile(values, q) for q in SPREAD)
    return (low, high) if low is not None and high is not None else None


def inputs(model: str, records: Iterable[RequestRecord], assessment: Optional[Assessment], *,
           now: float) -> ForecastInputs:
    recent = [r for r in records if r.model == model and r.at >= now - WINDOW]
    load_of = loads(recent)
    done = [r for r in recent if r.outcome == OK]
    observed = tuple(Observed(route=tuple(peer for peer, _, _ in r.route), load=load,
                              time_to_first_token=r.time_to_first_token, tokens_per_second=r.tokens_per_second,
                              continued=r.continued)
                     for r, load in zip(recent, load_of) if r.outcome == OK)[-MAX_OBSERVED:]
    # the room a session has: the least over the blocks of what their servers can hold of one session
    cache = [b.session_room for b in (assessment.blocks if assessment else ()) if b.session_room is not None]
    told = scored(done)
    return ForecastInputs(
        model=model, requests=len(done), observed=observed, calibration=calibration.calibrate(told),
        gone_wrong=tuple(calibration.gone_wrong(told)),
        time_to_first_token=percentile([r.time_to_first_token for r in done], 50),
        tokens_per_second=percentile([r.tokens_per_second for r in done], 50),
        est_tokens_per_s=assessment.est_tokens_per_s if assessment else None,
        session_room=min(cache) if cache else None,
        recommendation=assessment.recommendation.argument if assessment and assessment.recommendation else None,
        recommendation_reason=assessment.recommendation.reason if assessment and assessment.recommendation else None)


def scored(records: Iterable[RequestRecord]) -> list[Scored]:
    """The answered requests that kept their forecast, with what they got (oldest first)."""
    return [Scored(r.forecast, {"wait": r.waited, "time_to_first_token": r.time_to_first_token,
                                "tokens_per_second": r.tokens_per_second if r.tokens > 1 else None})
            for r in records if r.outcome == OK and r.forecast is not None]


def like(observed: Sequence[Observed], *, route: Optional[Sequence[str]], load: Optional[int],
         continued: Optional[bool] = None) -> list[Observed]:
    """The answered requests a request on ``route`` at ``load`` is most like: of the first group of
    at least MIN_REQUESTS of same route and similar load, similar load, same route, all — the
    newest ``RECENT`` (``observed`` is oldest first). ``continued``: whether the request continues a
    kept session (its first token comes without its earlier turns' prefill); the requests that did
    alike, when there are at least MIN_REQUESTS of them (None: any)."""
    if continued is not None:
        alike = [o for o in observed if o.continued == continued]
        observed = alike if len(alike) >= MIN_REQUESTS else observed
    route = tuple(route) if route else None
    groups = []
    if route is not None and load is not None:
        groups.append([o for o in observed if o.route == route and similar_load(o.load, load)])
    if load is not None:
        groups.append([o for o in observed if similar_load(o.load, load)])
    if route is not None:
        groups.append([o for o in observed if o.route == route])
    return next((g for g in groups if len(g) >= MIN_REQUESTS), list(observed))[-RECENT:]


def forecast(known: ForecastInputs, *, wait: float, prompt_tokens: int, max_tokens: int,
             load: Optional[int] = None, route: Optional[Sequence[str]] = None,
             continued: Optional[bool] = None) -> Forecast:
    """The forecast of a request of ``prompt_tokens`` asking for ``max_tokens``, ``wait`` seconds
    from a slot, that would generate alongside ``load - 1`` others on ``route`` (its peer ids; None:
    not known); ``continued``: whether it continues a kept session (``like``)."""
    group = like(known.observed, route=route, load=load, continued=continued) if known.observed else []
    ranges: dict = {}
    if len(group) >= MIN_REQUESTS and percentile([o.tokens_per_second for o in group], 50):
        source, based_on = REQUESTS, len(group)
        ttft = percentile([o.time_to_first_token for o in group], 50)
        speed = percentile([o.tokens_per_second for o in group], 50)
        ranges = dict(time_to_first_token_range=spread([o.time_to_first_token for o in group]),
                      tokens_per_second_range=spread([o.tokens_per_second for o in group]))
    elif known.requests >= MIN_REQUESTS and known.tokens_per_second:
        source, ttft, speed, based_on = REQUESTS, known.time_to_first_token, known.tokens_per_second, known.requests
    elif known.est_tokens_per_s:
        source, ttft, speed, based_on = PROBES, None, known.est_tokens_per_s, 0
    else:
        source, ttft, speed, based_on = NONE, None, None, 0
    if speed and ttft is None:  # the prompt's prefill, roughly a step
        ttft = 1.0 / speed
    total = wait + ttft + max(0, max_tokens - 1) / speed if speed and ttft is not None else None
    room = None if known.session_room is None else known.session_room >= prompt_tokens + max_tokens
    load_met = float(load if load is not None else 1)
    told, rested = {}, 0
    for name, median, base in (("wait", float(wait), None), ("time_to_first_token", ttft,
                                                            ranges.get("time_to_first_token_range")),
                               ("tokens_per_second", speed, ranges.get("tokens_per_second_range"))):
        shift, on = known.calibration.shift(load_met, name)
        told[name] = calibration.widen(name, median, base, shift)
        rested = max(rested, on)
    given = Given(load=load_met, source=source, based_on=based_on, calibrated_on=rested, **told)
    return Forecast(wait=float(wait), time_to_first_token=ttft, tokens_per_second=speed, total=total,
                    cache_room=room, source=source, based_on=based_on,
                    time_to_first_token_range=told["time_to_first_token"].range,
                    tokens_per_second_range=told["tokens_per_second"].range, wait_range=told["wait"].range,
                    calibrated_on=rested, gone_wrong=known.gone_wrong, given=given)


def forecast_record(records: Iterable[RequestRecord], *, now: float) -> dict:
    """How the forecasts fared (``core/calibration.py``): per window (30 minutes, a day) and figure,
    the answered requests that were told a range, the share of them within it and the median error
    of the medians; and the figures whose ranges held for under ``WRONG_BELOW`` of the newest
    ``WATCH`` answered requests (the forecast has gone wrong)."""
    done = [r for r in records if r.outcome == OK and r.forecast is not None]
    return {"coverage": calibration.COVERAGE, "wrong_below": calibration.WRONG_BELOW, "watched": calibration.WATCH,
            "windows": {name: calibration.track_record(scored(r for r in done if r.at >= now - span))
                        for name, span in LATENCY_WINDOWS},
            "gone_wrong": calibration.gone_wrong(scored(done))}
