"""Chat generation through the swarm: the configured models, generation slots, open sessions, batches.

A request's life, from the view to the answer, reads top to bottom in ``chat.request``; this
module holds what it runs on. One ``ChatEngine`` per process. Models load lazily (client side only: embeddings, head,
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

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.core.assessment import format_ranges, ranges
from monitor.core.forecast import Forecast, ForecastInputs, forecast
from monitor.core.requests import RequestRecord
from monitor.core.route_choice import RouteChoice, allowed, unmet

from chat.capacity import Capacity, OpenSessions, SessionsLoad, Slots, SlotsLoad
from chat.decoding import Delta, Finished, GenerationParams, TokenLogprob
from chat.errors import (
    Busy, ChatError, GenerationFailed, InvalidRequest, MaxLengthExceeded, ModelNotServed, RouteUnmet, SessionExpired,
    SessionTooLong, UnknownModel,
)
from chat.client_side import ClientSide, ClientSideSettings, ClientSideTooLarge
from chat import client_side
from chat.metrics import HeadStepHistograms, RequestHistograms
from chat.policy import PETALS_DEFAULT_SECONDS_PER_BLOCK, OutcomeSink, RouteHop, RoutingSettings, ScoreSource
from chat.server_load import ServerLimits, ServerLoad
from chat.remote_model import load_remote_model, sequence_manager_of
from chat.sequence import CACHE_WAIT, HealthAwareSequenceManager
from chat import request
from chat.request import Answer, BatchAnswer
from chat.session import ChatSession

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048  # for configs that name no context length (e.g. BLOOM's ALiBi)
CoverageCheck = Callable[[str], tuple[bool, str]]  # dht_prefix -> (served?, why not, for people)

DEFAULT_MAX_BATCH_ROWS = 16
DEFAULT_MAX_LOGPROBS = 20

__all__ = [  # what the HTTP side and the service use, in one import
    "Answer", "BatchAnswer", "Busy", "Capacity", "ChatEngine", "ChatError", "ChatSession", "CoverageCheck", "Delta",
    "EngineLoad", "Finished", "GenerationFailed", "GenerationParams", "InvalidRequest", "MaxLengthExceeded",
    "ModelNotServed", "ModelReadiness", "RouteChoice", "RouteUnmet", "SessionExpired", "SessionTooLong", "TokenLogprob", "UnknownModel",
]


@dataclass(frozen=True)
class ModelReadiness:
    """Can a model be chatted with now (``ChatEngine.status``), and if not, why."""

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
    client: Optional[ClientSide] = None  # the loaded client side: the petals model and its head steps

    @property
    def remote(self) -> Any:
        """The petals model, once loaded."""
        return self.client.remote if self.client is not None else None


def _system_folded(messages: list[dict]) -> Optional[list[dict]]:
    """The conversation with its system messages' text put before the first user turn's, for chat
    templates that accept no system role; None if it has no system message or no user turn."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    first_user = next((m for m in rest if m["role"] == "user"), None)
    if not system or first_user is None:
        return None
    first_user["content"] = "\n\n".join(system + [first_user["content"]])
    return rest


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
        cache_wait: float = CACHE_WAIT,
        client_config: Optional[dict] = None,
        request_sink: Optional[Callable[[RequestRecord], None]] = None,
        forecast_source: Optional[Callable[[], Mapping[str, ForecastInputs]]] = None,
        client_side: Optional[ClientSideSettings] = None,
    ):
        self.dht = dht
        # the client sides' precision and device (refused here, in one line, when this machine has no such device)
        self.client_side_settings = (client_side or ClientSideSettings()).checked()
        self._request_rows = request_sink  # each request's row (chat.request.RequestLog), e.g. StoreRequests
        self.forecast_source = forecast_source  # what forecasts rest on, per model (e.g. StoreForecasts)
        self.coverage_check = coverage_check
        self.routing = routing or RoutingSettings()
        self.capacity = capacity or Capacity(slots=max_sessions, queue_size=queue_size, queue_timeout=queue_timeout,
                                             retry_after=retry_after)
        # requests in flight per server (routes spread by it); directed ones bounded per server
        self.server_load = ServerLoad(directed_limit=self.capacity.slots_per_client)
        self.server_limits = ServerLimits()  # the longest session each server accepts, learned from refusals
        self.sequence_manager_cls = HealthAwareSequenceManager.configured(
            score_source=score_source, outcome_sink=outcome_sink, routing=self.routing, server_load=self.server_load,
            server_limits=self.server_limits, make_room=self.make_room, cache_wait=cache_wait,
        )
        # petals waits request_timeout (default 180 s) on a server that died mid-step before it
        # tries another one: a person waiting for an answer should not wait that long
        self._client_config = {"max_retries": max_retries, "request_timeout": request_timeout, "show_route": False,
                               **(client_config or {})}
        # no token for this long means something below us hangs: give up on the answer
        self.stall_timeout = self._client_config["request_timeout"] * (max_retries + 1) + 60
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

        self.request_histograms = RequestHistograms(self.model_names)  # /metrics (chat.metrics)
        self.head_step_histograms = HeadStepHistograms(self.model_names)

    def make_room(self, peer: str, needed: int) -> None:
        """``peer`` refused a session of ``needed`` tokens for want of cache room: this process's
        idle kept-open sessions on it let go of their caches (``ChatSession.release_cache``; each replays
        its text at its next answer). Sessions of other processes and clients are the server's to
        queue (``HealthAwareSequenceManager.get_request_metadata``)."""
        for member in self.sessions.idle_holding(peer, needed):
            member.release_cache()

    def request_sink(self, record: RequestRecord) -> None:
        """Where each request's row goes when it ends: this process's histograms, then the sink given."""
        self.request_histograms.observe(record)
        if self._request_rows is not None:
            self._request_rows(record)

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

    def loaded(self, name: str) -> _Model:
        """The model called ``name`` with its client files (tokenizer, context length, defaults) loaded."""
        return self._client_files(self._model(name))

    def _client_files(self, model: _Model) -> _Model:
        if model.tokenizer is None:
            if model.path is None:
                raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
            from transformers import AutoConfig

            from monitor import families

            families.install()
            with model.lock:
                if model.tokenizer is None:
                    config = AutoConfig.from_pretrained(str(model.path))
                    model.context_length = _context_length(config)
                    model.defaults = _defaults(model.path, model.context_length)
                    model.tokenizer = families.load_tokenizer(model.path)
        return model

    def tokenizer(self, name: str) -> Any:
        return self._client_files(self._model(name)).tokenizer

    def context_length(self, name: str) -> int:
        return self._client_files(self._model(name)).context_length

    def defaults(self, name: str) -> dict:
        return dict(self._client_files(self._model(name)).defaults)

    def title(self, name: str) -> str:
        return self._model(name).title

    def repository(self, name: str) -> str:
        """What petals' own tools call the model (its repository, e.g. ``org/model``), else its prefix."""
        model = self._model(name)
        found = next((alias for alias in model.aliases if "/" in alias), None)
        return found.removeprefix("https://huggingface.co/").strip("/") if found else model.name

    def remote(self, model: _Model) -> Any:
        """The model's petals model (its client side loads on first use)."""
        return self.client_side(model).remote

    def client_side(self, model: _Model) -> ClientSide:
        """The model's client side, loaded on first use in the configured precision and on the
        configured device (``chat.client_side``); ``ClientSideTooLarge`` when it does not fit the
        memory free now (the other models load as usual)."""
        self._client_files(model)
        if model.client is None:
            with model.lock:
                if model.client is None:
                    model.client = client_side.load(
                        model.name, model.path, self.client_side_settings,
                        lambda dtype: load_remote_model(model.path, self.dht, sequence_manager_cls=self.sequence_manager_cls,
                                                        dht_prefix=model.name, torch_dtype=dtype, **self._client_config),
                        observe=self.head_step_histograms.observer(model.name))
        return model.client

    def client_side_info(self, name: str) -> Optional[dict]:
        """The model's client side as ``GET /v1/models`` shows it (precision, device, memory, the
        chat's own milliseconds per token), or None before it is loaded."""
        model = self._model(name)
        return model.client.info() if model.client is not None else None

    def sequence_manager(self, name: str) -> HealthAwareSequenceManager:
        """The model's sequence manager (loads the model): its view of the swarm and its routes."""
        return sequence_manager_of(self.remote(self._model(name)))

    # -- coverage --------------------------------------------------------------------------------
    def status(self, name: str) -> ModelReadiness:
        """Can this model be chatted with now, and if not, why (for people)."""
        model = self._model(name)
        try:
            # with a coverage check, a model nobody chatted with yet is not loaded just to be listed
            self.check_served(model, load=self.coverage_check is None or model.remote is not None)
        except ModelNotServed as e:
            return ModelReadiness(model.name, model.title, False, e.reason, tuple(e.missing_blocks))
        except ClientSideTooLarge as e:
            return ModelReadiness(model.name, model.title, False, str(e))
        except Exception:  # noqa: BLE001 - a status page must still render; the cause is for the log
            logger.warning("status of %s failed", model.name, exc_info=True)
            return ModelReadiness(model.name, model.title, False, "could not check its servers right now; "
                                                              "try again in a minute")
        return ModelReadiness(model.name, model.title, True)

    def statuses(self) -> list[ModelReadiness]:
        return [self.status(name) for name in self._models]

    def check_served(self, model: _Model, *, load: bool = True, coverage: bool = True) -> None:
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
                folded = _system_folded(messages)
                if folded is not None:  # (Mixtral's template knows no system role: as Mistral's newer ones do,
                    try:                # its text goes before the first user turn's)
                        return list(tokenizer.apply_chat_template(folded, add_generation_prompt=True,
                                                                  tokenize=True)), ()
                    except TemplateError:
                        pass
                raise InvalidRequest("messages", f"the model's chat template rejected the messages: "
                                                 f"{str(e)[:300]}") from None
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return self.encode(name, text), ("\nUser:", "\nSystem:")

    # -- requests (their life: chat.request) ------------------------------------------------------
    def open_session(self, name: str, max_length: int, *, client: Optional[str] = None,
                     choice: Optional[RouteChoice] = None) -> ChatSession:
        """A petals inference session kept open between turns for ``client`` (``chat.request.open_session``).
        Raises Busy, UnknownModel, ModelNotServed, InvalidRequest, RouteUnmet."""
        return request.open_session(self, name, max_length, client=client, choice=choice)

    def answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
               client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
               prompt_param: str = "prompt", api: str = "openai", choice: Optional[RouteChoice] = None,
               on_wait: Optional[Callable[[int, float], object]] = None) -> Answer:
        """One answer in its own session (``chat.request.answer``): Delta events, then one Finished."""
        return request.answer(self, name, input_ids, params, client=client, stop_event=stop_event,
                              prompt_param=prompt_param, api=api, choice=choice, on_wait=on_wait)

    def answer_batch(self, name: str, rows: Sequence[Sequence[int]], params: GenerationParams, *,
                     client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
                     prompt_param: str = "prompt", api: str = "openai",
                     choice: Optional[RouteChoice] = None,
                     on_wait: Optional[Callable[[int, float], object]] = None) -> BatchAnswer:
        """Every row of one request (``chat.request.answer_batch``); refusals raise before any token."""
        return request.answer_batch(self, name, rows, params, client=client, stop_event=stop_event,
                                    prompt_param=prompt_param, api=api, choice=choice, on_wait=on_wait)

    def session_limit(self, name: str) -> int:
        """The longest session a request to this model may open now: its context, or less where
        its servers refused longer sessions (``HealthAwareSequenceManager.longest_session``)."""
        context = self.context_length(name)
        longest = self.sequence_manager(name).longest_session()
        return context if longest is None else min(context, longest)

    def check_session_length(self, name: str, length: int, *, param: str, prompt_tokens: int = 0) -> None:
        """``SessionTooLong`` when a session of ``length`` tokens is longer than any route accepts."""
        longest = self.sequence_manager(name).longest_session()
        if longest is not None and length > longest:
            raise SessionTooLong(name, param, length, longest, prompt_tokens)

    def check_route_choice(self, name: str, choice: Optional[RouteChoice], *, prompt_tokens: int, max_tokens: int,
                           field: str = "petals") -> None:
        """Refuse, before any slot, routing choices no route can meet now (``RouteUnmet``, naming the
        choice and what the swarm offers: ``monitor.core.route_choice.unmet``, on this manager's view
        of the swarm, which the operator's pins and blocks already bound), and a directed request
        (``only``) whose every server already runs its share of directed requests (``Busy``)."""
        if choice is None or choice.empty:
            return
        manager = self.sequence_manager(name)
        with manager.lock_changes:
            found = list(manager.state.sequence_info.spans_by_priority)
            num_blocks = len(manager)
        spans = {span.peer_id.to_base58(): (span.start, span.end) for span in found}
        weights = manager.peer_weights()
        seconds = {}
        for span in found:
            peer = span.peer_id.to_base58()
            weight = weights.get(peer)
            rps = getattr(span.server_info, "inference_rps", None)
            measured = weight.seconds_per_token_per_block if weight is not None else None
            seconds[peer] = measured or (1.0 / rps if rps else PETALS_DEFAULT_SECONDS_PER_BLOCK)
        verified = {peer for peer, weight in weights.items() if weight.verified}
        usable = allowed(choice, spans, verified=verified)
        known = self.forecast(name, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        problem = unmet(choice, spans=spans, num_blocks=num_blocks, seconds_per_block=seconds, allowed_peers=usable,
                        all_peers=spans, time_to_first_token=known.time_to_first_token, wait=known.wait, field=field)
        if problem is not None:
            raise RouteUnmet(problem.field, problem.message)
        if choice.directed and self.server_load.directed_full(usable):
            raise Busy(f"the servers {field + '.' if field else ''}only allows already run their share of requests "
                       f"that name their servers ({self.server_load.directed_limit} each); retry later or allow "
                       f"more servers", self.capacity.retry_after)

    def planned_route(self, name: str, tokens: int) -> list[RouteHop]:
        """The hops of the route an inference session of ``tokens`` tokens would take
        now (the sequence manager's own choice, nothing opened); [] when it cannot say."""
        try:
            spans = self.sequence_manager(name).make_sequence(mode="min_latency", cache_tokens_needed=tokens)
        except Exception as e:  # noqa: BLE001 - a preview, not the answer: the session finds its own route
            logger.debug("no route preview for %s: %r", name, e)
            return []
        return [RouteHop(span.peer_id.to_base58(), span.start, span.end) for span in spans]

    def recommendation(self, name: str) -> Optional[tuple[str, str]]:
        """(argument, reason): what a new server of this model should serve, as the stored assessment
        recommends (e.g. ``--block_indices 4:8``), if the forecast's source knows."""
        try:
            known = (self.forecast_source() if self.forecast_source is not None else {}).get(name)
        except Exception:  # noqa: BLE001 - no recommendation, not a failed request
            return None
        return (known.recommendation, known.recommendation_reason or "") if known and known.recommendation else None

    def forecast(self, name: str, *, prompt_tokens: int, max_tokens: int) -> Forecast:
        """What a request of ``prompt_tokens`` asking for ``max_tokens`` would get if it came now
        (``monitor.core.forecast``): the queue's wait now, and what real requests (or the probes) say
        of requests at the load it would meet, on no route in particular (a model list's forecast;
        for a request about to be made, ``forecast_route``)."""
        return self._forecast(name, prompt_tokens, max_tokens, [])

    def forecast_route(self, name: str, *, prompt_tokens: int, max_tokens: int) -> tuple[Forecast, list[RouteHop]]:
        """``forecast`` on the route the request would take now (the router's choice), and that
        route's hops ([]: unknown)."""
        hops = self.planned_route(name, prompt_tokens + max_tokens)
        return self._forecast(name, prompt_tokens, max_tokens, [peer for peer, _, _ in hops]), hops

    def _forecast(self, name: str, prompt_tokens: int, max_tokens: int, route: list[str]) -> Forecast:
        known = {}
        if self.forecast_source is not None:
            try:
                known = self.forecast_source()
            except Exception as e:  # noqa: BLE001 - a forecast of nothing, not a failed request
                logger.warning("forecast inputs unavailable: %r", e)
        wait = self.slots.expected_wait()
        if route:  # beside the requests on its busiest server now (one that waits takes a leaver's place)
            in_flight = self.server_load.in_flight()
            busiest = max(in_flight.get(peer, 0) for peer in route)
            load = max(1, busiest) if wait > 0 else busiest + 1
        else:  # beside those generating now; one that waits, beside a full house
            slots = self.slots.load()
            load = slots.limit if wait > 0 else min(slots.limit, slots.busy + 1)
        return forecast(known.get(name) or ForecastInputs(name), wait=wait, prompt_tokens=prompt_tokens,
                        max_tokens=max_tokens, load=load, route=route or None)

    def load(self) -> EngineLoad:
        """Slots, queue and open sessions now."""
        return EngineLoad(self.slots.load(), self.sessions.load())

    def check_answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
                     outcome_sink: Optional[OutcomeSink] = None) -> Answer:
        """The monitor's generation check through the chat's code (``chat.request.check_answer``)."""
        return request.check_answer(self, name, input_ids, params, outcome_sink=outcome_sink)

    def close(self) -> None:
        """Stop the loaded models' background routing threads (the DHT belongs to the caller)."""
        for model in self._models.values():
            if model.client is not None:
                model.client.heads.close()
                try:
                    sequence_manager_of(model.remote).shutdown()
                except Exception as e:  # noqa: BLE001 - shutting down anyway
                    logger.debug("shutting down %s failed: %r", model.name, e)
