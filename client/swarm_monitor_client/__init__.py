"""Route your own petals client like the swarm monitor's chat.

    from petals import AutoDistributedModelForCausalLM
    from swarm_monitor_client import route_with

    model = AutoDistributedModelForCausalLM.from_pretrained(name, initial_peers=peers)
    route_with(model, "http://monitor.example:5000")

``route_with`` reads the monitor's routing view of the model (``view``) and routes petals' inference
sessions and forward passes by it (``routing``, ``policy``): servers the monitor finds failing,
computing wrong outputs or not answering are left out wherever others cover their blocks, measured
speeds replace announced ones, and blocks are never left without a server. It sends the monitor
nothing but a GET of that view, and never explores servers the monitor has not measured.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from swarm_monitor_client.policy import PeerWeight, RoutingSettings
from swarm_monitor_client.view import FIRST_WAIT, PERIOD, MonitorView

__version__ = "0.1.0"
__all__ = ["route_with", "MonitorView", "PeerWeight", "RoutingSettings"]

logger = logging.getLogger("swarm_monitor_client")

CLIENT_ROUTING = RoutingSettings(mode="health", explore=False)  # the chat's policy, without exploring


def route_with(model: Any, monitor: str, *, prefix: Optional[str] = None, period: float = PERIOD,
               wait: float = FIRST_WAIT, routing: RoutingSettings = CLIENT_ROUTING) -> Optional[MonitorView]:
    """Route ``model`` (a petals model, or its ``RemoteSequential``) by the routing view of the
    monitor at ``monitor`` (its base URL, e.g. ``http://monitor.example:5000``).

    Waits at most ``wait`` seconds for the first view, then refreshes it every ``period`` seconds
    on a daemon thread. Returns the ``MonitorView`` (``close()`` stops it), or None when nothing was
    changed: this petals' sequence manager is not one ``route_with`` supports, or the model has no
    remote blocks (a warning says which). Never raises for the monitor being down or wrong."""
    from swarm_monitor_client import routing as seams  # petals, imported only when routing is asked for

    managers = seams.sequence_managers(model)
    if not managers:
        logger.warning("route_with: %s has no petals sequence manager; routing left as it is", type(model).__name__)
        return None
    unsupported = sorted({type(m).__name__ for m in managers if not seams.supported(type(m))})
    if unsupported:
        logger.warning("route_with: this petals' sequence manager (%s) lacks %s; routing left as it is",
                       ", ".join(unsupported), " and ".join(seams.OVERRIDDEN))
        return None
    prefix = prefix or seams.model_prefix(model)
    if not prefix:
        logger.warning("route_with: the model's config has no dht_prefix; pass prefix=...; routing left as it is")
        return None
    view = MonitorView(monitor, prefix, period=period)
    for manager in managers:
        manager.__class__ = seams.routed_class(type(manager), view, routing)
        manager.ping_first_servers()  # (made before: its __init__ did not)
        if manager.ready.is_set():  # it has a view of the swarm already: refresh it with those pings
            manager.update(wait=False)
    return view.start(wait=wait)
