"""chat.petals.dev's API, so that its clients work here unchanged: HTTP ``/api/v1/generate``
(one answer per request) and WebSocket ``/api/v2/generate`` (one inference session per
connection, continued request after request).

Errors keep that API's shape, ``{"ok": false, "traceback": ...}``, but the "traceback" is a short
message for people, never a Python traceback, an exception's text or a path. The two messages
chat.petals.dev's page acts on keep petals' words: "Maximum length exceeded: …" when a session's
``max_length`` is used up and cannot grow — a turn that does not fit, and a streamed answer that
reaches the session's end before its stop sequence, are answered on by a longer session the text so
far is replayed into (``ChatSession.grow``, up to the longest session the model's servers accept:
``Admission.session_limit``), so the page sees it only at that limit — and "Session <id>
expired: …" when the chat ends a session — after ``ws_idle_timeout`` seconds without a request,
after ``ws_max_lifetime`` seconds in all (``chat.http.limits.WsClock``), or when an idle session is
closed to make room for another (``chat.capacity.OpenSessions``) — on which the page opens a new
session by itself. Those endings come with a close frame that says the same.

A session holds a generation slot only while it answers (``chat.capacity``): between turns, while
its user reads and types, it holds none. A turn waits for its slot in turn, as long as its session
may last; it is never refused for a full queue.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Optional, Sequence

from flask import Blueprint, Response, jsonify
from simple_websocket import ConnectionClosed

from monitor.api_doc import documented
from monitor.core.route_choice import ChoiceError, parse_choice

from chat import request as chat_request

from chat.engine import (
    ChatEngine, ChatError, ChatSession, Delta, Finished, FollowUp, GenerationParams, InvalidRequest, MaxLengthExceeded,
    Rendered,
    SessionExpired,
)
from chat.http import api_models as m
from chat.http.limits import ChatLimits, WsClock, WsClosing
from chat.http.params import Params, client_address, request_params
from chat.http.responses import INTERNAL_ERROR, guarded, last_finished, petals_chat_error, petals_error

logger = logging.getLogger(__name__)

WS_CLOSE_NORMAL = 1000  # the close code when the chat ends a session (the reason says why)
MAX_CLOSE_REASON_BYTES = 123  # what a close frame can carry
EXPIRY_POLL = 1.0  # seconds between looks, while waiting for a request, at whether the session was expired


def generation_params(engine: ChatEngine, model: str, params: Params, *, n_input: int, used: int, room: int,
                      stop_sequences: Sequence[str] = (), stop_mode: str = "include") -> GenerationParams:
    """Parameters as chat.petals.dev reads them; max_length counts the whole text (HF's meaning)."""
    context = engine.models.context_length(model)
    defaults = engine.models.defaults(model)
    do_sample = params.field(m.GenerateBody, "do_sample")
    temperature = params.field(m.GenerateBody, "temperature")
    sampling = params.sampling(top_p=defaults["top_p"], top_k=defaults["top_k"], repetition_penalty=1.0)
    max_new_tokens = params.field(m.GenerateBody, "max_new_tokens", hi=context)
    max_length = params.field(m.GenerateBody, "max_length", hi=context)
    if max_new_tokens is not None and max_length is not None:
        raise InvalidRequest("max_new_tokens", "give max_new_tokens or max_length, not both")
    if max_new_tokens is None and max_length is None:
        raise InvalidRequest("max_new_tokens", "max_new_tokens (or max_length) is required")
    if max_length is not None:
        max_new_tokens = max_length - used - n_input
        if max_new_tokens <= 0:
            raise InvalidRequest("max_length", f"max_length {max_length} leaves no room for new tokens: the text "
                                               f"is already {used + n_input} tokens long")
    return GenerationParams(
        max_new_tokens=max(1, min(max_new_tokens, room)),
        temperature=(temperature if temperature is not None else 1.0) if do_sample else 0.0,
        **sampling,
        stop_sequences=tuple(stop_sequences),
        stop_mode=stop_mode,
        skip_special_tokens=False,
    )


def http_generate(engine: ChatEngine, limits: ChatLimits) -> Response:
    """/api/v1/generate: one answer, whole."""
    params = request_params()
    model = params.model(engine)
    inputs = params.field(m.GenerateBody, "inputs")
    limits.check_prompt_chars("inputs", len(inputs))
    input_ids = engine.encode(model, inputs)
    context = engine.models.context_length(model)
    if len(input_ids) >= context:
        raise InvalidRequest("inputs", f"inputs has {len(input_ids)} tokens; the model's context is {context}")
    generation = generation_params(engine, model, params, n_input=len(input_ids), used=0,
                                   room=context - len(input_ids), stop_mode="exclude")
    # ``session``: the handle of the answer these inputs follow (chat.kept: only what is new is sent)
    handle = params.field(m.GenerateBody, "session") or None
    with engine.answer(model, input_ids, generation, client=client_address(), prompt_param="inputs",
                       api="petals", rendered=Rendered(inputs),
                       follow=FollowUp(handle, text=inputs) if handle else None) as answer:
        finished = last_finished(answer)
    return jsonify(ok=True, outputs=finished.text, token_count=finished.completion_tokens,
                   route=[hop.to_dict() for hop in finished.route], session=answer.handle, continued=answer.continued)


def ws_generate(engine: ChatEngine, ws: Any, limits: ChatLimits) -> None:
    """/api/v2/generate: one ws connection = one inference session, within the time limits."""
    clock = WsClock(limits)
    session = None
    closed_because = None  # why the chat ended the session, as /metrics counts it
    try:
        message = _ws_receive(ws, clock, None)
        if message.get("type") != "open_inference_session":
            raise InvalidRequest("type", f"the first request must have type 'open_inference_session', "
                                         f"got {message.get('type')!r}")
        params = Params(message)
        model = params.model(engine)
        context = engine.models.context_length(model)
        max_length = params.field(m.GenerateBody, "max_length", hi=context)
        if max_length is None:
            raise InvalidRequest("max_length", f"max_length is required (1 to {context})")
        try:  # the routing choices of the OpenAI API's ``petals`` object, as fields of the message
            choice = parse_choice(None, field="", fields=message)
        except ChoiceError as e:
            raise InvalidRequest(e.field, str(e)) from None
        session = engine.open_session(model, max_length, client=client_address(), choice=choice)
        ws.send(json.dumps({"ok": True}))
        while True:
            message = _ws_receive(ws, clock, session)
            if message.get("type") != "generate":
                raise InvalidRequest("type", f"expected a request of type 'generate', got {message.get('type')!r}")
            _ws_step(engine, ws, session, model, Params(message), limits, clock)
    except WsClosing as e:
        closed_because = e.reason
        _ws_send_error(ws, str(e))
        _ws_close(ws, str(e))
    except SessionExpired as e:  # made room with: the registry counted it
        _ws_send_error(ws, str(e))
        _ws_close(ws, str(e))
    except ChatError as e:
        _ws_send_error(ws, str(e))
    except ConnectionClosed:  # the client went away, while we received or sent
        pass
    except Exception:  # noqa: BLE001 - never a traceback to the user
        logger.warning("ws generate failed", exc_info=True)
        _ws_send_error(ws, INTERNAL_ERROR)
    finally:
        if session is not None:
            session.close(closed_because)


def _ws_receive(ws: Any, clock: WsClock, session: Optional[ChatSession]) -> dict:
    """The next request; meanwhile, a look every EXPIRY_POLL seconds at whether the session was
    expired to make room (then its owner is told at once, and the connection's thread is free)."""
    until = time.monotonic() + clock.receive_timeout()
    while True:
        wait = max(0.0, until - time.monotonic())
        raw = ws.receive(timeout=min(wait, EXPIRY_POLL))
        if raw is not None:
            break
        if session is not None and session.expired_detail is not None:
            raise SessionExpired(session.label, session.expired_detail)
        if wait <= EXPIRY_POLL:
            raise clock.closing(session.label if session is not None else "(not opened)")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        raise InvalidRequest(None, "each message must be a JSON object") from None
    if not isinstance(data, dict):
        raise InvalidRequest(None, "each message must be a JSON object")
    return data


def _ws_send_error(ws: Any, message: str) -> None:
    try:
        ws.send(json.dumps({"ok": False, "traceback": message}))
    except Exception:  # noqa: BLE001 - the client is gone
        pass


def _ws_close(ws: Any, why: str) -> None:
    """Close with a frame whose reason says why (cut to what a close frame carries)."""
    reason = why.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
    try:
        ws.close(reason=WS_CLOSE_NORMAL, message=reason)
    except Exception:  # noqa: BLE001 - the client is gone
        pass


def _ws_step(engine: ChatEngine, ws: Any, session: ChatSession, model: str, params: Params, limits: ChatLimits,
             clock: WsClock) -> None:
    inputs = params.field(m.GenerateBody, "inputs", default=None)
    if inputs:
        limits.check_prompt_chars("inputs", len(inputs))
    first = session.used == 0
    input_ids = engine.encode(model, inputs, add_special_tokens=first) if inputs else []
    if first and not input_ids:
        raise InvalidRequest("inputs", "the first generate request of a session needs inputs")
    stop_sequence = params.string("stop_sequence", max_chars=m.MAX_STOP_CHARS) or None
    extra = params.strings("extra_stop_sequences", max_items=16, allow_single=False)
    cont_token = None
    if extra:
        if stop_sequence is None:
            raise InvalidRequest("stop_sequence", "extra_stop_sequences need a stop_sequence of exactly 1 token")
        ids = engine.encode(model, stop_sequence, add_special_tokens=False)
        if len(ids) != 1:
            raise InvalidRequest("stop_sequence", f"extra_stop_sequences need stop_sequence to be exactly 1 token; "
                                                  f"{stop_sequence!r} is {len(ids)} tokens")
        cont_token = ids[0]
    streaming = stop_sequence is not None
    stops = ((stop_sequence,) if stop_sequence else ()) + extra
    asked = generation_params(engine, model, params, n_input=len(input_ids), used=session.used,
                              room=engine.models.context_length(model), stop_sequences=stops)
    # a turn that outgrows the session: a longer one the text so far is replayed into (no error);
    # a streamed answer grows it again when it reaches its end (below)
    limit = engine.admission.session_limit(model)
    session.grow(len(input_ids), 1 if streaming else asked.max_new_tokens, limit)
    room = session.room(len(input_ids))
    if room <= 0:
        raise MaxLengthExceeded(f"prefix {session.used} + current {len(input_ids)} tokens leave no room in the "
                                f"session's max_length {session.max_length}; open a session with a larger max_length")
    chunk = asked.max_new_tokens
    # like chat.petals.dev: chunks of max_new_tokens until a stop sequence (or the session's end)
    generation = dataclasses.replace(asked, max_new_tokens=room if streaming else min(chunk, room))
    text, count, pending = "", 0, input_ids or None
    while True:
        # its user waits for this answer: the turn waits for a slot in turn, for as long as the session
        # may last (turns waiting at once are bounded by the open sessions, and so is the wait)
        events = chat_request.turn(session, pending, generation, slot_timeout=clock.remaining(),
                                   request_sink=engine.request_sink)
        at_end = False
        for event in events:
            if clock.expired():  # leaving the generator stops the answer after the current token
                events.close()
                raise clock.over(session.label)
            if isinstance(event, Delta):
                text, count = text + event.text, count + event.token_count
                if streaming and count >= chunk:
                    ws.send(json.dumps({"ok": True, "outputs": text, "stop": False, "token_count": count}))
                    text, count = "", 0
            elif isinstance(event, Finished):
                if streaming and event.finish_reason == "length":  # the session ended before the stop sequence
                    at_end = True  # (the turn's generator ends first: it holds the session)
                    continue
                if cont_token is not None and event.finish_reason == "stop" and event.text and \
                        any(event.text.endswith(seq) for seq in extra):
                    session.replace_last_token(cont_token)
                ws.send(json.dumps({"ok": True, "outputs": text, "stop": True, "token_count": count}))
        if not at_end:
            return
        if not session.grow(0, chunk, limit):  # else the answer goes on in a longer session
            if count:
                ws.send(json.dumps({"ok": True, "outputs": text, "stop": False, "token_count": count}))
            raise MaxLengthExceeded(f"the answer reached the session's max_length {session.max_length} before "
                                    f"its stop sequence; the model's servers accept no longer session")
        pending, generation = None, dataclasses.replace(generation, max_new_tokens=session.room(0))


def register(bp: Blueprint, engine: ChatEngine, limits: ChatLimits) -> None:
    """Add chat.petals.dev's routes to the chat blueprint (the ws route needs a server that
    speaks WebSocket: werkzeug, gunicorn with threads)."""
    from flask_sock import Sock

    @bp.post("/api/v1/generate", endpoint="http_generate")
    @documented("One answer, whole (chat.petals.dev's HTTP API)", "chat.petals.dev",
                {200: m.Generated, **m.PETALS_ERRORS}, body=m.GenerateBody, form=True)
    def http_generate_view():
        return guarded(lambda: http_generate(engine, limits), chat_error=petals_chat_error,
                       internal_error=lambda: petals_error(500, INTERNAL_ERROR), what="/api/v1/generate")

    @Sock().route("/api/v2/generate", bp=bp, endpoint="ws_generate")
    def ws_generate_view(ws):
        ws_generate(engine, ws, limits)
