"""The seam into petals: a sequence manager that routes by ``chat.policy``, and an inference
session that times each server's span and survives a server failing mid-answer.

petals has no hooks for either, so both are subclasses overriding petals 2.2 internals (routing:
``_build_inference_graph`` and ``_make_sequence_with_max_throughput``, in
``swarm_monitor_client.routing``, shared with other petals clients; here ``_update``, the inference
session's ``_update_sequence`` and ``_exit_server_sessions``). Everything petals-specific about
chat lives here (and in ``chat.remote_model``, which builds the model around this manager), so a
petals upgrade is checked in one place. Each peer's outcome (``ChatOutcome``) goes to the
configured ``outcome_sink``, which the monitor turns into scores.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.core.common import cache_full, short_error
from monitor.core.snapshot import ChatOutcome

from petals.client.inference_session import InferenceSession
from petals.client.routing.sequence_manager import RemoteSequenceManager

from swarm_monitor_client.routing import MonitorRouting

from monitor.core.route_choice import RouteChoice, allowed

from chat.policy import OutcomeSink, PeerWeight, RouteHop, RoutingSettings, ScoreSource
from chat.server_load import ServerLimits, ServerLoad, refused_length
from monitor.core.snapshot import session_room

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0  # seconds to wait for a server to acknowledge the end of a session
REFRESH_TIMEOUT = 30.0  # seconds to wait for a fresh view of the swarm (then the view at hand is used)
CACHE_WAIT = 30.0  # seconds a server is asked to wait for cache room, once it refused a session for want of it
# a step this long after the session's previous one ended follows an idle session (between two answers):
# a server whose session fails then had most likely dropped it for idleness (petals' step_timeout)
IDLE_GAP = 1.0


class HealthAwareSequenceManager(MonitorRouting, RemoteSequenceManager):
    """petals' RemoteSequenceManager, routing by peer health (``MonitorRouting``: the policy
    shared with ``swarm_monitor_client.route_with``), with the chat's own additions: the operator's
    pins and blocks applied at every refresh, and span timing.

    Configure a subclass with ``configured(...)`` and hand it to ``load_remote_model``; petals
    creates sub-managers with ``type(self)(...)``, so the configuration lives on the class.
    """

    score_source: Optional[ScoreSource] = None
    outcome_sink: Optional[OutcomeSink] = None
    routing: RoutingSettings = RoutingSettings()
    server_load: Optional[ServerLoad] = None  # the chat's requests in flight per server (``chat.server_load``)
    server_limits: Optional[ServerLimits] = None  # the longest session each server accepts, as learned
    # called with (peer, tokens needed) when a server refuses a session for want of cache room: the
    # chat releases its own idle sessions on that server (``ChatEngine.make_room``)
    make_room: Optional[Callable[[str, int], object]] = None
    cache_wait: float = CACHE_WAIT
    # the routing context of the one session a view serves (``for_session``); None on the shared manager
    context: Optional["RouteContext"] = None

    @classmethod
    def configured(
        cls,
        *,
        score_source: Optional[ScoreSource] = None,
        outcome_sink: Optional[OutcomeSink] = None,
        routing: Optional[RoutingSettings] = None,
        server_load: Optional[ServerLoad] = None,
        server_limits: Optional[ServerLimits] = None,
        make_room: Optional[Callable[[str, int], object]] = None,
        cache_wait: float = CACHE_WAIT,
    ) -> type["HealthAwareSequenceManager"]:
        return type(
            cls.__name__,
            (cls,),
            {"score_source": staticmethod(score_source) if score_source else None,
             "outcome_sink": staticmethod(outcome_sink) if outcome_sink else None,
             "routing": routing or RoutingSettings(), "server_load": server_load, "server_limits": server_limits,
             "make_room": staticmethod(make_room) if make_room else None, "cache_wait": float(cache_wait)},
        )

    # -- one session's view: its routing context, and the load -------------------------------
    def for_session(self, context: "RouteContext") -> "HealthAwareSequenceManager":
        """A view of this manager for one inference session: the same swarm view, bans, refresh
        thread and load ledger (a shallow copy shares them all), with the session's ``context`` —
        its routing choice, the load it reserved and counts, its span recorder — which petals'
        ``InferenceSession`` then hands to every call it makes on its manager (route choice,
        fail-over, outcomes, request metadata). petals builds its sub-managers with ``type(self)``
        and never hands them a session, so a view, not the class, carries it. (What petals and the
        routing change while routing lives in objects the view shares — the swarm view, bans,
        rpc_info, pings, the explorer — never in an attribute a view would assign to itself.)"""
        view = copy.copy(self)
        view.context = context
        return view

    def route_excluded(self, spans, weights: Mapping[str, PeerWeight], cache_tokens_needed: Optional[int]) -> set[str]:
        names = {span.peer_id.to_base58() for span in spans}
        excluded = set()
        if self.server_limits is not None and cache_tokens_needed:
            excluded |= self.server_limits.too_short(names, cache_tokens_needed)
        choice = self.context.choice if self.context is not None else None
        if choice is not None and not choice.empty:
            verified = {peer for peer, weight in weights.items() if weight.verified}
            excluded |= names - allowed(choice, names, verified=verified)
        return excluded

    def longest_session(self, choice: Optional[RouteChoice] = None) -> Optional[int]:
        """The longest session a route of this model's servers (those ``choice`` allows) accepts, as
        their refusals taught us (None: none refused; ``ServerLimits.longest``)."""
        if self.server_limits is None:
            return None
        with self.lock_changes:
            spans = {span.peer_id.to_base58(): (span.start, span.end)
                     for span in self.state.sequence_info.spans_by_priority}
        if choice is not None and not choice.empty:
            verified = {peer for peer, weight in self.peer_weights().items() if weight.verified}
            kept = allowed(choice, spans, verified=verified)
            spans = {peer: span for peer, span in spans.items() if peer in kept}
        return self.server_limits.longest(spans, len(self))

    def route_sort(self) -> Optional[str]:
        choice = self.context.choice if self.context is not None else None
        return choice.sort if choice is not None else None

    def make_sequence(self, *args: Any, **kwargs: Any):
        """A session's route (its first, or a fail-over's), chosen and counted in the chat's load at
        once, one chooser at a time (``RouteContext.reserve``): requests that arrive together each
        see the routes the others took, rather than all choosing before any is counted — and all
        choosing alike. The shared manager (a preview of a route) counts nothing."""
        if self.server_load is None or self.context is None:
            return super().make_sequence(*args, **kwargs)
        with self._choosing:
            spans = super().make_sequence(*args, **kwargs)
            self.context.reserve(spans)
        return spans

    def route_preview(self) -> bool:
        """The shared manager's routes are previews (a forecast's ``planned_route``); a session's
        view (with its context) takes its route."""
        return self.context is None

    def route_load(self, spans, cache_tokens_needed: Optional[int]) -> Mapping[str, float]:
        if self.server_load is None:
            return {}
        return self.server_load.factors(
            {span.peer_id.to_base58(): session_room(getattr(span.server_info, "cache_tokens_left", None),
                                                    span.end - span.start) for span in spans},
            cache_tokens_needed)

    def __init__(self, *args: Any, **kwargs: Any):
        self._policies: tuple[set, set] = (set(), set())  # PeerIDs pinned, blocked by the operator
        # refreshes of the swarm view started / finished (one thread runs them, one at a time):
        # ``missing_blocks(refresh=True)`` waits for one that started after it was called
        self._refreshes = threading.Condition()
        self._refreshes_started = self._refreshes_finished = 0
        self._choosing = threading.Lock()  # one session's route chosen and counted at a time (``make_sequence``)
        super().__init__(*args, **kwargs)
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

    def on_request_success(self, peer_id) -> None:
        super().on_request_success(peer_id)
        if self.context is not None and self.context.recorder is not None:
            self.context.recorder.span_done(peer_id)

    def get_request_metadata(self, protocol: str, *args: Any, **kwargs: Any) -> Optional[dict]:
        """petals' metadata, plus ``alloc_timeout`` for a session a server refused for want of cache
        room: its next servers wait up to ``cache_wait`` seconds for room (petals servers queue the
        allocation, up to their own ``max_alloc_timeout``) instead of refusing at once."""
        metadata = super().get_request_metadata(protocol, *args, **kwargs)
        if protocol == "rpc_inference" and metadata is not None and self.context is not None \
                and self.context.waits_for_cache:
            metadata = {**metadata, "alloc_timeout": self.cache_wait}
        return metadata

    def on_request_failure(self, peer_id) -> None:
        error = sys.exc_info()[1]
        limit = refused_length(error)
        if limit is not None and peer_id is not None and self.server_limits is not None:
            # a server refusing a session longer than it accepts is not failing: learn its limit, and
            # the retry routes around it (``route_excluded``) without banning it for everyone
            self.server_limits.learn(peer_id.to_base58(), limit)
            logger.info("%s accepts sessions of at most %d tokens", peer_id.to_base58(), limit)
            return
        if peer_id is not None and self.context is not None and self.context.dropped_while_idle(peer_id.to_base58()):
            # the server ended the session while it was idle between two answers (its step_timeout):
            # not failing, and not banned; the retry opens a session there again and replays the text
            logger.info("%s had ended an idle session; it is reopened", peer_id.to_base58())
            return
        if peer_id is not None and cache_full(error):
            # nor is a server whose cache holds other sessions now: it is busy. Not banned, no failed
            # span; it costs more for a while (routes go around it where they can), this process's
            # idle sessions on it let go of their caches, and the retry asks servers to wait for room
            peer = peer_id.to_base58()
            if self.server_load is not None:
                self.server_load.full(peer)
            if self.context is not None:
                self.context.waits_for_cache = True
            if self.make_room is not None:
                self.make_room(peer, self.context.max_length if self.context is not None else 0)
            logger.info("%s has no cache room for a session now; waiting for room or another server", peer)
            return
        super().on_request_failure(peer_id)
        if self.context is not None and self.context.recorder is not None and peer_id is not None:
            self.context.recorder.span_failed(peer_id, short_error(sys.exc_info()[1]))

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


# ---- one session's routing context -------------------------------------------------------------------

class RouteContext:
    """What routing knows of one inference session, owned by it and handed to its view of the
    sequence manager (``HealthAwareSequenceManager.for_session``): the request's routing ``choice``,
    its length (what a server short of cache room is asked for), whether a server refused it for
    want of cache room (the next ones are asked to wait), the ``recorder`` timing its spans, and its
    place in the chat's load ledger (``ServerLoad``) — entered when its route is chosen
    (``reserve``), followed as its server sessions open and fail over (``follow``), left when they
    close. One object, in one place: nothing of it lives in a thread or a module."""

    def __init__(self, load: Optional[ServerLoad], choice: Optional[RouteChoice], max_length: int):
        self.load, self.choice, self.max_length = load, choice, max_length
        self.directed = choice is not None and choice.directed
        self.waits_for_cache = False
        self.recorder: Optional["SpanRecorder"] = None
        self.idle_peers: set[str] = set()  # the servers it held a session on while idle, until the step after
        self.idle_drops = 0  # server sessions found dropped after an idle spell (their text was sent again)
        self._counted: list[str] = []  # the peers whose open server sessions it counts on now
        self._reserved: list[str] = []  # the peers of a route just chosen, counted while its sessions open

    def reserve(self, chosen_spans) -> None:
        """Count the route just chosen until its server sessions are open and ``follow`` counts them."""
        if self.load is not None:
            peers = [span.peer_id.to_base58() for span in chosen_spans]
            self.load.enter(peers, directed=self.directed)
            self._reserved.extend(peers)

    def follow(self, peers: list[str]) -> None:
        """The load follows the session's open server sessions (``peers``); a reserved route is
        handed over to them, or released when it was not taken."""
        if self.load is None:
            return
        if peers != self._counted:
            self.load.enter(peers, directed=self.directed)
            self.load.leave(self._counted, directed=self.directed)
            self._counted = peers
        self.release_reserved()

    def leave(self) -> None:
        """The session is idle, kept for a follow-up (``chat.kept``): it holds cache on its servers
        but computes nothing, so it leaves the load ledger until it steps again (``follow``)."""
        if self.load is not None and self._counted:
            self.load.leave(self._counted, directed=self.directed)
            self._counted = []

    def dropped_while_idle(self, peer: str) -> bool:
        """``peer`` failed the first step after the session was idle, on the server session it held
        while idle: it dropped it (once per idle spell: its next failure counts)."""
        if peer in self.idle_peers:
            self.idle_peers.discard(peer)
            self.idle_drops += 1
            return True
        return False

    def release_reserved(self) -> None:
        if self._reserved:
            self.load.leave(self._reserved, directed=self.directed)
            self._reserved = []


# ---- timing each span of an inference session ------------------------------------------------------

class NoFallback(RuntimeError):
    """A server of a route failed and the request said ``allow_fallbacks: false``."""


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
        self._answered: dict[tuple, float] = {}  # (peer, start, end) -> when it last answered a step (wall clock)
        self.failures = 0  # spans that failed (petals then replaced their server): the session's failovers

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
        self._answered[key] = time.time()
        if id(server_session) in self._seen and self._tokens == 1:
            self._decode.setdefault(key, []).append(elapsed)
        else:
            self._seen.add(id(server_session))
            self._prefill[key] = elapsed / max(1, self._tokens)

    def span_failed(self, peer_id, error: str) -> None:
        self._mark = time.perf_counter()
        self.failures += 1
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
        """Report one ok outcome per (peer, span) timed since the last flush, at when it last answered
        a step (the assess step reads a server that answered users after its failed checks as busy,
        not gone: a server that froze mid-answer answered last before it froze); start afresh."""
        now = time.time()
        outcomes = []
        for key in {*self._prefill, *self._decode}:
            peer, start, end = key
            values = self._decode.get(key)
            seconds = sum(values) / len(values) if values else self._prefill[key]
            outcomes.append(ChatOutcome(at=self._answered.get(key, now), peer_id=peer, model=self.model, start=start,
                                        end=end, ok=True, seconds_per_token=seconds))
        self._decode.clear()
        self._prefill.clear()
        self._answered.clear()
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
                 outcome_sink: Optional[OutcomeSink] = None, choice: Optional[RouteChoice] = None):
        """``outcome_sink``: where each server's outcome goes, if not the sequence manager's (the
        monitor's generation checks: none of theirs counts as a user's chat). ``choice``: the
        request's own routing choices (``monitor.core.route_choice``), which every route of this
        session (the first, and each fail-over's) honours."""
        self.routing = RouteContext(getattr(sequence_manager, "server_load", None), choice, max_length)
        view = sequence_manager.for_session(self.routing) if hasattr(sequence_manager, "for_session") \
            else sequence_manager
        super().__init__(view, max_length)
        self.choice = choice
        self.recorder = SpanRecorder(
            self, sequence_manager.config.dht_prefix,
            outcome_sink if outcome_sink is not None else getattr(sequence_manager, "outcome_sink", None)
        )
        self.routing.recorder = self.recorder
        self._step_tokens = 0
        self._last_step: Optional[float] = None  # when its previous step ended

    @property
    def max_length(self) -> int:
        return self._max_length

    def peers(self) -> tuple[str, ...]:
        """The servers this session holds open sessions on (and so cache room) now."""
        return tuple(s.span.peer_id.to_base58() for s in self._server_sessions if not getattr(s, "closed", False))

    def step(self, inputs, *args, **kwargs):
        self._step_tokens = inputs.shape[1]
        if self._last_step is not None and time.monotonic() - self._last_step >= IDLE_GAP:
            self.routing.idle_peers = set(self.peers())
        self.recorder.begin_step(inputs.shape[1])
        try:
            return super().step(inputs, *args, **kwargs)
        finally:
            self.routing.idle_peers = set()
            self._last_step = time.monotonic()

    def _update_sequence(self, server_idx: int, block_idx: int, attempt_no: int):
        failed = self._server_sessions[server_idx] if server_idx < len(self._server_sessions) else None
        if attempt_no >= 1 and self.choice is not None and not self.choice.allow_fallbacks:
            who = failed.span.peer_id.to_base58() if failed is not None else "a server"
            raise NoFallback(f"{who} failed and petals.allow_fallbacks is false: no other server takes its place")
        result = super()._update_sequence(server_idx, block_idx, attempt_no)
        self._count_load()
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
        self._count_load()

    def _count_load(self) -> None:
        """The chat's load per server follows this session's route (open server sessions)."""
        self.routing.follow(list(self.peers()))

    def _enter_server_sessions(self, chosen_spans):
        try:
            sessions = super()._enter_server_sessions(chosen_spans)
        except BaseException:
            self.routing.release_reserved()  # the route was not taken
            raise
        for server_session in sessions:
            server_session.step = functools.partial(self._step_span, server_session, server_session.step)
        return sessions

    def _step_span(self, server_session, step, inputs, *args, **kwargs):
        outputs = step(inputs, *args, **kwargs)
        following = server_session.next_session
        if following is not None and following.stepped and outputs.shape[1] > self._step_tokens:
            outputs = outputs[:, -self._step_tokens:]
        return outputs
