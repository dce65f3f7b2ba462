"""The OpenAI API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``), so that
OpenAI's clients and tools chat through the swarm.

A request may ask for several answers: ``n`` samples of each prompt, and on ``/v1/completions`` a
list of prompts (strings or token id lists); choices are numbered prompt by prompt (prompt ``i``'s
``j``-th sample is choice ``i × n + j``), streamed chunks carry their choice's ``index``, and
``usage`` counts every row the swarm computed (each sample's prompt and answer). At most
``max_batch_rows`` rows per request; rows of one length run as one petals session
(``chat.engine.answer_batch``). ``logprobs`` (``top_logprobs`` alternatives on the chat; an integer
on completions) come from the model's head, which runs here; ``echo`` with ``logprobs`` scores the
prompt too (``max_tokens`` 0: only scores it), as evaluation harnesses ask.

Parameters OpenAI defines but the swarm cannot honour (penalties other than repetition, logit
bias, tools, best_of) are refused with a 400 naming them rather than silently ignored. Each answer
carries a ``petals`` extension: its route and speed. A request may carry a ``petals`` object of
routing choices (``monitor.core.route_choice``: ``only``, ``ignore``, ``sort``, bounds; a choice
nobody meets is a 422 naming it) and a ``models`` list to fall back on. Errors have OpenAI's shape, also mid-stream.
Prompts are bounded before they are tokenized (``chat.http.limits``): characters over all messages
or prompts, token ids by the model's context.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from flask import Blueprint, Response, jsonify, stream_with_context

from monitor.http_errors import openai_error_body
from monitor.core.route_choice import ChoiceError, parse_choice

from chat.engine import (
    BatchAnswer,
    Busy,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    GenerationParams,
    InvalidRequest,
    ModelNotServed,
    ModelStatus,
    RouteChoice,
    RouteUnmet,
)
from chat.http import logprobs as lp
from chat.errors import check_fits_context
from chat.http.limits import ChatLimits, check_token_ids
from chat.http.params import Params, client_address, request_params
from chat.http.responses import (
    INTERNAL_ERROR,
    guarded,
    openai_chat_error,
    openai_chat_error_body,
    openai_error,
    sse,
)

logger = logging.getLogger(__name__)

MAX_MESSAGES = 512
MAX_CONTENT_PARTS = 64  # text parts of one message


@dataclass(frozen=True)
class _Logprobs:
    """What a request asks of log-probabilities: ``top`` alternatives per token; ``echo``: the prompt's too."""

    top: int
    echo: bool = False


def _logprobs(engine: ChatEngine, params: Params, *, chat: bool, echo: bool) -> Optional[_Logprobs]:
    """The chat's ``logprobs`` (true/false) and ``top_logprobs`` (0 to max_logprobs), or the text
    completions' ``logprobs`` (null, or 0 to max_logprobs alternatives)."""
    bound = engine.max_logprobs
    if chat:
        wanted = params.boolean("logprobs")
        top = params.integer("top_logprobs", lo=0, hi=bound)
        if top and not wanted:
            raise InvalidRequest("top_logprobs", "top_logprobs needs logprobs: true")
        return _Logprobs(top or 0) if wanted else None
    if isinstance(params.raw("logprobs"), bool):
        raise InvalidRequest("logprobs", f"logprobs must be null or an integer between 0 and {bound} here")
    top = params.integer("logprobs", lo=0, hi=bound)
    return None if top is None else _Logprobs(top, echo=echo)


def _generation_params(engine: ChatEngine, model: str, params: Params, n_prompt: int, *, chat: bool,
                       default_max: int, extra_stops: Sequence[str] = (),
                       logprobs: Optional[_Logprobs] = None) -> GenerationParams:
    context = engine.context_length(model)
    for name in ("presence_penalty", "frequency_penalty"):
        value = params.number(name, default=0.0, lo=-2, hi=2)
        if value != 0:
            raise InvalidRequest(name, f"{name} is not supported here (only 0); use repetition_penalty instead")
    if params.raw("logit_bias"):
        raise InvalidRequest("logit_bias", "logit_bias is not supported here")
    if params.raw("tools") or params.raw("functions"):
        raise InvalidRequest("tools" if params.raw("tools") else "functions", "tool and function calls are not supported here")
    response_format = params.raw("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise InvalidRequest("response_format", "only response_format {\"type\": \"text\"} is supported here")
    params.integer("seed")  # accepted (checked), not used: the swarm gives no reproducible sampling
    stream = params.boolean("stream")
    stream_options = params.raw("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidRequest("stream_options", "stream_options must be an object")
    temperature = params.number("temperature", default=1.0, lo=0, hi=2)
    sampling = params.sampling(top_p=1.0, top_k=0, repetition_penalty=1.0)
    limit_name = "max_completion_tokens" if params.present("max_completion_tokens") else "max_tokens"
    scoring = logprobs is not None and logprobs.echo
    max_tokens = params.integer(limit_name, lo=0 if scoring else 1, hi=context)
    if max_tokens == 0 and stream:
        raise InvalidRequest(limit_name, f"{limit_name} 0 (scoring the prompt) is answered whole: set stream to false")
    if scoring and stream:
        raise InvalidRequest("echo", "echo with logprobs is answered whole: set stream to false")
    check_fits_context("messages" if params.present("messages") else "prompt", n_prompt, context, what="the prompt")
    if max_tokens is None:
        max_tokens = min(default_max, context - n_prompt) if default_max else context - n_prompt
    stops = params.strings("stop") + tuple(extra_stops)
    return GenerationParams(max_new_tokens=max_tokens, temperature=temperature, **sampling, stop_sequences=stops,
                            stop_mode="exclude", skip_special_tokens=True, logprobs=logprobs is not None,
                            top_logprobs=logprobs.top if logprobs else 0, prompt_logprobs=scoring)


def _messages(params: Params, limits: ChatLimits) -> list[dict]:
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
            if len(content) > MAX_CONTENT_PARTS:
                raise InvalidRequest(f"{where}.content", f"{where}.content has {len(content)} parts; at most "
                                                         f"{MAX_CONTENT_PARTS} are accepted")
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidRequest(f"{where}.content[{j}]", f"{where}.content[{j}] must be a text part "
                                                                   "{\"type\": \"text\", \"text\": ...}")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise InvalidRequest(f"{where}.content", f"{where}.content must be a string")
        result.append({"role": role, "content": content})
    limits.check_prompt_chars("messages", sum(len(m["content"]) for m in result),
                              what="the content of messages, all together,")
    return result


def _token_ids(engine: ChatEngine, model: str, ids: list, param: str) -> list[int]:
    check_token_ids(param, ids, engine.context_length(model))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise InvalidRequest(param, f"{param} must be a string, a list of token ids, or a list of those")
    vocab = len(engine.tokenizer(model))
    if any(not 0 <= t < vocab for t in ids):
        raise InvalidRequest(param, f"{param} token ids must be between 0 and {vocab - 1}")
    return list(ids)


def _completion_prompts(engine: ChatEngine, model: str, params: Params,
                        limits: ChatLimits) -> list[tuple[list[int], str]]:
    """(token ids, text) of every prompt: a string, a list of token ids, or a list of either."""
    prompt = params.raw("prompt")
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and prompt:
        prompts = [prompt]  # one prompt of token ids
    else:
        raise InvalidRequest("prompt", "prompt must be a string, a list of token ids, or a list of those")
    if len(prompts) > engine.max_batch_rows:
        raise InvalidRequest("prompt", f"prompt has {len(prompts)} prompts; at most {engine.max_batch_rows} "
                                       f"are answered per request")
    limits.check_prompt_chars("prompt", sum(len(p) for p in prompts if isinstance(p, str)),
                              what="prompt" if len(prompts) == 1 else "the prompts, all together,")
    result = []
    for p in prompts:
        if isinstance(p, str):
            result.append((engine.encode(model, p), p))
        elif p:
            ids = _token_ids(engine, model, p, "prompt")
            result.append((ids, engine.tokenizer(model).decode(ids)))
        else:
            raise InvalidRequest("prompt", "prompt has an empty list of token ids")
    return result


def _petals_extension(finished: Finished) -> dict:
    stats = finished.stats()
    return {"route": [hop.to_dict() for hop in finished.route],
            "tokens_per_second": stats["tokens_per_second"], "time_to_first_token": stats["time_to_first_token"]}


def _usage(finished: Sequence[Finished]) -> dict:
    """Every row the swarm computed: each sample's prompt and answer."""
    prompt = sum(f.prompt_tokens for f in finished)
    completion = sum(f.completion_tokens for f in finished)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish_reason(finished: Finished) -> str:
    return "length" if finished.finish_reason == "length" else "stop"


CARD_FORECAST_TOKENS = 256  # the model list's forecast: a request of this many tokens, arriving now


def _model_card(engine: ChatEngine, status: ModelStatus) -> dict:
    forecast = engine.forecast(status.name, prompt_tokens=0, max_tokens=CARD_FORECAST_TOKENS)
    return {"id": status.name, "object": "model", "created": 0, "owned_by": "petals",
            "petals": {"title": status.title, "served": status.served, "reason": status.reason or None,
                       "forecast": {"max_tokens": CARD_FORECAST_TOKENS, **forecast.to_dict()}}}


def estimate(engine: ChatEngine, limits: ChatLimits) -> Response:
    """``POST /v1/estimate``: the body of a chat or text completion; its forecast, nothing generated."""
    params = request_params()
    name, model = _requested_model(engine, params)
    chat = params.raw("messages") is not None
    request = (_chat_request if chat else _text_request)(engine, model, params, limits)
    status = engine.status(model)
    prompt_tokens = max(len(row) for row in request.rows)
    forecast = engine.forecast(model, prompt_tokens=prompt_tokens, max_tokens=request.generation.max_new_tokens)
    route = {"meets": True}
    choice = route_choice(params)
    if status.served and not choice.empty:
        try:
            engine.check_route_choice(model, choice, prompt_tokens=prompt_tokens,
                                      max_tokens=request.generation.max_new_tokens)
        except (RouteUnmet, Busy) as e:
            route = {"meets": False, "param": getattr(e, "param", None), "status": e.status, "reason": str(e)}
    return jsonify(object="estimate", model=name, prompt_tokens=prompt_tokens,
                   max_tokens=request.generation.max_new_tokens, answers=len(request.rows),
                   petals={"served": status.served, "reason": status.reason or None, "forecast": forecast.to_dict(),
                           "route_choice": route})


@dataclass(frozen=True)
class _Request:
    """What a completion asks for: its rows (token ids; prompt by prompt, ``n`` samples each), how
    to generate, the parameter that holds the prompts (named in errors), each row's ``echo`` text
    (text completions' ``echo``) and the log-probabilities it wants."""

    rows: list[list[int]]
    generation: GenerationParams
    param: str
    echoes: list[str]
    logprobs: Optional[_Logprobs] = None


def _samples(params: Params, engine: ChatEngine, n_prompts: int) -> int:
    n = params.integer("n", default=1, lo=1, hi=engine.max_batch_rows)
    if n * n_prompts > engine.max_batch_rows:
        raise InvalidRequest("n", f"{n_prompts} prompts × n = {n} asks for {n * n_prompts} answers; at most "
                                  f"{engine.max_batch_rows} are computed per request")
    return n


def _chat_request(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> _Request:
    messages = _messages(params, limits)
    n = _samples(params, engine, 1)
    input_ids, extra_stops = engine.encode_chat(model, messages)
    logprobs = _logprobs(engine, params, chat=True, echo=False)
    generation = _generation_params(engine, model, params, len(input_ids), chat=True, default_max=0,
                                    extra_stops=extra_stops, logprobs=logprobs)
    return _Request([input_ids] * n, generation, "messages", [""] * n, logprobs)


def _text_request(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> _Request:
    if params.raw("suffix"):
        raise InvalidRequest("suffix", "suffix is not supported here")
    prompts = _completion_prompts(engine, model, params, limits)
    n = _samples(params, engine, len(prompts))
    echo = params.boolean("echo")
    logprobs = _logprobs(engine, params, chat=False, echo=echo)
    generation = _generation_params(engine, model, params, max(len(ids) for ids, _ in prompts), chat=False,
                                    default_max=16, logprobs=logprobs)
    rows = [ids for ids, _ in prompts for _ in range(n)]
    echoes = [text if echo else "" for _, text in prompts for _ in range(n)]
    return _Request(rows, generation, "prompt", echoes, logprobs)


def _requested_model(engine: ChatEngine, params: Params) -> tuple[str, str]:
    """(the model's name as asked, the engine's name for it), after the checks every completion
    shares: a JSON body, best_of 1."""
    if params.form:
        raise InvalidRequest(None, "send the request as JSON (Content-Type: application/json)")
    name = params.string("model", required=True, max_chars=500)
    model = engine.resolve(name)
    if params.integer("best_of", default=1, lo=1) != 1:
        raise InvalidRequest("best_of", "only best_of = 1 is supported here (use n for several answers)")
    return name, model


@dataclass
class _Reply:
    """The objects of one completion in OpenAI's shape, whole or as stream chunks."""

    chat: bool
    model: str  # as the client named it
    ident: str
    created: int
    request: _Request
    texts: lp.TokenTexts
    sent: dict = field(default_factory=dict)  # choice -> (token ids whose logprobs were streamed, characters sent)
    fallbacks: list = field(default_factory=list)  # the models of ``models`` that gave way, and why

    @classmethod
    def new(cls, chat: bool, model: str, request: _Request, tokenizer, *, fallbacks: Sequence[dict] = ()) -> "_Reply":
        return cls(chat, model, ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), int(time.time()),
                   request, lp.TokenTexts(tokenizer), fallbacks=list(fallbacks))

    def extension(self, finished: Finished) -> dict:
        found = _petals_extension(finished)
        return {**found, "fallbacks": self.fallbacks} if self.fallbacks else found

    # -- log-probabilities ----------------------------------------------------------------------
    def _chat_logprobs(self, index: int, logprobs: Sequence, before: Sequence[int]) -> Optional[dict]:
        if self.request.logprobs is None:
            return None
        return {"content": lp.chat_content(self.texts, logprobs, before, self.request.logprobs.top), "refusal": None}

    def _text_logprobs(self, index: int, finished: Finished, echo: str) -> Optional[dict]:
        wanted = self.request.logprobs
        if wanted is None:
            return None
        prompt = self.request.rows[index]
        echoed = None
        if wanted.echo and finished.prompt_logprobs:
            echoed = lp.completion_logprobs(self.texts, finished.prompt_logprobs, finished.prompt_ids, (), wanted.top)
        answer = lp.completion_logprobs(self.texts, finished.logprobs, finished.token_ids, prompt, wanted.top,
                                        offset=len(echo))
        return lp.merged(echoed, answer)

    # -- whole ----------------------------------------------------------------------------------
    def whole(self, finished: Sequence[Finished]) -> dict:
        choices = []
        for index, done in enumerate(finished):
            echo = self.request.echoes[index]
            reason = _finish_reason(done)
            if self.chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": done.text},
                                "logprobs": self._chat_logprobs(index, done.logprobs, self.request.rows[index]),
                                "finish_reason": reason})
            else:
                choices.append({"index": index, "text": echo + done.text,
                                "logprobs": self._text_logprobs(index, done, echo), "finish_reason": reason})
        return {"id": self.ident, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": _usage(finished),
                "petals": self.extension(finished[0])}

    # -- streamed -------------------------------------------------------------------------------
    def role_chunk(self, index: int) -> str:
        return self._event(choices=[{"index": index, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}])

    def chunk(self, index: int, text: Optional[str], logprobs: Sequence = (), finish: Optional[str] = None,
              **extra) -> str:
        """A chunk of choice ``index``: its new text and the log-probabilities of its new tokens."""
        ids, chars = self.sent.setdefault(index, ([], 0))
        before = self.request.rows[index] + ids
        if self.chat:
            delta = {"content": text} if text is not None else {}
            chunk_lp = self._chat_logprobs(index, logprobs, before) if logprobs else None
            choices = [{"index": index, "delta": delta, "logprobs": chunk_lp, "finish_reason": finish}]
        else:
            chunk_lp = None
            if logprobs and self.request.logprobs is not None:
                chunk_lp = lp.completion_logprobs(self.texts, logprobs, [t.token_id for t in logprobs], before,
                                                  self.request.logprobs.top, offset=chars)
            choices = [{"index": index, "text": text or "", "logprobs": chunk_lp, "finish_reason": finish}]
        self.sent[index] = (ids + [t.token_id for t in logprobs], chars + len(text or ""))
        return self._event(choices=choices, **extra)

    def finish_chunk(self, index: int, finished: Finished) -> str:
        """The choice's end: its finish reason, the log-probabilities not sent yet, its route."""
        sent = len(self.sent.get(index, ([], 0))[0])
        rest = finished.logprobs[sent:] if self.request.logprobs is not None else ()
        return self.chunk(index, None, rest, _finish_reason(finished), petals=self.extension(finished))

    def usage_chunk(self, finished: Sequence[Finished]) -> str:
        return self._event(choices=[], usage=_usage(finished))

    def _event(self, **fields) -> str:
        return sse(json.dumps({"id": self.ident, "object": "chat.completion.chunk" if self.chat else "text_completion",
                               "created": self.created, "model": self.model, **fields}))


def _collect(batch: BatchAnswer, rows: int) -> list[Finished]:
    finished: dict[int, Finished] = {}
    with batch:
        for index, event in batch:
            if isinstance(event, Finished):
                finished[index] = event
    return [finished[i] for i in range(rows)]


def _stream_events(batch: BatchAnswer, reply: _Reply, include_usage: bool) -> Iterator[str]:
    """The answers as server-sent events, ending with ``[DONE]``; an error after the status line
    goes into the stream, in OpenAI's shape."""
    rows = len(reply.request.rows)
    finished: dict[int, Finished] = {}
    with batch:
        try:
            for index in range(rows):
                if reply.chat:
                    yield reply.role_chunk(index)
                elif reply.request.echoes[index]:
                    yield reply.chunk(index, reply.request.echoes[index])
            for index, event in batch:
                if isinstance(event, Delta) and (event.text or event.logprobs):
                    yield reply.chunk(index, event.text, event.logprobs if reply.request.logprobs else ())
                elif isinstance(event, Finished):
                    finished[index] = event
                    yield reply.finish_chunk(index, event)
            if include_usage:
                yield reply.usage_chunk([finished[i] for i in range(rows)])
        except ChatError as e:
            yield sse(json.dumps(openai_chat_error_body(e)))
        except Exception:  # noqa: BLE001 - never an exception's text to the user
            logger.warning("streamed completion failed", exc_info=True)
            yield sse(json.dumps(openai_error_body(500, INTERNAL_ERROR)))
        yield "data: [DONE]\n\n"


MAX_FALLBACK_MODELS = 8  # models in a request's ``models`` list
FALLBACK_ON = (ModelNotServed, RouteUnmet)  # a model refused for these: the next of ``models`` is tried


def route_choice(params: Params) -> RouteChoice:
    """The request's ``petals`` routing choices (``monitor.core.route_choice``)."""
    try:
        return parse_choice(params.raw("petals"))
    except ChoiceError as e:
        raise InvalidRequest(e.field, str(e)) from None


def _models(engine: ChatEngine, params: Params, first: tuple[str, str]) -> list[tuple[str, str]]:
    """(name as asked, engine name) of ``model`` and then of each model in ``models`` (OpenRouter's
    fallbacks), each once."""
    listed = params.raw("models")
    if listed is None:
        return [first]
    if not isinstance(listed, list) or not all(isinstance(m, str) and 0 < len(m) <= 500 for m in listed):
        raise InvalidRequest("models", "models must be a list of model names")
    if len(listed) > MAX_FALLBACK_MODELS:
        raise InvalidRequest("models", f"models names {len(listed)} models; at most {MAX_FALLBACK_MODELS}")
    found = {first[1]: first}
    for index, name in enumerate(listed):
        try:
            found.setdefault(engine.resolve(name), (name, engine.resolve(name)))
        except ChatError as e:
            raise InvalidRequest(f"models[{index}]", str(e)) from None
    return list(found.values())


@dataclass
class _Started:
    """A completion that has its slots: the model that took it, the request as that model reads it,
    the batch being answered, and the models that gave way before it."""

    name: str
    model: str
    request: _Request
    batch: BatchAnswer
    fallbacks: list


def _start(engine: ChatEngine, limits: ChatLimits, params: Params, *, chat: bool, client: Optional[str],
           on_wait=None) -> _Started:
    """The request started on the first of its models that takes it (``models``: a model refused as
    not served or unable to meet the ``petals`` choices gives way to the next)."""
    first = _requested_model(engine, params)
    choice = route_choice(params)
    candidates = _models(engine, params, first)
    fallbacks: list[dict] = []
    for index, (name, model) in enumerate(candidates):
        request = (_chat_request if chat else _text_request)(engine, model, params, limits)
        try:
            batch = engine.answer_batch(model, request.rows, request.generation, client=client,
                                        prompt_param=request.param, choice=choice, on_wait=on_wait)
        except FALLBACK_ON as e:
            if index + 1 == len(candidates):
                raise
            fallbacks.append({"model": name, "status": e.status, "error": str(e)})
            continue
        return _Started(name, model, request, batch, fallbacks)
    raise AssertionError("no candidate model")  # (candidates is never empty)


def queue_comment(position: int, wait: float) -> str:
    """A waiting streamed request's place, as an SSE comment (OpenAI clients skip comments)."""
    return f": queue position {position}, expected wait {wait:.1f} s\n\n"


def complete(engine: ChatEngine, limits: ChatLimits, *, chat: bool) -> Response:
    """A chat completion (``chat``) or a text completion, whole or streamed, of one or more choices.
    With ``models``, a model refused as not served or unable to meet the request's ``petals``
    choices gives way to the next (``petals.fallbacks`` in the answer says which and why). A
    streamed request that has to wait for a slot gets its response at once, and SSE comments with
    its queue position and expected wait as they change; a refusal while it waits comes in the
    stream, in OpenAI's shape."""
    params = request_params()
    stream = params.boolean("stream")
    include_usage = bool((params.raw("stream_options") or {}).get("include_usage"))
    client = client_address()
    if not stream:
        started = _start(engine, limits, params, chat=chat, client=client)
        reply = _Reply.new(chat, started.name, started.request, engine.tokenizer(started.model),
                           fallbacks=started.fallbacks)
        return jsonify(reply.whole(_collect(started.batch, len(started.request.rows))))
    told: "queue.Queue[tuple]" = queue.Queue()
    lock, left = threading.Lock(), threading.Event()

    def run() -> None:
        try:
            started = _start(engine, limits, params, chat=chat, client=client,
                             on_wait=lambda position, wait: told.put(("queued", position, wait)))
        except BaseException as e:  # noqa: BLE001 - told to the request's thread, which answers it
            told.put(("error", e))
            return
        with lock:
            if left.is_set():  # its client went away while it waited: the slots go back at once
                started.batch.close()
                return
            told.put(("ready", started))

    threading.Thread(target=run, name="openai-start", daemon=True).start()
    first = told.get()
    if first[0] == "error":
        raise first[1]

    def events(item) -> Iterator[str]:
        try:
            while item[0] == "queued":
                yield queue_comment(item[1], item[2])
                item = told.get()
            if item[0] == "error":
                error = item[1]
                body = openai_chat_error_body(error) if isinstance(error, ChatError) else openai_error_body(
                    500, INTERNAL_ERROR)
                if not isinstance(error, ChatError):
                    logger.warning("streamed completion failed while waiting", exc_info=error)
                yield sse(json.dumps(body))
                yield "data: [DONE]\n\n"
                return
            started = item[1]
            reply = _Reply.new(chat, started.name, started.request, engine.tokenizer(started.model),
                               fallbacks=started.fallbacks)
            yield from _stream_events(started.batch, reply, include_usage)
        finally:
            with lock:
                left.set()
            while not told.empty():  # started, but never streamed
                late = told.get_nowait()
                if late[0] == "ready":
                    late[1].batch.close()

    return Response(stream_with_context(events(first)), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def register(bp: Blueprint, engine: ChatEngine, limits: ChatLimits) -> None:
    """Add the OpenAI API's routes to the chat blueprint."""

    def answer(view):
        return guarded(view, chat_error=openai_chat_error, internal_error=lambda: openai_error(500, INTERNAL_ERROR),
                       what="OpenAI API request")

    @bp.post("/v1/chat/completions")
    def openai_chat():
        return answer(lambda: complete(engine, limits, chat=True))

    @bp.post("/v1/completions")
    def openai_completions():
        return answer(lambda: complete(engine, limits, chat=False))

    @bp.get("/v1/models")
    def openai_models():
        return answer(lambda: jsonify(object="list", data=[_model_card(engine, s) for s in engine.statuses()]))

    @bp.get("/v1/models/<path:name>")
    def openai_model(name):
        return answer(lambda: jsonify(_model_card(engine, engine.status(engine.resolve(name)))))

    @bp.post("/v1/estimate")
    def openai_estimate():
        return answer(lambda: estimate(engine, limits))
