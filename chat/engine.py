"""Chat generation through the swarm: loaded models, sessions, streaming, limits, feedback.

One ``ChatEngine`` per process. Models load lazily (client side only: embeddings, head,
tokenizer) with the health-aware sequence manager. Every answer runs in its own petals inference
session inside a bounded pool of sessions with a bounded waiting queue; a full queue is a ``Busy``
error, not a hang. Tokens stream one by one; text is held back while the tokens so far end in an
incomplete UTF-8 character (or could be the start of a stop sequence). Each answer reports the
route it took and its speed; each peer's outcome goes to the outcome sink (see chat.routing).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

from monitor import compat  # noqa: F401  (must precede petals)

from chat.remote_model import load_remote_model
from chat.routing import (
    HealthAwareSequenceManager,
    OutcomeSink,
    PeerWeight,
    RouteHop,
    RoutingSettings,
    ScoreSource,
    TimedInferenceSession,
)

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048  # for configs that name no context length (e.g. BLOOM's ALiBi)
CoverageCheck = Callable[[str], tuple[bool, str]]


# ---- errors (the API maps each to one HTTP status) ------------------------------------------------


class ChatError(Exception):
    """Base: ``str(e)`` is a message for people (what failed, with what value, what to do)."""

    status = 500


class InvalidRequest(ChatError):
    status = 400

    def __init__(self, param: Optional[str], message: str):
        super().__init__(message)
        self.param = param


class UnknownModel(ChatError):
    status = 404

    def __init__(self, name: str, known: Sequence[str]):
        listed = ", ".join(repr(k) for k in known) or "none"
        super().__init__(f"unknown model {name!r}; models here: {listed}")
        self.name = name


class ModelNotServed(ChatError):
    status = 503

    def __init__(self, name: str, reason: str, missing_blocks: Sequence[int] = ()):
        super().__init__(f"model {name!r} is not fully served: {reason}")
        self.name, self.reason, self.missing_blocks = name, reason, list(missing_blocks)


class Busy(ChatError):
    status = 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class GenerationFailed(ChatError):
    status = 503


# ---- plain data --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationParams:
    """temperature 0 means greedy decoding; top_k 0 and top_p 1 switch those filters off.
    ``stop_mode`` "exclude" cuts the text before a stop sequence (OpenAI), "include" keeps it
    (chat.petals.dev)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop_sequences: tuple[str, ...] = ()
    stop_mode: str = "exclude"
    skip_special_tokens: bool = True

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    def generate_kwargs(self) -> dict:
        kwargs: dict = {"do_sample": self.do_sample}
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        if self.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = self.repetition_penalty
        return kwargs


@dataclass(frozen=True)
class ModelStatus:
    name: str  # dht_prefix
    title: str  # human name
    served: bool
    reason: str = ""  # why not, for people
    missing_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Delta:
    """New text of the answer, and how many tokens it took (held-back tokens included)."""

    text: str
    token_count: int


@dataclass(frozen=True)
class Finished:
    text: str  # the whole answer
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop sequence), "length", "cancelled"
    route: tuple[RouteHop, ...]
    time_to_first_token: Optional[float]  # seconds from the start of the answer
    tokens_per_second: Optional[float]  # after the first token
    elapsed: float

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    def stats(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "time_to_first_token": _round(self.time_to_first_token),
            "tokens_per_second": _round(self.tokens_per_second),
            "elapsed": _round(self.elapsed),
            "route": [hop.to_dict() for hop in self.route],
        }


def _round(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


def block_ranges(blocks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0:3, 5:6": the monitor's notation, petals' [start, end)."""
    from monitor.coverage import format_ranges, ranges

    return format_ranges(ranges(blocks))


# ---- decoding a stream of tokens -----------------------------------------------------------------


class StreamDecoder:
    """Turns token ids into text deltas, one token at a time.

    Text is emitted only when it is final: not while the tokens so far end in an incomplete UTF-8
    character (the tokenizer decodes those as U+FFFD), nor while its end could still grow into a
    stop sequence. Once a stop sequence appears the answer ends there (cut before it in
    "exclude" mode, after it in "include" mode).
    """

    def __init__(self, tokenizer, *, stop_sequences: Sequence[str] = (), stop_mode: str = "exclude",
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._stops = tuple(s for s in stop_sequences if s)
        self._include = stop_mode == "include"
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self._pending_tokens = 0

    def _decode(self) -> str:
        return self._tokenizer.decode(self.ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

    def _held_back(self, text: str) -> int:
        """Length of the longest end of ``text`` that is a proper start of a stop sequence."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def feed(self, token_id: int) -> Optional[Delta]:
        if self.stopped:
            return None
        self.ids.append(int(token_id))
        self._pending_tokens += 1
        text = self._decode()
        found = [(text.find(stop), stop) for stop in self._stops if stop in text]
        if found:
            index, stop = min(found)
            self.stopped = True
            return self._emit(text[: index + len(stop)] if self._include else text[:index])
        if text.endswith("\ufffd"):
            return None
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> Optional[Delta]:
        """Whatever was held back, now that no token follows."""
        if self.stopped:
            return None
        return self._emit(self._decode(), force=True)

    def _emit(self, final: str, force: bool = False) -> Optional[Delta]:
        if len(final) <= len(self.emitted) and not (force and self._pending_tokens):
            return None
        delta = Delta(final[len(self.emitted):], self._pending_tokens)
        self.emitted = final if len(final) > len(self.emitted) else self.emitted
        self._pending_tokens = 0
        return delta


# ---- concurrency ---------------------------------------------------------------------------------


class _Gate:
    """At most ``limit`` sessions at once; at most ``queue_size`` callers wait for a place."""

    def __init__(self, limit: int, queue_size: int, timeout: float, retry_after: int):
        self.limit, self.queue_size, self.timeout, self.retry_after = limit, queue_size, timeout, retry_after
        self.active = self.waiting = 0
        self._cond = threading.Condition()

    def acquire(self) -> None:
        with self._cond:
            if self.active < self.limit:
                self.active += 1
                return
            if self.waiting >= self.queue_size:
                raise Busy(
                    f"all {self.limit} chat sessions are in use and {self.waiting} requests are waiting; "
                    f"retry in {self.retry_after} s",
                    self.retry_after,
                )
            self.waiting += 1
            try:
                if not self._cond.wait_for(lambda: self.active < self.limit, timeout=self.timeout):
                    raise Busy(
                        f"no chat session became free within {self.timeout:.0f} s "
                        f"(all {self.limit} in use); retry in {self.retry_after} s",
                        self.retry_after,
                    )
                self.active += 1
            finally:
                self.waiting -= 1

    def release(self) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify()


# ---- models --------------------------------------------------------------------------------------


@dataclass
class _Model:
    """A configured model; its tokenizer and its remote model load on first use."""

    name: str
    title: str
    path: Optional[Path]
    aliases: tuple[str, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)
    tokenizer: object = None
    context_length: int = DEFAULT_CONTEXT
    defaults: dict = field(default_factory=dict)
    remote: object = None  # the petals model


def _context_length(config) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT


def _defaults(path: Path, context: int) -> dict:
    """The chat page's starting parameters: the model's generation_config.json where it has one."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(str(path))
    except (OSError, ValueError):
        config = GenerationConfig()
    max_new = config.max_new_tokens or 128
    return {
        "temperature": float(config.temperature) if config.do_sample and config.temperature else 0.0,
        "top_p": float(config.top_p if config.top_p is not None else 1.0),
        "top_k": int(config.top_k or 0),
        "repetition_penalty": float(config.repetition_penalty or 1.0),
        "max_new_tokens": max(1, min(int(max_new), context // 2)),
    }


class ChatEngine:
    """Chat with the swarm's models. Thread-safe; one per process."""

    def __init__(
        self,
        dht,
        models: Sequence,
        *,
        score_source: Optional[ScoreSource] = None,
        outcome_sink: Optional[OutcomeSink] = None,
        coverage_check: Optional[CoverageCheck] = None,
        routing: Optional[RoutingSettings] = None,
        max_sessions: int = 4,
        queue_size: int = 8,
        queue_timeout: float = 60.0,
        retry_after: int = 5,
        max_retries: int = 3,
        request_timeout: float = 60.0,
        client_config: Optional[dict] = None,
    ):
        self.dht = dht
        self.score_source = score_source
        self.coverage_check = coverage_check
        self.routing = routing or RoutingSettings()
        self.sequence_manager_cls = HealthAwareSequenceManager.configured(
            score_source=score_source, outcome_sink=outcome_sink, routing=self.routing
        )
        # petals waits request_timeout (default 180 s) on a server that died mid-step before it
        # tries another one: a person waiting for an answer should not wait that long
        self._client_config = {"max_retries": max_retries, "request_timeout": request_timeout, "show_route": False,
                               **(client_config or {})}
        # no token for this long means something below us hangs: give up on the answer
        self.stall_timeout = self._client_config["request_timeout"] * (max_retries + 1) + 60
        self._gate = _Gate(max_sessions, queue_size, queue_timeout, retry_after)
        self._models: dict[str, _Model] = {}
        for config in models:
            name = config.dht_prefix
            aliases = tuple(a for a in (getattr(config, "repository", None), getattr(config, "name", None)) if a)
            path = getattr(config, "path", None)
            self._models[name] = _Model(name=name, title=getattr(config, "name", None) or name,
                                        path=Path(path) if path else None, aliases=aliases)

    # -- models ----------------------------------------------------------------------------------
    @property
    def model_names(self) -> list[str]:
        return list(self._models)

    def resolve(self, name: Optional[str]) -> str:
        """The dht_prefix of the model called ``name`` (dht_prefix, repository or human name)."""
        if name in self._models:
            return name
        for model in self._models.values():
            if name in model.aliases:
                return model.name
        raise UnknownModel(str(name), list(self._models))

    def _model(self, name: str) -> _Model:
        return self._models[self.resolve(name)]

    def _client_files(self, model: _Model) -> _Model:
        if model.tokenizer is None:
            if model.path is None:
                raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
            from transformers import AutoConfig, AutoTokenizer

            with model.lock:
                if model.tokenizer is None:
                    config = AutoConfig.from_pretrained(str(model.path))
                    model.context_length = _context_length(config)
                    model.defaults = _defaults(model.path, model.context_length)
                    model.tokenizer = AutoTokenizer.from_pretrained(str(model.path))
        return model

    def tokenizer(self, name: str):
        return self._client_files(self._model(name)).tokenizer

    def context_length(self, name: str) -> int:
        return self._client_files(self._model(name)).context_length

    def defaults(self, name: str) -> dict:
        return dict(self._client_files(self._model(name)).defaults)

    def title(self, name: str) -> str:
        return self._model(name).title

    def _remote(self, model: _Model):
        self._client_files(model)
        if model.remote is None:
            with model.lock:
                if model.remote is None:
                    logger.info("loading the client side of %s from %s", model.name, model.path)
                    model.remote = load_remote_model(
                        model.path, self.dht, sequence_manager_cls=self.sequence_manager_cls,
                        dht_prefix=model.name, **self._client_config,
                    )
        return model.remote

    @staticmethod
    def _sequence_manager(remote) -> HealthAwareSequenceManager:
        return remote.transformer.h.sequence_manager

    def sequence_manager(self, name: str) -> HealthAwareSequenceManager:
        """The model's sequence manager (loads the model): its view of the swarm and its routes."""
        return self._sequence_manager(self._remote(self._model(name)))

    # -- coverage --------------------------------------------------------------------------------
    def status(self, name: str) -> ModelStatus:
        """Can this model be chatted with now, and if not, why (for people)."""
        model = self._model(name)
        try:
            # with a coverage check, a model nobody chatted with yet is not loaded just to be listed
            self._check_served(model, load=self.coverage_check is None or model.remote is not None)
        except ModelNotServed as e:
            return ModelStatus(model.name, model.title, False, e.reason, tuple(e.missing_blocks))
        except Exception as e:  # noqa: BLE001 - a status page must still render
            logger.warning("status of %s failed: %r", model.name, e)
            return ModelStatus(model.name, model.title, False, f"could not check it: {e}")
        return ModelStatus(model.name, model.title, True)

    def statuses(self) -> list[ModelStatus]:
        return [self.status(name) for name in self._models]

    def _check_served(self, model: _Model, *, load: bool = True) -> None:
        """Raise ModelNotServed unless the coverage check and (when ``load``) the sequence
        manager's own view, which knows pinned/blocked/banned peers, both see every block."""
        if model.path is None:
            raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
        if self.coverage_check is not None:
            ok, reason = self.coverage_check(model.name)
            if not ok:
                raise ModelNotServed(model.name, reason)
        if not load:
            return
        manager = self._sequence_manager(self._remote(model))
        missing = manager.missing_blocks()
        if missing:
            missing = manager.missing_blocks(refresh=True)  # the view may be stale; look again
        if missing:
            restricted = " among the pinned/allowed peers" if self.routing.pinned else ""
            raise ModelNotServed(
                model.name, f"no server{restricted} holds block{'s' if len(missing) > 1 else ''} "
                f"{block_ranges(missing)} (of {len(manager)})", missing,
            )

    # -- prompts ---------------------------------------------------------------------------------
    def encode(self, name: str, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer(name)(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_chat(self, name: str, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], tuple[str, ...]]:
        """Token ids of a conversation, ready for the assistant's turn, and the stop sequences it
        needs: the tokenizer's chat template when it has one, else a plain "Role: text" transcript
        that stops where the model starts to write the user's next turn."""
        tokenizer = self.tokenizer(name)
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        if getattr(tokenizer, "chat_template", None):
            try:
                return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)), ()
            except Exception as e:  # noqa: BLE001 - jinja errors from the model's own template
                raise InvalidRequest("messages", f"the model's chat template rejected the messages: {e}") from None
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return self.encode(name, text), ("\nUser:", "\nSystem:")

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, name: str, max_length: int) -> "ChatSession":
        """A petals inference session for up to ``max_length`` tokens in all, holding one of the
        engine's places until closed. Raises Busy, UnknownModel, ModelNotServed, InvalidRequest."""
        model = self._model(name)
        self._client_files(model)
        if not 0 < max_length <= model.context_length:
            raise InvalidRequest("max_length", f"max_length must be between 1 and the model's context "
                                               f"length {model.context_length}, got {max_length}")
        self._gate.acquire()
        try:
            self._check_served(model)
            return ChatSession(self, model, self._remote(model), max_length)
        except BaseException:
            self._gate.release()
            raise

    def answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
               stop_event: Optional[threading.Event] = None, prompt_param: str = "prompt") -> "Answer":
        """Start one answer in its own session. Everything that can be refused (unknown model,
        prompt too long, model not served, busy) raises here, before any token; iterate the
        Answer for Delta events and one Finished. max_new_tokens is cut to what the model's
        context leaves after the prompt."""
        context = self.context_length(name)
        if not input_ids:
            raise InvalidRequest(prompt_param, f"{prompt_param} is empty")
        if len(input_ids) >= context:
            raise InvalidRequest(prompt_param, f"{prompt_param} has {len(input_ids)} tokens; the model's context "
                                               f"is {context} tokens, so it must be shorter than that")
        max_new = min(params.max_new_tokens, context - len(input_ids))
        session = self.open_session(name, len(input_ids) + max_new)
        return Answer(session, session.generate(input_ids, params, stop_event=stop_event))

    def generate(self, name: str, input_ids: Sequence[int], params: GenerationParams,
                 *, stop_event: Optional[threading.Event] = None) -> Iterator[Union[Delta, Finished]]:
        """``answer`` as one generator (refusals surface at the first ``next``)."""
        with self.answer(name, input_ids, params, stop_event=stop_event) as answer:
            yield from answer

    def weights(self) -> dict[str, PeerWeight]:
        if self.score_source is None:
            return {}
        try:
            return dict(self.score_source())
        except Exception:  # noqa: BLE001
            return {}

    def close(self) -> None:
        """Stop the loaded models' background routing threads (the DHT belongs to the caller)."""
        for model in self._models.values():
            if model.remote is not None:
                try:
                    self._sequence_manager(model.remote).shutdown()
                except Exception as e:  # noqa: BLE001 - shutting down anyway
                    logger.debug("shutting down %s failed: %r", model.name, e)

class Answer:
    """An answer being generated; closing it (or leaving the ``with``) stops it and frees its place."""

    def __init__(self, session: "ChatSession", events: Iterator[Union[Delta, Finished]]):
        self.session = session
        self._events = events

    def __iter__(self) -> Iterator[Union[Delta, Finished]]:
        return self._events

    def route(self) -> tuple[RouteHop, ...]:
        return self.session.route()

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            self.session.close()

    def __enter__(self) -> "Answer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Streamer:
    """transformers' streamer protocol: ``put`` gets the prompt once, then every new token."""

    def __init__(self, on_token: Callable[[int], None]):
        self._on_token = on_token
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for token_id in value.reshape(-1).tolist():
            self._on_token(token_id)

    def end(self) -> None:
        pass


class ChatSession:
    """One petals inference session: one or more answers that continue the same text."""

    def __init__(self, engine: ChatEngine, model: _Model, remote, max_length: int):
        self.engine, self.model, self.remote, self.max_length = engine, model, remote, max_length
        self.tokenizer = model.tokenizer
        self._petals = TimedInferenceSession(ChatEngine._sequence_manager(remote), max_length)
        self._closed = False
        self._lock = threading.Lock()
        self._route: tuple[RouteHop, ...] = ()

    @property
    def used(self) -> int:
        """Tokens the session's servers have processed or will process next (the last one)."""
        output_ids = self._petals.output_ids
        return output_ids.shape[1] if output_ids is not None else 0

    def room(self, new_input_tokens: int) -> int:
        """How many tokens may still be generated after ``new_input_tokens`` more input."""
        return self.max_length - self.used - new_input_tokens

    def route(self) -> tuple[RouteHop, ...]:
        """The route now (live while generating), else the last answer's route."""
        hops = self._petals.recorder.route(self.engine.weights())
        return tuple(hops) or self._route

    def replace_last_token(self, token_id: int) -> None:
        """Make the session continue as if ``token_id`` had been generated last."""
        if self._petals.output_ids is not None:
            self._petals.output_ids[:, -1:] = token_id

    def generate(self, input_ids: Optional[Sequence[int]], params: GenerationParams,
                 *, stop_event: Optional[threading.Event] = None) -> Iterator[Union[Delta, Finished]]:
        """Continue the session with ``input_ids`` (None: continue from the last token) and stream
        the answer. Stopping (the event, or leaving the iterator) ends generation after the
        current token."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        if self._closed:
            raise GenerationFailed("the inference session is closed")
        n_input = len(input_ids) if input_ids else 0
        if not n_input and self._petals.output_ids is None:
            raise InvalidRequest("inputs", "the first request of a session needs inputs")
        budget = min(params.max_new_tokens, self.room(n_input))
        if budget <= 0:
            raise InvalidRequest("max_length", f"the session's max_length {self.max_length} is used up "
                                               f"({self.used} tokens so far, {n_input} new); open a longer session")
        stop_event = stop_event or threading.Event()
        decoder = StreamDecoder(self.tokenizer, stop_sequences=params.stop_sequences, stop_mode=params.stop_mode,
                                skip_special_tokens=params.skip_special_tokens)
        events: queue.Queue = queue.Queue()
        clock = {"start": time.perf_counter(), "first": None, "last": None}
        prompt_tokens = self.used + n_input

        def on_token(token_id: int) -> None:
            now = time.perf_counter()
            clock["first"] = clock["first"] or now
            clock["last"] = now
            delta = decoder.feed(token_id)
            if delta is not None:
                events.put(delta)

        cancel = threading.Event()  # set when the consumer leaves

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs) -> bool:
                return decoder.stopped or stop_event.is_set() or cancel.is_set()

        def run() -> None:
            try:
                inputs = torch.tensor([list(input_ids)], dtype=torch.long) if n_input else None
                pad = self.tokenizer.pad_token_id
                with torch.no_grad():
                    self.remote.generate(
                        inputs, session=self._petals, max_new_tokens=budget,
                        streamer=_Streamer(on_token), stopping_criteria=StoppingCriteriaList([_Stop()]),
                        pad_token_id=pad if pad is not None else self.tokenizer.eos_token_id,
                        **params.generate_kwargs(),
                    )
                self._route = tuple(self._petals.recorder.route(self.engine.weights()))
                self._petals.recorder.flush()
                events.put(("done", None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                self._petals.recorder.flush()
                events.put(("error", e))

        with self._lock:
            worker = threading.Thread(target=run, name=f"chat-{self.model.name}", daemon=True)
            worker.start()
            try:
                while True:
                    try:
                        item = events.get(timeout=self.engine.stall_timeout)
                    except queue.Empty:
                        raise GenerationFailed(f"the swarm sent no token for {self.engine.stall_timeout:.0f} s; "
                                               f"try again") from None
                    if isinstance(item, Delta):
                        yield item
                        continue
                    kind, error = item
                    if kind == "error":
                        raise _as_chat_error(self.model.name, error)
                    break
                tail = decoder.finish()
                if tail is not None:
                    yield tail
                yield self._finished(decoder, clock, prompt_tokens, budget, stop_event)
            finally:
                cancel.set()
                worker.join(self.engine.stall_timeout)

    def _finished(self, decoder: StreamDecoder, clock: dict, prompt_tokens: int, budget: int,
                  stop_event: threading.Event) -> Finished:
        end = time.perf_counter()
        ids = decoder.ids
        eos = self.tokenizer.eos_token_id
        if decoder.stopped or (ids and ids[-1] == eos):
            reason = "stop"
        elif stop_event.is_set():
            reason = "cancelled"
        elif len(ids) >= budget:
            reason = "length"
        else:
            reason = "stop"
        first, last = clock["first"], clock["last"]
        ttft = first - clock["start"] if first else None
        if len(ids) >= 2 and last > first:
            speed = (len(ids) - 1) / (last - first)
        elif ids and first:
            speed = len(ids) / (first - clock["start"])
        else:
            speed = None
        return Finished(text=decoder.emitted, token_ids=tuple(ids), prompt_tokens=prompt_tokens, finish_reason=reason,
                        route=self._route, time_to_first_token=ttft, tokens_per_second=speed,
                        elapsed=end - clock["start"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._petals.close()
        except Exception as e:  # noqa: BLE001
            logger.debug("closing the inference session failed: %r", e)
        finally:
            self.engine._gate.release()

    def __enter__(self) -> "ChatSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_chat_error(model: str, error: BaseException) -> ChatError:
    from petals.client.routing.sequence_manager import MissingBlocksError

    if isinstance(error, ChatError):
        return error
    if isinstance(error, MissingBlocksError):
        return ModelNotServed(model, "servers went away while answering; some blocks have no server now")
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    logger.warning("generation with %s failed: %s", model, text, exc_info=error)
    return GenerationFailed(f"generation with {model!r} failed in the swarm ({text[:300]}); try again")
