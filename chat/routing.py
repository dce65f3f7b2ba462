"""The seam between the monitor and petals: route chat requests by peer health, and report back.

petals 2.2 routes an inference session with Dijkstra over a graph whose compute edges cost the
seconds per block a server *announces*. A server that announces well but answers slowly (or keeps
failing) is still chosen. ``HealthAwareSequenceManager`` keeps petals' graph and only rescales
each peer's compute edges by ``penalty`` (its health score and the seconds per token we measured
on it), leaves out peers below ``min_score`` while the others still cover every block, and reports
how each peer did (``ChatOutcome``) to an ``outcome_sink``, which the monitor turns into scores.

Measurements only exist for peers that were used, and petals' estimates cannot tell a fast
alternative from a slow one: it prices every block at the server's announcement (or a default
3.3 ms) and every extra hop at a fixed 18 ms plus pings, which for small blocks outweighs a slow
server's measured time even when the alternative is several times faster. So while peers never
measured could serve the blocks of measured ones, one route in ``EXPLORE_EVERY`` leaves the
measured ones out (``peers_to_explore_around``): every peer gets measured once (per outcome
window), and from then on the measurements decide.

Pure parts (``PeerWeight``, ``penalty``, ``measured_speed``, ``peers_to_leave_out``,
``peers_to_explore_around``, ``weights_from_outcomes``) work on plain data; the petals subclasses
below them are the only I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.snapshot import ChatOutcome

from petals.client.inference_session import InferenceSession
from petals.client.routing.sequence_manager import MissingBlocksError, RemoteSequenceManager

logger = logging.getLogger(__name__)

NEUTRAL_SCORE = 50.0  # what monitor.scores gives a peer it knows nothing about
GOOD_SCORE = 90.0  # at or above: no health penalty
DOUBLING_POINTS = 20.0  # every this many points below GOOD_SCORE doubles the penalty
CLOSE_TIMEOUT = 5.0  # seconds to wait for a server to acknowledge the end of a session
PETALS_DEFAULT_SECONDS_PER_BLOCK = 1 / 300  # petals' default_inference_rps when a server announces none
EXPLORE_EVERY = 4  # one route in this many tries peers never measured, while there are any


# ---- pure: weights and penalties --------------------------------------------------------------


@dataclass(frozen=True)
class PeerWeight:
    """What routing knows about a peer: its health score (0–100) and, if measured, how many
    seconds one generated token took per block on it."""

    score: float = NEUTRAL_SCORE
    seconds_per_token_per_block: Optional[float] = None
    policy: Optional[str] = None  # "pinned" or "blocked", set by an operator from the peer's page


@dataclass(frozen=True)
class RoutingSettings:
    """``mode`` "health" weighs peers by score; "default" routes like petals, but for two petals
    2.2 bugs fixed in both modes: a peer that just failed is not retried while others cover its
    blocks, and the first block's servers are pinged. Pinned peers (if any) are the only ones
    used; blocked peers are never used (in both modes)."""

    mode: str = "health"
    min_score: float = 30.0
    pinned: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()

    def __post_init__(self):
        if self.mode not in ("health", "default"):
            raise ValueError(f"routing mode must be 'health' or 'default', got {self.mode!r}")
        if not 0 <= self.min_score <= 100:
            raise ValueError(f"min_score must be between 0 and 100, got {self.min_score!r}")

    @classmethod
    def from_settings(cls, settings) -> "RoutingSettings":
        """From monitor.settings.Settings (routing, min_peer_score, pinned_peers, blocked_peers)."""
        return cls(
            mode=settings.routing,
            min_score=settings.min_peer_score,
            pinned=tuple(settings.pinned_peers),
            blocked=tuple(settings.blocked_peers),
        )


def measured_speed(weight: Optional[PeerWeight], announced_seconds_per_block: float) -> Optional[float]:
    """How many times slower than it announces we measured the peer (< 1: faster); None if we
    never measured it."""
    measured = weight.seconds_per_token_per_block if weight is not None else None
    if measured is None or measured <= 0 or announced_seconds_per_block <= 0:
        return None
    return measured / announced_seconds_per_block


def penalty(weight: Optional[PeerWeight], announced_seconds_per_block: float = PETALS_DEFAULT_SECONDS_PER_BLOCK) -> float:
    """Factor by which a peer's compute edges (seconds per block) are multiplied.

    - Health: 1 for a score of ``GOOD_SCORE`` or more, doubling every ``DOUBLING_POINTS`` below it
      (70 → 2, 50 → 4, 30 → 8, 10 → 16). An unknown peer counts as ``NEUTRAL_SCORE``.
    - Speed: once we measured the peer, its edges cost what we measured (factor measured /
      announced), faster or slower than announced; a peer never measured keeps its announcement.

    The sequence manager divides every peer's factor by the smallest one in the graph, so only
    differences between peers matter: with equal weights it routes exactly like petals.
    """
    weight = weight or PeerWeight()
    score = min(100.0, max(0.0, float(weight.score)))
    health = 2.0 ** (max(0.0, GOOD_SCORE - score) / DOUBLING_POINTS)
    speed = measured_speed(weight, announced_seconds_per_block)
    return health * (speed if speed is not None else 1.0)


def covers(spans: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Do these [start, end) spans together cover every block in [start, end)?"""
    covered = set()
    for span_start, span_end in spans:
        covered.update(range(max(span_start, start), min(span_end, end)))
    return len(covered) == end - start


def peers_to_leave_out(
    spans: Mapping[str, tuple[int, int]],
    start: int,
    end: int,
    weights: Mapping[str, PeerWeight],
    min_score: float,
) -> set[str]:
    """Peers (by id) scoring below ``min_score`` that routing may skip: the worst first, each
    only while the remaining peers still cover every block of [start, end). A peer without a
    score is never left out. Never leaves the route without a server for some block."""
    low = sorted(
        (peer for peer in spans if peer in weights and weights[peer].score < min_score),
        key=lambda peer: (weights[peer].score, peer),
    )
    left_out: set[str] = set()
    for peer in low:
        rest = [span for other, span in spans.items() if other not in left_out and other != peer]
        if covers(rest, start, end):
            left_out.add(peer)
    return left_out


def peers_to_explore_around(
    spans: Mapping[str, tuple[int, int]],
    start: int,
    end: int,
    speeds: Mapping[str, Optional[float]],
) -> set[str]:
    """Measured peers (``speeds``: measured / announced; None or absent: never measured) that
    one route may skip so that peers never measured get tried on their blocks: the slowest
    first, each only while the others still cover [start, end) and some unmeasured peer serves
    one of its blocks."""
    measured = sorted((peer for peer in spans if speeds.get(peer) is not None),
                      key=lambda peer: (-speeds[peer], peer))
    unmeasured = [span for peer, span in spans.items() if speeds.get(peer) is None]
    skipped: set[str] = set()
    for peer in measured:
        peer_start, peer_end = max(spans[peer][0], start), min(spans[peer][1], end)
        tried_instead = any(s < peer_end and e > peer_start for s, e in unmeasured)
        rest = [span for other, span in spans.items() if other not in skipped and other != peer]
        if tried_instead and covers(rest, start, end):
            skipped.add(peer)
    return skipped


def weights_from_outcomes(
    outcomes: Iterable[ChatOutcome],
    *,
    scores: Optional[Mapping[str, float]] = None,
    now: Optional[float] = None,
    window: float = 3600.0,
    last: int = 20,
) -> dict[str, PeerWeight]:
    """PeerWeights from recent chat outcomes: the median seconds per token per block over each
    peer's last ``last`` successful timed outcomes within ``window`` seconds; the score from
    ``scores`` (e.g. monitor.scores) or neutral. For a score source without a store."""
    now = time.time() if now is None else now
    speeds: dict[str, list[float]] = {}
    for outcome in sorted(outcomes, key=lambda o: o.at):
        value = outcome.seconds_per_token_per_block
        if outcome.ok and value is not None and outcome.at >= now - window:
            speeds.setdefault(outcome.peer_id, []).append(value)
    peers = set(speeds) | set(scores or {})
    return {
        peer: PeerWeight(
            score=(scores or {}).get(peer, NEUTRAL_SCORE),
            seconds_per_token_per_block=statistics.median(speeds[peer][-last:]) if peer in speeds else None,
        )
        for peer in peers
    }


@dataclass(frozen=True)
class RouteHop:
    """One hop of the route an answer took: which peer served which blocks, how it did."""

    peer_id: str
    start: int
    end: int
    score: Optional[float] = None
    seconds_per_token: Optional[float] = None  # measured for this span during the answer

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- petals: the sequence manager ---------------------------------------------------------------

ScoreSource = Callable[[], Mapping[str, PeerWeight]]
OutcomeSink = Callable[[ChatOutcome], None]


class HealthAwareSequenceManager(RemoteSequenceManager):
    """petals' RemoteSequenceManager, routing by peer health (see the module docstring).

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

    def __init__(self, *args, **kwargs):
        self._policies: tuple[set, set] = (set(), set())
        self._routes_since_exploring = EXPLORE_EVERY  # the first chance to explore is taken
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
        pinned = self._policy_sets()[0]
        if not pinned:
            return self._allowed_servers
        return pinned if self._allowed_servers is None else self._allowed_servers & pinned

    @allowed_servers.setter
    def allowed_servers(self, value) -> None:
        self._allowed_servers = value

    @property
    def blocked_servers(self):
        blocked = self._policy_sets()[1]
        if not blocked:
            return self._blocked_servers
        return blocked if self._blocked_servers is None else self._blocked_servers | blocked

    @blocked_servers.setter
    def blocked_servers(self, value) -> None:
        self._blocked_servers = value

    def _policy_sets(self) -> tuple[set, set]:
        return self._policies

    def _update(self):
        """Read the operator's pins and blocks once per refresh, then let petals refresh."""
        weights = self.peer_weights()
        self._policies = (
            self._peer_ids_to_set([p for p, w in weights.items() if w.policy == "pinned"]) or set(),
            self._peer_ids_to_set([p for p, w in weights.items() if w.policy == "blocked"]) or set(),
        )
        return super()._update()

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
        """The score source's current view; routing goes on (unweighted) if the source fails."""
        if self.score_source is None:
            return {}
        try:
            return dict(self.score_source())
        except Exception as e:  # noqa: BLE001 - a broken store must not break chat
            logger.warning("score source failed, routing without scores: %r", e)
            return {}

    @staticmethod
    def _announced(span) -> float:
        rps = span.server_info.inference_rps
        return 1.0 / rps if rps else PETALS_DEFAULT_SECONDS_PER_BLOCK

    def _relative_penalties(self, spans, weights) -> dict:
        """peer_id -> penalty divided by the smallest among these spans' peers."""
        factors = {span.peer_id: penalty(weights.get(span.peer_id.to_base58()), self._announced(span))
                   for span in spans}
        smallest = min(factors.values(), default=1.0)
        return {peer: factor / smallest for peer, factor in factors.items()}

    def _explored_around(self, spans, start_index: int, end_index: int, weights) -> set:
        """The measured peers this route skips to try unmeasured ones (see the module
        docstring): on one route in ``EXPLORE_EVERY`` while there are any."""
        speeds = {span.peer_id.to_base58(): measured_speed(weights.get(span.peer_id.to_base58()),
                                                           self._announced(span)) for span in spans}
        names = peers_to_explore_around({span.peer_id.to_base58(): (span.start, span.end) for span in spans},
                                        start_index, end_index, speeds)
        if not names or self._routes_since_exploring < EXPLORE_EVERY - 1:
            self._routes_since_exploring += 1
            return set()
        self._routes_since_exploring = 0
        logger.info("routing around %s (measured) to measure the peers that could replace them", names)
        return {span.peer_id for span in spans if span.peer_id.to_base58() in names}

    def _left_out(self, spans, start_index: int, end_index: int, weights) -> set:
        """Peers petals banned a moment ago (they just failed), then peers below min_score: each
        left out only while the others still cover [start_index, end_index)."""
        by_id = {span.peer_id.to_base58(): (span.start, span.end) for span in spans}
        banned = {span.peer_id.to_base58(): PeerWeight(score=-1.0) for span in spans
                   if span.peer_id in self.state.banned_peers}
        if self.routing.mode == "health":
            weights = {**weights, **banned}
            threshold = self.routing.min_score
        else:
            weights, threshold = banned, 0.0
        names = peers_to_leave_out(by_id, start_index, end_index, weights, threshold)
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

    def on_request_success(self, peer_id):
        super().on_request_success(peer_id)
        recorder = _active_recorder()
        if recorder is not None:
            recorder.span_done(peer_id)

    def on_request_failure(self, peer_id):
        super().on_request_failure(peer_id)
        recorder = _active_recorder()
        if recorder is not None and peer_id is not None:
            error = sys.exc_info()[1]
            recorder.span_failed(peer_id, _short_error(error))

    # -- views for the engine -------------------------------------------------------------------
    def missing_blocks(self, *, refresh: bool = False) -> list[int]:
        """Blocks no usable server holds, in this manager's view (after pinned/blocked/bans).
        ``refresh`` re-reads the DHT first (the view is otherwise up to update_period old)."""
        with self._thread_start_lock:
            if not self.is_alive():
                self._thread.start()
        if refresh or not self.ready.is_set():
            self.update(wait=True)
        with self.lock_changes:
            spans = self.state.sequence_info.spans_containing_block
            return [index for index, found in enumerate(spans) if not found]


def _short_error(error: Optional[BaseException], limit: int = 200) -> str:
    if error is None:
        return "request failed"
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- petals: timing each span of an inference session --------------------------------------------

_ACTIVE = threading.local()


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
        outcome = ChatOutcome(at=time.time(), peer_id=peer_id.to_base58(), model=self.model,
                              start=start, end=end, ok=False, error=error)
        self._emit(outcome)

    def seconds_per_token(self) -> dict[str, float]:
        """peer_id -> mean seconds per generated token on its span (prefill if nothing else)."""
        result = {}
        for (peer, _, _), value in self._prefill.items():
            result[peer] = value
        for (peer, _, _), values in self._decode.items():
            result[peer] = sum(values) / len(values)
        return result

    def flush(self) -> list[ChatOutcome]:
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
        return outcomes

    def route(self, weights: Mapping[str, PeerWeight] = {}) -> list[RouteHop]:  # noqa: B006 (read-only)
        """The spans the session uses now, with their scores and measured seconds per token."""
        speeds = self.seconds_per_token()
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

    def __init__(self, sequence_manager: RemoteSequenceManager, max_length: int):
        super().__init__(sequence_manager, max_length)
        self.recorder = SpanRecorder(
            self, sequence_manager.config.dht_prefix, getattr(sequence_manager, "outcome_sink", None)
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


__all__: Sequence[str] = (
    "PeerWeight", "RoutingSettings", "RouteHop", "penalty", "measured_speed", "covers", "peers_to_leave_out",
    "peers_to_explore_around", "weights_from_outcomes", "HealthAwareSequenceManager", "TimedInferenceSession",
    "SpanRecorder",
)
