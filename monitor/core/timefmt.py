"""Moments and durations as text: the one place that writes them, so every page, notice, report and
log line says a time in the same style (and a spec keeps it so: ``tests/test_timefmt.py``).

Every moment is unix seconds, shown in UTC (the pages say "Times are UTC"):

- ``utc(at)`` "2026-12-05 14:03:07 UTC"; ``utc(at, seconds=False)`` "2026-12-05 14:03 UTC";
  ``utc(at, zone=False)`` "2026-12-05 14:03:07" (the text plotly reads on a date axis);
- ``date(at)`` "2026-12-05", ``clock(at)`` "14:03", ``short(at)`` "12-05 14:03" (tight lists on a
  page that already says its times are UTC);
- ``iso(at)`` "2026-12-05T14:03:07Z" (RFC 3339: the Atom feed; ``milliseconds=True`` for Alertmanager).

A length of time (``duration``) and the time since a moment (``ago``) share one choice of unit — ms
below a second, s below 2 min, min below 2 h, h below 2 d, d beyond — so 90 s stays "90 s" rather
than a rounded "2 min" (a setting reads back as it was typed). ``duration`` keeps one decimal below
10 of a unit ("4.2 s", "1.5 h"), ``ago`` whole units ("3 h ago": it moves on with every refresh).

Pure: the standard library only.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Optional

NONE = "—"  # a moment or duration that is not known

# (unit, its seconds, use it from this many seconds on): largest first
_UNITS = (("d", 86400.0, 2 * 86400.0), ("h", 3600.0, 2 * 3600.0), ("min", 60.0, 2 * 60.0), ("s", 1.0, 0.0))


def _moment(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=timezone.utc)


def utc(at: Optional[float], *, seconds: bool = True, zone: bool = True) -> str:
    """``2026-12-05 14:03:07 UTC``; without ``seconds`` ``2026-12-05 14:03 UTC``; without ``zone``
    the bare text (plotly's date axis); ``—`` for None."""
    if at is None:
        return NONE
    text = _moment(at).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return f"{text} UTC" if zone else text


def date(at: float) -> str:
    """``2026-12-05``: the UTC day."""
    return _moment(at).strftime("%Y-%m-%d")


def clock(at: float) -> str:
    """``14:03``: the UTC time of day, to the minute."""
    return _moment(at).strftime("%H:%M")


def short(at: float) -> str:
    """``12-05 14:03``: month, day and clock, for lists whose page says its times are UTC."""
    return _moment(at).strftime("%m-%d %H:%M")


def iso(at: float, *, milliseconds: bool = False) -> str:
    """RFC 3339 in UTC: ``2026-12-05T14:03:07Z`` (``…07.250Z`` with ``milliseconds``), what
    machines read (Atom's ``updated``, Alertmanager's ``startsAt``)."""
    text = _moment(at).isoformat(timespec="milliseconds" if milliseconds else "seconds")
    return text.replace("+00:00", "Z")


def _unit(seconds: float) -> tuple[float, str]:
    """``seconds`` (≥ 0) in the unit this module shows it in: (how many, unit)."""
    for name, size, start in _UNITS:
        if seconds >= start:
            return seconds / size, name
    raise AssertionError("unreachable: the last unit starts at 0")


def duration(seconds: Optional[float]) -> str:
    """``120 ms``, ``4.2 s``, ``42 s``, ``2.5 min``, ``45 min``, ``1.5 h``, ``36 h``, ``3 d``; ``0 s``
    for nothing, ``—`` for None or a non-finite value. A negative one counts as 0."""
    if seconds is None or not math.isfinite(seconds):
        return NONE
    seconds = max(0.0, float(seconds))
    value, unit = (seconds * 1000, "ms") if 0 < seconds < 1 else _unit(seconds)
    text = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
    return f"{text} {unit}"


def ago(at: Optional[float], now: float) -> str:
    """``42 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago`` (whole units); ``never`` for None. A
    moment after ``now`` (another host's clock) is ``0 s ago``."""
    if at is None:
        return "never"
    value, unit = _unit(max(0.0, now - at))
    return f"{value:.0f} {unit} ago"
