"""What an OpenAI completion asks for, read and checked before anything is generated: its messages
or prompts as token ids (bounded before they are tokenized, ``chat.http.limits``), how to generate,
the log-probabilities it wants, its ``petals`` routing choices (``monitor.core.route_choice``) and
the ``models`` it may fall back to. Every refusal is an ``InvalidRequest`` naming its parameter.
Each documented parameter is read with its field of the request models (``chat.http.api_models``:
type, bounds, default, and the rules of ``messages`` and ``models``); what stays here is what needs
the engine (a model's context and vocabulary, ``max_batch_rows``) or several parameters at once,
and the refusals of what this chat does not do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from monitor.core.route_choice import ChoiceError, parse_choice

from chat.engine import (ChatEngine, ChatError, FollowUp, GenerationParams, InvalidRequest, ModelNotServed, Rendered,
                         RouteChoice, RouteUnmet)
from chat.errors import check_fits_context
from chat.http.api_models import ChatCompletionBody, CompletionBody, Sampling, checked, kind_of
from chat.http.limits import ChatLimits, check_token_ids
from chat.http.params import Params


@dataclass(frozen=True)
class Logprobs:
    """What a request asks of log-probabilities: ``top`` alternatives per token; ``echo``: the prompt's too."""

    top: int
    echo: bool = False


def asked_logprobs(engine: ChatEngine, params: Params, *, chat: bool, echo: bool) -> Optional[Logprobs]:
    """The chat's ``logprobs`` (true/false) and ``top_logprobs`` (0 to max_logprobs), or the text
    completions' ``logprobs`` (null, or 0 to max_logprobs alternatives)."""
    bound = engine.max_logprobs
    if chat:
        wanted = params.field(ChatCompletionBody, "logprobs")
        top = params.field(ChatCompletionBody, "top_logprobs", hi=bound)
        if top and not wanted:
            raise InvalidRequest("top_logprobs", "top_logprobs needs logprobs: true")
        return Logprobs(top or 0) if wanted else None
    if isinstance(params.raw("logprobs"), bool):
        raise InvalidRequest("logprobs", f"logprobs must be null or an integer between 0 and {bound} here")
    top = params.field(CompletionBody, "logprobs", hi=bound)
    return None if top is None else Logprobs(top, echo=echo)


def generation_params(engine: ChatEngine, model: str, params: Params, n_prompt: int, *, chat: bool,
                       default_max: int, extra_stops: Sequence[str] = (),
                       logprobs: Optional[Logprobs] = None) -> GenerationParams:
    context = engine.models.context_length(model)
    for name in ("presence_penalty", "frequency_penalty"):
        value = params.field(Sampling, name)
        if value != 0:
            raise InvalidRequest(name, f"{name} is not supported here (only 0); use repetition_penalty instead")
    if params.raw("logit_bias"):
        raise InvalidRequest("logit_bias", "logit_bias is not supported here")
    if params.raw("tools") or params.raw("functions"):
        raise InvalidRequest("tools" if params.raw("tools") else "functions", "tool and function calls are not supported here")
    response_format = params.raw("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise InvalidRequest("response_format", "only response_format {\"type\": \"text\"} is supported here")
    params.field(Sampling, "seed")  # accepted (checked), not used: the swarm gives no reproducible sampling
    stream = params.field(Sampling, "stream")
    stream_options = params.raw("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidRequest("stream_options", "stream_options must be an object")
    temperature = params.field(Sampling, "temperature")
    sampling = params.sampling(top_p=1.0, top_k=0, repetition_penalty=1.0)
    limit_name = "max_completion_tokens" if params.present("max_completion_tokens") else "max_tokens"
    scoring = logprobs is not None and logprobs.echo
    max_tokens = params.field(Sampling, limit_name, lo=None if scoring else 1, hi=context)
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


def parse_messages(params: Params, limits: ChatLimits) -> list[dict]:
    """The messages as {role, content} (each checked by ``api_models.Message``: content joined, a
    "developer" a "system"), their characters counted before anything is tokenized."""
    found = checked("messages", params.raw("messages"), kind_of(ChatCompletionBody, "messages"))
    result = [{"role": message.role, "content": message.content} for message in found]
    limits.check_prompt_chars("messages", sum(len(m["content"]) for m in result),
                              what="the content of messages, all together,")
    return result


def parse_token_ids(engine: ChatEngine, model: str, ids: list, param: str) -> list[int]:
    check_token_ids(param, ids, engine.models.context_length(model))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise InvalidRequest(param, f"{param} must be a string, a list of token ids, or a list of those")
    vocab = len(engine.models.tokenizer(model))
    if any(not 0 <= t < vocab for t in ids):
        raise InvalidRequest(param, f"{param} token ids must be between 0 and {vocab - 1}")
    return list(ids)


def completion_prompts(engine: ChatEngine, model: str, params: Params,
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
            ids = parse_token_ids(engine, model, p, "prompt")
            result.append((ids, engine.models.tokenizer(model).decode(ids)))
        else:
            raise InvalidRequest("prompt", "prompt has an empty list of token ids")
    return result


@dataclass(frozen=True)
class CompletionRequest:
    """What a completion asks for: its rows (token ids; prompt by prompt, ``n`` samples each), how
    to generate, the parameter that holds the prompts (named in errors), each row's ``echo`` text
    (text completions' ``echo``) and the log-probabilities it wants."""

    rows: list[list[int]]
    generation: GenerationParams
    param: str
    echoes: list[str]
    logprobs: Optional[Logprobs] = None
    rendered: Optional[Rendered] = None  # how its one prompt was written (its session may be kept: ``chat.kept``)
    follow: Optional[FollowUp] = None  # the answer it follows (``petals.session``), as matching needs it


def samples(params: Params, engine: ChatEngine, n_prompts: int) -> int:
    n = params.field(Sampling, "n", hi=engine.max_batch_rows)
    if n * n_prompts > engine.max_batch_rows:
        raise InvalidRequest("n", f"{n_prompts} prompts × n = {n} asks for {n * n_prompts} answers; at most "
                                  f"{engine.max_batch_rows} are computed per request")
    return n


def chat_request(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> CompletionRequest:
    messages = parse_messages(params, limits)
    n = samples(params, engine, 1)
    text, extra_stops, special = engine.models.render_chat(model, messages)
    input_ids = engine.encode(model, text, add_special_tokens=special)
    logprobs = asked_logprobs(engine, params, chat=True, echo=False)
    generation = generation_params(engine, model, params, len(input_ids), chat=True, default_max=0,
                                    extra_stops=extra_stops, logprobs=logprobs)
    handle = session_handle(params)
    follow = None
    if handle is not None:
        follow = engine.models.chat_follow_up(model, messages, handle) or FollowUp(handle)
    return CompletionRequest([input_ids] * n, generation, "messages", [""] * n, logprobs, rendered=Rendered(text),
                             follow=follow)


def text_request(engine: ChatEngine, model: str, params: Params, limits: ChatLimits) -> CompletionRequest:
    if params.raw("suffix"):
        raise InvalidRequest("suffix", "suffix is not supported here")
    prompts = completion_prompts(engine, model, params, limits)
    n = samples(params, engine, len(prompts))
    echo = params.field(CompletionBody, "echo")
    logprobs = asked_logprobs(engine, params, chat=False, echo=echo)
    generation = generation_params(engine, model, params, max(len(ids) for ids, _ in prompts), chat=False,
                                    default_max=16, logprobs=logprobs)
    rows = [ids for ids, _ in prompts for _ in range(n)]
    echoes = [text if echo else "" for _, text in prompts for _ in range(n)]
    rendered = follow = None
    if len(prompts) == 1:  # (its text when it was sent as text; ids were sent as ids)
        sent = params.raw("prompt")
        as_text = sent if isinstance(sent, str) else sent[0] if isinstance(sent, list) and isinstance(sent[0], str) \
            else None
        rendered = Rendered(as_text)
        handle = session_handle(params)
        if handle is not None:
            follow = FollowUp(handle, text=as_text) if as_text is not None else FollowUp(handle, ids=tuple(rows[0]))
    return CompletionRequest(rows, generation, "prompt", echoes, logprobs, rendered=rendered, follow=follow)


def requested_model(engine: ChatEngine, params: Params) -> tuple[str, str]:
    """(the model's name as asked, the engine's name for it), after the checks every completion
    shares: a JSON body, best_of 1."""
    if params.form:
        raise InvalidRequest(None, "send the request as JSON (Content-Type: application/json)")
    name = params.field(Sampling, "model")
    model = engine.models.resolve(name)
    if params.field(Sampling, "best_of") != 1:
        raise InvalidRequest("best_of", "only best_of = 1 is supported here (use n for several answers)")
    return name, model


FALLBACK_ON = (ModelNotServed, RouteUnmet)  # a model refused for these: the next of ``models`` is tried


def route_choice(params: Params) -> RouteChoice:
    """The request's ``petals`` routing choices (``monitor.core.route_choice``; its ``session`` is
    not one: ``session_handle``)."""
    petals = params.raw("petals")
    if isinstance(petals, dict) and "session" in petals:
        petals = {key: value for key, value in petals.items() if key != "session"}
    try:
        return parse_choice(petals)
    except ChoiceError as e:
        raise InvalidRequest(e.field, str(e)) from None


def session_handle(params: Params) -> Optional[str]:
    """``petals.session``: the handle of the answer this request follows (``chat.kept``), as that
    answer gave it; else the ``X-Petals-Session`` header's (the same handle, where a proxy can read it
    to send the follow-up to the worker that keeps its session); None without one. Any string is
    taken (one that names no session of this client's is ignored: a fresh session starts); another
    type is refused."""
    petals = params.raw("petals")
    handle = petals.get("session") if isinstance(petals, dict) else None
    if handle is not None and not isinstance(handle, str):
        raise InvalidRequest("petals.session", "petals.session must be the string an answer's petals.session gave")
    return handle or params.session_header or None


def fallback_models(engine: ChatEngine, params: Params, first: tuple[str, str]) -> list[tuple[str, str]]:
    """(name as asked, engine name) of ``model`` and then of each model in ``models`` (OpenRouter's
    fallbacks), each once."""
    listed = params.field(Sampling, "models")
    if listed is None:
        return [first]
    found = {first[1]: first}
    for index, name in enumerate(listed):
        try:
            found.setdefault(engine.models.resolve(name), (name, engine.models.resolve(name)))
        except ChatError as e:
            raise InvalidRequest(f"models[{index}]", str(e)) from None
    return list(found.values())
