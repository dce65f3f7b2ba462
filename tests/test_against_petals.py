"""Our arithmetic against petals' own, on the live session swarm (tests/conftest.py): the
recommendation for a new server equals petals' ``choose_best_blocks`` over what the servers
announce, for the whole swarm and without each one of its servers. The diagnosis itself, on rows
made by hand: ``test_coverage.py``.
"""

from __future__ import annotations

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.coverage import HEALTHY
from monitor.swarm.routing import diagnose
from monitor.core.snapshot import ModelInfo, ServerRow
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS


def test_the_recommendation_equals_petals_block_selection_on_the_live_swarm(swarm):
    from petals.data_structures import RemoteModuleInfo, ServerState
    from petals.server.block_selection import choose_best_blocks
    from petals.utils.dht import compute_spans, get_remote_module_infos

    uids = [f"{TINY_DHT_PREFIX}.{i}" for i in range(TINY_NUM_BLOCKS)]
    infos = get_remote_module_infos(swarm.dht, uids, latest=True)
    model = ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS)
    peers = {swarm.peer_id(name): name for name in ("first-half", "second-half", "full")}
    assert {p.to_base58() for info in infos for p in info.servers} >= peers.keys()

    def rows_of(module_infos):
        return [
            ServerRow(peer_id=span.peer_id.to_base58(), model=TINY_DHT_PREFIX, start=span.start, end=span.end,
                      state=span.state.name, throughput=span.throughput,
                      inference_rps=span.server_info.inference_rps,
                      cache_tokens_left=span.server_info.cache_tokens_left,
                      public_name=span.server_info.public_name,
                      next_pings=dict(span.server_info.next_pings or {}))
            for span in compute_spans(module_infos, min_state=ServerState.OFFLINE).values()
        ]

    live = diagnose(model, rows_of(infos))
    assert live.state == HEALTHY, live.reasons
    assert live.missing_ranges == () and live.min_redundancy == 2
    assert {hop.peer_id for hop in live.route} <= peers.keys()

    # the whole swarm, and the swarm without each one of its servers: different weakest ranges
    for dropped in (None, *peers):
        view = [RemoteModuleInfo(info.uid, {p: s for p, s in info.servers.items() if p.to_base58() != dropped})
                for info in infos]
        rows = rows_of(view)
        for size in range(1, TINY_NUM_BLOCKS + 1):
            petals_choice = choose_best_blocks(size, view)
            ours = diagnose(model, rows, recommend_blocks=size).recommendation
            assert list(range(ours.start, ours.end)) == petals_choice, (peers.get(dropped), size)
