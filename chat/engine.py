"""Chat generation through the swarm: the configured models, generation slots, open sessions, batches.

One ``ChatEngine`` per process. Models load lazily (client side only: embeddings, head,
tokenizer) with the health-aware sequence manager (``chat.sequence``). Every answer is computed in
a petals inference session (``chat.session``) while it holds one of the engine's generation slots,
shared per client in turn (``chat.capacity``); sessions kept open between turns (chat.petals.dev's
WebSocket) are bounded apart and hold no slot while idle. A batch (``n`` samples, a list of
prompts) runs its rows of one length as one petals session — the batch dimension of each step —
and its groups of other lengths side by side, in slots that are free now, else one after the other
in its own. Everything that can be refused (unknown model, prompt too long, model not served,
busy) is refused before the first token, so the HTTP side can answer with a status instead of a
broken stream.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.core.assessment import format_ranges, ranges

from chat.capacity import Capacity, OpenSessions, SessionsLoad, Slot, Slots, SlotsLoad
from chat.decoding import Delta, Finished, GenerationParams, TokenLogprob
from chat.errors import (
    Busy, ChatError, GenerationFailed, InvalidRequest, MaxLengthExceeded, ModelNotServed, SessionExpired, UnknownModel,
    check_fits_context,
)
from chat.policy import OutcomeSink, RoutingSettings, ScoreSource
from chat.remote_model import load_remote_model, sequence_manager_of
from chat.sequence import HealthAwareSequenceManager
from chat.session import Answer, ChatSession
from chat.streams import ThreadStream

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048  # for configs that name no context length (e.g. BLOOM's ALiBi)
CoverageCheck = Callable[[str], tuple[bool, str]]  # dht_prefix -> (served?, why not, for people)

DEFAULT_MAX_BATCH_ROWS = 16
DEFAULT_MAX_LOGPROBS = 20

__all__ = [  # what the HTTP side and the service use, in one import
    "Answer", "BatchAnswer", "Busy", "Capacity", "ChatEngine", "ChatError", "ChatSession", "CoverageCheck", "Delta",
    "EngineLoad", "Finished", "GenerationFailed", "GenerationParams", "InvalidRequest", "MaxLengthExceeded",
    "ModelNotServed", "ModelStatus", "SessionExpired", "TokenLogprob", "UnknownModel",
]


@dataclass(frozen=True)
class ModelStatus:
    name: str  # dht_prefix
    title: str  # human name
    served: bool
    reason: str = ""  # why not, for people
    missing_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds now (``chat.metrics`` shows it on /metrics)."""

    slots: SlotsLoad
    sessions: SessionsLoad


class BatchAnswer:
    """A batch being answered: ``(row, Delta)`` events as each row's text comes, then ``(row,
    Finished)`` for each row. ``groups`` are (row indices, their prompts, their parameters), each a
    petals session of its own; they run in the ``slots`` held, side by side when there are several
    (a ``ThreadStream`` producer each), else one after the other in the caller's thread. Each slot
    is given back in one place, when the groups it took are done (``_in_turn``); closing it (or
    leaving the ``with``) stops every row."""

    def __init__(self, open_group: Callable[[list[list[int]], GenerationParams], ChatSession],
                 groups: Sequence[tuple[list[int], list[list[int]], GenerationParams]], slots: Sequence[Slot],
                 stop_event: Optional[threading.Event] = None):
        self._open_group = open_group
        self._groups = deque(groups)
        self._slots = list(slots)
        self._lock = threading.Lock()
        self._stop = stop_event  # the caller's: a row stopped by it ends "cancelled"
        self._cancel = threading.Event()  # the consumer left: every row stops after its current token
        self.sessions: list[ChatSession] = []  # the groups' sessions, as they open
        self._stream: Optional[ThreadStream] = None
        if len(self._slots) > 1:
            self._stream = ThreadStream([self._producer(slot) for slot in self._slots], name="chat-batch")
            self._iterator = self._stream.items()
        else:
            self._iterator = self._in_turn(self._slots[0])

    def _next_group(self):
        with self._lock:
            return self._groups.popleft() if self._groups and not self._cancel.is_set() else None

    def _in_turn(self, slot: Slot) -> Iterator[tuple[int, Union[Delta, Finished]]]:
        """The groups this slot takes, one after the other; gives the slot back at the end."""
        try:
            while True:
                group = self._next_group()
                if group is None:
                    return
                indices, rows, params = group
                session = self._open_group(rows, params)
                self.sessions.append(session)
                events = session.generate_rows(rows, params, stop_event=self._stop)
                try:
                    for row, event in events:
                        yield indices[row], event
                finally:
                    events.close()
                    session.close()
        finally:
            slot.release()

    def _producer(self, slot: Slot):
        def produce(emit, cancelled) -> None:
            items = self._in_turn(slot)
            try:
                for item in items:
                    if cancelled.is_set() or self._cancel.is_set():
                        break
                    emit(item)
            finally:
                items.close()  # (the slot goes back there, also if it took no group)

        return produce

    def __iter__(self) -> Iterator[tuple[int, Union[Delta, Finished]]]:
        return self._iterator

    def close(self) -> None:
        self._cancel.set()
        try:
            self._iterator.close()
        finally:
            if self._stream is not None:
                self._stream.close(60)
            for slot in self._slots:  # an answer never iterated: its slot never reached _in_turn
                slot.release()

    def __enter__(self) -> "BatchAnswer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class _Model:
    """A configured model; its tokenizer and its remote model load on first use."""

    name: str
    title: str
    path: Optional[Path]
    aliases: tuple[str, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)
    tokenizer: Any = None
    context_length: int = DEFAULT_CONTEXT
    defaults: dict = field(default_factory=dict)
    remote: Any = None  # the petals model


def _context_length(config: Any) -> int:
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
    """Chat with the swarm's models. Thread-safe; one per process.

    ``models``: monitor.settings.ModelConfig-like objects (dht_prefix, path, name,
    repository). ``score_source`` and ``outcome_sink`` link routing to the monitor (see
    chat.feedback); ``coverage_check`` refuses a model the monitor saw broken before loading it.
    ``capacity`` bounds slots, queue and open sessions (``chat.capacity``; without it, from
    ``max_sessions``, ``queue_size``, ``queue_timeout`` and ``retry_after`` with the other bounds'
    defaults); ``max_batch_rows`` bounds the rows of one request, ``max_logprobs`` the alternatives
    per token. ``client`` (the caller's address) is who a slot or session is for; None is this
    process itself (a spec, a benchmark), to which no per-client share applies.
    """

    def __init__(
        self,
        dht: Any,
        models: Sequence[Any],
        *,
        score_source: Optional[ScoreSource] = None,
        outcome_sink: Optional[OutcomeSink] = None,
        coverage_check: Optional[CoverageCheck] = None,
        routing: Optional[RoutingSettings] = None,
        capacity: Optional[Capacity] = None,
        max_sessions: int = 4,
        queue_size: int = 32,
        queue_timeout: float = 60.0,
        retry_after: int = 5,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        max_logprobs: int = DEFAULT_MAX_LOGPROBS,
        max_retries: int = 3,
        request_timeout: float = 60.0,
        client_config: Optional[dict] = None,
    ):
        self.dht = dht
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
        self.capacity = capacity or Capacity(slots=max_sessions, queue_size=queue_size, queue_timeout=queue_timeout,
                                             retry_after=retry_after)
        self.slots = Slots(self.capacity)
        self.sessions = OpenSessions(self.capacity)
        self.sessions.estimate_with(self.slots.estimate)
        self.max_batch_rows, self.max_logprobs = max_batch_rows, max_logprobs
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

    def tokenizer(self, name: str) -> Any:
        return self._client_files(self._model(name)).tokenizer

    def context_length(self, name: str) -> int:
        return self._client_files(self._model(name)).context_length

    def defaults(self, name: str) -> dict:
        return dict(self._client_files(self._model(name)).defaults)

    def title(self, name: str) -> str:
        return self._model(name).title

    def _remote(self, model: _Model) -> Any:
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

    def sequence_manager(self, name: str) -> HealthAwareSequenceManager:
        """The model's sequence manager (loads the model): its view of the swarm and its routes."""
        return sequence_manager_of(self._remote(self._model(name)))

    # -- coverage --------------------------------------------------------------------------------
    def status(self, name: str) -> ModelStatus:
        """Can this model be chatted with now, and if not, why (for people)."""
        model = self._model(name)
        try:
            # with a coverage check, a model nobody chatted with yet is not loaded just to be listed
            self._check_served(model, load=self.coverage_check is None or model.remote is not None)
        except ModelNotServed as e:
            return ModelStatus(model.name, model.title, False, e.reason, tuple(e.missing_blocks))
        except Exception:  # noqa: BLE001 - a status page must still render; the cause is for the log
            logger.warning("status of %s failed", model.name, exc_info=True)
            return ModelStatus(model.name, model.title, False, "could not check its servers right now; "
                                                              "try again in a minute")
        return ModelStatus(model.name, model.title, True)

    def statuses(self) -> list[ModelStatus]:
        return [self.status(name) for name in self._models]

    def _check_served(self, model: _Model, *, load: bool = True, coverage: bool = True) -> None:
        """Raise ModelNotServed unless the coverage check (when ``coverage``) and (when ``load``) the
        sequence manager's own view, which knows pinned/blocked/banned peers, both see every block."""
        if model.path is None:
            raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
        if coverage and self.coverage_check is not None:
            ok, reason = self.coverage_check(model.name)
            if not ok:
                raise ModelNotServed(model.name, reason)
        if not load:
            return
        manager = self.sequence_manager(model.name)
        missing = manager.missing_blocks()
        if missing:
            missing = manager.missing_blocks(refresh=True)  # the view may be stale; look again
        if missing:
            restricted = " among the pinned/allowed peers" if self.routing.pinned else ""
            raise ModelNotServed(
                model.name, f"no server{restricted} holds block{'s' if len(missing) > 1 else ''} "
                f"{format_ranges(ranges(missing))} (of {len(manager)})", missing,
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
            from jinja2 import TemplateError

            try:
                return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)), ()
            except TemplateError as e:  # the model's own template refuses (e.g. "roles must alternate")
                raise InvalidRequest("messages", f"the model's chat template rejected the messages: "
                                                 f"{str(e)[:300]}") from None
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return self.encode(name, text), ("\nUser:", "\nSystem:")

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, name: str, max_length: int, *, client: Optional[str] = None) -> ChatSession:
        """A petals inference session for up to ``max_length`` tokens in all, kept open for
        ``client`` until closed (or expired to make room: ``chat.capacity.OpenSessions``). It holds
        no generation slot while idle; each answer in it takes one, waiting its turn outside the
        queue's bound (see ``Slots.acquire``). Raises Busy (no idle session to make room with),
        UnknownModel, ModelNotServed, InvalidRequest."""
        model = self._model(name)
        self._client_files(model)
        if not 0 < max_length <= model.context_length:
            raise InvalidRequest("max_length", f"max_length must be between 1 and the model's context "
                                               f"length {model.context_length}, got {max_length}")
        self._check_served(model)
        session = ChatSession(self._remote(model), max_length, model=model.name, tokenizer=model.tokenizer,
                              stall_timeout=self.stall_timeout, registry=self.sessions,
                              acquire_slot=lambda timeout: self.slots.acquire(client, timeout, queued=False))
        try:
            self.sessions.admit(session, client)
        except BaseException:
            session.expire("it was never opened")  # (nothing reached a server yet)
            raise
        return session

    def answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
               client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
               prompt_param: str = "prompt") -> Answer:
        """Start one answer in its own session (a batch of one row, see ``answer_batch``);
        iterate the Answer for Delta events and one Finished."""
        batch = self.answer_batch(name, [input_ids], params, client=client, stop_event=stop_event,
                                  prompt_param=prompt_param)
        events = (event for _, event in batch)
        return Answer(events, batch.close, lambda: batch.sessions[-1] if batch.sessions else None)

    def answer_batch(self, name: str, rows: Sequence[Sequence[int]], params: GenerationParams, *,
                     client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
                     prompt_param: str = "prompt") -> BatchAnswer:
        """Start answering every row (a prompt's token ids) in one request. Rows of one length run
        as one petals session (its batch dimension), other lengths as sessions of their own: side
        by side in slots that are free now, else in turn in the request's one slot. Everything that
        can be refused (unknown model, prompt too long, too many rows, model not served, busy)
        raises here, before any token. max_new_tokens is cut to what the model's context leaves
        after each prompt."""
        context = self.context_length(name)
        model = self._model(name)
        if not rows:
            raise InvalidRequest(prompt_param, f"{prompt_param} is empty")
        if len(rows) > self.max_batch_rows:
            raise InvalidRequest("n", f"the request asks for {len(rows)} answers; at most {self.max_batch_rows} "
                                      f"(prompts × n) are computed per request")
        if params.top_logprobs > self.max_logprobs:
            raise InvalidRequest("top_logprobs", f"at most {self.max_logprobs} alternatives per token, "
                                                 f"got {params.top_logprobs}")
        groups: dict[int, tuple[list[int], list[list[int]]]] = {}
        for index, ids in enumerate(rows):
            if not ids:
                raise InvalidRequest(prompt_param, f"{prompt_param} is empty")
            check_fits_context(prompt_param, len(ids), context)
            indices, prompts = groups.setdefault(len(ids), ([], []))
            indices.append(index)
            prompts.append(list(ids))
        planned = [(indices, prompts, dataclasses.replace(
            params, max_new_tokens=min(params.max_new_tokens, context - len(prompts[0]))))
            for indices, prompts in groups.values()]
        self._check_served(model)
        slots = [self.slots.acquire(client)]
        for _ in planned[1:]:
            extra = self.slots.try_acquire(client)
            if extra is None:
                break
            slots.append(extra)

        def open_group(prompts: list[list[int]], group_params: GenerationParams) -> ChatSession:
            return ChatSession(self._remote(model), len(prompts[0]) + group_params.max_new_tokens, model=model.name,
                               tokenizer=model.tokenizer, stall_timeout=self.stall_timeout, rows=len(prompts))

        return BatchAnswer(open_group, planned, slots, stop_event)

    def load(self) -> EngineLoad:
        """Slots, queue and open sessions now."""
        return EngineLoad(self.slots.load(), self.sessions.load())

    # -- the monitor's generation checks ----------------------------------------------------------
    def check_answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
                     outcome_sink: Optional[OutcomeSink] = None) -> Answer:
        """An answer as ``answer`` starts one, through the same model, routing and session code, for
        the monitor's generation check (``monitor.app.generation_check``): it neither takes nor waits
        for one of the users' slots, it skips the coverage check (the check is how a model the
        monitor called broken is seen to work again; petals' own view of the blocks still applies),
        and each server's outcome goes to ``outcome_sink`` instead of the chat's, so none counts as
        a user's chat."""
        model = self._model(name)
        self._client_files(model)
        if not input_ids:
            raise InvalidRequest("prompt", "the check's prompt is empty")
        check_fits_context("prompt", len(input_ids), model.context_length, what="the check's prompt")
        self._check_served(model, coverage=False)
        max_length = len(input_ids) + min(params.max_new_tokens, model.context_length - len(input_ids))
        session = ChatSession(self._remote(model), max_length, model=model.name, tokenizer=model.tokenizer,
                              stall_timeout=self.stall_timeout,  # never the chat's own sink
                              outcome_sink=outcome_sink if outcome_sink is not None else (lambda outcome: None))
        return Answer(session.generate(input_ids, params), session.close, session)

    def close(self) -> None:
        """Stop the loaded models' background routing threads (the DHT belongs to the caller)."""
        for model in self._models.values():
            if model.remote is not None:
                try:
                    sequence_manager_of(model.remote).shutdown()
                except Exception as e:  # noqa: BLE001 - shutting down anyway
                    logger.debug("shutting down %s failed: %r", model.name, e)
