"""Maintenance windows, as pure functions: when a window is in force, what it covers, and the time
it takes out of uptime.

An operator who restarts their servers to upgrade petals should be neither paged for it nor
charged for it: during a maintenance window the monitor keeps recording everything, but the
alerts of what the window covers are held (``core/muting.py``), the pages say "maintenance", and
uptime figures leave the window's time out (and say how much they left out).

A window covers the whole swarm (``global``), one model (``model``: its DHT prefix; the model's
alerts and its servers'), or one peer (``peer``: a peer id or a public name). It is one-off (from
``starts_at`` to ``ends_at``) or recurring: each occurrence lasts ``duration`` seconds and starts

- at a time of day on some weekdays (``weekdays`` 0 = Monday … 6 = Sunday, ``at`` = "HH:MM"), or
- whenever a five-field cron expression fires (``croniter``: "0 2 * * sun"),

both in the window's time zone (an IANA name: "Europe/Berlin"; daylight saving time follows the
zone), between ``starts_at`` and ``ends_at`` (None: for ever). Ending a window early sets its
``ends_at`` to that moment: every occurrence is clipped to [starts_at, ends_at].

No I/O: plain dataclasses in, intervals out. The store keeps the windows (``store/mutes.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, time as dtime, timedelta
from typing import Iterable, Optional, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from monitor.core import timefmt
from monitor.core.common import DAY, HOUR
from monitor.core.snapshot import ONLINE, Observation

GLOBAL, MODEL, PEER = "global", "model", "peer"
SCOPES = (GLOBAL, MODEL, PEER)
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

MIN_DURATION, MAX_DURATION = 60.0, 7 * DAY  # one occurrence, or a one-off window
MAX_ONE_OFF = 30 * DAY  # a one-off window's whole length
MIN_CRON_GAP = HOUR  # a cron window starts at most once an hour (24 occurrences a day)
MAX_OCCURRENCES = 10_000  # per window and range asked for (90 days of hourly windows: 2,160)
MAX_HOLD = HOUR  # uptime: one observation stands for at most this long (an hourly rollup row)
_AT = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class Recurrence:
    """How a recurring window repeats: ``weekdays`` + ``at``, or ``cron``; local to ``timezone``."""

    duration: float  # seconds each occurrence lasts
    timezone: str = "UTC"
    weekdays: tuple[int, ...] = ()  # 0 = Monday; with ``at``
    at: Optional[str] = None  # "HH:MM", local time
    cron: Optional[str] = None  # five fields, local time

    def describe(self) -> str:
        length = timefmt.duration(self.duration)
        if self.cron:
            return f"cron “{self.cron}” ({self.timezone}), {length} each"
        days = ", ".join(WEEKDAYS[d] for d in sorted(self.weekdays))
        return f"{days} at {self.at} ({self.timezone}), {length} each"


@dataclass(frozen=True)
class MaintenanceWindow:
    """One maintenance window, as stored (``ends_at`` set early when an operator ends it)."""

    id: int
    scope: str  # global | model | peer
    target: Optional[str]  # the model's DHT prefix, the peer's id or public name; None: global
    starts_at: float
    ends_at: Optional[float]  # one-off: its end; recurring: the last moment it applies (None: for ever)
    reason: str
    recurrence: Optional[Recurrence] = None
    created_at: float = 0.0
    created_by: str = ""
    ended_at: Optional[float] = None  # an operator ended it (then ``ends_at`` is that moment)
    ended_by: Optional[str] = None

    @property
    def recurring(self) -> bool:
        return self.recurrence is not None

    def what(self) -> str:
        """What it covers, for people."""
        if self.scope == GLOBAL:
            return "the whole swarm"
        return f"{self.scope} {self.target}"

    def covers(self, *, models: Iterable[str] = (), peers: Iterable[Optional[str]] = ()) -> bool:
        """Does it cover something about these models and peers (ids or public names)? A model's
        window covers the model and its servers; a peer's window covers the peer."""
        if self.scope == GLOBAL:
            return True
        if self.scope == MODEL:
            return self.target in set(models)
        return self.target in {p for p in peers if p}


# ---- validation (the web and the settings call it with what people typed) --------------------


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError naming it when unknown."""
    if not isinstance(name, str) or not name or len(name) > 64 or not re.match(r"^[A-Za-z0-9_+\-/]+$", name) \
            or ".." in name or name.startswith("/"):
        raise ValueError(f"time zone {str(name)[:64]!r} is not an IANA time zone name like 'Europe/Berlin' or 'UTC'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}: give an IANA name like 'Europe/Berlin' or 'UTC'") from None


def check_recurrence(rec: Recurrence) -> Recurrence:
    """``rec`` if it can be used, else ValueError saying what is wrong with it."""
    if not (isinstance(rec.duration, (int, float)) and math.isfinite(rec.duration)
            and MIN_DURATION <= rec.duration <= MAX_DURATION):
        raise ValueError(f"each occurrence must last between {timefmt.duration(MIN_DURATION)} and "
                         f"{timefmt.duration(MAX_DURATION)}")
    zone(rec.timezone)
    if bool(rec.cron) == bool(rec.weekdays or rec.at):
        raise ValueError("a recurring window needs either `cron` or `weekdays` with `at`, not both")
    if rec.cron:
        _check_cron(rec.cron, rec.timezone)
        return rec
    if not rec.weekdays or not rec.at:
        raise ValueError("a weekly window needs `weekdays` (Mon … Sun) and `at` (HH:MM)")
    if any(not isinstance(d, int) or not 0 <= d <= 6 for d in rec.weekdays) or len(set(rec.weekdays)) != len(
            rec.weekdays):
        raise ValueError("`weekdays` are Mon … Sun (0 … 6), each once")
    if not _AT.match(rec.at):
        raise ValueError(f"`at` must be a time of day as HH:MM, got {rec.at[:20]!r}")
    return rec


def weekday_numbers(names: Iterable[str]) -> tuple[int, ...]:
    """("mon", "Sun") -> (0, 6); ValueError for anything else."""
    found = []
    for name in names:
        key = str(name).strip()[:3].title()
        if key not in WEEKDAYS or len(str(name).strip()) > 9:
            raise ValueError(f"{str(name)[:20]!r} is not a weekday: use Mon, Tue, Wed, Thu, Fri, Sat, Sun")
        found.append(WEEKDAYS.index(key))
    return tuple(sorted(set(found)))


def _check_cron(expression: str, tz: str) -> None:
    from croniter import croniter

    if len(expression) > 100 or len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise ValueError(f"{expression[:100]!r} is not a cron expression of five fields (minute hour day month "
                         f"weekday), e.g. '0 2 * * sun'")
    try:
        starts = _cron_starts(expression, tz, 1_700_000_000.0, 1_700_000_000.0 + 1500 * DAY, 200)  # leap days too
    except (ValueError, KeyError, OverflowError):  # croniter's "failed to find next date"
        starts = []
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    if not starts:
        raise ValueError(f"cron {expression!r} never fires")
    if gaps and min(gaps) < MIN_CRON_GAP:
        raise ValueError(f"cron {expression!r} fires more often than once an hour; a maintenance window "
                         f"starts at most once an hour")


# ---- occurrences and covered time --------------------------------------------------------------


def _cron_starts(expression: str, tz: str, since: float, until: float, limit: int) -> list[float]:
    from croniter import croniter

    start = datetime.fromtimestamp(since, zone(tz))
    found: list[float] = []
    it = croniter(expression, start - timedelta(seconds=1))
    while len(found) < limit:
        at = it.get_next(datetime).timestamp()
        if at > until:
            break
        found.append(at)
    return found


def _weekly_starts(rec: Recurrence, since: float, until: float, limit: int) -> list[float]:
    tz = zone(rec.timezone)
    hour, minute = (int(part) for part in (rec.at or "00:00").split(":"))  # (a weekly recurrence has its "at")
    day = datetime.fromtimestamp(since, tz).date() - timedelta(days=1)
    last = datetime.fromtimestamp(until, tz).date() + timedelta(days=1)
    wanted = set(rec.weekdays)
    found: list[float] = []
    while day <= last and len(found) < limit:
        if day.weekday() in wanted:
            at = datetime.combine(day, dtime(hour, minute), tzinfo=tz).timestamp()
            if since <= at <= until:
                found.append(at)
        day += timedelta(days=1)
    return found


def occurrences(window: MaintenanceWindow, since: float, until: float) -> list[tuple[float, float]]:
    """The window's occurrences that overlap [since, until], each clipped to the window's
    [starts_at, ends_at] and to [since, until], oldest first."""
    lo, hi = max(since, window.starts_at), until if window.ends_at is None else min(until, window.ends_at)
    if hi <= lo:
        return []
    rec = window.recurrence
    if rec is None:
        return [(lo, hi)]
    first = lo - rec.duration  # an occurrence that started before ``lo`` may still be running
    if rec.cron:
        starts = _cron_starts(rec.cron, rec.timezone, first, hi, MAX_OCCURRENCES)
    else:
        starts = _weekly_starts(rec, first, hi, MAX_OCCURRENCES)
    found = []
    for start in starts:
        a, b = max(start, lo), min(start + rec.duration, hi)
        if b > a:
            found.append((a, b))
    return found


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching intervals as one, oldest first."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def covered_intervals(windows: Iterable[MaintenanceWindow], since: float, until: float) -> list[tuple[float, float]]:
    """The time in [since, until] that these windows cover, as merged intervals, oldest first
    (what a status page or an uptime figure leaves out). Filter the windows first with
    ``MaintenanceWindow.covers`` for one model or peer."""
    return merge(interval for window in windows for interval in occurrences(window, since, until))


def covered_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def overlap(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside the (merged) intervals."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def active(windows: Iterable[MaintenanceWindow], at: float) -> list[MaintenanceWindow]:
    """The windows in force at ``at``."""
    return [w for w in windows if any(a <= at < b for a, b in occurrences(w, at - 1e-6, at + 1e-6))]


def current_end(window: MaintenanceWindow, at: float) -> Optional[float]:
    """When the occurrence in force at ``at`` ends (None: none is)."""
    if window.recurrence is None:
        return window.ends_at if window.starts_at <= at and (window.ends_at is None or at < window.ends_at) else None
    length = window.recurrence.duration
    return next((b for a, b in occurrences(window, at - length - 1, at + length + 1) if a <= at < b), None)


def next_start(window: MaintenanceWindow, after: float) -> Optional[float]:
    """When the window is next in force after ``after`` (None: never again)."""
    horizon = after + (8 * DAY if window.recurrence is None or not window.recurrence.cron else 40 * DAY)
    for a, _ in occurrences(window, after, horizon):
        if a > after:
            return a
    return None


# ---- uptime with the windows left out -----------------------------------------------------------


@dataclass(frozen=True)
class Uptime:
    """Time up of time observed in a range, with the maintenance time left out of both."""

    up_seconds: float
    observed_seconds: float
    maintenance_seconds: float  # observed time inside maintenance windows, left out

    @property
    def share(self) -> Optional[float]:
        """0 … 1; None: nothing observed outside maintenance."""
        return self.up_seconds / self.observed_seconds if self.observed_seconds > 0 else None


def uptime(observations: Iterable[Observation], since: float, until: float,
           left_out: Sequence[tuple[float, float]] = ()) -> Uptime:
    """How long a peer was ONLINE in [since, until], each observation standing until the next
    one of its model (at most ``MAX_HOLD``), the peer up while any model sees it ONLINE; time in
    ``left_out`` (merged intervals: ``covered_intervals``) counts neither as up nor as observed."""
    by_model: dict[str, list[Observation]] = {}
    for o in sorted(observations, key=lambda o: o.at):
        by_model.setdefault(o.model, []).append(o)
    events: list[tuple[float, int, int]] = []  # (time, observed +-1, up +-1)
    for rows in by_model.values():
        for this, following in zip(rows, rows[1:] + [None]):
            end = min(following.at if following is not None else until, this.at + MAX_HOLD, until)
            start = max(this.at, since)
            if end > start:
                is_up = int(this.seen and this.state == ONLINE)
                events += [(start, 1, is_up), (end, -1, -is_up)]
    events.sort()
    up = observed = held = 0.0
    watching = upping = 0
    previous = None
    for at, d_watch, d_up in events:
        if previous is not None and at > previous and watching:
            inside = overlap(left_out, previous, at)
            observed += (at - previous) - inside
            held += inside
            if upping:
                up += (at - previous) - inside
        watching += d_watch
        upping += d_up
        previous = at
    return Uptime(up_seconds=up, observed_seconds=observed, maintenance_seconds=held)
