"""petals' own routing and block selection, asked on plain rows: the ``Routing`` that
``monitor.core.coverage.diagnose`` is given (core stays pure; this is the edge that imports petals).

Where petals decides the same question, we ask petals' own code on the same data instead of
re-deriving it:

- the recommended range for a new server is ``petals.server.block_selection.choose_best_blocks``
  over ``RemoteModuleInfo``/``ServerInfo`` objects built from the rows (what a petals server
  started without ``--block_indices`` would pick from the same view);
- the best route and its speed are a shortest path (Dijkstar, as petals) over the graph that
  petals' min-latency routing builds (``RemoteSequenceManager._build_inference_graph``): per
  block ``1 / inference_rps`` (300 if unknown), per hop ``rtt / 2`` from the previous server's
  ``next_pings`` (0.15 s if unknown) plus 18 ms serialization overhead, and the client's own
  ``rtt / 2`` at both ends (our reachability checks' RTTs stand in for the client's pings).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Mapping, Optional, Sequence

from monitor import compat  # noqa: F401  (before petals)
from monitor.core import coverage
from monitor.core.assessment import RouteHop
from monitor.core.snapshot import ServerRow

import dijkstar
from hivemind import PeerID
from petals.client.routing.sequence_info import RemoteSequenceInfo
from petals.client.routing.sequence_manager import RemoteSequenceManager
from petals.data_structures import RemoteModuleInfo, ServerInfo, ServerState
from petals.server.block_selection import choose_best_blocks


SLOWEST_RPS = 1e-9  # a server announcing no inference speed at all: a block costs it 1e9 s per token


def _peer_ids(rows: Sequence[ServerRow]) -> dict[str, PeerID]:
    """Row peer id -> PeerID. Ids that are not base58 still get a stable PeerID of their bytes."""
    ids = {}
    for row in rows:
        try:
            peer_id = PeerID.from_base58(row.peer_id)
            if peer_id.to_base58() != row.peer_id:
                raise ValueError
        except ValueError:
            peer_id = PeerID(row.peer_id.encode())
        ids[row.peer_id] = peer_id
    return ids


def _module_infos(num_blocks: int, rows: Sequence[ServerRow]) -> tuple[list[RemoteModuleInfo], dict]:
    """The rows as petals' get_remote_module_infos would return them for blocks 0..num_blocks-1."""
    ids = _peer_ids(rows)
    # uids only need to parse back to (prefix, index); the real prefix may contain dots
    infos = [RemoteModuleInfo(uid=f"model.{index}", servers={}) for index in range(num_blocks)]
    for row in rows:
        next_pings = {
            (ids[peer].to_base58() if peer in ids else peer): float(rtt)
            for peer, rtt in row.next_pings.items()
            if rtt >= 0  # petals' ServerInfo rejects negative (and NaN) RTTs
        }
        info = ServerInfo(
            state=ServerState[row.state],
            throughput=float(row.throughput or 0.0),
            start_block=row.start,
            end_block=row.end,
            public_name=row.public_name,
            # petals prices a block at 1 / inference_rps and divides by zero on a server announcing 0
            # (our edge keeps it: non-negative): priced as the slowest a speed can be, not a crash
            inference_rps=None if row.inference_rps is None else max(float(row.inference_rps), SLOWEST_RPS),
            cache_tokens_left=row.cache_tokens_left,
            next_pings=next_pings,
        )
        for index in range(row.start, row.end):
            infos[index].servers[ids[row.peer_id]] = info
    return infos, ids


class _RoutingView:
    """Just enough of a RemoteSequenceManager to run petals' own _build_inference_graph."""

    _rtt_to_delay = staticmethod(RemoteSequenceManager._rtt_to_delay)
    _has_cache_for = staticmethod(RemoteSequenceManager._has_cache_for)

    def __init__(self, sequence_info: RemoteSequenceInfo, client_rtts: dict):
        self.state = SimpleNamespace(sequence_info=sequence_info)
        self.ping_aggregator = SimpleNamespace(to_dict=lambda: client_rtts)

    def build_graph(self, num_blocks: int, cache_tokens_needed: Optional[int]) -> dijkstar.Graph:
        build = RemoteSequenceManager._build_inference_graph
        return build(self, 0, num_blocks, cache_tokens_needed=cache_tokens_needed)


class PetalsRouting:
    """``coverage.Routing`` by petals' own code (see the module's docstring)."""

    def fastest_path(self, num_blocks: int, rows: Sequence[ServerRow], client_rtts: Mapping[str, float],
                     cache_tokens_needed: Optional[int]) -> tuple[list[RouteHop], float]:
        infos, ids = _module_infos(num_blocks, rows)
        names = {peer_id: name for name, peer_id in ids.items()}
        sequence_info = RemoteSequenceInfo.make_empty([info.uid for info in infos])
        sequence_info.update_(infos)
        rtts = {ids[peer]: float(rtt) for peer, rtt in client_rtts.items() if peer in ids}
        graph = _RoutingView(sequence_info, rtts).build_graph(num_blocks, cache_tokens_needed)
        path = dijkstar.find_path(graph, "start", "end")

        # the same folding of path nodes into spans as petals' _make_sequence_with_min_latency
        hops: list[list] = []
        for peer_id, block in path.nodes[1:-1]:
            if not hops or hops[-1][0] != peer_id:
                hops.append([peer_id, block, block])
            else:
                hops[-1][2] = block
        return ([RouteHop(names[peer_id], start, end) for peer_id, start, end in hops if end > start],
                float(path.total_cost))

    def choose_blocks(self, size: int, num_blocks: int, rows: Sequence[ServerRow]) -> tuple[int, int]:
        infos, _ = _module_infos(num_blocks, rows)
        chosen = choose_best_blocks(size, infos)
        return chosen[0], chosen[-1] + 1


PETALS_ROUTING = PetalsRouting()

# the diagnosis and the best route, priced by petals' own routing (what the poller, the specs and the
# benchmarks call)
diagnose = partial(coverage.diagnose, routing=PETALS_ROUTING)
best_route = partial(coverage.best_route, routing=PETALS_ROUTING)
route_speed = partial(coverage.route_speed, routing=PETALS_ROUTING)
