"""The life of a chat request, from the view to the answer, in the order it happens.

Every HTTP view (the chat page, chat.petals.dev's ``/api/v1/generate``, OpenAI's completions)
calls ``answer`` or ``answer_batch``; a WebSocket turn calls ``turn`` on the session
``open_session`` opened; the monitor's generation check calls ``check_answer``. Each goes:

1. **refuse early** — ``plan_groups``: the prompt fits the model's context (``chat.errors.
   check_fits_context``, the one check), the rows and alternatives are within bounds; the rows of
   one length become one group (one petals session: its batch dimension). Then the model must be
   served (``chat.admission.Admission.check_served``: the monitor's coverage, then petals' own view).
2. **take a slot** — ``chat.capacity.Slots.take``: the first slot waits its turn (or raises Busy
   before any token), more only when they are free now.
3. **compute in it** — ``BatchAnswer`` runs the groups in the slots it holds, side by side (one
   producer thread each, ``chat.streams.ThreadStream``) or one after the other in the caller's
   thread. Each group is a ``chat.session.ChatSession``, whose decoding loop
   (``chat.decoding.decode_steps``) runs on a worker thread through petals' inference session
   (``chat.sequence.TimedInferenceSession``: its routing context — the request's choice and the
   load it reserved — the route and every server's outcome, fed to the monitor's scores through the
   outcome sink), and hands each step's rows to the model's shared head steps
   (``chat.head_step``: one batched head and choice of next tokens for every answer that is ready).
4. **give the slot back** — ``chat.capacity.InSlot``, the one place a slot goes back: when what was
   computed in it ends, fails or is closed, started or not.
5. **leave its row** — ``RequestLog``: one request row (``monitor.core.requests.RequestRecord``, no
   text) to the engine's ``request_sink`` when the request ends: answered, failed, refused (but for
   the client's own mistakes) or left by its client.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import logging
import statistics
import threading
import time
from collections import deque
from typing import Callable, Iterator, Optional, Sequence, Union

from monitor.core.calibration import Given
from monitor.core.requests import CANCELLED, ERROR, OK, RequestRecord
from monitor.core.route_choice import RouteChoice

from chat import kept as keeping
from chat.admission import Admission
from chat.capacity import InSlot, OpenSessions, Slot, Slots
from chat.kept import FollowUp, KeptSessions, Rendered, Resumed
from chat.models import Models
from chat.decoding import Delta, Finished, GenerationParams
from chat.errors import (Busy, ChatError, GenerationFailed, InvalidRequest, ModelNotServed, RouteUnmet, SessionExpired,
                         UnknownModel, check_fits_context)
from chat.policy import OutcomeSink, RouteHop
from chat.session import ChatSession
from chat.streams import ThreadStream

log = logging.getLogger(__name__)

Event = Union[Delta, Finished]
Group = tuple[list[int], list[list[int]], GenerationParams]
HEADROOM_SHARE = 4  # a kept-eligible session's headroom takes at most 1/4 of the cache room its servers announce  # (row indices, their prompts, their parameters)


@dataclass(frozen=True)
class RequestContext:
    """What a request's life runs on (the engine makes one: ``chat.engine.ChatEngine.requests``):
    the models, admission, the slots and the kept sessions, where its row goes, and its bounds."""

    models: Models
    admission: Admission
    slots: Slots
    sessions: OpenSessions
    kept: KeptSessions  # sessions kept after an answer, for a follow-up of the same client
    request_sink: Callable[[RequestRecord], None]
    max_batch_rows: int
    max_logprobs: int
    stall_timeout: float  # no token for this long: the answer gives up on the swarm
    headroom: int = keeping.DEFAULT_HEADROOM  # tokens more a session that may be kept is opened with
    worker: Optional[str] = None  # this chat worker's tag (``chat_worker``): its kept sessions' handles begin with it


# -- 1. refuse early --------------------------------------------------------------------------------
def plan_groups(rows: Sequence[Sequence[int]], params: GenerationParams, context: int, *, max_rows: int,
                max_logprobs: int, prompt_param: str = "prompt") -> list[Group]:
    """The request's rows as groups of one prompt length, or InvalidRequest; each group's
    max_new_tokens cut to what the model's context leaves after its prompts."""
    if not rows:
        raise InvalidRequest(prompt_param, f"{prompt_param} is empty")
    if len(rows) > max_rows:
        raise InvalidRequest("n", f"the request asks for {len(rows)} answers; at most {max_rows} "
                                  f"(prompts × n) are computed per request")
    if params.top_logprobs > max_logprobs:
        raise InvalidRequest("top_logprobs", f"at most {max_logprobs} alternatives per token, "
                                             f"got {params.top_logprobs}")
    groups: dict[int, tuple[list[int], list[list[int]]]] = {}
    for index, ids in enumerate(rows):
        if not ids:
            raise InvalidRequest(prompt_param, f"{prompt_param} is empty")
        check_fits_context(prompt_param, len(ids), context)
        indices, prompts = groups.setdefault(len(ids), ([], []))
        indices.append(index)
        prompts.append(list(ids))
    return [(indices, prompts, dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens,
                                                                             context - len(prompts[0]))))
            for indices, prompts in groups.values()]


# -- the entry points -------------------------------------------------------------------------------
def answer_batch(chat: RequestContext, name: str, rows: Sequence[Sequence[int]], params: GenerationParams, *,
                 client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
                 prompt_param: str = "prompt", api: str = "openai", choice: Optional[RouteChoice] = None,
                 on_wait: Optional[Callable[[int, float], object]] = None, rendered: Optional[Rendered] = None,
                 follow: Optional[FollowUp] = None, owner: Optional[str] = None) -> "BatchAnswer":
    """Start answering every row (a prompt's token ids) of one request; everything that can be
    refused (unknown model, prompt too long, too many rows, model not served, routing choices
    nobody meets, busy) raises here, before any token. ``api``: which API it came through (its
    request row's); ``choice``: the request's own routing choices; ``on_wait``: told its place in
    the queue and the expected wait while it waits for a slot (``Slots.acquire``).

    ``rendered``: how its prompt was written (``chat.kept.Rendered``), given when its session may be
    kept after the answer for a follow-up of ``client`` — one row, no prompt scoring; the answer's
    handle is ``BatchAnswer.handle``. ``follow``: the handle of the answer it follows and its prompt
    as matching needs it: that answer's kept session is continued when it is ``client``'s and the
    prompt begins with what it holds (``chat.kept``), else a fresh session starts. ``owner``: whose
    the kept session is, when not ``client`` (the chat page: the visitor's conversation)."""
    owner = client if owner is None else owner
    record = RequestLog(chat.request_sink, name, api)
    record.follow_up = follow is not None
    try:
        model = chat.models.loaded(name)
        groups = plan_groups(rows, params, model.context_length, max_rows=chat.max_batch_rows,
                             max_logprobs=chat.max_logprobs, prompt_param=prompt_param)
        chat.admission.check_served(model)
        for _, prompts, group_params in groups:
            chat.admission.check_session_length(model.name, len(prompts[0]) + group_params.max_new_tokens,
                                                param="max_tokens", prompt_tokens=len(prompts[0]))
        chat.admission.check_route_choice(model.name, choice, prompt_tokens=max(len(r) for r in rows),
                                          max_tokens=params.max_new_tokens)
        record.forecast = given_forecast(chat, model.name, prompt_tokens=max(len(r) for r in rows),
                                         max_tokens=params.max_new_tokens, continued=follow is not None)
        waiting = time.perf_counter()
        slots = chat.slots.take(client, wanted=len(groups), on_wait=on_wait)
        record.waited = time.perf_counter() - waiting
    except ChatError as e:
        record.refused(e)
        raise
    keepable = rendered is not None and len(rows) == 1 and not params.prompt_logprobs and chat.kept.enabled
    resumed = None
    if keepable and follow is not None:
        resumed = resume(chat, model, follow, client=owner, choice=choice, prompt_tokens=len(rows[0]),
                         max_tokens=groups[0][2].max_new_tokens)
    elif follow is not None:
        chat.kept.count(model.name, keeping.NOT_KEPT)
    if resumed is not None:
        record.continued, record.not_resent = True, resumed.not_resent

    def open_group(prompts: list[list[int]], group_params: GenerationParams) -> tuple[ChatSession, Optional[list]]:
        if resumed is not None:  # only what is new goes through the swarm
            rest = resumed.kept.session.resume(resumed.new_ids)
            return resumed.kept.session, [rest] if rest else None
        length = len(prompts[0]) + group_params.max_new_tokens
        if keepable:  # room for a follow-up, within what the servers accept and a quarter of their free cache
            room = chat.admission.cache_room(model.name)
            headroom = chat.headroom if room is None else min(chat.headroom, room // HEADROOM_SHARE)
            length = max(length, min(chat.admission.session_limit(model.name), length + headroom))
        return ChatSession(chat.models.client_side(model), length, model=model.name, tokenizer=model.tokenizer,
                           stall_timeout=chat.stall_timeout, rows=len(prompts), choice=choice,
                           length_param="max_tokens"), prompts

    handle = keeping.new_handle(chat.worker) if keepable else None
    text = resumed.rendered if resumed is not None else rendered.text if rendered is not None else None

    def keep(session: ChatSession, finished: Finished) -> bool:
        return chat.kept.keep(handle, owner=owner, model=model.name, choice=choice, session=session,
                              rendered=Rendered(text), answer_ids=finished.token_ids, answer_text=finished.text)

    return BatchAnswer(open_group, groups, slots, stop_event, record=record, rows=len(rows),
                       keep=keep if keepable else None, handle=handle)


def given_forecast(chat: RequestContext, name: str, *, prompt_tokens: int, max_tokens: int,
                   continued: bool) -> Optional[Given]:
    """The forecast a request is given at admission, as its row keeps it (what ``POST /v1/estimate``
    would say now, on the route it would take); None when none can be made (never a failed request)."""
    try:
        told, _ = chat.admission.forecast_route(name, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                                continued=continued)
        return told.given
    except Exception as e:  # noqa: BLE001 - a row without its forecast, not a failed request
        log.warning("no forecast kept for a request of %s: %r", name, e)
        return None


def resume(chat: RequestContext, model, follow: FollowUp, *, client: Optional[str], choice: Optional[RouteChoice],
           prompt_tokens: int, max_tokens: int) -> Optional[Resumed]:
    """The kept session ``follow`` names, taken for this request when it is ``client``'s, for this
    model and routing choice, its text is where the prompt begins, it has room for the answer, and
    its route costs no more than a fresh one (``chat.kept``); else None (a session taken but not
    continued is closed). Counted either way, by why."""
    entry, reason = chat.kept.take(follow.handle, owner=client, model=model.name, choice=choice)
    resumed = None
    if reason == keeping.HIT:
        session = entry.session
        committed = session.committed_ids()
        new_ids = keeping.continuation(entry, follow, committed=committed,
                                       decode=lambda ids: chat.models.decode_all(model.name, ids),
                                       encode=lambda text: chat.models.encode(model.name, text, add_special_tokens=False))
        if new_ids is None:
            reason = keeping.PREFIX
        elif session.room(len(new_ids) - 1) < max_tokens:
            reason = keeping.NO_ROOM
        elif not keeping.worth_continuing(chat.admission.route_seconds(model.name, session.route()),
                                          chat.admission.route_seconds(model.name, chat.admission.planned_route(
                                              model.name, prompt_tokens + max_tokens)),
                                          new_tokens=len(new_ids), all_tokens=prompt_tokens, max_tokens=max_tokens):
            reason = keeping.SLOWER
        else:
            resumed = Resumed(entry, tuple(new_ids), len(committed), keeping.rendered_after(entry, follow))
    if resumed is None and entry is not None:
        entry.session.close()
    chat.kept.count(model.name, reason)
    return resumed


def answer(chat: RequestContext, name: str, input_ids: Sequence[int], params: GenerationParams, *,
           client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
           prompt_param: str = "prompt", api: str = "openai", choice: Optional[RouteChoice] = None,
           on_wait: Optional[Callable[[int, float], object]] = None, rendered: Optional[Rendered] = None,
           follow: Optional[FollowUp] = None, owner: Optional[str] = None) -> "Answer":
    """One answer in its own session (or a kept one it continues): a batch of one row."""
    batch = answer_batch(chat, name, [input_ids], params, client=client, stop_event=stop_event,
                         prompt_param=prompt_param, api=api, choice=choice, on_wait=on_wait, rendered=rendered,
                         follow=follow, owner=owner)
    return Answer((event for _, event in batch), batch.close, lambda: batch.sessions[-1] if batch.sessions else None,
                  batch=batch)


def open_session(chat: RequestContext, name: str, max_length: int, *, client: Optional[str] = None,
                 choice: Optional[RouteChoice] = None) -> ChatSession:
    """A session kept open between turns (chat.petals.dev's WebSocket), admitted among the open
    sessions (``chat.capacity.OpenSessions``, which may expire an idle one to make room). It holds
    no slot while idle: each ``turn`` takes one. ``choice``: its routing choices, for every turn."""
    model = chat.models.loaded(name)
    if not 0 < max_length <= model.context_length:
        raise InvalidRequest("max_length", f"max_length must be between 1 and the model's context "
                                           f"length {model.context_length}, got {max_length}")
    chat.admission.check_served(model)
    chat.admission.check_session_length(model.name, max_length, param="max_length")
    chat.admission.check_route_choice(model.name, choice, prompt_tokens=0, max_tokens=max_length, field="")
    session = ChatSession(chat.models.client_side(model), max_length, model=model.name, tokenizer=model.tokenizer,
                          stall_timeout=chat.stall_timeout, registry=chat.sessions, choice=choice,
                          take_slot=lambda timeout: chat.slots.take(client, timeout=timeout, queued=False)[0])
    try:
        chat.sessions.admit(session, client)
    except BaseException:
        session.expire("it was never opened")  # (nothing reached a server yet)
        raise
    return session


def turn(session: ChatSession, input_ids: Optional[Sequence[int]], params: GenerationParams, *,
         stop_event: Optional[threading.Event] = None, slot_timeout: Optional[float] = None,
         request_sink: Optional[Callable[[RequestRecord], None]] = None, api: str = "petals") -> Iterator[Event]:
    """One turn of a kept-open session: waits for a slot in turn (at most ``slot_timeout``), then
    continues the session's text with ``input_ids`` (None: from its last token). Its request row
    goes to ``request_sink`` (its slot wait is not told apart from the answer's start)."""
    record = RequestLog(request_sink, session.model, api)
    return record.observe(session.generate(input_ids, params, stop_event=stop_event, slot_timeout=slot_timeout),
                          lambda: [session], rows=1)


def check_answer(chat: RequestContext, name: str, input_ids: Sequence[int], params: GenerationParams, *,
                 outcome_sink: Optional[OutcomeSink] = None) -> "Answer":
    """An answer through the same model, routing and session code, for the monitor's generation
    check: no user's slot, no coverage check (the check is how a model called broken is seen to
    work again; petals' own view of the blocks still applies), and each server's outcome goes to
    ``outcome_sink`` instead of the chat's, so none counts as a user's chat."""
    model = chat.models.loaded(name)
    if not input_ids:
        raise InvalidRequest("prompt", "the check's prompt is empty")
    check_fits_context("prompt", len(input_ids), model.context_length, what="the check's prompt")
    chat.admission.check_served(model, coverage=False)
    max_length = len(input_ids) + min(params.max_new_tokens, model.context_length - len(input_ids))
    session = ChatSession(chat.models.client_side(model), max_length, model=model.name, tokenizer=model.tokenizer,
                          stall_timeout=chat.stall_timeout,  # never the chat's own sink
                          outcome_sink=outcome_sink if outcome_sink is not None else (lambda outcome: None))
    return Answer(session.generate(input_ids, params), session.close, session)


# -- 3. compute in the slots ------------------------------------------------------------------------
class BatchAnswer:
    """A batch being answered: ``(row, Delta)`` events as each row's text comes, then ``(row,
    Finished)`` for each row. Its groups run in the slots held: side by side when there are several
    (a ``ThreadStream`` producer per slot), else one after the other in the caller's thread. Each
    slot is an ``InSlot`` over the groups it takes, so it goes back when they are done; closing the
    batch (or leaving the ``with``) stops every row and gives back every slot."""

    def __init__(self, open_group: Callable[[list[list[int]], GenerationParams], tuple[ChatSession, Optional[list]]],
                 groups: Sequence[Group], slots: Sequence[Slot], stop_event: Optional[threading.Event] = None, *,
                 record: Optional["RequestLog"] = None, rows: int = 1,
                 keep: Optional[Callable[[ChatSession, Finished], bool]] = None, handle: Optional[str] = None):
        """``open_group``: a group's session and the input it continues with; ``keep``: offered a
        one-row session whose answer ended (not stopped, not failed) instead of closing it
        (``chat.kept``: True when kept); ``handle``: what names it then."""
        self._open_group = open_group
        self._record = record
        self._keep = keep
        self.handle = handle
        self._groups = deque(groups)
        self._lock = threading.Lock()
        self._stop = stop_event  # the caller's: a row stopped by it ends "cancelled"
        self._cancel = threading.Event()  # the consumer left: every row stops after its current token
        self.sessions: list[ChatSession] = []  # the groups' sessions, as they open
        self._held = [InSlot(slot, self._in_turn()) for slot in slots]
        self._stream: Optional[ThreadStream] = None
        if len(self._held) > 1:
            self._stream = ThreadStream([_producer(held, self._cancel) for held in self._held], name="chat-batch")
            self._iterator: Iterator = self._stream.items()
        else:
            self._iterator = self._held[0]
        if record is not None:
            self._iterator = record.observe(self._iterator, lambda: self.sessions, rows=rows, batch=True)

    @property
    def continued(self) -> bool:
        """It continued a kept session (``chat.kept``)."""
        return self._record is not None and self._record.continued

    @property
    def not_resent(self) -> int:
        """Tokens of its prompt the kept session it continued already held."""
        return self._record.not_resent if self._record is not None else 0

    @property
    def waited(self) -> Optional[float]:
        """Seconds it waited for its slots (what its forecast's wait was about)."""
        return self._record.waited if self._record is not None else None

    def _next_group(self) -> Optional[Group]:
        with self._lock:
            return self._groups.popleft() if self._groups and not self._cancel.is_set() else None

    def _in_turn(self) -> Iterator[tuple[int, Event]]:
        """The groups one slot takes, one after the other."""
        while (group := self._next_group()) is not None:
            indices, rows, params = group
            session, inputs = self._open_group(rows, params)
            self.sessions.append(session)
            events = session.generate_rows(inputs, params, stop_event=self._stop)
            finished: Optional[Finished] = None
            try:
                for row, event in events:
                    if isinstance(event, Finished):
                        finished = event
                    yield indices[row], event
            finally:
                events.close()
                if not self._kept(session, finished):
                    session.close()

    def _kept(self, session: ChatSession, finished: Optional[Finished]) -> bool:
        if self._keep is None or finished is None or finished.finish_reason not in ("stop", "length") \
                or self._cancel.is_set() or (self._stop is not None and self._stop.is_set()):
            return False
        try:
            return self._keep(session, finished)
        except Exception as e:  # noqa: BLE001 - the answer is done; the session is closed as before
            log.warning("keeping a session failed: %r", e)
            return False

    def __iter__(self) -> Iterator[tuple[int, Event]]:
        return self._iterator

    def close(self) -> None:
        self._cancel.set()
        try:
            if self._stream is None:
                self._held[0].close()
                return
            try:
                self._iterator.close()
            finally:  # each producer gives its own slot back as it ends (it runs from the start)
                self._stream.close(60)
        finally:
            if self._record is not None:
                self._record.end(lambda: self.sessions)

    def __enter__(self) -> "BatchAnswer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _producer(held: InSlot, cancel: threading.Event):
    def produce(emit, cancelled) -> None:
        try:
            for item in held:
                if cancelled.is_set() or cancel.is_set():
                    break
                emit(item)
        finally:
            held.close()

    return produce


class Answer:
    """An answer being generated, one row; closing it (or leaving the ``with``) stops it and ends
    what it holds (its session, its slot). ``session``: the petals session answering it (its live
    route), once there is one."""

    def __init__(self, events: Iterator[Event], close: Callable[[], None],
                 session: Union[ChatSession, Callable[[], Optional[ChatSession]], None] = None, *,
                 batch: Optional[BatchAnswer] = None):
        """``batch``: the one-row batch it is (its kept session's ``handle``, whether it ``continued``)."""
        self._session = session
        self.handle = batch.handle if batch is not None else None
        self._batch = batch
        self._events = events
        self._close = close

    @property
    def session(self) -> Optional[ChatSession]:
        return self._session() if callable(self._session) else self._session

    @property
    def continued(self) -> bool:
        return self._batch is not None and self._batch.continued

    def __iter__(self) -> Iterator[Event]:
        return self._events

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            self._close()

    def __enter__(self) -> "Answer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- 5. leave its row -------------------------------------------------------------------------------
ERROR_KINDS = ((Busy, "busy"), (ModelNotServed, "not_served"), (SessionExpired, "expired"),
               (GenerationFailed, "failed"))
NOT_COUNTED = (InvalidRequest, UnknownModel, RouteUnmet)  # the client's own asks: no request of the model's


def error_kind(error: BaseException) -> str:
    return next((kind for cls, kind in ERROR_KINDS if isinstance(error, cls)), "error")


class RequestLog:
    """One request's row, sent to ``sink`` once, when the request ends (a sink that fails costs
    only the row, never the request)."""

    def __init__(self, sink: Optional[Callable[[RequestRecord], None]], model: str, api: str):
        self.sink, self.model, self.api = sink, model, api
        self.at = time.time()
        self.waited: Optional[float] = None
        self.follow_up = False  # it came with the handle of an answer it follows (``chat.kept``)
        self.continued = False  # and continued that answer's kept session
        self.not_resent = 0  # tokens of its prompt the swarm did not get again (the kept session had them)
        self.forecast: Optional[Given] = None  # what it was told at admission (``given_forecast``)
        self._finished: list[Finished] = []
        self._rows = 1
        self._written = False
        self._lock = threading.Lock()

    def refused(self, error: ChatError) -> None:
        """Refused before any token: a row of its error, unless it was the client's own mistake."""
        if not isinstance(error, NOT_COUNTED):
            self._write(ERROR, error_kind(error), ())

    def observe(self, events: Iterator, sessions: Callable[[], list], *, rows: int, batch: bool = False) -> Iterator:
        """``events`` as they come; the row is written when they end, fail, or are left."""
        self._rows = rows
        try:
            for item in events:
                event = item[1] if batch else item
                if isinstance(event, Finished):
                    self._finished.append(event)
                yield item
        except ChatError as e:
            self._write(ERROR, error_kind(e), sessions())
            raise
        finally:
            self.end(sessions)

    def end(self, sessions: Callable[[], list]) -> None:
        """The request is over: answered if every row finished (and none was cancelled), else left."""
        done = len(self._finished) >= self._rows and all(f.finish_reason != "cancelled" for f in self._finished)
        self._write(OK if done else CANCELLED, None, sessions())

    def _write(self, outcome: str, kind: Optional[str], sessions) -> None:
        with self._lock:
            if self._written or self.sink is None:
                self._written = True
                return
            self._written = True
        finished = self._finished
        speeds = [f.tokens_per_second for f in finished if f.tokens_per_second is not None]
        firsts = [f.time_to_first_token for f in finished if f.time_to_first_token is not None]
        route = tuple(dict.fromkeys(RouteHop(hop.peer_id, hop.start, hop.end) for f in finished for hop in f.route))
        # a kept session a server had dropped while idle sent its text again: it did not continue
        continued = self.continued and not any(getattr(s, "idle_drops", 0) for s in sessions or ())
        record = RequestRecord(
            at=self.at, model=self.model, api=self.api, outcome=outcome, error_kind=kind, route=route,
            waited=self.waited, time_to_first_token=min(firsts) if firsts else None,
            tokens=sum(f.completion_tokens for f in finished),
            tokens_per_second=statistics.median(speeds) if speeds else None,
            failovers=sum(getattr(s, "failovers", 0) for s in sessions or ()), follow_up=self.follow_up,
            continued=continued, tokens_not_resent=self.not_resent if continued else 0, forecast=self.forecast)
        try:
            self.sink(record)
        except Exception as e:  # noqa: BLE001 - the row is lost, the request is not
            log.warning("request row not recorded: %r", e)

