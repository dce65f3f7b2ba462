"""HTTP side of the chat: the chat page, the chat.petals.dev-compatible API, the OpenAI-compatible API.

Thin views: each reads and checks its parameters (a bad one is a 400 that names it), hands the
work to ``chat.engine.ChatEngine`` and maps its errors to statuses (unknown model 404, model not
fully served 503, busy 429 with Retry-After). Nobody gets a Python traceback: the ws API's
``traceback`` field carries a short message, like every other error here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from flask import Blueprint, Response, jsonify, render_template, request, stream_with_context
from simple_websocket import ConnectionClosed

from chat.engine import (
    Busy,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    GenerationParams,
    InvalidRequest,
    ModelNotServed,
    UnknownModel,
)

logger = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
MAX_TEXT_CHARS = 200_000  # any one text parameter
MAX_MESSAGES = 512
MAX_STOP_SEQUENCES = 4
WS_STEP_TIMEOUT = 300  # seconds a ws session may wait for its next request


# ---- reading parameters ---------------------------------------------------------------------------


class _Params:
    """Typed parameters from a JSON object (typed values) or a form (strings; "" means absent).
    Every problem is an InvalidRequest naming the parameter and what it should be."""

    def __init__(self, data: Any, *, form: bool = False, where: str = "the request body"):
        if not isinstance(data, Mapping):
            raise InvalidRequest(None, f"{where} must be a JSON object")
        self.data, self.form = data, form

    def raw(self, name: str):
        value = self.data.get(name)
        if self.form and value == "":
            return None
        return value

    def present(self, name: str) -> bool:
        return self.raw(name) is not None

    def string(self, name: str, *, required: bool = False, default: Optional[str] = None,
               max_chars: int = MAX_TEXT_CHARS) -> Optional[str]:
        value = self.raw(name)
        if value is None:
            if required:
                raise InvalidRequest(name, f"{name} is required")
            return default
        if not isinstance(value, str):
            raise InvalidRequest(name, f"{name} must be a string, got {_kind(value)}")
        if len(value) > max_chars:
            raise InvalidRequest(name, f"{name} is {len(value)} characters long; at most {max_chars} are accepted")
        return value

    def integer(self, name: str, *, default: Optional[int] = None, lo: Optional[int] = None,
                hi: Optional[int] = None) -> Optional[int]:
        value = self.raw(name)
        if value is None:
            return default
        if self.form and isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise InvalidRequest(name, f"{name} must be an integer, got {value!r}") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(name, f"{name} must be an integer, got {_kind(value)}")
        return _in_range(name, value, lo, hi)

    def number(self, name: str, *, default: Optional[float] = None, lo: Optional[float] = None,
               hi: Optional[float] = None, lo_open: bool = False) -> Optional[float]:
        value = self.raw(name)
        if value is None:
            return default
        if self.form and isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise InvalidRequest(name, f"{name} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InvalidRequest(name, f"{name} must be a number, got {_kind(value)}")
        value = float(value)
        if lo_open and lo is not None and value <= lo:
            raise InvalidRequest(name, f"{name} must be greater than {lo:g}" + (f" and at most {hi:g}" if hi is not None else "")
                                 + f", got {value:g}")
        return _in_range(name, value, lo, hi)

    def sampling(self, *, top_p: float, top_k: int, repetition_penalty: float) -> dict:
        """top_p, top_k and repetition_penalty, checked alike by every API; only the defaults differ."""
        return {
            "top_p": self.number("top_p", default=top_p, lo=0, hi=1, lo_open=True),
            "top_k": self.integer("top_k", default=top_k, lo=0, hi=100_000),
            "repetition_penalty": self.number("repetition_penalty", default=repetition_penalty, lo=0, hi=100,
                                              lo_open=True),
        }

    def boolean(self, name: str, *, default: bool = False) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
            return value.strip().lower() in ("1", "true")
        raise InvalidRequest(name, f"{name} must be true/false (or 1/0), got {value!r}")

    def strings(self, name: str, *, max_items: int = MAX_STOP_SEQUENCES, allow_single: bool = True) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        if isinstance(value, str) and allow_single:
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(name, f"{name} must be {'a string or ' if allow_single else ''}a list of strings")
        if len(value) > max_items:
            raise InvalidRequest(name, f"{name} has {len(value)} entries; at most {max_items} are accepted")
        if any(len(v) > 1000 for v in value):
            raise InvalidRequest(name, f"each entry of {name} must be at most 1000 characters")
        return tuple(v for v in value if v)


def _kind(value) -> str:
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), repr(value)[:40])


def _in_range(name, value, lo, hi):
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else (
            f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        raise InvalidRequest(name, f"{name} must be {bounds}, got {value:g}")
    return value


def _body() -> tuple[Any, bool]:
    """The request's parameters: its JSON body, or its form / query values."""
    if request.is_json:
        data = request.get_json(silent=True)
        if data is None:
            raise InvalidRequest(None, "the request body is not valid JSON")
        return data, False
    return request.values.to_dict(), True


def _model(engine: ChatEngine, params: _Params) -> str:
    name = params.string("model", max_chars=500)
    if name is None:
        if len(engine.model_names) == 1:
            return engine.model_names[0]
        raise InvalidRequest("model", f"model is required; one of {', '.join(engine.model_names)}")
    return engine.resolve(name)


def _error_fields(error: ChatError) -> tuple[int, dict]:
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, Busy) else {}
    return error.status, headers


# ---- the chat.petals.dev API ----------------------------------------------------------------------


def _petals_params(engine: ChatEngine, model: str, params: _Params, *, n_input: int, used: int,
                   room: int, stop_sequences=(), stop_mode="include") -> GenerationParams:
    """Parameters as chat.petals.dev reads them; max_length counts the whole text (HF's meaning)."""
    context = engine.context_length(model)
    defaults = engine.defaults(model)
    do_sample = params.boolean("do_sample")
    temperature = params.number("temperature", lo=0, hi=100, lo_open=True)
    sampling = params.sampling(top_p=defaults["top_p"], top_k=defaults["top_k"], repetition_penalty=1.0)
    max_new_tokens = params.integer("max_new_tokens", lo=1, hi=context)
    max_length = params.integer("max_length", lo=1, hi=context)
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


def _http_generate(engine: ChatEngine):
    data, form = _body()
    params = _Params(data, form=form)
    model = _model(engine, params)
    inputs = params.string("inputs", required=True)
    input_ids = engine.encode(model, inputs)
    context = engine.context_length(model)
    if len(input_ids) >= context:
        raise InvalidRequest("inputs", f"inputs has {len(input_ids)} tokens; the model's context is {context}")
    generation = _petals_params(engine, model, params, n_input=len(input_ids), used=0, room=context - len(input_ids),
                                stop_mode="exclude")
    with engine.answer(model, input_ids, generation, prompt_param="inputs") as answer:
        finished = _last(answer)
    return jsonify(ok=True, outputs=finished.text, token_count=finished.completion_tokens,
                   route=[hop.to_dict() for hop in finished.route])


def _last(events) -> Finished:
    finished = None
    for event in events:
        if isinstance(event, Finished):
            finished = event
    return finished


def _ws_generate(engine: ChatEngine, ws) -> None:
    """One ws connection = one inference session (chat.petals.dev's /api/v2/generate)."""
    session = None
    try:
        request_ = _ws_receive(ws)
        if request_.get("type") != "open_inference_session":
            raise InvalidRequest("type", f"the first request must have type 'open_inference_session', "
                                         f"got {request_.get('type')!r}")
        params = _Params(request_)
        model = _model(engine, params)
        context = engine.context_length(model)
        max_length = params.integer("max_length", lo=1, hi=context)
        if max_length is None:
            raise InvalidRequest("max_length", f"max_length is required (1 to {context})")
        session = engine.open_session(model, max_length)
        ws.send(json.dumps({"ok": True}))
        while True:
            request_ = _ws_receive(ws)
            if request_.get("type") != "generate":
                raise InvalidRequest("type", f"expected a request of type 'generate', got {request_.get('type')!r}")
            _ws_step(engine, ws, session, model, _Params(request_))
    except ChatError as e:
        _ws_send_error(ws, str(e))
    except ConnectionClosed:  # the client went away, while we received or sent
        pass
    except Exception as e:  # noqa: BLE001 - never a traceback to the user
        logger.warning("ws generate failed", exc_info=True)
        _ws_send_error(ws, f"internal error ({type(e).__name__}); try again")
    finally:
        if session is not None:
            session.close()


def _ws_receive(ws) -> dict:
    raw = ws.receive(timeout=WS_STEP_TIMEOUT)
    if raw is None:
        raise InvalidRequest(None, f"no request within {WS_STEP_TIMEOUT} s; the session is closed")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        raise InvalidRequest(None, "each message must be a JSON object") from None
    if not isinstance(data, dict):
        raise InvalidRequest(None, "each message must be a JSON object")
    return data


def _ws_send_error(ws, message: str) -> None:
    try:
        ws.send(json.dumps({"ok": False, "traceback": message}))
    except Exception:  # noqa: BLE001 - the client is gone
        pass


def _ws_step(engine: ChatEngine, ws, session, model: str, params: _Params) -> None:
    inputs = params.string("inputs")
    first = session.used == 0
    input_ids = engine.encode(model, inputs, add_special_tokens=first) if inputs else []
    if first and not input_ids:
        raise InvalidRequest("inputs", "the first generate request of a session needs inputs")
    stop_sequence = params.string("stop_sequence", max_chars=1000) or None
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
    room = session.room(len(input_ids))
    if room <= 0:
        raise InvalidRequest("max_length", f"the session's max_length {session.max_length} is used up; "
                                           f"open a new session with a larger max_length")
    streaming = stop_sequence is not None
    stops = ((stop_sequence,) if stop_sequence else ()) + extra
    generation = _petals_params(engine, model, params, n_input=len(input_ids), used=session.used, room=room,
                                stop_sequences=stops)
    chunk = generation.max_new_tokens
    if streaming:  # like chat.petals.dev: chunks of max_new_tokens until a stop sequence (or the session's end)
        generation = dataclasses.replace(generation, max_new_tokens=room)
    text, count = "", 0
    for event in session.generate(input_ids or None, generation):
        if isinstance(event, Delta):
            text, count = text + event.text, count + event.token_count
            if streaming and count >= chunk:
                ws.send(json.dumps({"ok": True, "outputs": text, "stop": False, "token_count": count}))
                text, count = "", 0
        elif isinstance(event, Finished):
            if cont_token is not None and event.finish_reason == "stop" and event.text and \
                    any(event.text.endswith(seq) for seq in extra):
                session.replace_last_token(cont_token)
            ws.send(json.dumps({"ok": True, "outputs": text, "stop": True, "token_count": count}))


# ---- the OpenAI-compatible API --------------------------------------------------------------------


def _openai_error(error: ChatError) -> Response:
    status, headers = _error_fields(error)
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_exceeded",
            503: "service_unavailable"}.get(status, "api_error")
    code = "model_not_found" if isinstance(error, UnknownModel) else None
    body = {"error": {"message": str(error), "type": kind, "param": getattr(error, "param", None), "code": code}}
    response = jsonify(body)
    response.status_code = status
    response.headers.update(headers)
    return response


def _openai_common(engine: ChatEngine, model: str, params: _Params, n_prompt: int, *,
                   default_max: int, extra_stops=()) -> GenerationParams:
    context = engine.context_length(model)
    for name in ("presence_penalty", "frequency_penalty"):
        value = params.number(name, default=0.0, lo=-2, hi=2)
        if value != 0:
            raise InvalidRequest(name, f"{name} is not supported here (only 0); use repetition_penalty instead")
    if params.raw("logit_bias"):
        raise InvalidRequest("logit_bias", "logit_bias is not supported here")
    if params.raw("logprobs") not in (None, False, 0):
        raise InvalidRequest("logprobs", "logprobs are not supported here")
    if params.raw("tools") or params.raw("functions"):
        raise InvalidRequest("tools" if params.raw("tools") else "functions", "tool and function calls are not supported here")
    response_format = params.raw("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise InvalidRequest("response_format", "only response_format {\"type\": \"text\"} is supported here")
    params.integer("seed")  # accepted (checked), not used: the swarm gives no reproducible sampling
    params.boolean("stream")
    stream_options = params.raw("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidRequest("stream_options", "stream_options must be an object")
    temperature = params.number("temperature", default=1.0, lo=0, hi=2)
    sampling = params.sampling(top_p=1.0, top_k=0, repetition_penalty=1.0)
    limit_name = "max_completion_tokens" if params.present("max_completion_tokens") else "max_tokens"
    max_tokens = params.integer(limit_name, lo=1, hi=context)
    if n_prompt >= context:
        raise InvalidRequest("messages" if params.present("messages") else "prompt",
                             f"the prompt is {n_prompt} tokens; the model's context is {context} tokens")
    if max_tokens is None:
        max_tokens = min(default_max, context - n_prompt) if default_max else context - n_prompt
    stops = params.strings("stop") + tuple(extra_stops)
    return GenerationParams(max_new_tokens=max_tokens, temperature=temperature, **sampling, stop_sequences=stops,
                            stop_mode="exclude", skip_special_tokens=True)


def _messages(params: _Params) -> list[dict]:
    messages = params.raw("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages", "messages must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequest("messages", f"messages has {len(messages)} entries; at most {MAX_MESSAGES} are accepted")
    result = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(where, f"{where} must be an object with role and content")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise InvalidRequest(f"{where}.role", f"{where}.role must be 'system', 'user' or 'assistant', got {role!r}")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidRequest(f"{where}.content[{j}]", f"{where}.content[{j}] must be a text part "
                                                                   "{\"type\": \"text\", \"text\": ...}")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise InvalidRequest(f"{where}.content", f"{where}.content must be a string")
        if len(content) > MAX_TEXT_CHARS:
            raise InvalidRequest(f"{where}.content", f"{where}.content is longer than {MAX_TEXT_CHARS} characters")
        result.append({"role": role, "content": content})
    return result


def _completion_prompt(engine: ChatEngine, model: str, params: _Params) -> tuple[list[int], str]:
    prompt = params.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if len(prompt) > MAX_TEXT_CHARS:
            raise InvalidRequest("prompt", f"prompt is longer than {MAX_TEXT_CHARS} characters")
        return engine.encode(model, prompt), prompt
    vocab = len(engine.tokenizer(model))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(not 0 <= t < vocab for t in prompt):
            raise InvalidRequest("prompt", f"prompt token ids must be between 0 and {vocab - 1}")
        return list(prompt), engine.tokenizer(model).decode(prompt)
    raise InvalidRequest("prompt", "prompt must be a string, or a list of token ids (one prompt per request)")


def _sse(data: str, event: Optional[str] = None) -> str:
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in lines) + "\n"


def _openai_extension(finished: Finished) -> dict:
    stats = finished.stats()
    return {"route": [hop.to_dict() for hop in finished.route],
            "tokens_per_second": stats["tokens_per_second"], "time_to_first_token": stats["time_to_first_token"]}


def _usage(finished: Finished) -> dict:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def _finish_reason(finished: Finished) -> str:
    return "length" if finished.finish_reason == "length" else "stop"


def _openai_run(engine: ChatEngine, *, chat: bool):
    data, form = _body()
    if form:
        raise InvalidRequest(None, "send the request as JSON (Content-Type: application/json)")
    params = _Params(data)
    name = params.string("model", required=True, max_chars=500)
    model = engine.resolve(name)
    if params.integer("n", default=1, lo=1) != 1:
        raise InvalidRequest("n", "only n = 1 is supported here")
    if params.integer("best_of", default=1, lo=1) != 1:
        raise InvalidRequest("best_of", "only best_of = 1 is supported here")
    echo = ""
    if chat:
        messages = _messages(params)
        input_ids, extra_stops = engine.encode_chat(model, messages)
        generation = _openai_common(engine, model, params, len(input_ids), default_max=0, extra_stops=extra_stops)
        prompt_param = "messages"
    else:
        if params.raw("suffix"):
            raise InvalidRequest("suffix", "suffix is not supported here")
        input_ids, prompt_text = _completion_prompt(engine, model, params)
        if params.boolean("echo"):
            echo = prompt_text
        generation = _openai_common(engine, model, params, len(input_ids), default_max=16)
        prompt_param = "prompt"
    stream = params.boolean("stream")
    include_usage = bool((params.raw("stream_options") or {}).get("include_usage"))
    answer = engine.answer(model, input_ids, generation, prompt_param=prompt_param)
    ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"

    if not stream:
        with answer:
            finished = _last(answer)
        text = echo + finished.text
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish_reason(finished)}
                  if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish_reason(finished)})
        return jsonify(id=ident, object=obj, created=created, model=name, choices=[choice], usage=_usage(finished),
                       petals=_openai_extension(finished))

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: Optional[str], finish: Optional[str] = None, role: bool = False, **extra) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        return _sse(json.dumps({"id": ident, "object": chunk_obj, "created": created, "model": name,
                                "choices": choices, **extra}))

    def events() -> Iterator[str]:
        with answer:
            try:
                if chat:
                    yield chunk(None, role=True)
                if echo:
                    yield chunk(echo)
                for event in answer:
                    if isinstance(event, Delta) and event.text:
                        yield chunk(event.text)
                    elif isinstance(event, Finished):
                        yield chunk(None, _finish_reason(event), petals=_openai_extension(event))
                        if include_usage:
                            yield _sse(json.dumps({"id": ident, "object": chunk_obj, "created": created, "model": name,
                                                   "choices": [], "usage": _usage(event)}))
            except ChatError as e:
                status, _ = _error_fields(e)
                yield _sse(json.dumps({"error": {"message": str(e), "type": "api_error", "code": status}}))
            yield "data: [DONE]\n\n"

    return Response(stream_with_context(events()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---- the chat page -------------------------------------------------------------------------------


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


def _page_params(engine: ChatEngine, model: str, params: _Params) -> GenerationParams:
    context = engine.context_length(model)
    defaults = engine.defaults(model)
    return GenerationParams(
        max_new_tokens=params.integer("max_new_tokens", default=defaults["max_new_tokens"], lo=1, hi=context),
        temperature=params.number("temperature", default=defaults["temperature"], lo=0, hi=2),
        **params.sampling(top_p=defaults["top_p"], top_k=defaults["top_k"],
                          repetition_penalty=defaults["repetition_penalty"]),
    )


def _same_origin() -> None:
    """The page's POSTs start generation: accept them from our own pages only (no cross-site forms)."""
    from monitor.web.security import same_origin

    if not same_origin(request.headers, request.host_url):
        raise _Forbidden(None, "this form only accepts requests from the chat page itself (same origin)")


class _Forbidden(InvalidRequest):
    status = 403


def _page_error(error: ChatError) -> Response:
    status, headers = _error_fields(error)
    response = Response(render_template("chat/_error.html", message=str(error)), status=status)
    response.headers.update(headers)
    response.headers["HX-Retarget"] = "#chat-error"
    response.headers["HX-Reswap"] = "innerHTML"
    response.headers["X-Chat-Error"] = "1"
    return response


# ---- the blueprint ---------------------------------------------------------------------------------


def create_blueprint(engine: ChatEngine) -> Blueprint:
    """The chat page (/chat), the chat.petals.dev API (/api/v1/generate, ws /api/v2/generate) and
    the OpenAI API (/v1/...). The ws route needs a server that speaks WebSocket (werkzeug,
    gunicorn with threads)."""
    from flask_sock import Sock

    bp = Blueprint("chat", __name__, template_folder=str(TEMPLATES), static_folder="static",
                   static_url_path="/chat/static")
    conversations = _Conversations()

    # -- chat.petals.dev ---------------------------------------------------------------------
    @bp.post("/api/v1/generate")
    def http_generate():
        try:
            return _http_generate(engine)
        except ChatError as e:
            status, headers = _error_fields(e)
            return jsonify(ok=False, traceback=str(e), param=getattr(e, "param", None)), status, headers

    def ws_generate(ws):
        _ws_generate(engine, ws)

    Sock().route("/api/v2/generate", bp=bp)(ws_generate)

    # -- OpenAI ------------------------------------------------------------------------------
    @bp.post("/v1/chat/completions")
    def openai_chat():
        try:
            return _openai_run(engine, chat=True)
        except ChatError as e:
            return _openai_error(e)

    @bp.post("/v1/completions")
    def openai_completions():
        try:
            return _openai_run(engine, chat=False)
        except ChatError as e:
            return _openai_error(e)

    def model_card(status) -> dict:
        return {"id": status.name, "object": "model", "created": 0, "owned_by": "petals",
                "petals": {"title": status.title, "served": status.served, "reason": status.reason or None}}

    @bp.get("/v1/models")
    def openai_models():
        return jsonify(object="list", data=[model_card(s) for s in engine.statuses()])

    @bp.get("/v1/models/<path:name>")
    def openai_model(name):
        try:
            return jsonify(model_card(engine.status(engine.resolve(name))))
        except ChatError as e:
            return _openai_error(e)

    # -- the page ----------------------------------------------------------------------------
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
            return _page_error(e)

    @bp.post("/chat/turns")
    def post_turn():
        try:
            _same_origin()
            params = _Params(request.form.to_dict(), form=True)
            model = engine.resolve(params.string("model", required=True, max_chars=500))
            message = params.string("message", required=True)
            if not message.strip():
                raise InvalidRequest("message", "message is empty; write something to send")
            system = params.string("system")
            generation = _page_params(engine, model, params)
            status = engine.status(model)
            if not status.served:
                raise ModelNotServed(model, status.reason, status.missing_blocks)
            conversation = conversations.get_or_create(params.string("conversation_id", max_chars=100))
            history = [m for m in conversation.messages]
            prompt = ([{"role": "system", "content": system}] if system and system.strip() else []) + history + [
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
        except ChatError as e:
            return _page_error(e)

    @bp.get("/chat/turns/<turn_id>/events")
    def turn_events(turn_id):
        turn = conversations.claim(turn_id)
        if turn is None:
            return Response(status=204)  # finished or unknown: tells EventSource not to reconnect

        def events() -> Iterator[str]:
            answer_text = None
            try:
                with engine.answer(turn.model, turn.input_ids, turn.params, stop_event=turn.stop_event,
                                   prompt_param="message") as answer:
                    for event in answer:
                        if isinstance(event, Delta) and event.text:
                            yield _sse(event.text, "token")  # plain text: the page adds it as a text node
                        elif isinstance(event, Finished):
                            answer_text = event.text
                            yield _sse(render_template("chat/_done.html", finished=event, stats=event.stats()), "done")
            except ChatError as e:
                yield _sse(str(e), "failed")
                yield _sse(render_template("chat/_done.html", finished=None, stats=None), "done")
            except Exception as e:  # noqa: BLE001 - never a traceback to the user
                logger.warning("chat turn failed", exc_info=True)
                yield _sse(f"internal error ({type(e).__name__}); try again", "failed")
                yield _sse(render_template("chat/_done.html", finished=None, stats=None), "done")
            finally:
                conversations.finish(turn, answer_text)

        return Response(stream_with_context(events()), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @bp.post("/chat/turns/<turn_id>/stop")
    def stop_turn(turn_id):
        try:
            _same_origin()
        except ChatError as e:
            return _page_error(e)
        turn = conversations.turn(turn_id)
        if turn is not None:
            turn.stop_event.set()
        return '<span class="chat-stopping">stopping…</span>'

    return bp
