"""The process's DHT client, and the one way to run work inside it.

One DHT client per process: the poller's scrapes and reachability checks and the chat's petals client
share it.
Its work runs inside the DHT's own process (``DHT.run_coroutine``), which receives its arguments
through a pipe that hangs on large pickles: callers send small batches, parse there, and get back
compact plain tuples and dicts.

A monitor must start when the swarm is down (a reboot during an outage must leave it watching):
``DhtClient`` tries to start the DHT client once, and if no bootstrap peer answers, keeps trying
in the background with backoff (``retry_delay``) and says why meanwhile (``problem``: "cannot
reach any bootstrap peer (…), retrying"); whoever needs the DHT asks ``dht`` (None until then)
and hears of it once it is up (``on_up``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

from monitor import compat  # noqa: F401  (before hivemind/petals users)
from monitor.swarm.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs
from monitor.swarm.reaper import guard_dht_daemons

# Imported here, before any DHT process is forked, so the DHT child already has petals loaded
# and the reachability/scrape coroutines never stall its event loop on a multi-second import.
import petals.data_structures  # noqa: E402,F401
import petals.utils.dht  # noqa: E402,F401

log = logging.getLogger(__name__)

RETRY_FIRST = 2.0  # seconds before the first retry of a DHT client that did not start
RETRY_MAX = 60.0  # the longest wait between two retries
SHOWN_PEERS = 3  # bootstrap peers a problem names (the rest counted)


class BootstrapUnreachable(RuntimeError):
    """The DHT client could not start: no bootstrap peer answered (or the daemon failed); the
    message says which peers, for people."""


def start_dht(initial_peers: Sequence[str], *, client_mode: bool = True, startup_timeout: float = 60, **kwargs):
    """Start this process's DHT client, with NAT traversal and relays off.

    A client-mode peer listens on loopback only; it dials out to the initial peers it is given.
    """
    import hivemind

    start_shared_memory_manager_off_stderr()
    options: dict[str, Any] = dict(NO_NAT_TRAVERSAL)
    options.update(kwargs)
    options.setdefault("host_maddrs", loopback_maddrs())
    dht = hivemind.DHT(
        initial_peers=list(initial_peers),
        client_mode=client_mode,
        start=True,
        startup_timeout=startup_timeout,
        **options,
    )
    guard_dht_daemons(dht)
    return dht


_manager_lock = threading.Lock()
_manager_started = False


def start_shared_memory_manager_off_stderr() -> None:
    """Start torch's shared-memory manager for this process with its stderr on /dev/null.

    hivemind shares its futures' state through torch's ``file_system`` strategy, whose first
    shared tensor starts a ``torch_shm_manager`` process. That process inherits our stderr and
    outlives us by 2 s (it waits that long after its last client): whoever reads our output
    through a pipe (``swarm-monitor report 2>&1 | grep …``, a supervisor, a spec) waited
    those 2 s for the end of it after we had exited. Started here first, from a tensor shared
    while fd 2 points at /dev/null, it holds nothing of ours; the DHT's futures then use it. (The
    manager writes nothing but a fatal error, which its start reports to us anyway; a line another
    thread logs in the few milliseconds of the swap is lost.) Once per process."""
    global _manager_started
    import torch

    with _manager_lock:
        if _manager_started or torch.multiprocessing.get_sharing_strategy() != "file_system":
            return
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        saved = os.dup(2)
        try:
            os.dup2(devnull, 2)
            torch.empty(1).share_memory_()  # (the manager starts with the first shared tensor)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
        _manager_started = True


def retry_delay(attempts: int, first: float = RETRY_FIRST, longest: float = RETRY_MAX) -> float:
    """Seconds before the next start after ``attempts`` failed ones: first, 2×, 4× ... up to ``longest``."""
    return min(longest, first * 2 ** max(0, attempts - 1))


def peer_places(initial_peers: Sequence[str], shown: int = SHOWN_PEERS) -> str:
    """The bootstrap peers as people read them: ``host:port`` each (a ``/dns`` and an ``/ip4``
    address of the same peer both shown), the first ``shown`` and how many more."""
    places: list[str] = []
    for address in initial_peers:
        parts = address.split("/")
        host = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("ip4", "ip6", "dns", "dns4", "dns6")), None)
        port = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("tcp", "udp")), None)
        place = f"{host}:{port}" if host and port else address[:80]
        if place not in places:
            places.append(place)
    more = len(places) - shown
    return ", ".join(places[:shown]) + (f" and {more} more" if more > 0 else "")


def tcp_places(initial_peers: Sequence[str]) -> list[tuple[str, int]]:
    """The (host, port) of every TCP address among the bootstrap peers."""
    places = []
    for address in initial_peers:
        parts = address.split("/")
        host = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("ip4", "ip6", "dns", "dns4", "dns6")), None)
        port = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "tcp"), None)
        if host and port and port.isdigit():
            places.append((host, int(port)))
    return places


def none_accepts(places: Sequence[tuple[str, int]], timeout: float = 1.0) -> bool:
    """True when there are TCP places and not one accepts a connection within ``timeout`` s."""
    for host, port in places[:SHOWN_PEERS]:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return False
        except OSError:
            continue
    return bool(places)


def start_problem(initial_peers: Sequence[str], error: BaseException) -> str:
    """Why the DHT client did not start, in one line: no bootstrap peer answered (the usual case),
    or what the daemon said. The daemon does not always say it (it may exit with a routine log
    line last), so a daemon that failed is asked about once more: does any peer accept at all?"""
    text = " ".join(str(error).split())
    if "bootstrap" in text.lower() or "initial_peers" in text or (
            "Daemon failed to start" in text and none_accepts(tcp_places(initial_peers))):
        return f"cannot reach any bootstrap peer ({peer_places(initial_peers)})"
    return f"the DHT client did not start ({type(error).__name__}: {text[:200]})"


class DhtClient:
    """The process's DHT client, started whether or not the swarm answers: ``dht`` is the hivemind
    DHT once it is up (None before), ``problem`` says why not meanwhile."""

    def __init__(self, initial_peers: Sequence[str], *, retry_first: float = RETRY_FIRST,
                 retry_max: float = RETRY_MAX, **options):
        self.initial_peers = list(initial_peers)
        self.retry_first, self.retry_max = retry_first, retry_max
        self.options = options
        self.dht = None
        self.attempts = 0  # failed starts so far
        self.retry_at: Optional[float] = None  # when the next start is tried (unix time)
        self._error: Optional[str] = None
        self._listeners: list[Callable] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def up(self) -> bool:
        return self.dht is not None

    @property
    def problem(self) -> Optional[str]:
        """None once up; else "cannot reach any bootstrap peer (…), retrying" (the same words
        until something changes: the pages, /metrics and the alerts show them)."""
        if self.dht is not None:
            return None
        if self._error is None:
            return "the DHT client is starting"
        return self._error if self.retry_at is None else f"{self._error}, retrying"

    def start(self, *, retry: bool = True) -> "DhtClient":
        """Try to start the DHT client now; if that fails, keep trying in the background
        (``retry``), or raise ``BootstrapUnreachable`` (one line, for people)."""
        if self._attempt():
            return self
        if not retry:
            raise BootstrapUnreachable(self._error)
        self.retry_at = time.time() + retry_delay(self.attempts, self.retry_first, self.retry_max)
        log.warning("%s; retrying in the background, every %g s at most", self._error, self.retry_max)
        self._thread = threading.Thread(target=self._retry, name="dht-start", daemon=True)
        self._thread.start()
        return self

    def on_up(self, callback: Callable) -> None:
        """Call ``callback(dht)`` once the DHT client is up (now, if it is)."""
        with self._lock:
            if self.dht is None:
                self._listeners.append(callback)
                return
        callback(self.dht)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.dht is None and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.1)
        return self.dht is not None

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        with self._lock:
            dht, self.dht = self.dht, None
        if dht is not None:
            dht.shutdown()

    def _attempt(self) -> bool:
        try:
            dht = start_dht(self.initial_peers, **self.options)
        except Exception as e:  # noqa: BLE001 - hivemind's P2PDaemonError, a bootstrap that failed, ...
            self.attempts += 1
            self._error = start_problem(self.initial_peers, e)
            log.debug("the DHT client did not start", exc_info=True)
            return False
        with self._lock:
            if self._stop.is_set():
                dht.shutdown()
                return False
            self.dht, self.retry_at, self._error = dht, None, None
            listeners, self._listeners = self._listeners, []
        if self.attempts:
            log.info("the DHT client is up after %d failed start%s: a bootstrap peer answers", self.attempts,
                     "s" if self.attempts != 1 else "")
        for listener in listeners:
            try:
                listener(dht)
            except Exception:  # noqa: BLE001 - one listener's bug must not keep the others from hearing
                log.exception("a listener of the DHT client's start failed")
        return True

    def _retry(self) -> None:
        while not self._stop.wait(max(0.0, (self.retry_at or 0) - time.time())):
            if self._attempt():
                return
            wait = retry_delay(self.attempts, self.retry_first, self.retry_max)
            self.retry_at = time.time() + wait
            log.info("%s (attempt %d; the next in %.0f s)", self.problem, self.attempts, wait)


def submit(dht, coroutine) -> concurrent.futures.Future:
    """Start a coroutine in the DHT process; a dead DHT process gives a failed future, not a crash."""
    try:
        return dht.run_coroutine(coroutine, return_future=True)
    except Exception as e:  # noqa: BLE001 - e.g. BrokenPipeError after the DHT process died
        failed: concurrent.futures.Future = concurrent.futures.Future()
        failed.set_exception(RuntimeError(f"the DHT client process is not running ({e!r}); restart the monitor"))
        return failed
