"""The load this chat process puts on each server (pure: a lock, no petals): which requests are in
flight through it now, and what that makes it cost a new route.

Every petals inference session the chat opens counts once on each server of its route from the
moment the route is chosen until it closes (``chat.sequence``: chosen and counted at once, one
chooser at a time, so requests that arrive together see each other's routes; moved with a
fail-over, left when it closes). Routing multiplies a server's compute edges by ``factor``: ``1 + LOAD_WEIGHT`` per
request in flight through it — a server computing for n requests gives each about 1/(n+1) of its
time — and up to ``2×`` more as the session room its announced ``cache_tokens_left`` leaves
(``monitor.core.snapshot.session_room``) nears what the new session needs.
So concurrent requests spread over routes of like speed, and a server far faster than the others
still takes more of them. Counted per chat process (each gunicorn worker counts its own), as the
generation slots are.

A request that names its servers (``petals.only``) is *directed*: at most ``directed_limit`` such
requests run through one server at a time, whoever sends them (``directed_full``), so a list of
peers cannot aim everyone's load at one victim.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

from swarm_monitor_client.policy import covers

LOAD_WEIGHT = 1.0  # added to a server's cost factor per request in flight through it
CACHE_SLACK = 4  # below this many times the tokens a session needs, a server's cache left costs more
FULL_FACTOR = 4.0  # a server that just refused a session for want of cache room costs this many times more
FULL_COOL = 10.0  # seconds it costs more after such a refusal


def cache_factor(room: Optional[int], needed: Optional[int]) -> float:
    """1 while the server has room (``session_room``) for ``CACHE_SLACK`` sessions like this one (or
    announces nothing); up to 2 as its room falls to one session's."""
    if room is None or not needed or needed <= 0:
        return 1.0
    share = room / (CACHE_SLACK * needed)
    return 1.0 + max(0.0, min(1.0, 1.0 - share))


@dataclass(frozen=True)
class OthersLoad:
    """What the other chat workers put on each server, as their newest published records say
    (``chat.shared_load``): requests in flight, directed ones, and the servers that refused one of
    them a session for want of cache room (peer -> how many seconds ago, when it was read)."""

    in_flight: Mapping[str, int] = field(default_factory=dict)
    directed: Mapping[str, int] = field(default_factory=dict)
    full_ago: Mapping[str, float] = field(default_factory=dict)
    read_at: float = 0.0  # (the clock of ``ServerLoad``) when it was read: full_ago ages from then


NOBODY_ELSE = OthersLoad()


class ServerLoad:
    """Requests in flight through each server (peer id), and the directed ones among them — this
    worker's own, plus the other workers' (``others``: their newest published load, read by
    ``chat.shared_load.SharedLedger`` in the background; never a network call here)."""

    def __init__(self, directed_limit: int = 2, clock: Callable[[], float] = time.monotonic):
        self.directed_limit = max(1, directed_limit)
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight: Counter = Counter()
        self._directed: Counter = Counter()
        self._full: dict[str, float] = {}  # peer -> when it last refused a session for want of cache room
        self.others: Callable[[], OthersLoad] = lambda: NOBODY_ELSE

    def now(self) -> float:
        """This load's clock (``OthersLoad.read_at`` is on it)."""
        return self._clock()

    def own(self) -> dict:
        """This worker's own load, as it publishes it: in flight, directed, and the servers full
        lately (peer -> seconds since they refused)."""
        with self._lock:
            now = self._clock()
            return {"in_flight": dict(self._in_flight), "directed": dict(self._directed),
                    "full_ago": {p: now - t for p, t in self._full.items() if now - t < FULL_COOL}}

    def _with_others(self) -> tuple[Counter, Counter, set[str]]:
        """In flight, directed and full-lately over every worker (under the lock)."""
        others, now = self.others(), self._clock()
        counts, directed = Counter(self._in_flight), Counter(self._directed)
        counts.update(others.in_flight)
        directed.update(others.directed)
        full = {peer for peer, at in self._full.items() if now - at < FULL_COOL}
        full |= {peer for peer, ago in others.full_ago.items() if ago + (now - others.read_at) < FULL_COOL}
        return counts, directed, full

    def enter(self, peers: Iterable[str], *, directed: bool = False) -> None:
        with self._lock:
            for peer in peers:
                self._in_flight[peer] += 1
                if directed:
                    self._directed[peer] += 1

    def leave(self, peers: Iterable[str], *, directed: bool = False) -> None:
        with self._lock:
            for peer in peers:
                for counter in (self._in_flight, self._directed) if directed else (self._in_flight,):
                    counter[peer] -= 1
                    if counter[peer] <= 0:
                        del counter[peer]

    def in_flight(self) -> dict[str, int]:
        """Requests in flight through each server, every worker's."""
        with self._lock:
            return dict(self._with_others()[0])

    def directed_full(self, peers: Iterable[str]) -> bool:
        """Every one of ``peers`` already runs ``directed_limit`` directed requests (every worker's)."""
        peers = list(peers)
        with self._lock:
            directed = self._with_others()[1]
            return bool(peers) and all(directed[peer] >= self.directed_limit for peer in peers)

    def full(self, peer: str) -> None:
        """``peer`` just refused a session for want of attention-cache room
        (``monitor.core.common.cache_full``): for ``FULL_COOL`` seconds it costs ``FULL_FACTOR``
        times more, so routes go around it where they can, and still through it where it is the
        only server of its blocks."""
        with self._lock:
            now = self._clock()
            self._full = {p: t for p, t in self._full.items() if now - t < FULL_COOL}
            self._full[peer] = now

    def factors(self, rooms: Mapping[str, Optional[int]], needed: Optional[int]) -> dict[str, float]:
        """peer -> its cost factor now, for the peers of ``rooms`` (each one's ``session_room`` for
        its span of the route; None where it announces nothing), for a session of ``needed`` tokens."""
        with self._lock:
            counts, _, full = self._with_others()
        return {peer: (1.0 + LOAD_WEIGHT * counts.get(peer, 0)) * cache_factor(left, needed)
                * (FULL_FACTOR if peer in full else 1.0)
                for peer, left in rooms.items()}


# ---- the longest session each server accepts ------------------------------------------------------

REFUSED_LENGTH = re.compile(r"Cannot allocate KV cache for (\d+) tokens, max = (\d+)")  # petals' server's words


def refused_length(error: object) -> Optional[int]:
    """The longest session a server said it accepts, when ``error`` is its refusal of a longer one
    (petals servers refuse sessions beyond their ``inference_max_length`` — 2048 tokens by default,
    8192 with grouped-query attention — and do not announce it)."""
    found = REFUSED_LENGTH.search(str(error))
    return int(found.group(2)) if found else None


class ServerLimits:
    """The longest session each server accepts, as learned from its refusals (per chat process)."""

    MAX_KNOWN = 10_000  # servers remembered at most

    def __init__(self):
        self._lock = threading.Lock()
        self._max: dict[str, int] = {}

    def learn(self, peer: str, max_length: int) -> None:
        with self._lock:
            if peer in self._max or len(self._max) < self.MAX_KNOWN:
                self._max[peer] = max(0, int(max_length))

    def known(self) -> dict[str, int]:
        with self._lock:
            return dict(self._max)

    def too_short(self, peers: Iterable[str], length: int) -> set[str]:
        """Of ``peers``, those known to refuse a session of ``length`` tokens."""
        known = self.known()
        return {peer for peer in peers if peer in known and known[peer] < length}

    def longest(self, spans: Mapping[str, tuple[int, int]], num_blocks: int) -> Optional[int]:
        """The longest session some route over ``spans`` accepts, as far as refusals tell (None: no
        server refused anything: the servers' own limits are unknown, up to the model's context)."""
        known = {peer: limit for peer, limit in self.known().items() if peer in spans}
        if not known or covers([span for peer, span in spans.items() if peer not in known], 0, num_blocks):
            return None  # a route of servers that never refused: their limits are their own
        for length in sorted(set(known.values()), reverse=True):
            if covers([span for peer, span in spans.items() if known.get(peer, length) >= length], 0, num_blocks):
                return length
        return 0
