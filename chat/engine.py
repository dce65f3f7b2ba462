"""Chat generation through the swarm: one ``ChatEngine`` per process, wiring the chat's parts, each
with one job:

- **models** (``chat.models.Models``): the configured models, their client files and client sides
  (the petals model with the health-aware sequence manager, ``chat.sequence``, and the model's shared
  head steps, ``chat.head_step``), loaded on first use;
- **admission** (``chat.admission.Admission``): what is refused before any slot (a model not
  served, a session longer than its servers accept, routing choices no route meets) and what a
  request would get (its forecast and route);
- **capacity** (``chat.capacity``): generation slots, shared per client in turn, and the sessions
  kept open between turns (chat.petals.dev's WebSocket, and answered sessions kept for a follow-up
  of the same client: ``chat.kept``), bounded apart; and the load ledger of requests in flight per
  server (``chat.server_load``).

A request's life reads top to bottom in ``chat.request``, over those parts (``RequestContext``);
the engine's entry points (``answer``, ``answer_batch``, ``open_session``, ``check_answer``) hand
it that context. Everything that can be refused (unknown model, prompt too long, model not served,
busy) is refused before the first token, so the HTTP side can answer with a status instead of a
broken stream.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.core.forecast import ForecastInputs
from monitor.core.requests import RequestRecord
from monitor.core.route_choice import RouteChoice

from chat.admission import Admission, AssessmentCheck, ModelReadiness
from chat.shared_load import SharedLedger
from chat.capacity import Capacity, OpenSessions, SessionsLoad, Slots, SlotsLoad
from chat.client_side import ClientSideSettings
from chat.decoding import Delta, Finished, GenerationParams, TokenLogprob
from chat.errors import (
    Busy, ChatError, GenerationFailed, InvalidRequest, MaxLengthExceeded, ModelNotServed, RouteUnmet, SessionExpired,
    SessionTooLong, UnknownModel,
)
from chat.kept import DEFAULT_HEADROOM, DEFAULT_KEEP_SECONDS, FollowUp, KeptLoad, KeptSessions, Rendered
from chat.metrics import HeadStepHistograms, RequestHistograms, queue_waits
from chat.models import Models
from chat.policy import OutcomeSink, RoutingSettings, ScoreSource
from chat.server_load import ServerLimits, ServerLoad
from chat.remote_model import load_remote_model
from chat.sequence import CACHE_WAIT, HealthAwareSequenceManager
from chat import request
from chat.request import Answer, BatchAnswer, RequestContext
from chat.session import ChatSession

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_ROWS = 16
DEFAULT_MAX_LOGPROBS = 20

__all__ = [  # what the HTTP side and the service use, in one import
    "Answer", "BatchAnswer", "Busy", "Capacity", "ChatEngine", "ChatError", "ChatSession", "AssessmentCheck", "Delta",
    "EngineLoad", "Finished", "FollowUp", "GenerationFailed", "Rendered", "GenerationParams", "InvalidRequest", "MaxLengthExceeded",
    "ModelNotServed", "ModelReadiness", "RouteChoice", "RouteUnmet", "SessionExpired", "SessionTooLong", "TokenLogprob", "UnknownModel",
]


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds now (``chat.metrics`` shows it on /metrics)."""

    slots: SlotsLoad
    sessions: SessionsLoad
    kept: KeptLoad


class ChatEngine:
    """Chat with the swarm's models. Thread-safe; one per process.

    ``models``: monitor.settings.ModelConfig-like objects (dht_prefix, path, name,
    repository). ``score_source`` and ``outcome_sink`` link routing to the monitor (see
    chat.feedback); ``assessment_check`` refuses a model the monitor saw broken before loading it.
    ``capacity`` bounds slots, queue and open sessions (``chat.capacity``; without it, from
    ``slots``, ``queue_size``, ``queue_timeout`` and ``retry_after`` with the other bounds'
    defaults); ``max_batch_rows`` bounds the rows of one request, ``max_logprobs`` the alternatives
    per token; ``client_side``: the client sides' precision and device (``chat.client_side``).
    ``client`` (the caller's address) is who a slot or session is for; None is this process itself
    (a spec, a benchmark), to which no per-client share applies.
    """

    def __init__(
        self,
        dht: Any,
        models: Sequence[Any],
        *,
        score_source: Optional[ScoreSource] = None,
        outcome_sink: Optional[OutcomeSink] = None,
        assessment_check: Optional[AssessmentCheck] = None,
        routing: Optional[RoutingSettings] = None,
        capacity: Optional[Capacity] = None,
        slots: int = 4,
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
        keep_seconds: float = DEFAULT_KEEP_SECONDS,
        keep_headroom: int = DEFAULT_HEADROOM,
        shared: Optional[str] = None,
        worker: Optional[str] = None,
    ):
        self.dht = dht
        self._request_rows = request_sink  # each request's row (chat.request.RequestLog), e.g. StoreRequests
        self.routing = routing or RoutingSettings()
        # -- capacity: slots, kept sessions, the load per server
        self.capacity = capacity or Capacity(slots=slots, queue_size=queue_size, queue_timeout=queue_timeout,
                                             retry_after=retry_after)
        self.queue_waits = queue_waits()  # /metrics (chat.metrics)
        self.slots = Slots(self.capacity, observe_wait=self.queue_waits.observe)
        self.sessions = OpenSessions(self.capacity)
        self.sessions.estimate_with(self.slots.estimate)
        self.kept = KeptSessions(self.sessions, keep_seconds=keep_seconds)  # answered sessions, for follow-ups
        # requests in flight per server (routes spread by it); directed ones bounded per server
        self.server_load = ServerLoad(directed_limit=self.capacity.slots_per_client)
        # several chat workers: each one's load on each server, published to and read from Redis
        self.shared_load = SharedLedger(shared, self.server_load, self.slots).start() if shared else None
        self.server_limits = ServerLimits()  # the longest session each server accepts, learned from refusals
        # -- models, routed by the health-aware sequence manager
        self.sequence_manager_cls = HealthAwareSequenceManager.configured(
            score_source=score_source, outcome_sink=outcome_sink, routing=self.routing, server_load=self.server_load,
            server_limits=self.server_limits, make_room=self.make_room, cache_wait=cache_wait,
        )
        # petals waits request_timeout (default 180 s) on a server that died mid-step before it
        # tries another one: a person waiting for an answer should not wait that long
        self._client_config = {"max_retries": max_retries, "request_timeout": request_timeout, "show_route": False,
                               **(client_config or {})}
        names = [config.dht_prefix for config in models]
        self.request_histograms = RequestHistograms(names)  # /metrics (chat.metrics)
        self.head_step_histograms = HeadStepHistograms(names)
        # (the client sides' precision and device: refused here, in one line, when this machine has no such device)
        self.models = Models(models, client_side_settings=(client_side or ClientSideSettings()).checked(),
                             build=self._build_remote, observe=self.head_step_histograms.observer)
        # -- admission
        self.admission = Admission(self.models, self.slots, self.server_load, routing=self.routing,
                                   assessment_check=assessment_check, forecast_source=forecast_source,
                                   retry_after=self.capacity.retry_after)
        # no token for this long means something below us hangs: give up on the answer
        self.stall_timeout = self._client_config["request_timeout"] * (max_retries + 1) + 60
        self.max_batch_rows, self.max_logprobs = max_batch_rows, max_logprobs
        self.requests = RequestContext(models=self.models, admission=self.admission, slots=self.slots,
                                       sessions=self.sessions, kept=self.kept, request_sink=self.request_sink,
                                       max_batch_rows=max_batch_rows, max_logprobs=max_logprobs,
                                       stall_timeout=self.stall_timeout, headroom=keep_headroom, worker=worker)
        self.worker = worker  # this chat worker's tag (several workers behind a proxy: README)
        self.draining = False  # stopping: no new answer starts (``drain``)

    def _build_remote(self, model, torch_dtype) -> Any:
        return load_remote_model(model.path, self.dht, sequence_manager_cls=self.sequence_manager_cls,
                                 dht_prefix=model.name, torch_dtype=torch_dtype, **self._client_config)

    @property
    def forecast_source(self):
        """What forecasts rest on, per model (e.g. ``chat.feedback.StoreForecasts``)."""
        return self.admission.forecast_source

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

    # -- what specs, scripts and the HTTP side ask of the parts, by model name -----------------------
    def encode(self, name: str, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.models.encode(name, text, add_special_tokens=add_special_tokens)

    def sequence_manager(self, name: str) -> HealthAwareSequenceManager:
        """The model's sequence manager (loads the model): its view of the swarm and its routes."""
        return self.models.sequence_manager(name)

    # -- requests (their life: chat.request) ------------------------------------------------------
    def open_session(self, name: str, max_length: int, *, client: Optional[str] = None,
                     choice: Optional[RouteChoice] = None) -> ChatSession:
        """A petals inference session kept open between turns for ``client`` (``chat.request.open_session``).
        Raises Busy, UnknownModel, ModelNotServed, InvalidRequest, RouteUnmet."""
        return request.open_session(self.requests, name, max_length, client=client, choice=choice)

    def answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
               client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
               prompt_param: str = "prompt", api: str = "openai", choice: Optional[RouteChoice] = None,
               on_wait: Optional[Callable[[int, float], object]] = None, rendered: Optional[Rendered] = None,
               follow: Optional[FollowUp] = None, owner: Optional[str] = None) -> Answer:
        """One answer in its own session, or a kept one it continues (``chat.request.answer``): Delta
        events, then one Finished."""
        return request.answer(self.requests, name, input_ids, params, client=client, stop_event=stop_event,
                              prompt_param=prompt_param, api=api, choice=choice, on_wait=on_wait, rendered=rendered,
                              follow=follow, owner=owner)

    def answer_batch(self, name: str, rows: Sequence[Sequence[int]], params: GenerationParams, *,
                     client: Optional[str] = None, stop_event: Optional[threading.Event] = None,
                     prompt_param: str = "prompt", api: str = "openai",
                     choice: Optional[RouteChoice] = None,
                     on_wait: Optional[Callable[[int, float], object]] = None, rendered: Optional[Rendered] = None,
                     follow: Optional[FollowUp] = None) -> BatchAnswer:
        """Every row of one request (``chat.request.answer_batch``: ``rendered`` and ``follow`` for
        sessions kept after an answer, ``chat.kept``); refusals raise before any token."""
        return request.answer_batch(self.requests, name, rows, params, client=client, stop_event=stop_event,
                                    prompt_param=prompt_param, api=api, choice=choice, on_wait=on_wait,
                                    rendered=rendered, follow=follow)

    def load(self) -> EngineLoad:
        """Slots, queue and open sessions now."""
        return EngineLoad(self.slots.load(), self.sessions.load(), self.kept.load())

    def check_answer(self, name: str, input_ids: Sequence[int], params: GenerationParams, *,
                     outcome_sink: Optional[OutcomeSink] = None) -> Answer:
        """The monitor's generation check through the chat's code (``chat.request.check_answer``)."""
        return request.check_answer(self.requests, name, input_ids, params, outcome_sink=outcome_sink)

    def drain(self) -> None:
        """This worker is stopping (SIGTERM in a rolling deploy: ``monitor.app.chat_wsgi``): the
        answers being computed finish, no new one starts (the chat's routes answer 503 with
        ``Retry-After``: another worker takes it), kept sessions close, and open sessions are told
        "Session … expired" as they turn idle — chat.petals.dev's page reopens on another worker."""
        if self.draining:
            return
        self.draining = True
        self.kept.close()
        self.sessions.stop("this chat worker is stopping (a restart or a deploy); open a new session to go on")

    def close(self) -> None:
        """Close the kept sessions, stop the loaded models' head steps and background routing threads
        (the DHT belongs to the caller)."""
        self.kept.close()
        self.models.close()
        if self.shared_load is not None:
            self.shared_load.close()
            self.shared_load = None
