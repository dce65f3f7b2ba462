"""The monitor's routing view, fetched and checked (standard library only).

``GET <monitor>/api/v1/routing/<prefix>`` answers, per ONLINE server of the model, its span, the
seconds per token per block the monitor measured on it, its health score, whether it is failing,
wrong, slow, unreachable, and whether the monitor's operator blocked or pinned it. ``MonitorView``
keeps the newest good answer in memory for routing to ask at every route, refreshed on a thread of
its own (an ``ETag`` makes an unchanged view a ``304``).

Nothing is sent to the monitor but that GET. Everything that comes back is untrusted: a view
larger than ``MAX_BYTES``, slower than ``TIMEOUT`` in all, not JSON, of another model or version,
or with one entry out of its range (a peer id that is not one, a score outside 0–100, a speed that
is not a positive finite number of seconds) is refused whole; the last good view is kept for
``STALE_AFTER`` seconds, then routing goes back to petals' own. One warning per run of failures.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Mapping, Optional

from swarm_monitor_client.policy import NEUTRAL_SCORE, PeerWeight

logger = logging.getLogger("swarm_monitor_client")

VERSION = 1  # the view's format this client reads
FIRST_WAIT = 2.0  # seconds route_with waits for the first view at most (then petals' routing until it comes)
PERIOD = 10.0  # seconds between two fetches
TIMEOUT = 5.0  # seconds one fetch may take in all (a slow trickle is cut off)
STALE_AFTER = 300.0  # seconds the last good view is used while the monitor does not answer
MAX_BYTES = 4 << 20  # a view larger than this is refused (500 servers: ~120 kB)
MAX_PEERS = 20_000
MAX_SECONDS_PER_BLOCK = 3600.0
_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{20,128}$")  # base58 (a libp2p peer id)


class ViewError(ValueError):
    """A routing view that is refused; the message says why (shortly)."""


def view_url(monitor: str, prefix: str) -> str:
    """``<monitor>/api/v1/routing/<prefix>`` (``monitor``: the monitor's base URL)."""
    parts = urllib.parse.urlsplit(monitor)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the monitor's URL must be http(s)://host[:port], got {monitor[:100]!r}")
    return f"{monitor.rstrip('/')}/api/v1/routing/{urllib.parse.quote(prefix, safe='')}"


def _number(entry: dict, key: str, low: float, high: float, *, low_open: bool = False) -> Optional[float]:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or value > high or (low_open and value == low):
        raise ViewError(f"{key} out of range: {str(value)[:40]}")
    return float(value)


def parse_view(body: bytes, prefix: str) -> dict[str, PeerWeight]:
    """peer id -> ``PeerWeight`` from a view's body, or ``ViewError``."""
    if len(body) > MAX_BYTES:
        raise ViewError(f"larger than {MAX_BYTES} bytes")
    try:
        view = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ViewError(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(view, dict):
        raise ViewError("not a JSON object")
    if view.get("version") != VERSION:
        raise ViewError(f"version {str(view.get('version'))[:20]} (this client reads {VERSION})")
    if view.get("model") != prefix:
        raise ViewError(f"a view of {str(view.get('model'))[:60]!r}, not of {prefix!r}")
    peers = view.get("peers")
    if not isinstance(peers, list) or len(peers) > MAX_PEERS:
        raise ViewError(f"peers must be a list of at most {MAX_PEERS}")
    weights: dict[str, PeerWeight] = {}
    for entry in peers:
        if not isinstance(entry, dict):
            raise ViewError("a peer entry is not an object")
        peer = entry.get("peer_id")
        if not isinstance(peer, str) or not _PEER_ID.match(peer):
            raise ViewError(f"not a peer id: {str(peer)[:40]!r}")
        score = _number(entry, "score", 0.0, 100.0)
        seconds = _number(entry, "seconds_per_token_per_block", 0.0, MAX_SECONDS_PER_BLOCK, low_open=True)
        flags = {key: entry.get(key, False) for key in ("failing", "wrong", "unreachable", "slow", "blocked", "pinned",
                                                           "verified")}
        if not all(isinstance(flag, bool) for flag in flags.values()):
            raise ViewError("a flag is not true or false")
        if flags["failing"] or flags["wrong"] or flags["unreachable"]:
            score = 0.0
        policy = "blocked" if flags["blocked"] else "pinned" if flags["pinned"] else None
        weight = PeerWeight(score=NEUTRAL_SCORE if score is None else score,
                            seconds_per_token_per_block=seconds, policy=policy,
                            verified=flags["verified"] and not flags["wrong"])
        known = weights.get(peer)  # a peer serving two spans: the worse of what is said of it
        weights[peer] = weight if known is None or weight.score < known.score else known
    return weights


def fetch(url: str, etag: Optional[str], *, timeout: float = TIMEOUT,
          max_bytes: int = MAX_BYTES) -> tuple[Optional[bytes], Optional[str]]:
    """(body, its ETag) of one GET, or (None, etag) when the view is unchanged (304). Raises
    ``ViewError`` for an answer that is not a 200, too large, or not done within ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Accept": "application/json",
                                                   "User-Agent": "swarm-monitor-client"})
    if etag:
        request.add_header("If-None-Match", etag)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            chunks, size = [], 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ViewError(f"not answered within {timeout:g} s")
                sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
                if sock is not None:  # each read waits no longer than the time left (CPython's socket)
                    sock.settimeout(remaining)
                chunk = response.read1(min(65536, max_bytes + 1 - size))  # what came, not a full buffer
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise ViewError(f"larger than {max_bytes} bytes")
            return b"".join(chunks), response.headers.get("ETag")
    except urllib.error.HTTPError as e:
        if e.code == 304:
            return None, etag
        raise ViewError(f"HTTP {e.code}") from None
    except ViewError:
        raise
    except (OSError, ValueError) as e:  # refused, reset, timed out, a bad URL
        raise ViewError(f"{type(e).__name__}: {str(e)[:100]}") from None


class MonitorView:
    """The newest good routing view of one model, as a score source (``__call__``: peer id ->
    PeerWeight), refreshed every ``period`` seconds on a daemon thread."""

    def __init__(self, monitor: str, prefix: str, *, period: float = PERIOD, timeout: float = TIMEOUT,
                 stale_after: float = STALE_AFTER, clock=time.monotonic):
        self.url = view_url(monitor, prefix)
        self.prefix = prefix
        self.period, self.timeout, self.stale_after = period, timeout, stale_after
        self._clock = clock
        self._weights: Mapping[str, PeerWeight] = {}
        self._good_at: Optional[float] = None
        self._etag: Optional[str] = None
        self._failing = False
        self.fetches = self.failures = 0
        self.first = threading.Event()  # set once the first fetch ended (well or not)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __call__(self) -> Mapping[str, PeerWeight]:
        if self._good_at is not None and self._clock() - self._good_at > self.stale_after:
            return {}
        return self._weights

    def refresh(self) -> bool:
        """One fetch; True if the view at hand is good and fresh."""
        self.fetches += 1
        try:
            body, etag = fetch(self.url, self._etag if self._good_at is not None else None, timeout=self.timeout)
            if body is not None:
                self._weights = parse_view(body, self.prefix)
                self._etag = etag
            self._good_at = self._clock()
        except ViewError as e:
            self.failures += 1
            if not self._failing:
                logger.warning("swarm monitor's routing view %s not used (%s): %s", self.url, e,
                               "keeping the last one a while" if self._good_at is not None
                               else "petals' own routing until it answers")
            self._failing = True
            return False
        if self._failing:
            logger.info("swarm monitor's routing view %s is used again", self.url)
        self._failing = False
        return True

    def start(self, *, wait: float = FIRST_WAIT) -> "MonitorView":
        """Fetch on a thread; wait at most ``wait`` seconds for the first fetch."""
        def loop():
            try:
                self.refresh()
            finally:
                self.first.set()
            while not self._stop.wait(self.period):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="swarm-monitor-view", daemon=True)
        self._thread.start()
        self.first.wait(wait)
        return self

    def close(self) -> None:
        self._stop.set()
