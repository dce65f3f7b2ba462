"""Specs of the reachability checks: servers and bootstrap peers are asked directly whether they
answer (not probes: those run inference, ``test_speed_probes.py``).

Checks run concurrently with a per-peer timeout, so N peers that do not answer cost about one
timeout, not N; and they are separate from the scrape, which a dead server does not slow down.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from contextlib import ExitStack

from monitor.harness.local_swarm import ServerSpec
from monitor.core.snapshot import ModelInfo
from monitor.swarm import check_bootstrap, check_servers, scrape
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import random_peer_id

TINY = ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS, official=True)
SERVERS = ("first-half", "second-half", "full")


def test_every_server_of_the_session_swarm_answers_its_rpc_info(swarm):
    peers = [swarm.peer_id(name) for name in SERVERS]
    batch = check_servers(swarm.dht, peers, timeout=5, concurrency=8)

    assert [r.peer_id for r in batch.results] == peers
    for result in batch.results:
        assert result.ok and result.kind == "server" and result.error is None and not result.joining
        assert 0 < result.rtt < 5
    assert batch.duration > 0


def test_a_peer_up_without_the_petals_handler_counts_as_joining_not_unreachable(swarm):
    # The bootstrap peer runs a DHT but no TransformerConnectionHandler, like a server still
    # loading its blocks: libp2p answers "protocol not supported".
    bootstrap_peer = swarm.bootstrap.info["peer_id"]
    [result] = check_servers(swarm.dht, [bootstrap_peer], timeout=5, concurrency=1).results
    assert result.joining and not result.ok and result.error


def test_peer_ids_without_a_live_process_fail_together_within_the_timeout(swarm):
    nobody = [random_peer_id() for _ in range(40)]
    alive = swarm.peer_id("full")

    batch = check_servers(swarm.dht, [*nobody, alive, "not a peer id"], timeout=2, concurrency=16)

    results = {r.peer_id: r for r in batch.results}
    assert results[alive].ok
    assert all(not results[p].ok and results[p].error for p in nobody)
    assert not results["not a peer id"].ok and "peer id" in results["not a peer id"].error
    assert batch.duration < 2 * 3 + 2  # 41 peers at 16 at once: at most 3 rounds of the timeout


def test_the_bootstrap_peer_answers_a_connect_check(swarm):
    [result] = check_bootstrap(swarm.dht, swarm.initial_peers, timeout=5)
    assert (result.kind, result.ok, result.address) == ("bootstrap", True, swarm.initial_peers[0])
    assert result.peer_id == swarm.bootstrap.info["peer_id"] and 0 < result.rtt < 5


def test_silent_bootstrap_addresses_cost_one_timeout_together(swarm):
    with ExitStack() as stack:
        silent = []  # TCP accepts (kernel backlog) but nothing ever answers the libp2p handshake
        for _ in range(6):
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            silent.append(f"/ip4/127.0.0.1/tcp/{listener.getsockname()[1]}/p2p/{random_peer_id()}")
        addresses = [*silent, "/ip4/127.0.0.1/tcp/1", *swarm.initial_peers]

        started = time.perf_counter()
        results = check_bootstrap(swarm.dht, addresses, timeout=2)
        elapsed = time.perf_counter() - started

    assert [r.address for r in results] == addresses
    assert [r.ok for r in results] == [False] * 7 + [True]
    assert all("2 s" in r.error for r in results[:6])
    assert "/p2p/" in results[6].error
    assert 1.5 < elapsed < 2 + 2  # all six waited out their timeout, at the same time


def test_killed_and_hung_servers_fail_their_check_within_the_timeout_while_the_scrape_goes_on(make_swarm):
    s = make_swarm([ServerSpec("killed", 0, TINY_NUM_BLOCKS), ServerSpec("hung", 0, TINY_NUM_BLOCKS),
                    ServerSpec("alive", 0, TINY_NUM_BLOCKS)])
    killed, hung, alive = (s.peer_id(name) for name in ("killed", "hung", "alive"))
    assert all(r.ok for r in check_servers(s.dht, [killed, hung, alive], timeout=5, concurrency=4).results)

    s.kill("killed")
    batch = check_servers(s.dht, [killed, alive], timeout=3, concurrency=4)
    results = {r.peer_id: r for r in batch.results}
    assert results[alive].ok
    assert not results[killed].ok and results[killed].error
    assert batch.duration < 3 + 2
    started = time.perf_counter()
    snapshot = scrape(s.dht, [TINY], discover=False)
    assert time.perf_counter() - started < 2, "a dead server must not slow the scrape"
    assert s.peer_id("alive") in {r.peer_id for r in snapshot.servers}

    os.killpg(s.pid("hung"), signal.SIGSTOP)  # the server, its handlers and its p2pd stop answering
    try:
        batch = check_servers(s.dht, [killed, hung, alive], timeout=3, concurrency=4)
        results = {r.peer_id: r for r in batch.results}
        assert results[alive].ok
        assert not results[killed].ok and results[killed].error
        assert not results[hung].ok and "3 s" in results[hung].error
        assert batch.duration < 3 + 2

        # A hung DHT node delays a DHT lookup by hivemind's per-request wait_timeout (3 s), once:
        # then it leaves the routing table. (What the lookup finds while the swarm re-replicates
        # is the DHT's business: petals' own get_remote_module_infos sees the same.)
        started = time.perf_counter()
        scrape(s.dht, [TINY], discover=False)
        assert time.perf_counter() - started < 3 * 2 + 2
    finally:
        os.killpg(s.pid("hung"), signal.SIGCONT)
