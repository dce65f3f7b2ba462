"""Reachability checks: ask servers (rpc_info) and bootstrap peers (connect + DHT ping) directly
whether they answer. (Not probes: a probe runs real inference through a server's span,
``monitor.swarm.speed``.)

Separate from the scrape, so a peer that does not answer can slow a batch of checks (bounded by its
timeout) but never a scrape. Calls carry small batches of peer ids into the DHT process and bring
back plain tuples.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from functools import partial
from typing import Optional, Sequence

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.common import short_error
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, confirmed, to_confirm
from monitor.swarm.announce import MAX_RAW_TEXT_CHARS, MAX_TEXT_CHARS, InvalidRecord, clean_text, parse_peer_id
from monitor.swarm.client import submit

REACHABILITY_BATCH_PEERS = 48  # peers per DHT call: its pickle stays under PIPE_BUF (4 KB), an atomic write

# p2pd's answer when the peer is up but has no rpc_info handler (yet): "protocol not supported",
# or in newer daemons "failed to negotiate protocol: protocols not supported: [...]"
_NOT_SERVED = re.compile(r"protocols? not supported")

_REACHABILITY_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def _error_text(error: BaseException) -> str:
    """A peer's error message as safe, short text (it may carry what the peer sent)."""
    return clean_text(short_error(str(error)[:MAX_RAW_TEXT_CHARS] or repr(error))) or "error"


def _reachability_semaphore(concurrency: int) -> asyncio.Semaphore:
    """One semaphore per DHT event loop, shared by all the batches of checks in flight, so that
    at most ``concurrency`` checks run at once whatever the batching (lives in the DHT process)."""
    key = (id(asyncio.get_running_loop()), concurrency)
    if key not in _REACHABILITY_SEMAPHORES:
        _REACHABILITY_SEMAPHORES[key] = asyncio.Semaphore(concurrency)
    return _REACHABILITY_SEMAPHORES[key]


async def _check_servers(dht, node, peer_ids: list[str], timeout: float, concurrency: int) -> list[tuple]:
    """rpc_info on each peer, at most `concurrency` at once -> [(peer, ok, rtt, error, joining)]."""
    from hivemind.p2p import PeerID
    from hivemind.proto import runtime_pb2
    from petals.server.handler import TransformerConnectionHandler

    semaphore = _reachability_semaphore(concurrency)

    async def check(peer: str) -> tuple:
        async with semaphore:
            started = time.perf_counter()
            try:
                stub = TransformerConnectionHandler.get_stub(node.p2p, PeerID.from_base58(peer))
                # empty uid: the server answers about its first block, whatever span it serves
                await asyncio.wait_for(stub.rpc_info(runtime_pb2.ExpertUID(), timeout=timeout), timeout)
                return peer, True, time.perf_counter() - started, None, False
            except asyncio.TimeoutError:
                return peer, False, None, f"no answer to rpc_info within {timeout:g} s", False
            except Exception as e:  # noqa: BLE001 - every failure is a check's result
                if _NOT_SERVED.search(str(e)):  # handlers not registered yet: still joining
                    return peer, False, None, "joining: rpc_info not served yet", True
                return peer, False, None, _error_text(e), False

    return list(await asyncio.gather(*(check(peer) for peer in peer_ids)))


async def _check_bootstrap(dht, node, targets: list[tuple[str, str]], timeout: float) -> list[tuple]:
    """Connect to each (peer id, multiaddr) and ping its DHT -> [(peer, ok, rtt, error)]."""
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils.multiaddr import Multiaddr

    async def check(peer: str, address: str) -> tuple:
        try:
            peer_id = PeerID.from_base58(peer)
            async with asyncio.timeout(timeout):
                # the daemon client's connect (as health.petals.dev does): dials this exact address
                await node.p2p._client.connect(peer_id, [Multiaddr(address).decapsulate(Multiaddr(f"/p2p/{peer}"))])
                started = time.perf_counter()
                request = dht_pb2.PingRequest(peer=node.protocol.node_info)
                await node.protocol.get_stub(peer_id).rpc_ping(request, timeout=timeout)
                return peer, True, time.perf_counter() - started, None
        except (asyncio.TimeoutError, TimeoutError):
            return peer, False, None, f"no connection and DHT ping within {timeout:g} s"
        except Exception as e:  # noqa: BLE001 - every failure is a check's result
            return peer, False, None, _error_text(e)

    return list(await asyncio.gather(*(check(peer, address) for peer, address in targets)))


def check_servers(dht, peer_ids: Sequence[str], *, timeout: float = 5.0, concurrency: int = 32) -> ReachabilityBatch:
    """Ask each server for its rpc_info, concurrently: ok and RTT, or why not.

    N silent peers cost about ``ceil(N / concurrency) * timeout`` seconds, never N * timeout.
    A server that answers "protocol not supported" is still loading its blocks (joining=True).
    """
    if timeout <= 0 or concurrency < 1:
        raise ValueError(f"reachability timeout must be > 0 and concurrency >= 1, got {timeout} and {concurrency}")
    taken_at, started = time.time(), time.perf_counter()
    results: dict[str, ReachabilityResult] = {}
    valid = []
    for peer in dict.fromkeys(peer_ids):
        try:
            valid.append(parse_peer_id(peer))
        except InvalidRecord as e:
            results[peer] = ReachabilityResult(peer_id=str(peer)[:MAX_TEXT_CHARS], kind="server", ok=False, error=str(e))

    # All batches go at once; a semaphore shared inside the DHT process bounds the concurrency.
    # Each call stays under PIPE_BUF (4 KB pickled), so concurrent writes to hivemind's command
    # pipe are atomic and a slow peer holds up only its own check, not a whole batch.
    batches = [valid[i : i + REACHABILITY_BATCH_PEERS] for i in range(0, len(valid), REACHABILITY_BATCH_PEERS)]
    pending = [
        (batch, submit(dht, partial(_check_servers, peer_ids=batch, timeout=timeout, concurrency=concurrency)))
        for batch in batches
    ]
    waits = math.ceil(len(valid) / concurrency) * timeout + 30
    for batch, future in pending:
        try:
            for peer, ok, rtt, error, joining in future.result(waits):
                results[peer] = ReachabilityResult(peer_id=peer, kind="server", ok=ok, rtt=rtt, error=error,
                                            joining=joining)
        except Exception as e:  # noqa: BLE001 - the DHT process failed this batch
            future.cancel()
            for peer in batch:
                results[peer] = ReachabilityResult(peer_id=peer, kind="server", ok=False,
                                            error=f"reachability batch failed in the DHT process: {short_error(e)}")
    ordered = tuple(results[peer] for peer in dict.fromkeys(peer_ids))
    return ReachabilityBatch(taken_at=taken_at, duration=time.perf_counter() - started, results=ordered)


RECHECK_AFTER = 2.0  # seconds before a server found unreachable is checked once more


def check_servers_confirmed(dht, peer_ids: Sequence[str], *, timeout: float = 5.0, concurrency: int = 32,
                            recheck_after: float = RECHECK_AFTER) -> ReachabilityBatch:
    """``check_servers``, with every server found unreachable checked once more ``recheck_after``
    seconds later, and stored as that second check found it (``core.snapshot.confirmed``)."""
    batch = check_servers(dht, peer_ids, timeout=timeout, concurrency=concurrency)
    failed = to_confirm(batch)
    if not failed:
        return batch
    time.sleep(recheck_after)
    return confirmed(batch, check_servers(dht, failed, timeout=timeout, concurrency=concurrency))


def check_bootstrap(dht, initial_peers: Sequence[str], timeout: float = 5.0, *,
                    down: Optional[str] = None) -> list[ReachabilityResult]:
    """Connect to each bootstrap multiaddr and ping its DHT, all at once. ``down``: the DHT client
    could not start, for this reason (``DhtClient.problem``): every peer is unreachable with it."""
    from hivemind.utils.multiaddr import Multiaddr

    results: dict[str, ReachabilityResult] = {}
    targets = []
    for address in dict.fromkeys(initial_peers):
        try:
            peer = parse_peer_id(Multiaddr(address).value_for_protocol("p2p"))
            targets.append((peer, address))
        except Exception as e:  # noqa: BLE001 - a bad configured address is a failed check, named
            results[address] = ReachabilityResult(
                peer_id="", kind="bootstrap", ok=False, address=clean_text(address[:MAX_RAW_TEXT_CHARS]),
                error=f"not a multiaddr ending in /p2p/<peer id>: {short_error(e)}",
            )
    if targets and down is not None:
        for peer, address in targets:
            results[address] = ReachabilityResult(peer_id=peer, kind="bootstrap", ok=False, error=down,
                                                  address=address)
    elif targets:
        future = submit(dht, partial(_check_bootstrap, targets=targets, timeout=timeout))
        try:
            answers = future.result(timeout + 30)
        except Exception as e:  # noqa: BLE001
            future.cancel()
            answers = [(peer, False, None, f"reachability check failed in the DHT process: {short_error(e)}")
                       for peer, _ in targets]
        for (peer, ok, rtt, error), (_, address) in zip(answers, targets):
            results[address] = ReachabilityResult(peer_id=peer, kind="bootstrap", ok=ok, rtt=rtt, error=error,
                                           address=address)
    return [results[address] for address in dict.fromkeys(initial_peers)]
