"""A model's uptime and its day-by-day bar, as pure functions over its status history.

"Has this model been up this month?" is answered from what the poller stored of it: one status
per poll where raw rows are kept, one row per hour before that (its polls counted per state).
Each of those points stands for the time until the next point, at most its ``hold`` (an hour for
an hourly row; a few scrape periods for a poll, so a poller that was down leaves a gap instead of
stretching the last state over it). Over that time it is spread by its states' shares: an hour
with 6 broken polls of 60 was broken for 6 minutes of it.

- **up** is every state in which the model can be used: ``healthy`` and ``degraded``; ``broken``
  is down; ``unknown`` (the diagnosis failed) is neither: it counts as not observed.
- **maintenance**: time inside maintenance windows that cover the model (``core.maintenance``)
  counts neither as up nor as observed, and is reported apart (``Tally.maintenance``).
- **a day's state** (the status page's bar, one cell per UTC day) is the worst state seen outside
  maintenance; a day whose only trouble (or nothing but good) fell inside maintenance shows
  ``maintenance``; a day with nothing observed shows ``no data``. An hourly row is judged whole:
  its worst state counts unless all of the hour is inside maintenance (its polls are counted,
  not placed in time).

No I/O: the store reads the points (``store/status_history.py``), the web draws them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping, Optional, Sequence

from monitor.core.common import DAY
from monitor.core.assessment import BROKEN, DEGRADED, HEALTHY, STATE_SEVERITY

UP_STATES = frozenset({HEALTHY, DEGRADED})
KNOWN_STATES = frozenset({HEALTHY, DEGRADED, BROKEN})
MAINTENANCE, NO_DATA = "maintenance", "no data"
DAY_STATES = (HEALTHY, DEGRADED, BROKEN, MAINTENANCE, NO_DATA)  # what a day's cell may say
WINDOWS = {"24h": DAY, "7d": 7 * DAY, "30d": 30 * DAY}  # the uptime figures (badges, status page)


@dataclass(frozen=True)
class StatusPoint:
    """One stored status of a model: a poll (``states`` = {its state: 1}) or an hourly rollup
    (polls per state); it stands from ``at`` until the next point, at most ``hold`` seconds."""

    at: float
    states: Mapping[str, int]
    hold: float

    @cached_property
    def worst(self) -> Optional[str]:
        known = [s for s, n in self.states.items() if n > 0 and s in KNOWN_STATES]
        return max(known, key=lambda s: STATE_SEVERITY[s]) if known else None

    @cached_property
    def shares(self) -> tuple[float, float, tuple[tuple[str, float], ...]]:
        """(known, up, ((state, share), ...)): the shares of its polls that were diagnosed, up,
        and in each known state (computed once: a page folds each point into several tallies)."""
        total = sum(n for n in self.states.values() if n > 0)
        if total <= 0:
            return 0.0, 0.0, ()
        each = tuple((s, n / total) for s, n in self.states.items() if n > 0 and s in KNOWN_STATES)
        return (sum(share for _, share in each), sum(share for s, share in each if s in UP_STATES), each)


@dataclass
class Tally:
    """Seconds up, observed and in maintenance over some time; and the worst state seen outside
    maintenance (None: none)."""

    up: float = 0.0
    observed: float = 0.0
    maintenance: float = 0.0
    worst: Optional[str] = None
    states: dict[str, float] = field(default_factory=dict)  # seconds per state, maintenance left out

    @property
    def share(self) -> Optional[float]:
        """0 … 1 of the observed time up; None: nothing observed outside maintenance."""
        return self.up / self.observed if self.observed > 0 else None

    def _see(self, state: Optional[str]) -> None:
        if state is not None and (self.worst is None or STATE_SEVERITY[state] > STATE_SEVERITY[self.worst]):
            self.worst = state


@dataclass(frozen=True)
class Day:
    """One cell of the status page's bar: a UTC day (the last one ends now)."""

    start: float
    end: float
    state: str  # one of DAY_STATES
    up: float
    observed: float
    maintenance: float
    outages: tuple[tuple[float, float], ...] = ()  # broken stretches, clipped to the day, maintenance left out
    states: Mapping[str, float] = field(default_factory=dict)

    @property
    def share(self) -> Optional[float]:
        return self.up / self.observed if self.observed > 0 else None

    @property
    def outage_seconds(self) -> float:
        return sum(b - a for a, b in self.outages)


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


class _Overlap:
    """Seconds of [a, b] inside merged intervals, in O(log n) per question."""

    def __init__(self, intervals: Sequence[tuple[float, float]]):
        self.intervals = _merged(intervals)
        self.starts = [a for a, _ in self.intervals]

    def __call__(self, a: float, b: float) -> float:
        if not self.intervals or b <= a:
            return 0.0
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        total = 0.0
        while i < len(self.intervals) and self.intervals[i][0] < b:
            lo, hi = self.intervals[i]
            total += max(0.0, min(hi, b) - max(lo, a))
            i += 1
        return total


def compact(points: Sequence[StatusPoint]) -> list[StatusPoint]:
    """The same time, in fewer points: a run of consecutive points with the same states, each
    starting within the previous one's hold, is one point holding from the first to the last one's
    end (a model healthy for two days of polls is one point, not 2,880). Every tally and day is
    the same over the compacted points (``_segments`` cuts a point at the next one)."""
    found: list[StatusPoint] = []
    ordered = sorted(points, key=lambda p: p.at)
    run_start: Optional[StatusPoint] = None
    run_end = -math.inf
    for point in ordered:
        if run_start is not None and point.states == run_start.states and point.at <= run_end:
            run_end = max(run_end, point.at + point.hold)
            continue
        if run_start is not None:
            found.append(StatusPoint(run_start.at, run_start.states, run_end - run_start.at))
        run_start, run_end = point, point.at + point.hold
    if run_start is not None:
        found.append(StatusPoint(run_start.at, run_start.states, run_end - run_start.at))
    return found


def _segments(points: Sequence[StatusPoint], since: float, until: float):
    """(start, end, point) of the time each point stands for, clipped to [since, until]."""
    ordered = sorted(points, key=lambda p: p.at)
    for i, point in enumerate(ordered):
        following = ordered[i + 1].at if i + 1 < len(ordered) else math.inf
        start, end = max(point.at, since), min(following, point.at + point.hold, until)
        if end > start:
            yield start, end, point


def _add(tally: Tally, start: float, end: float, point: StatusPoint, inside: float, by_state: bool = True) -> None:
    """One segment into ``tally``, ``inside`` of its seconds in maintenance (``by_state``: also the
    seconds per state). Its worst state counts if any of it is outside (an hourly row is judged
    whole: its states are not placed in time)."""
    known, up, each = point.shares
    if not each:
        return
    outside = max(0.0, end - start - inside)
    tally.observed += outside * known
    tally.up += outside * up
    tally.maintenance += inside * known
    if by_state:
        for state, share in each:
            tally.states[state] = tally.states.get(state, 0.0) + outside * share
    if outside > 0:
        tally._see(point.worst)


def tally(points: Sequence[StatusPoint], since: float, until: float,
          maintenance: Sequence[tuple[float, float]] = ()) -> Tally:
    """The model's time up, observed and in maintenance over [since, until]."""
    overlap = _Overlap(maintenance)
    found = Tally()
    for start, end, point in _segments(points, since, until):
        _add(found, start, end, point, overlap(start, end))
    return found


def uptimes(points: Sequence[StatusPoint], now: float,
            maintenance: Sequence[tuple[float, float]] = ()) -> dict[str, Tally]:
    """``WINDOWS`` ("24h", "7d", "30d") -> the tally over the last that long, to ``now`` (one pass:
    each segment goes into every window it overlaps, cut at the window's start)."""
    overlap = _Overlap(maintenance)
    starts = {name: now - seconds for name, seconds in WINDOWS.items()}
    found = {name: Tally() for name in WINDOWS}
    for start, end, point in _segments(points, min(starts.values()), now):
        whole = overlap(start, end)
        for name, since in starts.items():
            if end <= since:
                continue
            if start >= since:
                _add(found[name], start, end, point, whole, by_state=False)
            else:
                _add(found[name], since, end, point, overlap(since, end), by_state=False)
    return found


def day_start(at: float) -> float:
    return math.floor(at / DAY) * DAY


def days(points: Sequence[StatusPoint], now: float, *, count: int = 90,
         maintenance: Sequence[tuple[float, float]] = (),
         outages: Sequence[tuple[float, Optional[float]]] = ()) -> list[Day]:
    """The last ``count`` UTC days to ``now`` (oldest first; today ends at ``now``), each with its
    state, figures and outages (``outages``: broken stretches, ``end`` None while it lasts)."""
    first = day_start(now) - (count - 1) * DAY
    overlap = _Overlap(maintenance)
    tallies = [Tally() for _ in range(count)]
    for start, end, point in _segments(points, first, now):
        index = int((start - first) // DAY)
        while start < end and index < count:
            cut = min(end, first + (index + 1) * DAY)
            _add(tallies[index], start, cut, point, overlap(start, cut))
            start, index = cut, index + 1
    found = []
    for index, t in enumerate(tallies):
        lo, hi = first + index * DAY, min(first + (index + 1) * DAY, now)
        clipped = [(max(a, lo), min(b if b is not None else now, hi)) for a, b in outages
                   if a < hi and (b is None or b > lo)]
        found.append(Day(start=lo, end=hi, state=day_state(t), up=t.up, observed=t.observed,
                         maintenance=t.maintenance, outages=tuple(_outside(clipped, overlap.intervals)),
                         states=dict(t.states)))
    return found


def _outside(intervals: Sequence[tuple[float, float]], held: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``intervals`` outside the merged intervals ``held`` (an outage during
    maintenance is not an outage)."""
    found = []
    for a, b in intervals:
        for lo, hi in held:
            if hi <= a or lo >= b:
                continue
            if lo > a:
                found.append((a, lo))
            a = max(a, hi)
        if b > a:
            found.append((a, b))
    return found


def day_state(t: Tally) -> str:
    """A day's word (``DAY_STATES``): its worst state outside maintenance; ``maintenance`` when
    that is healthy (or nothing) and some of the day was in maintenance; ``no data`` else."""
    if t.maintenance > 0 and t.worst in (None, HEALTHY):
        return MAINTENANCE
    return t.worst or NO_DATA


def percent(share: Optional[float]) -> str:
    """0.99234 -> "99.23%", 1.0 -> "100%", None -> "no data" (never rounded up to 100%)."""
    if share is None:
        return NO_DATA
    if share >= 1.0:
        return "100%"
    value = math.floor(share * 10000) / 100
    return f"{value:.2f}%".replace(".00%", "%")
