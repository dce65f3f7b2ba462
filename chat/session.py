"""One petals inference session and the answers generated in it, one row or a batch of rows.

A petals inference session runs a batch through the swarm in one pass: its rows are the batch
dimension of every step (``input_ids`` of shape [rows, tokens]), so ``n`` samples of one prompt, or
prompts of equal length, cost about one row's time. The decoding loop is ours, not transformers'
``generate``, because a batch needs what ``generate`` cannot give per row: each row's own stop
sequences and end, its tokens streamed as they come, and the log-probabilities of its tokens (and of
its prompt's, for scoring) from the model's head, which runs here, in the model's shared head steps
(``chat.head_step``). The loop lives in ``chat.decoding``; it runs on a worker thread (petals' client is blocking) whose text reaches the
caller through the chat's one stream (``chat.streams.ThreadStream``), so the caller can stream it,
stop it, and give up on a swarm that stalls. Sampling uses transformers' own logits processors
(repetition penalty, then temperature, top-k, top-p, as ``generate`` orders them), so a greedy row
is exactly what ``generate`` would give.

A session the chat keeps open between turns (chat.petals.dev's WebSocket) takes a generation slot
for each turn only (``chat.capacity``); the route each answer took and every peer's outcome come
from ``chat.sequence``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.common import cache_full, short_error
from monitor.core.route_choice import RouteChoice

from chat.client_side import ClientSide
from chat.capacity import GENERATING, IDLE, WAITING, InSlot, OpenSessions, Slot
from chat.decoding import AnswerRun, Delta, Finished, GenerationParams, decode_steps
from chat.errors import (ChatError, GenerationFailed, InvalidRequest, MaxLengthExceeded, ModelNotServed,
                         ServersFull, SessionExpired, SessionTooLong)
from chat.policy import RouteHop
from chat.remote_model import sequence_manager_of
from chat.sequence import CACHE_WAIT, TimedInferenceSession
from chat.streams import ThreadStream

logger = logging.getLogger(__name__)

Event = Union[Delta, Finished]


class ChatSession:
    """One petals inference session of ``rows`` rows: one or more answers that continue the same text.

    A session the chat keeps open (``registry``) is listed there, idle between answers, and takes a
    generation slot from ``take_slot`` for each answer; ``expire`` ends it from outside (the
    registry making room), after which its next answer is refused with chat.petals.dev's "Session …
    expired". A one-answer session (HTTP) gets its slot from its caller and is not listed.
    ``stall_timeout`` is how long an answer waits for its next token before it gives up."""

    def __init__(self, client: ClientSide, max_length: int, *, model: str, tokenizer: Any, stall_timeout: float,
                 rows: int = 1, registry: Optional[OpenSessions] = None,
                 take_slot: Optional[Callable[[Optional[float]], Slot]] = None,
                 outcome_sink: Optional[Callable] = None, choice: Optional[RouteChoice] = None,
                 length_param: str = "max_length"):
        self.model, self.tokenizer, self.max_length, self.rows = model, tokenizer, max_length, rows
        self.remote, self._heads = client.remote, client.heads  # the petals model; the model's shared head steps
        remote = self.remote
        self.label = secrets.token_hex(4)  # names the session in the messages its owner gets
        self._manager = sequence_manager_of(remote)
        self._outcome_sink = outcome_sink
        self.choice = choice  # the request's own routing choices, honoured by every route it takes
        self.length_param = length_param  # what asked for its length (named when it is too long)
        self._petals = TimedInferenceSession(self._manager, max_length, outcome_sink=outcome_sink, choice=choice)
        self._replay: list[int] = []  # the text so far, for a longer session to take in first (``grow``)
        self._stall_timeout = stall_timeout
        self._registry, self._take_slot = registry, take_slot
        self._closed = False
        self.expired_detail: Optional[str] = None
        self.on_expire: Optional[Callable[[], object]] = None  # told when ``expire`` ends it (``chat.kept``)
        self.opened_at = time.monotonic()  # when its petals session opened (servers end one after 30 min)
        self._lock = threading.Lock()
        self._route: tuple[RouteHop, ...] = ()
        eos = getattr(getattr(remote, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self._eos = frozenset(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        pad = tokenizer.pad_token_id
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)

    @property
    def used(self) -> int:
        """Tokens the session's servers have processed or will process next (the last one)."""
        output_ids = self._petals.output_ids
        return output_ids.shape[1] if output_ids is not None else len(self._replay)

    def grow(self, new_input_tokens: int, wanted: int, limit: int) -> bool:
        """Make room for ``new_input_tokens`` and ``wanted`` tokens more when the session has less: a
        longer petals session (twice as long, or as long as needed, at most ``limit``: the model's
        context) takes the place of this one, and the text so far is replayed into it with the next
        input — as fail-over replays it to a new server: no error, no reconnect. False when it
        cannot (there is room already, the session is at ``limit``, it answers several rows, or it
        is closed); the caller then refuses as before."""
        if self.room(new_input_tokens) >= wanted or self.rows != 1 or self._closed or self.max_length >= limit:
            return False
        with self._lock:
            history = self._history()
            length = min(limit, max(2 * self.max_length, len(history) + new_input_tokens + wanted))
            old = self._reopen(length, history)
        _close_quietly(old, "the outgrown")
        logger.info("session %s grew to max_length %d (%d tokens replayed)", self.label, length, len(history))
        return True

    def holds(self, peer: str) -> bool:
        """The session holds cache room on ``peer`` now (an open session on it)."""
        return peer in self._petals.peers()

    def release_cache(self) -> bool:
        """Let go of the servers' caches this idle session holds, keeping its text: its next answer
        replays the text into a fresh petals session first, as ``grow`` and fail-over do — no error,
        no reconnect, one prefill more. Called when a server refused another session for want of
        cache room (``OpenSessions.idle_holding``). False when it cannot: it is answering now, holds
        nothing, answers several rows, or is closed."""
        if self.rows != 1 or self._closed or not self._lock.acquire(blocking=False):
            return False
        try:
            if not self._petals.peers():
                return False
            history = self._history()
            old = self._reopen(self.max_length, history)
        finally:
            self._lock.release()
        _close_quietly(old, "the released")
        logger.info("session %s let go of its servers' caches (%d tokens to replay)", self.label, len(history))
        return True

    def _history(self) -> list[int]:
        """Every token of the text so far (lock held)."""
        output_ids = self._petals.output_ids
        return output_ids[0].tolist() if output_ids is not None else list(self._replay)

    def _reopen(self, length: int, history: list[int]) -> TimedInferenceSession:
        """A fresh petals session of ``length`` takes this one's place, ``history`` to be replayed
        into it with the next input (lock held); returns the old one, to be closed."""
        old, self._petals = self._petals, TimedInferenceSession(self._manager, length, outcome_sink=self._outcome_sink,
                                                                 choice=self.choice)
        self.max_length, self._replay = length, history
        self.opened_at = time.monotonic()
        return old

    def room(self, new_input_tokens: int) -> int:
        """How many tokens may still be generated after ``new_input_tokens`` more input."""
        return self.max_length - self.used - new_input_tokens

    @property
    def failovers(self) -> int:
        """Spans of this session that failed and were taken over by another server."""
        return self._petals.recorder.failures

    def route(self) -> tuple[RouteHop, ...]:
        """The route now (live while generating), else the last answer's route."""
        hops = self._petals.recorder.route(self._manager.peer_weights())
        return tuple(hops) or self._route

    @property
    def idle_drops(self) -> int:
        """Servers that had dropped this session while it was idle (its text went to them again)."""
        return self._petals.routing.idle_drops

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def holds_cache(self) -> bool:
        """Its servers hold its text so far (nothing of it is waiting to be replayed)."""
        return not self._replay and self._petals.output_ids is not None and bool(self._petals.peers())

    def committed_ids(self) -> list[int]:
        """The tokens its servers have processed: all of its text but the last token, which was
        generated and is sent with the next input (one row)."""
        output_ids = self._petals.output_ids
        return output_ids[0, :-1].tolist() if output_ids is not None else []

    def resume(self, new_ids: Sequence[int]) -> Optional[list[int]]:
        """Continue with ``new_ids`` after the committed tokens: the first takes the place of the last
        generated token (not sent yet); returns the input for ``generate`` (None: none more)."""
        self._petals.routing.follow(list(self._petals.peers()))  # (it computes again: back in the load)
        self.replace_last_token(new_ids[0])
        return list(new_ids[1:]) or None

    def leave_load(self) -> None:
        """Kept idle for a follow-up: out of the load ledger (cache use, not load) until ``resume``."""
        self._petals.routing.leave()

    def replace_last_token(self, token_id: int) -> None:
        """Make the session continue as if ``token_id`` had been generated last."""
        if self._petals.output_ids is not None:
            self._petals.output_ids[:, -1:] = token_id

    # -- answers -------------------------------------------------------------------------------
    def generate(self, input_ids: Optional[Sequence[int]], params: GenerationParams,
                 *, stop_event: Optional[threading.Event] = None, slot_timeout: Optional[float] = None) -> Iterator[Event]:
        """Continue a one-row session with ``input_ids`` (None: continue from the last token) and
        stream the answer. Stopping (the event, or leaving the iterator) ends generation after the
        current token."""
        events = self.generate_rows([list(input_ids)] if input_ids else None, params, stop_event=stop_event,
                                    slot_timeout=slot_timeout)
        try:
            for _, event in events:
                yield event
        finally:
            events.close()

    def generate_rows(self, rows: Optional[Sequence[Sequence[int]]], params: GenerationParams,
                      *, stop_event: Optional[threading.Event] = None,
                      slot_timeout: Optional[float] = None) -> Iterator[tuple[int, Event]]:
        """Continue every row with its new input (all of one length; None: from the last token) and
        stream ``(row, Delta)`` as text comes, then ``(row, Finished)`` for every row. A kept-open
        session first waits for its slot, at most ``slot_timeout`` seconds (None: the queue's)."""
        n_input, budget = self._checked_budget(rows, params)
        self._set_state(WAITING)
        try:
            slot = self._take_slot(slot_timeout) if self._take_slot is not None else None
            events = InSlot(slot, self._answer(rows, n_input, budget, params, stop_event))
            try:
                self._set_state(GENERATING)
                yield from events
            finally:
                events.close()
        finally:
            self._set_state(IDLE)

    def _answer(self, rows: Optional[Sequence[Sequence[int]]], n_input: int, budget: int, params: GenerationParams,
                stop_event: Optional[threading.Event]) -> Iterator[tuple[int, Event]]:
        prompt_tokens = self.used + n_input
        run = AnswerRun(self.tokenizer, params, self.rows, stop_event)
        new_rows = [list(r) for r in rows] if n_input else None
        if self._replay:  # a grown session: the text so far first, then the new input
            new_rows = [self._replay + (new_rows[0] if new_rows else [])]
            self._replay = []
        with self._lock:
            stream = ThreadStream([lambda emit, cancelled: self._work(run, emit, cancelled, new_rows, budget, params)],
                                  name=f"chat-{self.model}")
            try:
                yield from stream.items(stall_timeout=self._stall_timeout, on_stall=self._stalled,
                                        as_error=lambda error: _as_chat_error(self.model, error, self._too_long(),
                                                                             self._manager))
                for index, row in enumerate(run.rows):
                    tail = row.decoder.finish()
                    if tail is not None:
                        yield index, tail
                for index in range(self.rows):
                    yield index, self._finished(run, index, prompt_tokens, budget, rows, params)
            finally:
                stream.close(self._stall_timeout)

    def _too_long(self) -> Optional[ChatError]:
        """``SessionTooLong`` if no route accepts a session as long as this one (learned from the
        servers' refusals), else None."""
        longest = getattr(self._manager, "longest_session", lambda choice: None)(self.choice)
        if longest is not None and self.max_length > longest:
            return SessionTooLong(self.model, self.length_param, self.max_length, longest)
        return None

    def _stalled(self) -> GenerationFailed:
        return GenerationFailed(f"the swarm sent no token for {self._stall_timeout:.0f} s; try again")

    def _set_state(self, state: str) -> None:
        if self._registry is None:
            return
        if self.expired_detail is not None:
            if state == IDLE:
                return
            raise SessionExpired(self.label, self.expired_detail)
        try:
            self._registry.set_state(self, state)
        except SessionExpired:
            if state != IDLE:
                raise

    def _checked_budget(self, rows: Optional[Sequence[Sequence[int]]], params: GenerationParams) -> tuple[int, int]:
        """(new input tokens per row, tokens each row may generate), or why the session cannot answer."""
        if self.expired_detail is not None:
            raise SessionExpired(self.label, self.expired_detail)
        if self._closed:
            raise GenerationFailed("the inference session is closed")
        if rows is not None and (len(rows) != self.rows or len({len(r) for r in rows}) != 1):
            raise InvalidRequest(None, f"a session of {self.rows} rows continues with {self.rows} inputs of one "
                                       f"length")
        n_input = len(rows[0]) if rows else 0
        if not n_input and self._petals.output_ids is None and not self._replay:
            raise InvalidRequest("inputs", "the first request of a session needs inputs")
        budget = min(params.max_new_tokens, self.room(n_input))
        if budget <= 0 and not (params.max_new_tokens == 0 and params.prompt_logprobs and self.room(n_input) >= 0):
            raise MaxLengthExceeded(f"the session's max_length {self.max_length} is used up ({self.used} tokens so "
                                    f"far, {n_input} new); open a session with a larger max_length")
        return n_input, max(0, budget)

    def _work(self, run: AnswerRun, emit, cancelled, rows: Optional[list[list[int]]], budget: int,
              params: GenerationParams) -> None:
        """The decoding loop (``chat.decoding.decode_steps``) through the petals session, on the
        stream's thread (petals' client blocks): every row's text goes to ``emit``."""
        run.emit, run.cancel = emit, cancelled
        try:
            import torch

            with torch.no_grad(), self.remote.use_session(self._petals):
                decode_steps(run, self.remote, self._petals, rows, budget, params, n_rows=self.rows, eos=self._eos,
                             pad=self._pad, heads=self._heads)
            self._route = self.route()
        finally:
            self._petals.recorder.flush()

    def _finished(self, run: AnswerRun, index: int, prompt_tokens: int, budget: int,
                  rows: Optional[Sequence[Sequence[int]]], params: GenerationParams) -> Finished:
        end = time.perf_counter()
        row = run.rows[index]
        ttft, speed = row.timings(run.started)
        scored = params.prompt_logprobs and bool(row.prompt_logprobs)
        return Finished(text=row.decoder.emitted, token_ids=tuple(row.decoder.ids), prompt_tokens=prompt_tokens,
                        finish_reason=run.finish_reason(index, budget), route=self._route,
                        time_to_first_token=ttft, tokens_per_second=speed, elapsed=end - run.started,
                        logprobs=tuple(row.logprobs),
                        prompt_ids=tuple(rows[index]) if scored and rows else (),
                        prompt_logprobs=tuple(row.prompt_logprobs) if scored else ())

    # -- the end -------------------------------------------------------------------------------
    def expire(self, detail: str) -> None:
        """End the session from outside (the registry made room with it): its servers' caches are
        freed now, its owner is told "Session … expired: <detail>" at its next request."""
        self.expired_detail = detail
        self._close_petals()
        told, self.on_expire = self.on_expire, None
        if told is not None:
            told()

    def close(self, reason: Optional[str] = None) -> None:
        """End the inference session on its servers and leave the registry (idempotent);
        ``reason``: why the chat ended it ("idle", "lifetime"), None when its owner did."""
        if self._registry is not None:
            self._registry.remove(self, reason)
        self._close_petals()

    def _close_petals(self) -> None:
        if self._closed:
            return
        self._closed = True
        _close_quietly(self._petals, "the")


def _close_quietly(petals_session: TimedInferenceSession, what: str) -> None:
    try:
        petals_session.close()
    except Exception as e:  # noqa: BLE001 - its servers free the cache on their own timeout
        logger.debug("closing %s inference session failed: %r", what, e)


def _as_chat_error(model: str, error: BaseException, too_long: Optional[ChatError] = None,
                   manager: Any = None) -> ChatError:
    """``too_long``: the session's own refusal, if its servers refuse sessions of its length;
    ``manager``: the session's sequence manager (how long servers were asked to wait for cache room)."""
    from petals.client.routing.sequence_manager import MissingBlocksError

    if isinstance(error, ChatError):
        return error
    if too_long is not None:
        return too_long
    if isinstance(error, MissingBlocksError):
        return ModelNotServed(model, "servers went away while answering; some blocks have no server now")
    from chat.sequence import NoFallback

    if isinstance(error, NoFallback):
        return GenerationFailed(f"a server of the route failed while answering with {model!r}, and "
                                f"petals.allow_fallbacks is false: no other server took its place")
    if cache_full(error):
        return ServersFull(model, getattr(manager, "cache_wait", CACHE_WAIT))
    if type(error).__name__ == "NoPathError":  # dijkstar: the request's choices leave no route now
        return GenerationFailed(f"no route through the servers the request allows serves {model!r} now "
                                f"(they left or failed while answering)")
    # the petals error names peers, addresses and internals: it is for the operator's log only
    logger.warning("generation with %s failed: %s", model, short_error(error), exc_info=error)
    return GenerationFailed(f"the swarm's servers failed while answering with {model!r}, also after retrying "
                            f"other servers; try again in a moment")
