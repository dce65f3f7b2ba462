"""The process's DHT client, and the one way to run work inside it.

One DHT client per process: the poller's scrapes and probes and the chat's petals client share it.
Its work runs inside the DHT's own process (``DHT.run_coroutine``), which receives its arguments
through a pipe that hangs on large pickles: callers send small batches, parse there, and get back
compact plain tuples and dicts.
"""

from __future__ import annotations

import concurrent.futures
from typing import Sequence

from monitor import compat  # noqa: F401  (before hivemind/petals users)
from monitor.swarm.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs
from monitor.swarm.reaper import guard_dht_daemons

# Imported here, before any DHT process is forked, so the DHT child already has petals loaded
# and the probe/scrape coroutines never stall its event loop on a multi-second import.
import petals.data_structures  # noqa: E402,F401
import petals.utils.dht  # noqa: E402,F401


def start_dht(initial_peers: Sequence[str], *, client_mode: bool = True, startup_timeout: float = 60, **kwargs):
    """Start this process's DHT client, with NAT traversal and relays off.

    A client-mode peer listens on loopback only; it dials out to the initial peers it is given.
    """
    import hivemind

    options = dict(NO_NAT_TRAVERSAL)
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


def submit(dht, coroutine) -> concurrent.futures.Future:
    """Start a coroutine in the DHT process; a dead DHT process gives a failed future, not a crash."""
    try:
        return dht.run_coroutine(coroutine, return_future=True)
    except Exception as e:  # noqa: BLE001 - e.g. BrokenPipeError after the DHT process died
        failed = concurrent.futures.Future()
        failed.set_exception(RuntimeError(f"the DHT client process is not running ({e!r}); restart the monitor"))
        return failed
