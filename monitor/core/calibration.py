"""Forecast ranges calibrated on the forecasts' own record (pure).

Every request row keeps the forecast it was given at admission (``Told``: for its wait, time to
first token and tokens/s, the median, the range it was told, and the range the requests alike gave
before calibration). How those forecasts fared is the record a range is calibrated on:

- **the scores of one answered request** for one figure are how far its real value fell below the
  low end of the range the requests alike gave, and how far above its high end (negative: how far
  inside), on a log scale — ``log`` for first token and tokens/s, ``log1p`` for the wait, which is
  often 0 (``scores``). A forecast without a range (from the probes, or too few requests alike) has
  its median as its range.
- **the calibration** of a model and load band moves each end of the range on its own: the low end
  by the conformal ``1 − (1 − COVERAGE) / 2`` quantile of the low-end scores, the high end by that of
  the high-end scores (so at most one request in ten falls below, one in ten above: eight in ten
  within), over its newest ``CALIBRATION_REQUESTS`` answered requests weighted by recency (a weight
  that halves every ``HALF_LIFE`` requests: weighted split-conformal, which follows a change of load
  within tens of requests rather than hundreds). Two ends calibrated apart keep a range sharp where
  the misses fall on one side (a median that runs low under load widens the high end only). The
  range stated is the requests alike's range with each end moved outward by its shift (inward when
  negative: the ranges were wider than they needed to be), never past the median, at most
  ``MAX_SHIFT`` either way (``widen``). Bands: the load the request meets (``BANDS``: alone, shared,
  busy), because the scatter under load is not the scatter alone; a band with fewer than
  ``MIN_CALIBRATION`` scored requests borrows the model's overall calibration; fewer than that in
  all, and the range is stated as the requests alike gave it, "not calibrated yet".
- **the record** (``track_record``): over a window, the share of answered requests whose real
  figure fell within the range they were told, and the median relative error of the medians; when
  the share over the newest ``WATCH`` falls below ``WRONG_BELOW`` for a figure, the forecast says it
  has gone wrong.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

COVERAGE = 0.8  # the share of requests a stated range is for
FIGURES = ("wait", "time_to_first_token", "tokens_per_second")
CALIBRATION_REQUESTS = 200  # the newest answered requests with a stored forecast a calibration rests on, per band
HALF_LIFE = 60.0  # requests: a scored request's weight in the calibration halves with every this many newer ones
END_LEVEL = 1.0 - (1.0 - COVERAGE) / 2  # each end of a range: at most one request in ten beyond it
MIN_CALIBRATION = 20  # scored requests a band needs for a calibration of its own
MAX_SHIFT = math.log(8.0)  # a range moves at most ×8 (or ÷8) outward or inward
BANDS = (("alone", 1.0), ("shared", 4.0), ("busy", math.inf))  # by the load the request meets, at most
ALL = "all"
WATCH = 100  # the newest answered requests the forecast's health is judged on
WRONG_BELOW = 0.65  # within their stated range, at least this share of them, or the forecast has gone wrong
MIN_WATCHED = 30  # and no verdict on fewer


@dataclass(frozen=True)
class Told:
    """One figure of a forecast as told to a request: its median, the range it was told, and the
    range the requests alike gave before calibration (None: no range; a median only)."""

    median: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    base_low: Optional[float] = None
    base_high: Optional[float] = None

    @property
    def range(self) -> Optional[tuple[float, float]]:
        return (self.low, self.high) if self.low is not None and self.high is not None else None


@dataclass(frozen=True)
class Given:
    """The forecast a request was given at admission, kept with its row."""

    load: float  # the requests it would generate beside on its busiest server, itself included
    source: str  # what the speed figures came from (``monitor.core.forecast``: requests, probes, none)
    based_on: int  # answered requests alike behind them
    calibrated_on: int  # scored requests the ranges' calibration rested on (0: not calibrated)
    wait: Told = field(default_factory=Told)
    time_to_first_token: Told = field(default_factory=Told)
    tokens_per_second: Told = field(default_factory=Told)

    def to_json(self) -> dict:
        short = lambda v: float(f"{v:.5g}") if isinstance(v, float) else v  # noqa: E731
        out = {k: short(v) for k, v in asdict(self).items() if k not in FIGURES}
        out.update({name: [short(v) for v in asdict(getattr(self, name)).values()] for name in FIGURES})
        return out

    @classmethod
    def from_json(cls, data: object) -> Optional["Given"]:
        """From a stored row (untrusted: anything out of shape or range is None, not an error)."""
        if not isinstance(data, Mapping):
            return None
        try:
            figures = {}
            for name in FIGURES:
                values = data.get(name) or [None] * 5
                if not isinstance(values, (list, tuple)) or len(values) != 5:
                    return None
                numbers = [None if v is None else float(v) for v in values]
                if any(v is not None and not (math.isfinite(v) and v >= 0) for v in numbers):
                    return None
                figures[name] = Told(*numbers)
            load, based_on, calibrated_on = float(data["load"]), int(data["based_on"]), int(data["calibrated_on"])
            if not (math.isfinite(load) and load >= 0 and based_on >= 0 and calibrated_on >= 0):
                return None
            return cls(load=load, source=str(data["source"])[:16], based_on=based_on, calibrated_on=calibrated_on,
                       **figures)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Scored:
    """An answered request as the calibration reads it: what it was told and what it got."""

    given: Given
    got: Mapping[str, Optional[float]]  # figure -> its real value (None: it has none, e.g. one token)


def band(load: float) -> str:
    return next(name for name, top in BANDS if load <= top)


def _scale(name: str, value: float) -> float:
    return math.log1p(value) if name == "wait" else math.log(max(value, 1e-9))


def _unscale(name: str, value: float) -> float:
    return max(0.0, math.expm1(value)) if name == "wait" else math.exp(value)


def scores(name: str, told: Told, got: Optional[float]) -> Optional[tuple[float, float]]:
    """How far ``got`` fell below the low end and above the high end of the range the requests
    alike gave (negative: inside), on the figure's scale; None when there is nothing to score."""
    if got is None or told.median is None or not math.isfinite(got) or got < 0:
        return None
    low = told.base_low if told.base_low is not None else told.median
    high = told.base_high if told.base_high is not None else told.median
    value = _scale(name, got)
    return _scale(name, low) - value, value - _scale(name, high)


def conformal_shift(scores: Sequence[float], *, level: float = END_LEVEL,
                    half_life: Optional[float] = HALF_LIFE) -> Optional[float]:
    """The weighted split-conformal ``level`` quantile of ``scores`` (oldest first; None below
    ``MIN_CALIBRATION``), bounded by ``MAX_SHIFT``: the smallest score whose weight, with that of
    every smaller one, reaches ``level`` of the total weight including the next request's own (1:
    the newest score weighs 1/2^(1/half_life), the one before it less...). Without a half-life every
    score weighs 1: the ``ceil((n + 1) · level)``-th smallest. Past the last score: ``MAX_SHIFT``."""
    if len(scores) < MIN_CALIBRATION:
        return None
    n = len(scores)
    weights = [1.0 if half_life is None else 0.5 ** ((n - i) / half_life) for i in range(n)]
    needed = level * (sum(weights) + 1.0)
    reached = 0.0
    for value, weight in sorted(zip(scores, weights)):
        reached += weight
        if reached >= needed - 1e-12:
            return max(-MAX_SHIFT, min(MAX_SHIFT, value))
    return MAX_SHIFT


Shift = tuple[float, float]  # (the low end's shift, the high end's): outward when positive


@dataclass(frozen=True)
class Calibration:
    """A model's calibration: per band (and ``ALL``), per figure, the shifts of the two ends and how
    many scored requests they rest on."""

    shifts: Mapping[str, Mapping[str, tuple[Shift, int]]] = field(default_factory=dict)

    def shift(self, load: float, name: str) -> tuple[Optional[Shift], int]:
        """(shifts, requests they rest on) for a request meeting ``load``: its band's, else the
        model's over all bands, else (None, 0)."""
        for key in (band(load), ALL):
            found = self.shifts.get(key, {}).get(name)
            if found is not None:
                return found
        return None, 0


def calibrate(scored: Iterable[Scored], *, half_life: Optional[float] = HALF_LIFE,
              score: Optional[Callable[[str, Told, Optional[float]], Optional[tuple[float, float]]]] = None) -> Calibration:
    """The calibration from answered requests' forecasts and figures, oldest first (the newest
    ``CALIBRATION_REQUESTS`` of each band count, and of all; ``half_life``: ``conformal_shift``'s;
    ``score``: how one request is scored, ``scores`` unless given — the forecast bench replays
    other ways of scoring beside it)."""
    score = score or scores
    by_band: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for item in scored:
        for key in (band(item.given.load), ALL):
            for name in FIGURES:
                found = score(name, getattr(item.given, name), item.got.get(name))
                if found is not None:
                    by_band.setdefault(key, {}).setdefault(name, []).append(found)
    shifts: dict[str, dict[str, tuple[Shift, int]]] = {}
    for key, figures in by_band.items():
        for name, values in figures.items():
            newest = values[-CALIBRATION_REQUESTS:]
            low = conformal_shift([v[0] for v in newest], half_life=half_life)
            high = conformal_shift([v[1] for v in newest], half_life=half_life)
            if low is not None and high is not None:
                shifts.setdefault(key, {})[name] = ((low, high), len(newest))
    return Calibration(shifts)


def widen(name: str, median: Optional[float], base: Optional[tuple[float, float]],
          shift: Optional[Shift]) -> Told:
    """The range told for one figure: the requests alike's range (``base``; the median alone when
    None) with its low end moved down by ``shift[0]`` and its high end up by ``shift[1]`` (inward when
    negative), never past the median; without a shift, the base range as it is."""
    if median is None:
        return Told()
    low, high = base if base is not None else (None, None)
    if shift is None:
        return Told(median, low, high, low, high)
    start_low = low if low is not None else median
    start_high = high if high is not None else median
    told_low = min(median, _unscale(name, _scale(name, start_low) - shift[0]))
    told_high = max(median, _unscale(name, _scale(name, start_high) + shift[1]))
    return Told(median, told_low, told_high, low, high)


def within(told: Told, got: Optional[float]) -> Optional[bool]:
    bounds = told.range
    if got is None or bounds is None:
        return None
    return bounds[0] - 1e-9 <= got <= bounds[1] + 1e-9


def track_record(scored: Sequence[Scored]) -> dict:
    """For each figure: the answered requests told a range, the share of them within it, and the
    median relative error of the medians (|got − median| / got)."""
    out = {}
    for name in FIGURES:
        hits = [h for h in (within(getattr(s.given, name), s.got.get(name)) for s in scored) if h is not None]
        errors = sorted(abs(got - told.median) / got for told, got in
                        ((getattr(s.given, name), s.got.get(name)) for s in scored)
                        if told.median is not None and got)
        out[name] = {"requests": len(hits), "within_range": sum(hits) / len(hits) if hits else None,
                     "median_error": errors[len(errors) // 2] if errors else None}
    return out


def gone_wrong(scored: Sequence[Scored]) -> list[str]:
    """The figures whose newest ``WATCH`` answered requests fell within their stated range less
    often than ``WRONG_BELOW`` (judged on at least ``MIN_WATCHED``)."""
    wrong = []
    for name in FIGURES:
        hits = [h for h in (within(getattr(s.given, name), s.got.get(name)) for s in scored) if h is not None][-WATCH:]
        if len(hits) >= MIN_WATCHED and sum(hits) / len(hits) < WRONG_BELOW:
            wrong.append(name)
    return wrong
