"""The DHT edge: the process's DHT client (NAT traversal off, started whether or not the swarm
answers), validation of what peers announce (untrusted: every field bounded), the scrape and the
reachability checks.

Importing this package imports petals (and so torch): the web layer never does.
"""

from monitor.swarm.client import BootstrapUnreachable, DhtClient, start_dht
from monitor.swarm.reachability import check_bootstrap, check_servers, check_servers_confirmed
from monitor.swarm.scrape import scrape

__all__ = ["BootstrapUnreachable", "DhtClient", "start_dht", "scrape", "check_servers", "check_servers_confirmed",
           "check_bootstrap"]
