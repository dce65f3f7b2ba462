"""The benchmarks' swarm simulator announces what petals servers announce: the monitor's scrape reads
every virtual server back as a valid row, and a virtual server with a responder answers reachability
checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.harness.local_swarm import LocalSwarm
from monitor.swarm import check_servers, scrape, start_dht

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from simulate_swarm import SimulatedSwarm  # noqa: E402

pytestmark = pytest.mark.swarm  # a real bootstrap peer and DHT, announcing virtual servers


def test_simulated_swarm_is_scraped_as_valid_servers(tmp_path):
    with LocalSwarm(Path("unused"), "unused", workdir=tmp_path) as bootstrap:
        bootstrap.start_bootstrap()
        with SimulatedSwarm(bootstrap.initial_peers, servers=40, models=2, responders=1, update_period=30) as sim:
            dht = start_dht(bootstrap.initial_peers)
            try:
                snapshot = scrape(dht, [], discover=True)
                answering = sim.peer_ids("answering")
                checks = check_servers(dht, answering + sim.peer_ids("unreachable")[:1], timeout=5)
            finally:
                dht.shutdown()

    assert snapshot.invalid_records == 0 and snapshot.errors == ()
    assert {(m.dht_prefix, m.num_blocks) for m in snapshot.models} == {(m.dht_prefix, m.num_blocks) for m in sim.models}
    announced = {(s.peer_id, s.model, s.start, s.end, s.info["state"], s.info["throughput"]) for s in sim.servers}
    scraped = {(r.peer_id, r.model, r.start, r.end, r.state, r.throughput) for r in snapshot.servers}
    assert scraped == announced
    assert {"ONLINE", "JOINING"} <= {r.state for r in snapshot.servers}
    assert any(r.next_pings for r in snapshot.servers)
    assert [c.ok for c in checks.results] == [True, False]
