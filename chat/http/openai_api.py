"""The OpenAI API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``), so that
OpenAI's clients and tools chat through the swarm.

Parameters OpenAI defines but the swarm cannot honour (penalties other than repetition, logit
bias, logprobs, tools, n > 1) are refused with a 400 naming them rather than silently ignored.
Each answer carries a ``petals`` extension: its route and speed. Errors have OpenAI's shape, also
mid-stream. Prompts are bounded before they are tokenized (``chat.http.limits``): characters over
all messages, token ids by the model's context.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from flask import Blueprint, Response, jsonify, stream_with_context

from monitor.http_errors import openai_error_body

from chat.engine import (
    Answer,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    GenerationParams,
    InvalidRequest,
    ModelStatus,
)
from chat.http.limits import ChatLimits, check_token_ids
from chat.http.params import Params, request_params
from chat.http.responses import (
    INTERNAL_ERROR,
    guarded,
    last_finished,
    openai_chat_error,
    openai_chat_error_body,
    openai_error,
    sse,
)

logger = logging.getLogger(__name__)

MAX_MESSAGES = 512
MAX_CONTENT_PARTS = 64  # text parts of one message


def _generation_params(engine: ChatEngine, model: str, params: Params, n_prompt: int, *,
                       default_max: int, extra_stops: Sequence[str] = ()) -> GenerationParams:
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


def _completion_prompt(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> tuple[list[int], str]:
    prompt = params.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        limits.check_prompt_chars("prompt", len(prompt))
        return engine.encode(model, prompt), prompt
    if isinstance(prompt, list) and prompt:
        check_token_ids("prompt", prompt, engine.context_length(model))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(engine.tokenizer(model))
        if any(not 0 <= t < vocab for t in prompt):
            raise InvalidRequest("prompt", f"prompt token ids must be between 0 and {vocab - 1}")
        return list(prompt), engine.tokenizer(model).decode(prompt)
    raise InvalidRequest("prompt", "prompt must be a string, or a list of token ids (one prompt per request)")


def _petals_extension(finished: Finished) -> dict:
    stats = finished.stats()
    return {"route": [hop.to_dict() for hop in finished.route],
            "tokens_per_second": stats["tokens_per_second"], "time_to_first_token": stats["time_to_first_token"]}


def _usage(finished: Finished) -> dict:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def _finish_reason(finished: Finished) -> str:
    return "length" if finished.finish_reason == "length" else "stop"


def _model_card(status: ModelStatus) -> dict:
    return {"id": status.name, "object": "model", "created": 0, "owned_by": "petals",
            "petals": {"title": status.title, "served": status.served, "reason": status.reason or None}}


@dataclass(frozen=True)
class _Prompt:
    """What a request asks to continue: its token ids, how to generate, the parameter that holds
    it (named in errors) and the text to echo before the answer (text completions' ``echo``)."""

    input_ids: list[int]
    generation: GenerationParams
    param: str
    echo: str = ""


def _chat_prompt(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> _Prompt:
    messages = _messages(params, limits)
    input_ids, extra_stops = engine.encode_chat(model, messages)
    generation = _generation_params(engine, model, params, len(input_ids), default_max=0, extra_stops=extra_stops)
    return _Prompt(input_ids, generation, "messages")


def _text_prompt(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> _Prompt:
    if params.raw("suffix"):
        raise InvalidRequest("suffix", "suffix is not supported here")
    input_ids, prompt_text = _completion_prompt(engine, model, params, limits)
    echo = prompt_text if params.boolean("echo") else ""
    generation = _generation_params(engine, model, params, len(input_ids), default_max=16)
    return _Prompt(input_ids, generation, "prompt", echo)


def _requested_model(engine: ChatEngine, params: Params) -> tuple[str, str]:
    """(the model's name as asked, the engine's name for it), after the checks every completion
    shares: a JSON body, one choice."""
    if params.form:
        raise InvalidRequest(None, "send the request as JSON (Content-Type: application/json)")
    name = params.string("model", required=True, max_chars=500)
    model = engine.resolve(name)
    if params.integer("n", default=1, lo=1) != 1:
        raise InvalidRequest("n", "only n = 1 is supported here")
    if params.integer("best_of", default=1, lo=1) != 1:
        raise InvalidRequest("best_of", "only best_of = 1 is supported here")
    return name, model


@dataclass(frozen=True)
class _Reply:
    """The objects of one completion in OpenAI's shape, whole or as stream chunks."""

    chat: bool
    model: str  # as the client named it
    ident: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> "_Reply":
        return cls(chat, model, ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), int(time.time()))

    def whole(self, finished: Finished, echo: str) -> dict:
        text = echo + finished.text
        reason = _finish_reason(finished)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return {"id": self.ident, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": _usage(finished),
                "petals": _petals_extension(finished)}

    def chunk(self, text: Optional[str], finish: Optional[str] = None, *, role: bool = False, **extra) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        return self._event(choices=choices, **extra)

    def usage_chunk(self, finished: Finished) -> str:
        return self._event(choices=[], usage=_usage(finished))

    def _event(self, **fields) -> str:
        return sse(json.dumps({"id": self.ident, "object": "chat.completion.chunk" if self.chat else "text_completion",
                               "created": self.created, "model": self.model, **fields}))


def _stream_events(answer: Answer, reply: _Reply, echo: str, include_usage: bool) -> Iterator[str]:
    """The answer as server-sent events, ending with ``[DONE]``; an error after the status line
    goes into the stream, in OpenAI's shape."""
    with answer:
        try:
            if reply.chat:
                yield reply.chunk(None, role=True)
            if echo:
                yield reply.chunk(echo)
            for event in answer:
                if isinstance(event, Delta) and event.text:
                    yield reply.chunk(event.text)
                elif isinstance(event, Finished):
                    yield reply.chunk(None, _finish_reason(event), petals=_petals_extension(event))
                    if include_usage:
                        yield reply.usage_chunk(event)
        except ChatError as e:
            yield sse(json.dumps(openai_chat_error_body(e)))
        except Exception:  # noqa: BLE001 - never an exception's text to the user
            logger.warning("streamed completion failed", exc_info=True)
            yield sse(json.dumps(openai_error_body(500, INTERNAL_ERROR)))
        yield "data: [DONE]\n\n"


def complete(engine: ChatEngine, limits: ChatLimits, *, chat: bool) -> Response:
    """A chat completion (``chat``) or a text completion, whole or streamed."""
    params = request_params()
    name, model = _requested_model(engine, params)
    prompt = (_chat_prompt if chat else _text_prompt)(engine, model, params, limits)
    stream = params.boolean("stream")
    include_usage = bool((params.raw("stream_options") or {}).get("include_usage"))
    answer = engine.answer(model, prompt.input_ids, prompt.generation, prompt_param=prompt.param)
    reply = _Reply.new(chat, name)
    if not stream:
        with answer:
            finished = last_finished(answer)
        return jsonify(reply.whole(finished, prompt.echo))
    return Response(stream_with_context(_stream_events(answer, reply, prompt.echo, include_usage)),
                    mimetype="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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
        return answer(lambda: jsonify(object="list", data=[_model_card(s) for s in engine.statuses()]))

    @bp.get("/v1/models/<path:name>")
    def openai_model(name):
        return answer(lambda: jsonify(_model_card(engine.status(engine.resolve(name)))))
