"""The chat page (``/chat``): a conversation in the browser, one turn at a time.

A turn is two requests, so that htmx can show the question at once and the answer as it streams:
``POST /chat/turns`` checks the form and keeps the turn (the question and its generation
parameters), and ``GET /chat/turns/<id>/events`` streams that answer as server-sent events, once
(a second connection, e.g. EventSource reconnecting, gets 204). Conversations live in memory
only. The POSTs get no origin check of their own: the web app's CSRF protection covers every
form/htmx POST, these included.
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

from flask import Blueprint, Response, render_template, request, stream_with_context

from chat.engine import ChatEngine, ChatError, Delta, Finished, GenerationParams, InvalidRequest, ModelNotServed
from chat.http.params import Params
from chat.http.responses import error_status, sse

logger = logging.getLogger(__name__)


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


@dataclass
class _Conversation:
    id: str
    messages: list[dict] = field(default_factory=list)
    turn: Optional[_Turn] = None  # the answer being written, if any


class _Conversations:
    """The chat page's conversations, in memory, the least recently used forgotten first."""

    PENDING_TIMEOUT = 60.0  # a turn whose stream never connected is dropped after this

    def __init__(self, limit: int = 500):
        self._items: OrderedDict[str, _Conversation] = OrderedDict()
        self._turns: dict[str, _Turn] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def get_or_create(self, conversation_id: Optional[str]) -> _Conversation:
        with self._lock:
            conversation = self._items.get(conversation_id or "")
            if conversation is None:
                conversation = _Conversation(secrets.token_urlsafe(12))
                self._items[conversation.id] = conversation
                while len(self._items) > self._limit:
                    _, old = self._items.popitem(last=False)
                    if old.turn:
                        self._turns.pop(old.turn.id, None)
            self._items.move_to_end(conversation.id)
            return conversation

    def start_turn(self, conversation: _Conversation, message: dict, turn: _Turn) -> None:
        with self._lock:
            busy = conversation.turn
            if busy is not None and not (busy.state == "pending" and time.monotonic() - busy.created > self.PENDING_TIMEOUT):
                raise InvalidRequest("message", "the previous answer is still being written; wait for it or stop it")
            if busy is not None:
                self._turns.pop(busy.id, None)
            conversation.messages.append(message)
            conversation.turn = turn
            self._turns[turn.id] = turn

    def claim(self, turn_id: str) -> Optional[_Turn]:
        """The turn, if it is waiting for its stream (a second connection gets None)."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None or turn.state != "pending":
                return None
            turn.state = "running"
            return turn

    def turn(self, turn_id: str) -> Optional[_Turn]:
        return self._turns.get(turn_id)

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
    status, headers = error_status(error)
    response = Response(render_template("chat/_error.html", message=str(error)), status=status)
    response.headers.update(headers)
    response.headers["HX-Retarget"] = "#chat-error"
    response.headers["HX-Reswap"] = "innerHTML"
    response.headers["X-Chat-Error"] = "1"
    return response


def _start_turn(engine: ChatEngine, conversations: _Conversations) -> str:
    """Check the page's form and keep the turn; the fragment that shows the question."""
    params = Params(request.form.to_dict(), form=True)
    model = engine.resolve(params.string("model", required=True, max_chars=500))
    message = params.string("message", required=True)
    if not message.strip():
        raise InvalidRequest("message", "message is empty; write something to send")
    system = params.string("system")
    generation = _generation_params(engine, model, params)
    status = engine.status(model)
    if not status.served:
        raise ModelNotServed(model, status.reason, status.missing_blocks)
    conversation = conversations.get_or_create(params.string("conversation_id", max_chars=100))
    prompt = ([{"role": "system", "content": system}] if system and system.strip() else []) + conversation.messages + [
        {"role": "user", "content": message}]
    input_ids, stops = engine.encode_chat(model, prompt)
    context = engine.context_length(model)
    if len(input_ids) >= context:
        raise InvalidRequest("message", f"the conversation is {len(input_ids)} tokens, more than the model's "
                                        f"context of {context}; start a new conversation")
    generation = dataclasses.replace(generation, stop_sequences=stops)
    turn = _Turn(secrets.token_urlsafe(12), conversation, model, input_ids, generation)
    conversations.start_turn(conversation, {"role": "user", "content": message}, turn)
    return render_template("chat/_turn.html", turn=turn, message=message, conversation_id=conversation.id,
                           title=engine.title(model))


def _answer_events(engine: ChatEngine, conversations: _Conversations, turn: _Turn) -> Iterator[str]:
    """The turn's answer as server-sent events: "token" (plain text), "failed", then one "done"."""
    answer_text = None
    try:
        with engine.answer(turn.model, turn.input_ids, turn.params, stop_event=turn.stop_event,
                           prompt_param="message") as answer:
            for event in answer:
                if isinstance(event, Delta) and event.text:
                    yield sse(event.text, "token")  # plain text: the page adds it as a text node
                elif isinstance(event, Finished):
                    answer_text = event.text
                    yield sse(render_template("chat/_done.html", finished=event, stats=event.stats()), "done")
    except ChatError as e:
        yield sse(str(e), "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    except Exception as e:  # noqa: BLE001 - never a traceback to the user
        logger.warning("chat turn failed", exc_info=True)
        yield sse(f"internal error ({type(e).__name__}); try again", "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    finally:
        conversations.finish(turn, answer_text)


def register(bp: Blueprint, engine: ChatEngine) -> None:
    """Add the chat page's routes to the chat blueprint (templates/chat/*.html name them)."""
    conversations = _Conversations()

    @bp.get("/chat")
    def page():
        statuses = engine.statuses()
        served = [s for s in statuses if s.served]
        wanted = request.args.get("model")
        selected = next((s.name for s in served if s.name == wanted), served[0].name if served else None)
        defaults = engine.defaults(selected) if selected else {}
        return render_template("chat/page.html", statuses=statuses, selected=selected, defaults=defaults,
                               context=engine.context_length(selected) if selected else None,
                               conversation_id=conversations.get_or_create(None).id)

    @bp.get("/chat/params")
    def params_partial():
        try:
            model = engine.resolve(request.args.get("model", ""))
            return render_template("chat/_params.html", defaults=engine.defaults(model),
                                   context=engine.context_length(model))
        except ChatError as e:
            return _error(e)

    @bp.post("/chat/turns")
    def post_turn():
        try:
            return _start_turn(engine, conversations)
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/turns/<turn_id>/events")
    def turn_events(turn_id):
        turn = conversations.claim(turn_id)
        if turn is None:
            return Response(status=204)  # finished or unknown: tells EventSource not to reconnect
        return Response(stream_with_context(_answer_events(engine, conversations, turn)), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @bp.post("/chat/turns/<turn_id>/stop")
    def stop_turn(turn_id):
        turn = conversations.turn(turn_id)
        if turn is not None:
            turn.stop_event.set()
        return '<span class="chat-stopping">stopping…</span>'
