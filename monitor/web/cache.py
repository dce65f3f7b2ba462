"""What a web app keeps between requests: one ``WebCache`` per app, made by ``create_app``.

A page refreshes every few seconds and a poll lands every minute, so the web reads the store once
per change and reuses what it derived until the next one. Everything kept lives here, in the app's
own ``WebCache`` and nowhere else (no module keeps anything): two apps in one process — tests,
benchmarks, a chat and a dashboard over different stores — never see each other's entries, even
when their stores' change marks are alike. Each entry is keyed by what it depends on:

- ``latest``: the latest state read (``queries.current``), reused while the store's change marks
  (``Store.change_marks``) and the thresholds it was diagnosed with hold; while the database is
  away, the last state read, marked unavailable. What is derived from one state (the state
  document, charts) is kept by that state itself (``queries.Current.derive``).
- ``pages``: what a page derives from the store beyond the latest state (a peer's history, its
  history API answer), keyed by the change marks and the page's own key (its minute, its range).
- ``live``: what is rendered "now" and shared by every visitor (the "my server" report, the peer
  page's live parts), keyed by the change marks, ``LIVE_SECONDS`` and the page's own key (for
  HTML, the request's script root too: ``peer_view.rendered``); apart from ``pages`` so that it never pushes out the histories.
- ``reachability``: live reachability checks per peer, for ``REACHABILITY_SECONDS``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar

from monitor.store import StoreError

T = TypeVar("T")

MAX_ENTRIES = 256  # pages kept per app and cache (each a few tens of kB)
LIVE_SECONDS = 10  # what is rendered "now" (ages, the report) is reused this long at most
REACHABILITY_SECONDS = 60.0  # a live check of one peer answers every visitor this long


class Lru:
    """A bounded LRU of computed values; one computation per key at a time (single flight):
    concurrent requests for the same page wait for one computation instead of all doing it."""

    def __init__(self, size: int = MAX_ENTRIES):
        self.size = size
        self._values: OrderedDict = OrderedDict()
        self._running: dict[Any, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, key, compute: Callable[[], T]) -> T:
        while True:
            with self._lock:
                if key in self._values:
                    self._values.move_to_end(key)
                    return self._values[key]
                running = self._running.get(key)
                if running is None:
                    running = self._running[key] = threading.Event()
                    break
            running.wait(30)
        try:
            value = compute()
            with self._lock:
                self._values[key] = value
                while len(self._values) > self.size:
                    self._values.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._running.pop(key, None)
            running.set()


class Expiring:
    """Values kept ``seconds`` after they were computed (monotonic clock); a failed computation
    keeps nothing."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._values: dict[Any, tuple[float, Any]] = {}  # key -> (computed at, value)
        self._lock = threading.Lock()

    def get(self, key, compute: Callable[[], T]) -> T:
        now = self._clock()
        with self._lock:
            for stale in [k for k, (at, _) in self._values.items() if now - at > self.seconds]:
                del self._values[stale]
            if key in self._values:
                return self._values[key][1]
        value = compute()
        with self._lock:
            self._values[key] = (now, value)
        return value


class Latest(Generic[T]):
    """The latest value read from the store, reused while its key and the store's change marks hold;
    while the store fails, the last value read (``stale(value, error)``: how to say it is stale)."""

    def __init__(self):
        self._last: Optional[tuple[tuple, T]] = None  # ((key, marks), value); replaced whole

    def get(self, key, marks: Callable[[], tuple], read: Callable[[tuple], T],
            stale: Callable[[T, StoreError], T]) -> T:
        last = self._last
        try:
            now = marks()
            if last is not None and last[0] == (key, now):
                return last[1]
            value = read(now)
        except StoreError as e:
            if last is None:
                raise
            return stale(last[1], e)
        self._last = ((key, now), value)
        return value


@dataclass
class WebCache:
    """Every cache of one web app (see the module's docstring for what each keeps, keyed by what)."""

    latest: Latest = field(default_factory=Latest)
    pages: Lru = field(default_factory=Lru)
    live: Lru = field(default_factory=Lru)
    reachability: Expiring = field(default_factory=lambda: Expiring(REACHABILITY_SECONDS))

    def page(self, marks: tuple, key: tuple, compute: Callable[[], T]) -> T:
        """``compute()`` once per store state (``marks``) and ``key``; callers must not mutate it."""
        return self.pages.get((marks, key), compute)

    def now(self, marks: tuple, now: float, key: tuple, compute: Callable[[], T]) -> T:
        """``compute()`` once per store state (``marks``), ``key`` and ``LIVE_SECONDS``."""
        return self.live.get((marks, int(now // LIVE_SECONDS), key), compute)
