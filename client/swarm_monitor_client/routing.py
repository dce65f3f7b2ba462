"""The seam into petals' routing: ``MonitorRouting``, a mixin of petals' ``RemoteSequenceManager``
that routes by ``swarm_monitor_client.policy``, and ``route_with``, which puts it under a model
already loaded.

petals has no routing hooks, so the mixin overrides two internals of its sequence manager:
``_build_inference_graph`` (inference sessions: Dijkstra over a graph whose compute edges cost the
seconds per block a server announces) and ``_make_sequence_with_max_throughput`` (forward and
backward passes: a random choice, longer spans more likely). Both have the same signature and
meaning in petals 2.2.0.post1 and on petals' main branch (2.3.0.dev), which ``route_with``
supports; a petals whose sequence manager lacks them is left alone, with a warning.

petals makes sub-managers (a slice of the blocks) with ``type(self)(...)``, so the configuration
(``score_source``, ``routing``) lives on the class.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Optional

from petals.client.routing.sequence_manager import MissingBlocksError, RemoteSequenceManager

from swarm_monitor_client.policy import (
    PETALS_DEFAULT_SECONDS_PER_BLOCK,
    Explorer,
    PeerWeight,
    RoutingSettings,
    ScoreSource,
    measured_speed,
    peers_to_leave_out,
    relative_penalties,
)

logger = logging.getLogger(__name__)

OVERRIDDEN = ("_build_inference_graph", "_make_sequence_with_max_throughput")


def announced_seconds_per_block(span) -> float:
    """Seconds per block the span's server announces (petals' default if it announces none)."""
    rps = getattr(span.server_info, "inference_rps", None)
    return 1.0 / rps if rps else PETALS_DEFAULT_SECONDS_PER_BLOCK


def spans_by_name(spans) -> dict[str, tuple[int, int]]:
    return {span.peer_id.to_base58(): (span.start, span.end) for span in spans}


class MonitorRouting:
    """Routing by peer weights, for a subclass of petals' ``RemoteSequenceManager``.

    ``score_source``: peer id -> ``PeerWeight``, asked at every route (serve it from memory);
    ``routing``: ``RoutingSettings``. With no weights (no source, or it fails), routing is petals'
    own, but that a peer petals has just banned is left out while others cover its blocks."""

    score_source: Optional[ScoreSource] = None
    routing: RoutingSettings = RoutingSettings()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._explorer = Explorer()  # (made here, so that a view of this manager shares it)
        self.ping_first_servers()

    def ping_first_servers(self) -> None:
        """petals 2.2's ``_update`` means to ping up to ``max_pinged`` servers of the first block,
        of the middle and of the last, but assigns the middle sample over the first one; so a
        server that starts the route but is missing from the middle sample keeps no RTT, and the
        route's first hop through it is priced at petals' 150 ms "unknown" delay until a later
        refresh happens to sample it (a 3× faster route lost to a throttled server). Wrapped
        around the aggregator's ``ping``, which ``_update`` calls with its sample just after
        updating the spans: the first block's unpinged servers join that sample (once per manager)."""
        petals_ping = self.ping_aggregator.ping
        if getattr(petals_ping, "pings_first_servers", False):
            return
        try:
            from petals.utils.random import sample_up_to
        except ImportError:  # a petals without it: its own sample, as it is
            return

        def ping(peer_ids, **kwargs):
            with self.lock_changes:
                spans = self.state.sequence_info.spans_containing_block
                first = [span.peer_id for span in spans[0]] if spans else []
            known = self.ping_aggregator.to_dict()
            unpinged = [peer for peer in first if peer not in known and peer not in peer_ids]
            return petals_ping(list(peer_ids) + list(sample_up_to(unpinged, self.config.max_pinged)), **kwargs)

        ping.pings_first_servers = True
        self.ping_aggregator.ping = ping

    # -- weights ------------------------------------------------------------------------------
    def peer_weights(self) -> dict[str, PeerWeight]:
        """The score source's current view (peer id -> weight); empty, so routing goes on
        unweighted, if there is no source or it fails."""
        if self.score_source is None:
            return {}
        try:
            return dict(self.score_source())
        except Exception as e:  # noqa: BLE001 - a broken source must never break generation
            logger.warning("peer weights unavailable, routing without them: %r", e)
            return {}

    def _relative_penalties(self, spans, weights: Mapping[str, PeerWeight]) -> dict:
        """PeerID -> ``relative_penalties`` among these spans' peers."""
        factors = relative_penalties({span.peer_id.to_base58(): announced_seconds_per_block(span) for span in spans},
                                     weights)
        return {span.peer_id: factors[span.peer_id.to_base58()] for span in spans}

    def _explored_around(self, spans, start_index: int, end_index: int, weights: Mapping[str, PeerWeight]) -> set:
        """The measured peers (PeerIDs) this route skips to try unmeasured ones, if it explores."""
        if not self.routing.explore:
            return set()
        explorer = self.__dict__.get("_explorer")
        if explorer is None:  # (a manager whose class ``route_with`` swapped: made on first use)
            explorer = self.__dict__["_explorer"] = Explorer()
        speeds = {span.peer_id.to_base58(): measured_speed(weights.get(span.peer_id.to_base58()),
                                                           announced_seconds_per_block(span))
                  for span in spans}
        names = explorer.around(spans_by_name(spans), start_index, end_index, speeds, preview=self.route_preview())
        if names:
            logger.info("routing around %s (measured) to measure the peers that could replace them", names)
        return {span.peer_id for span in spans if span.peer_id.to_base58() in names}

    def _left_out(self, spans, start_index: int, end_index: int, weights: Mapping[str, PeerWeight]) -> set:
        """Peers petals banned a moment ago (they just failed), peers the weights say are blocked,
        then peers below min_score: each left out only while the others still cover
        [start_index, end_index)."""
        banned = {span.peer_id.to_base58(): PeerWeight(score=-1.0) for span in spans
                  if span.peer_id in self.state.banned_peers}
        if self.routing.mode == "health":
            blocked = {peer: PeerWeight(score=-1.0) for peer, weight in weights.items() if weight.policy == "blocked"}
            weights = {**weights, **blocked, **banned}
            threshold = self.routing.min_score
        else:
            weights, threshold = banned, 0.0
        names = peers_to_leave_out(spans_by_name(spans), start_index, end_index, weights, threshold)
        return {span.peer_id for span in spans if span.peer_id.to_base58() in names}

    # -- a request's own choices and the load now (hooks: none here; the monitor's chat sets them) --
    def route_excluded(self, spans, weights: Mapping[str, PeerWeight], cache_tokens_needed: Optional[int]) -> set[str]:
        """Peer ids this route must not use, whatever the coverage (a request's ``only`` /
        ``ignore`` / ``verified_only``, servers known to refuse sessions of ``cache_tokens_needed``
        tokens): a route that needs them fails instead."""
        return set()

    def route_sort(self) -> Optional[str]:
        """What this route is priced by: None (health and measured speed), "speed" (measured speed
        only), "score" (health only) or "latency" (petals' own costs)."""
        return None

    def route_preview(self) -> bool:
        """Whether the route being made is only shown (a forecast's), not taken: it then says
        whether it would explore, without counting as a route (``Explorer.around``)."""
        return False

    def route_load(self, spans, cache_tokens_needed: Optional[int]) -> Mapping[str, float]:
        """peer id -> a factor (≥ 1) on its compute edges for the load it carries now (requests in
        flight through it, its cache left for ``cache_tokens_needed``): concurrent routes spread
        over servers of like speed."""
        return {}

    # -- petals overrides ---------------------------------------------------------------------
    def _build_inference_graph(self, start_index: int, end_index: int, *, cache_tokens_needed, **kwargs):
        """petals' graph, without the left-out peers, with compute edges scaled by penalty.

        Both modes leave out peers petals has just banned: petals bans a failed peer but keeps
        routing to it until its next DHT refresh (its spans are not recomputed on failure). A
        request's excluded peers (``route_excluded``) go whatever the coverage; its ``route_sort``
        picks what the penalties weigh; ``route_load`` scales them by the load now."""
        graph = super()._build_inference_graph(start_index, end_index, cache_tokens_needed=cache_tokens_needed, **kwargs)
        spans = [
            span for span in self.state.sequence_info.spans_by_priority
            if span.start < end_index and span.end > start_index
        ]
        health = self.routing.mode == "health"
        weights = self.peer_weights() if health else {}
        excluded = self.route_excluded(spans, weights, cache_tokens_needed)
        hard = {span.peer_id for span in spans if span.peer_id.to_base58() in excluded}
        usable = [span for span in spans if span.peer_id not in hard]
        sort = self.route_sort()
        left_out = hard | self._left_out(usable, start_index, end_index, weights)
        if health and sort is None and not excluded:
            left_out |= self._explored_around([s for s in spans if s.peer_id not in left_out],
                                              start_index, end_index, weights)
        kept = [span for span in spans if span.peer_id not in left_out]
        factors = self._relative_penalties(kept, sorted_by(weights, sort)) if health and sort != "latency" else {}
        load = self.route_load(kept, cache_tokens_needed)
        if load:
            factors = {span.peer_id: factors.get(span.peer_id, 1.0) * max(1.0, load.get(span.peer_id.to_base58(), 1.0))
                       for span in kept}
        for span in spans:
            blocks = range(max(span.start, start_index), min(span.end, end_index))
            if span.peer_id in left_out:
                for block_idx in [*blocks, blocks.stop]:
                    if (span.peer_id, block_idx) in graph.get_data():
                        graph.remove_node((span.peer_id, block_idx))
                continue
            if span.peer_id not in factors:
                continue
            for block_idx in blocks:
                u, v = (span.peer_id, block_idx), (span.peer_id, block_idx + 1)
                graph.add_edge(u, v, graph.get_edge(u, v) * factors[span.peer_id])
        return graph

    def _make_sequence_with_max_throughput(self, start_index: int, end_index: int):
        """petals' choice (longer spans more likely, unreachable peers almost never), with each
        span's chance divided by its penalty and low-score peers left out like in inference."""
        if self.routing.mode != "health":
            return super()._make_sequence_with_max_throughput(start_index, end_index)
        import numpy as np

        rtts = self.ping_aggregator.to_dict()
        all_spans = {
            span.peer_id: span for spans in self.state.sequence_info.spans_containing_block[start_index:end_index]
            for span in spans
        }
        weights = self.peer_weights()
        left_out = self._left_out(list(all_spans.values()), start_index, end_index, weights)
        factors = self._relative_penalties([s for s in all_spans.values() if s.peer_id not in left_out], weights)
        sequence, current = [], start_index
        while current < end_index:
            candidates = [
                span for span in self.state.sequence_info.spans_containing_block[current] if span.peer_id not in left_out
            ]
            if not candidates:
                raise MissingBlocksError(current)
            chances = np.array(
                [(span.length if rtts.get(span.peer_id) != np.inf else 1e-6) / factors[span.peer_id] for span in candidates],
                dtype=np.float64,
            )
            chosen = np.random.choice(candidates, p=chances / chances.sum())
            sequence.append(dataclasses.replace(chosen, start=current))
            current = chosen.end
        return sequence


def sorted_by(weights: Mapping[str, PeerWeight], sort: Optional[str]) -> Mapping[str, PeerWeight]:
    """The weights a route sorted by ``sort`` prices: "speed" forgets the scores, "score" the
    measured speeds; None (or "latency", which prices by petals' costs alone) keeps both."""
    if sort == "speed":
        return {peer: dataclasses.replace(w, score=100.0) for peer, w in weights.items()}
    if sort == "score":
        return {peer: dataclasses.replace(w, seconds_per_token_per_block=None) for peer, w in weights.items()}
    return weights


# ---- putting it under a loaded model ------------------------------------------------------------


def supported(manager_class: type) -> bool:
    """Whether this petals' sequence manager has the internals ``MonitorRouting`` overrides."""
    return issubclass(manager_class, RemoteSequenceManager) and all(
        callable(getattr(manager_class, name, None)) for name in OVERRIDDEN)


def routed_class(manager_class: type, score_source: ScoreSource, routing: RoutingSettings) -> type:
    """``manager_class`` with ``MonitorRouting`` in front, configured (a class of its own, so that
    petals' sub-managers, made with ``type(self)(...)``, route the same way)."""
    base = manager_class.__mro__[1] if issubclass(manager_class, MonitorRouting) else manager_class
    return type(f"Monitored{base.__name__}", (MonitorRouting, base),
                {"score_source": staticmethod(score_source), "routing": routing})


def sequence_managers(model: Any) -> list:
    """Every petals sequence manager in ``model`` (its remote blocks: ``RemoteSequential``)."""
    found, seen = [], set()
    modules = model.modules() if hasattr(model, "modules") else [model]
    for module in modules:
        manager = getattr(module, "sequence_manager", None)
        if isinstance(manager, RemoteSequenceManager) and id(manager) not in seen:
            seen.add(id(manager))
            found.append(manager)
    return found


def model_prefix(model: Any) -> Optional[str]:
    """The model's DHT prefix, as petals' config holds it."""
    config = getattr(model, "config", None)
    prefix = getattr(config, "dht_prefix", None)
    return prefix if isinstance(prefix, str) and prefix else None
