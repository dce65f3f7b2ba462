"""The seam into petals: a sequence manager that routes by ``chat.policy``, and an inference
session that times each server's span and survives a server failing mid-answer.

petals has no hooks for either, so both are subclasses overriding petals 2.2 internals
(``_build_inference_graph``, ``_make_sequence_with_max_throughput``, ``_update``, the inference
session's ``_update_sequence`` and ``_exit_server_sessions``). Everything petals-specific about
chat lives here (and in ``chat.remote_model``, which builds the model around this manager), so a
petals upgrade is checked in one place. Each peer's outcome (``ChatOutcome``) goes to the
configured ``outcome_sink``, which the monitor turns into scores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import sys
import threading
import time
from typing import Any, Mapping, Optional

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.core.common import short_error
from monitor.core.snapshot import ChatOutcome

from petals.client.inference_session import InferenceSession
from petals.client.routing.sequence_manager import MissingBlocksError, RemoteSequenceManager

from chat.policy import (
    PETALS_DEFAULT_SECONDS_PER_BLOCK,
    Explorer,
    OutcomeSink,
    PeerWeight,
    RouteHop,
    RoutingSettings,
    ScoreSource,
    measured_speed,
    peers_to_leave_out,
    relative_penalties,
)

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0  # seconds to wait for a server to acknowledge the end of a session
REFRESH_TIMEOUT = 30.0  # seconds to wait for a fresh view of the swarm (then the view at hand is used)


def _announced(span) -> float:
    """Seconds per block the span's server announces (petals' default if it announces none)."""
    rps = span.server_info.inference_rps
    return 1.0 / rps if rps else PETALS_DEFAULT_SECONDS_PER_BLOCK


def _by_name(spans) -> dict[str, tuple[int, int]]:
    return {span.peer_id.to_base58(): (span.start, span.end) for span in spans}


class HealthAwareSequenceManager(RemoteSequenceManager):
    """petals' RemoteSequenceManager, routing by peer health (see ``chat.policy``).

    Configure a subclass with ``configured(...)`` and hand it to ``load_remote_model``; petals
    creates sub-managers with ``type(self)(...)``, so the configuration lives on the class.
    """

    score_source: Optional[ScoreSource] = None
    outcome_sink: Optional[OutcomeSink] = None
    routing: RoutingSettings = RoutingSettings()

    @classmethod
    def configured(
        cls,
        *,
        score_source: Optional[ScoreSource] = None,
        outcome_sink: Optional[OutcomeSink] = None,
        routing: Optional[RoutingSettings] = None,
    ) -> type["HealthAwareSequenceManager"]:
        return type(
            cls.__name__,
            (cls,),
            {"score_source": staticmethod(score_source) if score_source else None,
             "outcome_sink": staticmethod(outcome_sink) if outcome_sink else None,
             "routing": routing or RoutingSettings()},
        )

    def __init__(self, *args: Any, **kwargs: Any):
        self._policies: tuple[set, set] = (set(), set())  # PeerIDs pinned, blocked by the operator
        self._explorer = Explorer()
        # refreshes of the swarm view started / finished (one thread runs them, one at a time):
        # ``missing_blocks(refresh=True)`` waits for one that started after it was called
        self._refreshes = threading.Condition()
        self._refreshes_started = self._refreshes_finished = 0
        super().__init__(*args, **kwargs)
        self.ping_aggregator.ping = self._ping_with_first_servers(self.ping_aggregator.ping)
        if self.routing.pinned:
            pinned = self._peer_ids_to_set(list(self.routing.pinned))
            self.allowed_servers = pinned if self.allowed_servers is None else self.allowed_servers & pinned
        if self.routing.blocked:
            blocked = self._peer_ids_to_set(list(self.routing.blocked))
            self.blocked_servers = blocked if self.blocked_servers is None else self.blocked_servers | blocked

    # -- operator policies: petals' allowed/blocked servers, plus what the score source says ---
    # petals reads these two attributes when it refreshes the swarm view (every update_period),
    # so a peer pinned or blocked from the dashboard takes effect at the next refresh.
    @property
    def allowed_servers(self):
        pinned = self._policies[0]
        if not pinned:
            return self._allowed_servers
        return pinned if self._allowed_servers is None else self._allowed_servers & pinned

    @allowed_servers.setter
    def allowed_servers(self, value) -> None:
        self._allowed_servers = value

    @property
    def blocked_servers(self):
        blocked = self._policies[1]
        if not blocked:
            return self._blocked_servers
        return blocked if self._blocked_servers is None else self._blocked_servers | blocked

    @blocked_servers.setter
    def blocked_servers(self, value) -> None:
        self._blocked_servers = value

    def _update(self):
        """Read the operator's pins and blocks once per refresh, then let petals refresh."""
        with self._refreshes:
            self._refreshes_started += 1
        try:
            weights = self.peer_weights()
            self._policies = (
                self._peer_ids_to_set([p for p, w in weights.items() if w.policy == "pinned"]) or set(),
                self._peer_ids_to_set([p for p, w in weights.items() if w.policy == "blocked"]) or set(),
            )
            return super()._update()
        finally:
            with self._refreshes:
                self._refreshes_finished += 1
                self._refreshes.notify_all()

    def _ping_with_first_servers(self, petals_ping):
        """petals 2.2's ``_update`` means to ping up to ``max_pinged`` servers of the first block,
        of the middle and of the last, but assigns the middle sample over the first one; so a
        server that starts the route but is missing from the middle sample keeps no RTT, and the
        route's first hop through it is priced at petals' 150 ms "unknown" delay until a later
        refresh happens to sample it (here: a 3× faster route lost to a throttled server).
        Wrapped around the aggregator's ``ping``, which ``_update`` calls with its sample just
        after updating the spans: the first block's unpinged servers join that sample."""
        from petals.utils.random import sample_up_to

        def ping(peer_ids, **kwargs):
            with self.lock_changes:
                spans = self.state.sequence_info.spans_containing_block
                first = [span.peer_id for span in spans[0]] if spans else []
            known = self.ping_aggregator.to_dict()
            unpinged = [peer for peer in first if peer not in known and peer not in peer_ids]
            return petals_ping(list(peer_ids) + list(sample_up_to(unpinged, self.config.max_pinged)), **kwargs)

        return ping

    # -- weights ------------------------------------------------------------------------------
    def peer_weights(self) -> dict[str, PeerWeight]:
        """The score source's current view (peer id -> weight); empty, so routing goes on
        unweighted, if there is no source or it fails."""
        if self.score_source is None:
            return {}
        try:
            return dict(self.score_source())
        except Exception as e:  # noqa: BLE001 - a broken store must not break chat
            logger.warning("score source failed, routing without scores: %r", e)
            return {}

    def _relative_penalties(self, spans, weights: Mapping[str, PeerWeight]) -> dict:
        """PeerID -> ``relative_penalties`` among these spans' peers."""
        factors = relative_penalties({span.peer_id.to_base58(): _announced(span) for span in spans}, weights)
        return {span.peer_id: factors[span.peer_id.to_base58()] for span in spans}

    def _explored_around(self, spans, start_index: int, end_index: int, weights: Mapping[str, PeerWeight]) -> set:
        """The measured peers (PeerIDs) this route skips to try unmeasured ones, if it explores."""
        speeds = {span.peer_id.to_base58(): measured_speed(weights.get(span.peer_id.to_base58()), _announced(span))
                  for span in spans}
        names = self._explorer.around(_by_name(spans), start_index, end_index, speeds)
        if names:
            logger.info("routing around %s (measured) to measure the peers that could replace them", names)
        return {span.peer_id for span in spans if span.peer_id.to_base58() in names}

    def _left_out(self, spans, start_index: int, end_index: int, weights: Mapping[str, PeerWeight]) -> set:
        """Peers petals banned a moment ago (they just failed), then peers below min_score: each
        left out only while the others still cover [start_index, end_index)."""
        banned = {span.peer_id.to_base58(): PeerWeight(score=-1.0) for span in spans
                  if span.peer_id in self.state.banned_peers}
        if self.routing.mode == "health":
            weights = {**weights, **banned}
            threshold = self.routing.min_score
        else:
            weights, threshold = banned, 0.0
        names = peers_to_leave_out(_by_name(spans), start_index, end_index, weights, threshold)
        return {span.peer_id for span in spans if span.peer_id.to_base58() in names}

    # -- petals overrides ---------------------------------------------------------------------
    def _build_inference_graph(self, start_index: int, end_index: int, *, cache_tokens_needed, **kwargs):
        """petals' graph, without the left-out peers, with compute edges scaled by penalty.

        Both modes leave out peers petals has just banned: petals 2.2 bans a failed peer but keeps
        routing to it until its next DHT refresh (its spans are not recomputed on failure)."""
        graph = super()._build_inference_graph(start_index, end_index, cache_tokens_needed=cache_tokens_needed, **kwargs)
        spans = [
            span for span in self.state.sequence_info.spans_by_priority
            if span.start < end_index and span.end > start_index
        ]
        health = self.routing.mode == "health"
        weights = self.peer_weights() if health else {}
        left_out = self._left_out(spans, start_index, end_index, weights)
        if health:
            left_out |= self._explored_around([s for s in spans if s.peer_id not in left_out],
                                              start_index, end_index, weights)
        kept = [span for span in spans if span.peer_id not in left_out]
        factors = self._relative_penalties(kept, weights) if health else {}
        for span in spans:
            blocks = range(max(span.start, start_index), min(span.end, end_index))
            if span.peer_id in left_out:
                for block_idx in [*blocks, blocks.stop]:
                    if (span.peer_id, block_idx) in graph.get_data():
                        graph.remove_node((span.peer_id, block_idx))
                continue
            if not health:
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

    def on_request_success(self, peer_id) -> None:
        super().on_request_success(peer_id)
        recorder = _active_recorder()
        if recorder is not None:
            recorder.span_done(peer_id)

    def on_request_failure(self, peer_id) -> None:
        super().on_request_failure(peer_id)
        recorder = _active_recorder()
        if recorder is not None and peer_id is not None:
            recorder.span_failed(peer_id, short_error(sys.exc_info()[1]))

    # -- views for the engine -------------------------------------------------------------------
    def missing_blocks(self, *, refresh: bool = False) -> list[int]:
        """Blocks no usable server holds, in this manager's view (after pinned/blocked/bans).
        ``refresh`` re-reads the DHT first (the view is otherwise up to update_period old)."""
        with self._thread_start_lock:
            if not self.is_alive():
                self._thread.start()
        with self._refreshes:
            # petals' ``update(wait=True)`` returns when the refresh running at the call ends (a view
            # read before the call), and never if that refresh fails: wait for the next one instead.
            # Not ready (none done yet, or petals dropped the view after a failure): the next to end
            if refresh:
                wanted = self._refreshes_started + 1
            else:
                wanted = 0 if self.ready.is_set() else self._refreshes_finished + 1
            if self._refreshes_finished < wanted:
                self._thread.trigger.set()
                self._refreshes.wait_for(lambda: self._refreshes_finished >= wanted,
                                         timeout=REFRESH_TIMEOUT)
        with self.lock_changes:
            spans = self.state.sequence_info.spans_containing_block
            return [index for index, found in enumerate(spans) if not found]


# ---- timing each span of an inference session ------------------------------------------------------

_ACTIVE = threading.local()  # .session: the TimedInferenceSession stepping in this thread


def _active_recorder() -> Optional["SpanRecorder"]:
    session = getattr(_ACTIVE, "session", None)
    return session.recorder if session is not None else None


class SpanRecorder:
    """Times every span of every step of one inference session, in the thread that steps it.

    petals calls ``on_request_success(peer)`` right after a server answered its span of a step,
    so the time since the previous mark is that span's time. The first step on a server session
    replays the whole prefix: it is kept apart from the per-token times.
    """

    def __init__(self, session: "TimedInferenceSession", model: str, sink: Optional[OutcomeSink]):
        self._session = session
        self.model = model
        self._sink = sink
        self._mark = 0.0
        self._tokens = 0
        self._seen: set[int] = set()  # id() of server sessions that already stepped once
        self._decode: dict[tuple, list[float]] = {}  # (peer, start, end) -> seconds per 1-token step
        self._prefill: dict[tuple, float] = {}

    def begin_step(self, n_tokens: int) -> None:
        self._mark = time.perf_counter()
        self._tokens = n_tokens

    def _server_session(self, peer_id):
        for server_session in self._session._server_sessions:
            if server_session.span.peer_id == peer_id:
                return server_session
        return None

    def span_done(self, peer_id) -> None:
        now = time.perf_counter()
        elapsed, self._mark = now - self._mark, now
        server_session = self._server_session(peer_id)
        if server_session is None:
            return
        span = server_session.span
        key = (peer_id.to_base58(), span.start, span.end)
        if id(server_session) in self._seen and self._tokens == 1:
            self._decode.setdefault(key, []).append(elapsed)
        else:
            self._seen.add(id(server_session))
            self._prefill[key] = elapsed / max(1, self._tokens)

    def span_failed(self, peer_id, error: str) -> None:
        self._mark = time.perf_counter()
        server_session = self._server_session(peer_id)
        start, end = (server_session.span.start, server_session.span.end) if server_session else (0, 0)
        self._emit(ChatOutcome(at=time.time(), peer_id=peer_id.to_base58(), model=self.model,
                               start=start, end=end, ok=False, error=error))

    def _seconds_per_token(self) -> dict[str, float]:
        """peer_id -> mean seconds per generated token on its span (prefill if nothing else)."""
        result = {peer: value for (peer, _, _), value in self._prefill.items()}
        for (peer, _, _), values in self._decode.items():
            result[peer] = sum(values) / len(values)
        return result

    def flush(self) -> None:
        """Report one ok outcome per (peer, span) timed since the last flush; start afresh."""
        now = time.time()
        outcomes = []
        for key in {*self._prefill, *self._decode}:
            peer, start, end = key
            values = self._decode.get(key)
            seconds = sum(values) / len(values) if values else self._prefill[key]
            outcomes.append(ChatOutcome(at=now, peer_id=peer, model=self.model, start=start, end=end,
                                        ok=True, seconds_per_token=seconds))
        self._decode.clear()
        self._prefill.clear()
        for outcome in outcomes:
            self._emit(outcome)

    def route(self, weights: Mapping[str, PeerWeight]) -> list[RouteHop]:
        """The spans the session uses now, with their scores and measured seconds per token."""
        speeds = self._seconds_per_token()
        hops = []
        for server_session in self._session._server_sessions:
            span = server_session.span
            peer = span.peer_id.to_base58()
            weight = weights.get(peer)
            hops.append(RouteHop(peer, span.start, span.end, weight.score if weight else None, speeds.get(peer)))
        return hops

    def _emit(self, outcome: ChatOutcome) -> None:
        if self._sink is None:
            return
        try:
            self._sink(outcome)
        except Exception as e:  # noqa: BLE001 - feedback must not break the answer
            logger.warning("outcome sink failed: %r", e)


class TimedInferenceSession(InferenceSession):
    """petals' InferenceSession that lets the sequence manager time each server's span, and
    that survives a server failure mid-answer.

    petals 2.2 cannot replace a failed server after the first token (bigscience-workshop/petals
    #587): the replacement gets the failed session's input history with position 0, so its first
    step trips "Broken input cache"; and a replacement returns hidden states for the whole prefix,
    which a next server that already has its cache would take as new tokens. Here the replacement
    gets the history *before* the failed step and that step's position (so its first step sends
    prefix + new tokens, as petals intends), and a span's outputs are cut to the step's new tokens
    whenever the next server has already stepped.
    """

    def __init__(self, sequence_manager: RemoteSequenceManager, max_length: int, *,
                 outcome_sink: Optional[OutcomeSink] = None):
        """``outcome_sink``: where each server's outcome goes, if not the sequence manager's (the
        monitor's generation checks: none of theirs counts as a user's chat)."""
        super().__init__(sequence_manager, max_length)
        self.recorder = SpanRecorder(
            self, sequence_manager.config.dht_prefix,
            outcome_sink if outcome_sink is not None else getattr(sequence_manager, "outcome_sink", None)
        )
        self._step_tokens = 0

    def step(self, inputs, *args, **kwargs):
        self._step_tokens = inputs.shape[1]
        self.recorder.begin_step(inputs.shape[1])
        previous = getattr(_ACTIVE, "session", None)
        _ACTIVE.session = self
        try:
            return super().step(inputs, *args, **kwargs)
        finally:
            _ACTIVE.session = previous

    def _update_sequence(self, server_idx: int, block_idx: int, attempt_no: int):
        failed = self._server_sessions[server_idx] if server_idx < len(self._server_sessions) else None
        result = super()._update_sequence(server_idx, block_idx, attempt_no)
        if failed is not None and failed.history is not None:
            replacement = self._server_sessions[server_idx]
            replacement.history = failed.history[:, : failed._position]
            replacement._position = failed._position
        return result

    def _exit_server_sessions(self, server_sessions) -> None:
        """petals closes a server session by waiting for the server's goodbye, without a time
        limit: a server that died mid-step would hang the answer forever. Wait CLOSE_TIMEOUT."""
        from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker

        for server_session in reversed(server_sessions):
            try:
                if server_session._outputs_stream is not None:
                    RemoteExpertWorker.run_coroutine(
                        asyncio.wait_for(server_session._aclose_stream(), CLOSE_TIMEOUT))
            except Exception as e:  # noqa: BLE001 - the server is gone either way
                logger.debug("closing the session on %s failed: %r", server_session.span.peer_id, e)
            finally:
                server_session._outputs_stream = server_session._inputs_queue = None
                server_session.closed = True

    def _enter_server_sessions(self, chosen_spans):
        sessions = super()._enter_server_sessions(chosen_spans)
        for server_session in sessions:
            server_session.step = functools.partial(self._step_span, server_session, server_session.step)
        return sessions

    def _step_span(self, server_session, step, inputs, *args, **kwargs):
        outputs = step(inputs, *args, **kwargs)
        following = server_session.next_session
        if following is not None and following.stepped and outputs.shape[1] > self._step_tokens:
            outputs = outputs[:, -self._step_tokens:]
        return outputs
