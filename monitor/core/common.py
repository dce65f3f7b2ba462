"""Small helpers every layer uses, so each exists once: time constants, the short peer id,
JSON-safe values, short error text (and a remote peer's own error out of hivemind's wrapping), and
the "poller is stale" rule. Moments and durations as text are ``timefmt``'s.

Pure: no I/O, no petals.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
WEEK = 7 * DAY

# The poller counts as stale (stopped or failing) after this many scrape periods without a stored poll.
STALE_PERIODS = 3

ERROR_CHARS = 200  # short error text is cut to this


def short_peer_id(peer_id: Optional[str]) -> str:
    """``…`` and the last 6 characters, as health.petals.dev shows peers; ``—`` for none."""
    return f"…{peer_id[-6:]}" if peer_id else "—"


def jsonable(value: Any) -> Any:
    """Tuples become lists, mapping keys strings, non-finite floats ``None``: what strict JSON
    (PostgreSQL's json type, browsers' ``JSON.parse``) accepts."""
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def finite(value: Optional[float]) -> Optional[float]:
    """The value if it is a finite number, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def short_error(error: Any, limit: int = ERROR_CHARS) -> str:
    """One line of at most ``limit`` characters saying what failed: ``Type: message`` for an
    exception, the first line of a string. For logs and operators, never for anonymous clients."""
    if error is None:
        return "failed"
    if isinstance(error, BaseException):
        message = str(error).strip()
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    else:
        text = str(error)
    text = " ".join((text.strip().splitlines() or ["failed"])[0].split()) or "failed"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_stale(last_poll_at: Optional[float], now: float, scrape_period: float) -> bool:
    """True when no poll was stored for ``STALE_PERIODS`` scrape periods (or ever)."""
    return last_poll_at is None or now - last_poll_at > STALE_PERIODS * scrape_period


# petals' server's words when its attention cache has no room for a session *now* (its caches hold
# other sessions; server/memory_cache.py): "… bytes immediately: out of memory", "… (timeout=…)",
# "… within … seconds", "… cache is full, …". Not "Could not allocate N bytes, max cache size = M
# bytes": that session never fits that server.
_CACHE_FULL = re.compile(r"Could not allocate \d+ (?:bytes immediately|\(timeout=|within )|attention cache is full")


def cache_full(error: Any) -> bool:
    """``error`` is a server's refusal of a session for want of attention-cache room now: the
    server is **busy**, not failing — its other sessions hold the room, and it serves them."""
    return error is not None and bool(_CACHE_FULL.search(str(error)))


_REMOTE_ERROR = re.compile(r"Failed to call handler `[^`]*` at \S+?: ")


def remote_error(error: Any) -> Optional[str]:
    """What a remote peer's handler said when it raised, out of hivemind's wrapping ("Failed to
    call handler `X` at PEER: <the peer's own message>"), stripped to one short line; None when
    ``error`` is not such an error (a timeout, a refused connection, our own failure)."""
    text = str(error) if error is not None else ""
    found = _REMOTE_ERROR.search(text)
    if found is None:
        return None
    return short_error(text[found.end():]) if text[found.end():].strip() else "the peer answered with an error"

