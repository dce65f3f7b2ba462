"""Time ranges from query strings (``?since=&until=``): unix seconds or ISO 8601, checked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Optional

from monitor.core.common import DAY

MAX_RANGE = 400 * DAY  # longer than any retention; beyond it a query is a mistake


class BadRange(ValueError):
    """A ``since``/``until`` the API cannot use; the message says which and why (HTTP 400)."""


@dataclass(frozen=True)
class TimeRange:
    since: float
    until: float


def parse_time(name: str, raw: str) -> float:
    """Unix seconds (``1700000000``, ``1700000000.5``) or ISO 8601 (``2024-05-01T12:00:00Z``;
    no zone means UTC)."""
    raw = raw.strip()
    if not raw:
        raise BadRange(f"{name} is empty; give unix seconds or an ISO 8601 time like 2024-05-01T12:00:00Z")
    try:
        value = float(raw)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise BadRange(
                f"{name}={raw!r} is neither unix seconds nor an ISO 8601 time like 2024-05-01T12:00:00Z"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise BadRange(f"{name}={raw!r} is not a time: give non-negative unix seconds")
    return value


def time_range(args: Mapping[str, str], now: float, *, default_seconds: float = DAY) -> TimeRange:
    """The ``since``/``until`` of a request; by default the last ``default_seconds`` until now."""
    until = parse_time("until", args["until"]) if args.get("until") is not None else now
    since = parse_time("since", args["since"]) if args.get("since") is not None else until - default_seconds
    if since >= until:
        raise BadRange(f"since ({since:.0f}) must be before until ({until:.0f})")
    if until - since > MAX_RANGE:
        raise BadRange(f"the range is {(until - since) / DAY:.0f} days; ask for at most {MAX_RANGE / DAY:.0f} days")
    return TimeRange(since, until)


WINDOWS = (1, 6, 24, 72, 168)  # the history windows a page offers, in hours


def window(hours: Optional[str], *, default: float = 24, allowed=WINDOWS) -> float:
    """A page's history window in hours (``?hours=``), one of a few choices."""
    if hours is None:
        return default
    try:
        value = float(hours)
    except ValueError:
        raise BadRange(f"hours={hours!r} is not a number; choose one of {', '.join(map(str, allowed))}") from None
    if value not in allowed:
        raise BadRange(f"hours={hours!r} is not offered; choose one of {', '.join(map(str, allowed))}")
    return value
