"""The options every hivemind DHT/P2P we start must carry.

hivemind's p2pd tries UPnP/NAT-PMP port mapping, AutoNAT and relays by default, which sends
traffic off this machine. The monitor, the chat client, the bootstrap peer and every demo or test
server start their DHT with these options, so nothing we run does NAT traversal.
"""

from __future__ import annotations

NO_NAT_TRAVERSAL = {
    "nat_port_map": False,
    "auto_nat": False,
    "use_relay": False,
    "use_auto_relay": False,
}

LOOPBACK_HOST = "127.0.0.1"


def loopback_maddrs(port: int = 0) -> list[str]:
    """Listen addresses on loopback only (port 0 picks a free port)."""
    return [f"/ip4/{LOOPBACK_HOST}/tcp/{port}"]
