"""The chat page (``/chat``): a conversation in the browser, one turn at a time.

A turn is two requests, so that htmx can show the question at once and the answer as it streams:
``POST /chat/turns`` checks the form and keeps the turn (the question and its generation
parameters), and ``GET /chat/turns/<id>/events`` streams that answer as server-sent events, once
(a second connection, e.g. EventSource reconnecting, gets 204). The POSTs get no origin check of
their own: the web app's CSRF protection covers every form/htmx POST, these included.

Conversations live in memory, kept apart per visitor: the first turn gives the browser a random
visitor id in its signed session cookie, and a visitor can read, continue, stream or stop only
their own conversations and turns (someone else's ids answer as if unknown). Each visitor keeps at
most ``conversations_per_visitor`` conversations (the least recently used idle one is forgotten
first) and the page keeps at most ``max_visitors`` visitors (the least recently active idle
visitor is forgotten first); an answer being written is never forgotten, so when all are busy a
new one is refused with 429.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Optional

from flask import Blueprint, Response, render_template, request, session, stream_with_context

from chat.engine import (
    Busy,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    GenerationParams,
    InvalidRequest,
    ModelNotServed,
)
from chat import markdown
from chat.errors import check_fits_context
from chat.http.limits import ChatLimits
from chat.http.params import Params, client_address
from chat.http.responses import INTERNAL_ERROR, error_status, sse

logger = logging.getLogger(__name__)

VISITOR_KEY = "chat_visitor"  # the visitor's id in the session cookie
PENDING_TIMEOUT = 60.0  # a turn whose stream never connected stops counting as active after this
RETRY_AFTER = 30  # seconds, when every visitor's place holds an answer being written


@dataclass
class _Turn:
    id: str
    conversation: "_Conversation"
    model: str
    input_ids: list[int]
    params: GenerationParams
    stop_event: threading.Event = field(default_factory=threading.Event)
    state: str = "pending"  # pending -> running -> done
    created: float = field(default_factory=time.monotonic)

    def active(self, now: float) -> bool:
        """Being written, or waiting (not too long) for its stream."""
        return self.state == "running" or (self.state == "pending" and now - self.created <= PENDING_TIMEOUT)


@dataclass
class _Conversation:
    id: str
    visitor: str
    messages: list[dict] = field(default_factory=list)
    turn: Optional[_Turn] = None  # the answer being written, if any

    def active(self, now: float) -> bool:
        return self.turn is not None and self.turn.active(now)

    def chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)


@dataclass
class _Visitor:
    id: str
    conversations: "OrderedDict[str, _Conversation]" = field(default_factory=OrderedDict)  # least recent first

    def active(self, now: float) -> bool:
        return any(c.active(now) for c in self.conversations.values())


class _Conversations:
    """The chat page's conversations, in memory, per visitor; bounded per visitor and in all."""

    def __init__(self, per_visitor: int, max_visitors: int):
        self._visitors: OrderedDict[str, _Visitor] = OrderedDict()  # least recently active first
        self._turns: dict[str, _Turn] = {}
        self._per_visitor, self._max_visitors = per_visitor, max_visitors
        self._lock = threading.Lock()

    def get_or_create(self, visitor_id: str, conversation_id: Optional[str]) -> _Conversation:
        """The visitor's conversation ``conversation_id``, or a new one (for an id that is not
        theirs too). Raises Busy when no idle conversation or visitor can make room."""
        now = time.monotonic()
        with self._lock:
            visitor = self._visitors.get(visitor_id)
            if visitor is None:
                self._make_room_for_a_visitor(now)
                visitor = self._visitors[visitor_id] = _Visitor(visitor_id)
            self._visitors.move_to_end(visitor_id)
            conversation = visitor.conversations.get(conversation_id or "")
            if conversation is None:
                self._make_room_in(visitor, now)
                conversation = _Conversation(secrets.token_urlsafe(12), visitor_id)
                visitor.conversations[conversation.id] = conversation
            visitor.conversations.move_to_end(conversation.id)
            return conversation

    def _make_room_for_a_visitor(self, now: float) -> None:
        if len(self._visitors) < self._max_visitors:
            return
        idle = next((v for v in self._visitors.values() if not v.active(now)), None)
        if idle is None:
            raise Busy(f"the chat page is writing answers for {len(self._visitors)} visitors, the most it serves at "
                       f"once; retry in {RETRY_AFTER} s", RETRY_AFTER)
        for conversation in idle.conversations.values():
            self._drop_turn(conversation)
        del self._visitors[idle.id]

    def _make_room_in(self, visitor: _Visitor, now: float) -> None:
        if len(visitor.conversations) < self._per_visitor:
            return
        idle = next((c for c in visitor.conversations.values() if not c.active(now)), None)
        if idle is None:
            raise Busy(f"you have {len(visitor.conversations)} conversations waiting for answers, the most one "
                       f"visitor may have; wait for an answer to finish (or stop one)", 10)
        self._drop_turn(idle)
        del visitor.conversations[idle.id]

    def _drop_turn(self, conversation: _Conversation) -> None:
        if conversation.turn is not None:
            self._turns.pop(conversation.turn.id, None)

    def start_turn(self, conversation: _Conversation, message: dict, turn: _Turn) -> None:
        with self._lock:
            busy = conversation.turn
            if busy is not None and busy.active(time.monotonic()):
                raise InvalidRequest("message", "the previous answer is still being written; wait for it or stop it")
            if busy is not None:
                self._turns.pop(busy.id, None)
            conversation.messages.append(message)
            conversation.turn = turn
            self._turns[turn.id] = turn

    def _own(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        turn = self._turns.get(turn_id)
        if turn is None or visitor_id is None or turn.conversation.visitor != visitor_id:
            return None
        return turn

    def claim(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        """The visitor's turn, if it is waiting for its stream (a second connection gets None)."""
        with self._lock:
            turn = self._own(visitor_id, turn_id)
            if turn is None or turn.state != "pending":
                return None
            turn.state = "running"
            if visitor_id in self._visitors:
                self._visitors.move_to_end(visitor_id)
            return turn

    def turn(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        with self._lock:
            return self._own(visitor_id, turn_id)

    def finish(self, turn: _Turn, answer: Optional[str]) -> None:
        with self._lock:
            turn.state = "done"
            self._turns.pop(turn.id, None)
            conversation = turn.conversation
            if conversation.turn is turn:
                conversation.turn = None
            if answer is not None:
                conversation.messages.append({"role": "assistant", "content": answer})
            elif conversation.messages and conversation.messages[-1]["role"] == "user":
                conversation.messages.pop()  # no answer: the question may be asked again


def _visitor_id(*, create: bool) -> Optional[str]:
    """This browser's visitor id, from its signed session cookie (made on its first turn)."""
    visitor = session.get(VISITOR_KEY)
    if not isinstance(visitor, str) and create:
        visitor = session[VISITOR_KEY] = secrets.token_urlsafe(18)
    return visitor if isinstance(visitor, str) else None


def _generation_params(engine: ChatEngine, model: str, params: Params) -> GenerationParams:
    context = engine.context_length(model)
    defaults = engine.defaults(model)
    return GenerationParams(
        max_new_tokens=params.integer("max_new_tokens", default=defaults["max_new_tokens"], lo=1, hi=context),
        temperature=params.number("temperature", default=defaults["temperature"], lo=0, hi=2),
        **params.sampling(top_p=defaults["top_p"], top_k=defaults["top_k"],
                          repetition_penalty=defaults["repetition_penalty"]),
    )


def _error(error: ChatError) -> Response:
    """The error as a fragment htmx puts into the page's error box."""
    return error_fragment(str(error), *error_status(error))


def error_fragment(message: str, status: int, headers: Optional[dict] = None) -> Response:
    response = Response(render_template("chat/_error.html", message=message), status=status)
    response.headers.update(headers or {})
    response.headers["HX-Retarget"] = "#chat-error"
    response.headers["HX-Reswap"] = "innerHTML"
    response.headers["X-Chat-Error"] = "1"
    return response


def _start_turn(engine: ChatEngine, conversations: _Conversations, limits: ChatLimits) -> str:
    """Check the page's form and keep the turn; the fragment that shows the question."""
    params = Params(request.form.to_dict(), form=True)
    model = engine.resolve(params.string("model", required=True, max_chars=500))
    message = params.string("message", required=True, max_chars=None)
    system = params.string("system", max_chars=None) or ""
    limits.check_prompt_chars("message", len(message))  # before anything is tokenized
    limits.check_prompt_chars("system", len(system), what="the system prompt")
    if not message.strip():
        raise InvalidRequest("message", "message is empty; write something to send")
    generation = _generation_params(engine, model, params)
    status = engine.status(model)
    if not status.served:
        raise ModelNotServed(model, status.reason, status.missing_blocks)
    conversation = conversations.get_or_create(_visitor_id(create=True),
                                               params.string("conversation_id", max_chars=100))
    limits.check_prompt_chars("message", conversation.chars() + len(system) + len(message),
                              what="the conversation with this message")
    prompt = ([{"role": "system", "content": system}] if system.strip() else []) + conversation.messages + [
        {"role": "user", "content": message}]
    input_ids, stops = engine.encode_chat(model, prompt)
    context = engine.context_length(model)
    check_fits_context("message", len(input_ids), context, what="the conversation with this message",
                       hint="start a new conversation")
    generation = dataclasses.replace(generation, stop_sequences=stops)
    turn = _Turn(secrets.token_urlsafe(12), conversation, model, input_ids, generation)
    conversations.start_turn(conversation, {"role": "user", "content": message}, turn)
    return render_template("chat/_turn.html", turn=turn, message=message, conversation_id=conversation.id,
                           title=engine.title(model), max_prompt_chars=limits.max_prompt_chars)


def _answer_events(engine: ChatEngine, conversations: _Conversations, turn: _Turn, client: str) -> Iterator[str]:
    """The turn's answer as server-sent events: "token" (plain text), "failed", "rendered" (the
    whole answer's Markdown as sanitised HTML), then one "done"."""
    answer_text = None
    try:
        with engine.answer(turn.model, turn.input_ids, turn.params, client=client, stop_event=turn.stop_event,
                           prompt_param="message", api="page") as answer:
            for event in answer:
                if isinstance(event, Delta) and event.text:
                    yield sse(event.text, "token")  # plain text: the page adds it as a text node
                elif isinstance(event, Finished):
                    answer_text = event.text
                    # the answer as Markdown, sanitised here (chat.markdown): it replaces the streamed text
                    yield sse(markdown.render(event.text), "rendered")
                    yield sse(render_template("chat/_done.html", finished=event, stats=event.stats()), "done")
    except ChatError as e:
        yield sse(str(e), "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    except Exception:  # noqa: BLE001 - never a traceback to the user
        logger.warning("chat turn failed", exc_info=True)
        yield sse(INTERNAL_ERROR, "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    finally:
        conversations.finish(turn, answer_text)


FORECAST_TOKENS = 256  # the page's forecast when the form does not say how many tokens


def register(bp: Blueprint, engine: ChatEngine, limits: ChatLimits) -> None:
    """Add the chat page's routes to the chat blueprint (templates/chat/*.html name them)."""
    conversations = _Conversations(limits.conversations_per_visitor, limits.max_visitors)

    @bp.get("/chat")
    def page():
        statuses = engine.statuses()
        served = [s for s in statuses if s.served]
        wanted = request.args.get("model")
        selected = next((s.name for s in served if s.name == wanted), served[0].name if served else None)
        defaults = engine.defaults(selected) if selected else {}
        # no conversation yet: the first turn makes one (a page view keeps nothing in memory)
        return render_template("chat/page.html", statuses=statuses, selected=selected, defaults=defaults,
                               context=engine.context_length(selected) if selected else None,
                               conversation_id="", max_prompt_chars=limits.max_prompt_chars)

    @bp.get("/chat/params")
    def params_partial():
        try:
            model = engine.resolve(request.args.get("model", ""))
            return render_template("chat/_params.html", defaults=engine.defaults(model),
                                   context=engine.context_length(model))
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/forecast")
    def forecast_partial():
        """What a turn would get if sent now (``ChatEngine.forecast``), refreshed by the page."""
        try:
            model = engine.resolve(request.args.get("model", ""))
            tokens = request.args.get("max_new_tokens", "")
            max_tokens = int(tokens) if tokens.isdigit() and 0 < int(tokens) <= 1 << 16 else FORECAST_TOKENS
            return render_template("chat/_forecast.html", forecast=engine.forecast(model, prompt_tokens=0,
                                                                                  max_tokens=max_tokens),
                                   max_tokens=max_tokens)
        except ChatError as e:
            return _error(e)

    @bp.post("/chat/turns")
    def post_turn():
        try:
            return _start_turn(engine, conversations, limits)
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/turns/<turn_id>/events")
    def turn_events(turn_id):
        turn = conversations.claim(_visitor_id(create=False), turn_id)
        if turn is None:
            return Response(status=204)  # finished, unknown or not yours: tells EventSource not to reconnect
        return Response(stream_with_context(_answer_events(engine, conversations, turn, client_address())),
                        mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @bp.post("/chat/turns/<turn_id>/stop")
    def stop_turn(turn_id):
        turn = conversations.turn(_visitor_id(create=False), turn_id)
        if turn is None:
            return Response("this answer is finished, or is not yours to stop", status=404, mimetype="text/plain")
        turn.stop_event.set()
        return '<span class="chat-stopping">stopping…</span>'
