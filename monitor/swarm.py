"""I/O with the swarm: the process's DHT client, the scrape and the probes."""

from __future__ import annotations

from typing import Sequence

from monitor import compat  # noqa: F401  (before hivemind/petals users)
from monitor.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs
from monitor.reaper import guard_dht_daemons


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
