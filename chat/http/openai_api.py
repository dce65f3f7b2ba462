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
What a request asks for is read and checked in ``chat.http.openai_request``; this module answers it.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from flask import Blueprint, Response, jsonify, stream_with_context

from monitor.api_doc import OpenAIError, documented
from monitor.http_errors import openai_error_body
from chat.engine import (
    BatchAnswer,
    Busy,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    ModelReadiness,
    RouteUnmet,
)
from chat.http import api_models as m
from chat.http import logprobs as lp
from chat.streams import started_waiting
from chat.http.limits import ChatLimits
from chat.http.openai_request import (
    FALLBACK_ON,
    CompletionRequest,
    chat_request,
    fallback_models,
    requested_model,
    route_choice,
    text_request,
)
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


def _petals_extension(finished: Finished) -> dict:
    stats = finished.stats()
    return {"route": [hop.to_dict() for hop in finished.route],
            "tokens_per_second": stats["tokens_per_second"], "time_to_first_token": stats["time_to_first_token"]}


def _usage(finished: Sequence[Finished], cached: int = 0) -> dict:
    """Every row the swarm computed: each sample's prompt and answer; ``cached``: prompt tokens a
    kept session already held (OpenAI's ``prompt_tokens_details.cached_tokens``)."""
    prompt = sum(f.prompt_tokens for f in finished)
    completion = sum(f.completion_tokens for f in finished)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish_reason(finished: Finished) -> str:
    return "length" if finished.finish_reason == "length" else "stop"


CARD_FORECAST_TOKENS = 256  # the model list's forecast: a request of this many tokens, arriving now


def _model_card(engine: ChatEngine, status: ModelReadiness) -> dict:
    forecast = engine.admission.forecast(status.name, prompt_tokens=0, max_tokens=CARD_FORECAST_TOKENS)
    return {"id": status.name, "object": "model", "created": 0, "owned_by": "petals",
            "petals": {"title": status.title, "served": status.served, "reason": status.reason or None,
                       "forecast": {"max_tokens": CARD_FORECAST_TOKENS, **forecast.to_dict()},
                       "client_side": engine.models.client_side_info(status.name)}}


def estimate(engine: ChatEngine, limits: ChatLimits) -> Response:
    """``POST /v1/estimate``: the body of a chat or text completion; its forecast, nothing generated."""
    params = request_params()
    name, model = requested_model(engine, params)
    chat = params.raw("messages") is not None
    request = (chat_request if chat else text_request)(engine, model, params, limits)
    status = engine.admission.status(model)
    prompt_tokens = max(len(row) for row in request.rows)
    # (a follow-up with its handle: what requests that continued their kept session got)
    forecast, planned = engine.admission.forecast_route(model, prompt_tokens=prompt_tokens,
                                              max_tokens=request.generation.max_new_tokens,
                                              continued=True if request.follow is not None else None)
    route = {"meets": True}
    choice = route_choice(params)
    if status.served and not choice.empty:
        try:
            engine.admission.check_route_choice(model, choice, prompt_tokens=prompt_tokens,
                                      max_tokens=request.generation.max_new_tokens)
        except (RouteUnmet, Busy) as e:
            route = {"meets": False, "param": getattr(e, "param", None), "status": e.status, "reason": str(e)}
    return jsonify(object="estimate", model=name, prompt_tokens=prompt_tokens,
                   max_tokens=request.generation.max_new_tokens, answers=len(request.rows),
                   petals={"served": status.served, "reason": status.reason or None, "forecast": forecast.to_dict(),
                           "planned_route": [hop.to_dict() for hop in planned], "route_choice": route})


@dataclass
class _Reply:
    """The objects of one completion in OpenAI's shape, whole or as stream chunks."""

    chat: bool
    model: str  # as the client named it
    ident: str
    created: int
    request: CompletionRequest
    texts: lp.TokenTexts
    sent: dict = field(default_factory=dict)  # choice -> (token ids whose logprobs were streamed, characters sent)
    fallbacks: list = field(default_factory=list)  # the models of ``models`` that gave way, and why
    batch: Optional[BatchAnswer] = None  # what answers it: its session's handle, whether it continued one

    @classmethod
    def new(cls, chat: bool, model: str, request: CompletionRequest, tokenizer, *, fallbacks: Sequence[dict] = (),
            batch: Optional[BatchAnswer] = None) -> "_Reply":
        return cls(chat, model, ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), int(time.time()),
                   request, lp.TokenTexts(tokenizer), fallbacks=list(fallbacks), batch=batch)

    def session(self) -> dict:
        """``petals.session``: the handle a follow-up sends back to continue this answer's session
        (``chat.kept``; absent when it cannot be kept), and whether this answer continued one."""
        if self.batch is None or self.batch.handle is None:
            return {}
        return {"session": self.batch.handle, "continued": self.batch.continued}

    def cached(self) -> int:
        return self.batch.not_resent if self.batch is not None else 0

    def extension(self, finished: Finished) -> dict:
        found = {**_petals_extension(finished), **self.session()}
        if self.batch is not None and self.batch.waited is not None:  # the slot wait its forecast told of
            found["waited"] = round(self.batch.waited, 4)
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
                "created": self.created, "model": self.model, "choices": choices,
                "usage": _usage(finished, self.cached()), "petals": self.extension(finished[0])}

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
        return self._event(choices=[], usage=_usage(finished, self.cached()))

    def _event(self, **fields) -> str:
        if "petals" not in fields and self.session():  # (every chunk carries the handle)
            fields["petals"] = self.session()
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


@dataclass
class _Started:
    """A completion that has its slots: the model that took it, the request as that model reads it,
    the batch being answered, and the models that gave way before it."""

    name: str
    model: str
    request: CompletionRequest
    batch: BatchAnswer
    fallbacks: list


def _start(engine: ChatEngine, limits: ChatLimits, params: Params, *, chat: bool, client: Optional[str],
           on_wait=None) -> _Started:
    """The request started on the first of its models that takes it (``models``: a model refused as
    not served or unable to meet the ``petals`` choices gives way to the next)."""
    first = requested_model(engine, params)
    choice = route_choice(params)
    candidates = fallback_models(engine, params, first)
    fallbacks: list[dict] = []
    for index, (name, model) in enumerate(candidates):
        request = (chat_request if chat else text_request)(engine, model, params, limits)
        try:
            batch = engine.answer_batch(model, request.rows, request.generation, client=client,
                                        prompt_param=request.param, choice=choice, on_wait=on_wait,
                                        rendered=request.rendered, follow=request.follow)
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
    stream = params.field(m.Sampling, "stream")
    include_usage = bool((params.raw("stream_options") or {}).get("include_usage"))
    client = client_address()
    if not stream:
        started = _start(engine, limits, params, chat=chat, client=client)
        reply = _Reply.new(chat, started.name, started.request, engine.models.tokenizer(started.model),
                           fallbacks=started.fallbacks, batch=started.batch)
        return jsonify(reply.whole(_collect(started.batch, len(started.request.rows))))
    waiting = started_waiting(lambda on_wait: _start(engine, limits, params, chat=chat, client=client, on_wait=on_wait),
                              lambda started: started.batch.close(), name="openai-start")
    first = next(waiting)  # a refusal before any wait is answered with its own status

    def events(item) -> Iterator[str]:
        try:
            while item[0] == "queued":
                yield queue_comment(item[1], item[2])
                item = next(waiting)
        except ChatError as error:  # refused while it waited: in the stream, in OpenAI's shape
            yield sse(json.dumps(openai_chat_error_body(error)))
            yield "data: [DONE]\n\n"
            return
        except Exception:  # noqa: BLE001 - never an exception's text to the user
            logger.warning("streamed completion failed while waiting", exc_info=True)
            yield sse(json.dumps(openai_error_body(500, INTERNAL_ERROR)))
            yield "data: [DONE]\n\n"
            return
        finally:
            if item[0] != "ready":
                waiting.close()
        started = item[1]
        reply = _Reply.new(chat, started.name, started.request, engine.models.tokenizer(started.model),
                           fallbacks=started.fallbacks, batch=started.batch)
        yield from _stream_events(started.batch, reply, include_usage)

    return Response(stream_with_context(events(first)), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def register(bp: Blueprint, engine: ChatEngine, limits: ChatLimits) -> None:
    """Add the OpenAI API's routes to the chat blueprint."""

    def answer(view):
        return guarded(view, chat_error=openai_chat_error, internal_error=lambda: openai_error(500, INTERNAL_ERROR),
                       what="OpenAI API request")

    @bp.post("/v1/chat/completions")
    @documented("A chat completion, whole or streamed", "OpenAI", {200: m.ChatCompletion, **m.OPENAI_ERRORS},
                body=m.ChatCompletionBody, stream=m.Chunk, description=STREAMED)
    def openai_chat():
        return answer(lambda: complete(engine, limits, chat=True))

    @bp.post("/v1/completions")
    @documented("A text completion of one or more prompts, whole or streamed", "OpenAI",
                {200: m.TextCompletion, **m.OPENAI_ERRORS}, body=m.CompletionBody, stream=m.Chunk,
                description=STREAMED)
    def openai_completions():
        return answer(lambda: complete(engine, limits, chat=False))

    @bp.get("/v1/models")
    @documented("The chat's models, each with whether it is served and its forecast", "OpenAI",
                {200: m.ModelList})
    def openai_models():
        return answer(lambda: jsonify(object="list", data=[_model_card(engine, s) for s in engine.admission.statuses()]))

    @bp.get("/v1/models/<path:name>")
    @documented("One model of the chat", "OpenAI", {200: m.ModelCard, 404: OpenAIError},
                path_params={"name": "the model's name"})
    def openai_model(name):
        return answer(lambda: jsonify(_model_card(engine, engine.admission.status(engine.models.resolve(name)))))

    @bp.post("/v1/estimate")
    @documented("The forecast of a completion (its body), nothing generated", "OpenAI",
                {200: m.Estimate, **m.OPENAI_ERRORS}, body=m.EstimateBody)
    def openai_estimate():
        return answer(lambda: estimate(engine, limits))


STREAMED = ('With `"stream": true` the answer is a text/event-stream of `Chunk`s (`data: {...}`), ending with '
            '`data: [DONE]`; a refusal after the status line comes as an `OpenAIError` event; comments '
            '(`: queue position ...`) tell a waiting request its place.')
