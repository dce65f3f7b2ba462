"""The chat's links to the monitor's store: peer weights in; each span's outcome and each
request's row (``StoreRequests``) out.

Routing asks for peer weights every time it builds a route, inside petals' routing lock, so the
weights are served from memory and refreshed from the store by a background thread: the latest
scores (from the monitor's score job), the measured seconds per token of recent chat requests,
and what the stored assessments (``monitor.core.assessment``) say of each server: its speed as
the probes measured it (every ONLINE server is probed, so every server has a measured weight
before the first chat request), and whether its outputs are wrong or it fails every step — such a
server gets score 0, so routing leaves it out wherever others cover its blocks. The verdict is the
one the dashboard and the alerts show: the chat draws none of its own from the probes. Chat
outcomes, which come only when someone chats, are read over a window of their own
(``CHAT_OUTCOME_WINDOW``).
The thread refreshes every few seconds, and at once after each recorded outcome, so the next
request already routes by what the last one measured.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

from monitor.core.assess import round_trip_speeds
from monitor.core.compute_checks import confirming_request
from monitor.core.forecast import WINDOW as FORECAST_WINDOW, ForecastInputs, inputs as forecast_inputs
from monitor.core.requests import RequestRecord
from monitor.core.routing_view import CHAT_OUTCOME_WINDOW, UNUSABLE_SCORE, PeerRouting, peer_routing, probe_speeds
from monitor.core.snapshot import ChatOutcome

from chat.policy import NEUTRAL_SCORE, OutcomeSink, PeerWeight

log = logging.getLogger(__name__)

__all__ = ["CHAT_OUTCOME_WINDOW", "UNUSABLE_SCORE", "probe_speeds", "StoreWeights", "StoreRequests", "StoreForecasts",
           "as_weight",
           "store_outcome_sink", "ask_to_confirm", "store_assessment_check"]


def as_weight(known: PeerRouting) -> PeerWeight:
    """The policy's weight of what routing knows of a peer (a peer not scored yet: neutral)."""
    return PeerWeight(score=NEUTRAL_SCORE if known.score is None else known.score,
                      seconds_per_token_per_block=known.seconds_per_token_per_block, policy=known.policy,
                      verified=known.verified)


def every(period: float, work: Callable[[], object], *, name: str, stop: threading.Event,
          wake: Optional[threading.Event] = None, last: Optional[Callable[[], object]] = None) -> threading.Thread:
    """A daemon thread calling ``work`` every ``period`` seconds (at once when ``wake`` is set) until
    ``stop`` is set, then ``last`` once: the refresh loop of each link to the store."""
    wake = wake or stop

    def loop():
        while not stop.is_set():
            wake.wait(period)
            if wake is not stop:
                wake.clear()
            if not stop.is_set():
                work()
        if last is not None:
            last()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


class StoreWeights:
    """A cheap ``score_source`` for HealthAwareSequenceManager, refreshed every ``period`` s; chat
    outcomes count for ``outcome_window``."""

    def __init__(self, store: Any, *, period: float = 5.0, outcome_window: float = CHAT_OUTCOME_WINDOW):
        self.store = store
        self.period = period
        self.outcome_window = outcome_window
        self._weights: dict[str, PeerWeight] = {}
        self.probed: dict[str, float] = {}  # peer -> what its newest probes measured (round trip included)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __call__(self) -> dict[str, PeerWeight]:
        return self._weights

    def refresh(self) -> dict[str, PeerWeight]:
        now = time.time()
        try:
            scores = {peer: stored.score for peer, stored in self.store.latest_scores().items()}
            outcomes = self.store.recent_chat_outcomes(now - self.outcome_window)
            assessments = self.store.latest_assessments()
            policies = self.store.peer_policies()
        except Exception as e:  # noqa: BLE001 - keep routing on the last weights while the DB is away
            log.warning("peer weights not refreshed (keeping the last ones): %s", e)
            return self._weights
        routing = peer_routing(scores=scores, outcomes=outcomes, assessments=assessments, policies=policies,
                               now=now, window=self.outcome_window)
        weights = {peer: as_weight(known) for peer, known in routing.items()}
        self._weights = weights
        self.probed = {peer: seconds for peer, (seconds, _) in round_trip_speeds(assessments).items()}
        return self._weights

    def start(self) -> "StoreWeights":
        self.refresh()
        self._thread = every(self.period, self.refresh, name="peer-weights", stop=self._stop, wake=self._wake)
        return self

    def refresh_soon(self) -> None:
        """Refresh in the background now (new evidence was recorded), not at the next period."""
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


class StoreRequests:
    """The engine's ``request_sink``: request rows queued in memory (a request never waits for the
    database) and written in batches by a thread of their own, at least every ``period`` seconds.
    At most ``max_queued`` rows wait; beyond that (the database away for long) new rows are dropped
    and counted (``dropped``), with one warning per run of drops."""

    def __init__(self, store: Any, *, period: float = 1.0, batch: int = 500, max_queued: int = 10_000,
                 on_written: Optional[Callable[[], object]] = None):
        """``on_written``: called after a flush that wrote rows (e.g. ``StoreForecasts.refresh_soon``)."""
        self.store, self.period, self.batch, self.on_written = store, period, batch, on_written
        self._queue: "queue.Queue[RequestRecord]" = queue.Queue(max_queued)
        self.dropped = self.written = 0
        self._dropping = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __call__(self, record: RequestRecord) -> None:
        try:
            self._queue.put_nowait(record)
            self._dropping = False
        except queue.Full:
            self.dropped += 1
            if not self._dropping:
                log.warning("request rows dropped: %d wait for the database already", self._queue.maxsize)
            self._dropping = True

    def flush(self) -> int:
        """Write what waits (in batches); returns how many rows were written. Rows whose batch fails
        go back to wait for the next flush (as many as fit)."""
        written = 0
        while True:
            rows = []
            while len(rows) < self.batch:
                try:
                    rows.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not rows:
                if written and self.on_written is not None:
                    self.on_written()
                return written
            try:
                self.store.record_requests(rows)
            except Exception as e:  # noqa: BLE001 - kept for the next flush
                log.warning("request rows not recorded yet (%d): %s", len(rows), e)
                for row in rows:
                    self(row)
                return written
            written += len(rows)
            self.written += len(rows)

    def start(self) -> "StoreRequests":
        self._thread = every(self.period, self.flush, name="request-rows", stop=self._stop, last=self.flush)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None


class StoreForecasts:
    """The engine's ``forecast_source``: per model what its forecasts rest on (``core/forecast.py``:
    the model's answered requests of the last half hour, the stored assessment), read from the store
    every ``period`` seconds on a thread of its own, and soon after this process stored rows of its
    own (``refresh_soon``; at most every ``min_gap`` seconds); the last good read while the database
    is away."""

    def __init__(self, store: Any, models: list[str], *, period: float = 30.0, min_gap: float = 5.0):
        self.store, self.models, self.period, self.min_gap = store, list(models), period, min_gap
        self._known: dict[str, ForecastInputs] = {}
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last = float("-inf")  # (monotonic) when the last refresh began
        self.refreshes = 0

    def __call__(self) -> dict[str, ForecastInputs]:
        return self._known

    def refresh(self) -> dict[str, ForecastInputs]:
        now, self._last = time.time(), time.monotonic()
        self.refreshes += 1
        try:
            assessments = self.store.latest_assessments()
            known = {model: forecast_inputs(model, self.store.requests_since(now - FORECAST_WINDOW, model=model),
                                            assessments.get(model), now=now) for model in self.models}
        except Exception as e:  # noqa: BLE001 - the last forecasts stand
            log.warning("forecast inputs not refreshed (keeping the last ones): %s", e)
            return self._known
        self._known = known
        return known

    def start(self) -> "StoreForecasts":
        self.refresh()
        self._thread = every(self.period, self._tick, name="forecasts", stop=self._stop, wake=self._wake)
        return self

    def refresh_soon(self) -> None:
        """New rows were stored: refresh now, or ``min_gap`` after the last refresh."""
        self._wake.set()

    def _tick(self) -> None:
        early = self._last + self.min_gap - time.monotonic()
        if early > 0 and self._stop.wait(early):
            return
        self._wake.clear()  # (whatever asked for a read until now, this one answers)
        self.refresh()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


def store_outcome_sink(store: Any, weights: Optional[StoreWeights] = None) -> OutcomeSink:
    """``outcome_sink`` for the engine: each request's per-peer outcome goes into the store,
    where the scores and StoreWeights pick it up (``weights``, if given, at once). A database
    hiccup never fails a chat."""

    def sink(outcome: ChatOutcome) -> None:
        try:
            store.record_chat_outcome(outcome)
        except Exception as e:  # noqa: BLE001
            log.warning("chat outcome for %s not recorded: %s", outcome.peer_id, e)
            return
        ask_to_confirm(store, outcome, weights.probed.get(outcome.peer_id) if weights is not None else None,
                       by="chat")
        if weights is not None:
            weights.refresh_soon()

    return sink


def ask_to_confirm(store: Any, outcome: ChatOutcome, probed: Optional[float], *, by: str) -> None:
    """A user's failure (or a span far slower than probed) asks the leader, through the store, for
    a confirming check of that server (``compute_checks.confirming_request``); never fails the caller."""
    request = confirming_request(outcome, probed)
    if request is None:
        return
    try:
        store.request_job(request.job, target=request.peer_id, by=by, why=request.why,
                          min_interval=request.min_interval)
    except Exception as e:  # noqa: BLE001 - the check comes in its turn instead
        log.warning("no confirming check of %s asked for: %s", request.peer_id, e)


def store_assessment_check(store: Any) -> Callable[[str], tuple[bool, str]]:
    """``assessment_check`` for the engine: a model the monitor's newest assessment calls broken (the
    one the dashboard, API, /metrics and alerts show: after the latest poll, probe round and
    generation check) is refused before generation starts, with the monitor's reasons."""

    def check(dht_prefix: str) -> tuple[bool, str]:
        try:
            assessment = store.latest_assessments().get(dht_prefix)
        except Exception:  # noqa: BLE001 - no verdict: let petals' own view decide
            return True, ""
        if assessment is None or assessment.state != "broken":
            return True, ""
        return False, "; ".join(assessment.reasons)

    return check


WORKER_BEAT = 10.0  # seconds between a chat worker's reports of itself (the overview's chat workers)


class WorkerBeat:
    """This chat worker's report of itself to the store every ``period`` seconds
    (``monitor.store.chat_workers``): alive, its slots, queue, open sessions, the servers its
    requests use, whether it drains; a last one saying it stopped when it closes. A report the
    database does not take is logged once and tried again at the next beat."""

    def __init__(self, store: Any, engine: Any, *, period: float = WORKER_BEAT, clock: Callable[[], float] = time.time):
        import os
        import socket

        from chat.shared_load import worker_id

        self.store, self.engine, self.period, self._clock = store, engine, period, clock
        shared = getattr(engine, "shared_load", None)
        self.worker = shared.worker if shared is not None else worker_id()
        self.host, self.pid, self.started_at = socket.gethostname(), os.getpid(), clock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failing = False

    def start(self) -> "WorkerBeat":
        self.beat()
        self._thread = every(self.period, self.beat, name="chat-worker-beat", stop=self._stop)
        return self

    def beat(self, *, stopped: bool = False) -> None:
        from monitor.store import chat_workers

        load = self.engine.load()
        report = chat_workers.ChatWorker(
            worker=self.worker, host=self.host, pid=self.pid, started_at=self.started_at, beat_at=self._clock(),
            tag=getattr(self.engine, "worker", None), slots=load.slots.limit, busy=load.slots.busy,
            waiting=load.slots.waiting, sessions_open=sum(load.sessions.states.values()),
            servers_used=len(self.engine.server_load.own()["in_flight"]),
            draining=bool(getattr(self.engine, "draining", False)), stopped=stopped)
        try:
            with self.store.db.write("reporting this chat worker") as conn:
                chat_workers.record(conn, report)
            self._failing = False
        except Exception as e:  # noqa: BLE001 - the chat goes on; the overview shows it silent
            if not self._failing:
                log.warning("this chat worker's report was not stored (the overview shows it silent): %s", e)
            self._failing = True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.beat(stopped=True)
