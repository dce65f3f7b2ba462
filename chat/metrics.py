"""The chat's load on /metrics: generation slots, the queue and its waits, open sessions;
histograms of what its real requests got (``RequestHistograms``: time to first token and decode
tokens/s per model, requests by model, API and outcome), counted as each request's row is made; and
its own compute (``HeadStepHistograms``: seconds and rows per head step, per model).

These live in the chat's process (the engine's ``Slots`` and ``OpenSessions``), not in the store,
so they are read from the engine at scrape time by a Prometheus collector that the chat's blueprint
carries (``metric_collectors``); the web app registers the collectors of the blueprints it is given
in its own registry, without importing the chat. A web worker without the chat shows none of these.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from monitor.core.requests import APIS, FIRST_TOKEN_BUCKETS, OK, OUTCOMES, SPEED_BUCKETS, RequestRecord

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "swarm_monitor_chat"
REFUSALS = ("queue_full", "client_share", "timeout", "sessions_full")
EXPIRIES = ("evicted", "idle", "lifetime", "kept")  # (kept: a session kept after an answer, past its time)


OTHER_MODEL = "other"  # the label of a model the engine does not serve (none: the label stays bounded)


WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)  # seconds
HEAD_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # seconds
HEAD_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class RequestHistograms:
    """What the chat's real requests got, counted in this process as each request's row is made
    (``observe``: the engine's request sink passes every row through): requests by model, API and
    outcome; time to first token and decode tokens/s of the answered ones, per model. Label values
    are bounded: the engine's models, ``APIS``, ``OUTCOMES``. Like the slots, the counts are this
    process's: several chat workers each show their own (sum them in Prometheus). prometheus_client's
    own types, in no registry: ``ChatCollector`` yields them into the app's."""

    def __init__(self, models: Sequence[str]):
        self.models = tuple(models)
        self.requests = Counter(f"{PREFIX}_requests", "Requests the chat served, by model, API and outcome (ok, "
                                "error, cancelled: left by its client)", ["model", "api", "outcome"], registry=None)
        self.first_token = Histogram(f"{PREFIX}_request_first_token_seconds", "Time to the first token of the chat's "
                                     "answered requests (after their slot wait)", ["model"], registry=None,
                                     buckets=FIRST_TOKEN_BUCKETS)
        self.speed = Histogram(f"{PREFIX}_request_tokens_per_second", "Decode tokens per second of the chat's "
                               "answered requests", ["model"], registry=None, buckets=SPEED_BUCKETS)
        for model in self.models:
            self.first_token.labels(model)
            self.speed.labels(model)
            for api in APIS:
                for outcome in OUTCOMES:
                    self.requests.labels(model, api, outcome)

    def observe(self, record: RequestRecord) -> None:
        model = record.model if record.model in self.models else OTHER_MODEL
        if record.api not in APIS or record.outcome not in OUTCOMES:
            return
        self.requests.labels(model, record.api, record.outcome).inc()
        if record.outcome == OK and record.time_to_first_token is not None and record.time_to_first_token >= 0:
            self.first_token.labels(model).observe(record.time_to_first_token)
        if record.outcome == OK and record.tokens_per_second is not None and record.tokens_per_second >= 0:
            self.speed.labels(model).observe(record.tokens_per_second)

    def families(self) -> Iterator:
        for metric in (self.requests, self.first_token, self.speed):
            yield from metric.collect()


def queue_waits() -> Histogram:
    """Seconds from a request to its generation slot (``chat.capacity.Slots``' ``observe_wait``)."""
    return Histogram(f"{PREFIX}_queue_wait_seconds", "Seconds from a request to its generation slot (0 when one "
                     "was free)", registry=None, buckets=WAIT_BUCKETS)


class HeadStepHistograms:
    """The chat's own compute per model (``chat.head_step``): seconds per head step and rows per
    step (each row one answer's next token, or a prompt position scored). The milliseconds per
    token an operator compares with the swarm's speed are their sums' ratio."""

    def __init__(self, models: Sequence[str]):
        self.seconds = Histogram(f"{PREFIX}_head_step_seconds", "Seconds of one head step of the chat's own "
                                 "compute (the head and the choice of every ready answer's next token)", ["model"],
                                 registry=None, buckets=HEAD_STEP_BUCKETS)
        self.rows = Histogram(f"{PREFIX}_head_step_rows", "Rows of one head step (answers' next tokens and prompt "
                              "positions scored together)", ["model"], registry=None, buckets=HEAD_ROWS_BUCKETS)
        for model in models:
            self.seconds.labels(model)
            self.rows.labels(model)

    def observer(self, model: str):
        """What the model's head steps call after each step: ``(seconds, rows)``."""
        seconds, rows = self.seconds.labels(model), self.rows.labels(model)

        def observe(step_seconds: float, step_rows: int) -> None:
            seconds.observe(step_seconds)
            rows.observe(step_rows)

        return observe

    def families(self) -> Iterator:
        for metric in (self.seconds, self.rows):
            yield from metric.collect()


class ChatCollector:
    """Reads ``engine.load()`` on every scrape."""

    def __init__(self, engine: Any):
        self.engine = engine

    def describe(self):
        return []

    def collect(self) -> Iterator:
        load = self.engine.load()
        slots, sessions = load.slots, load.sessions
        family = GaugeMetricFamily(f"{PREFIX}_slots", "Generation slots: busy (an answer is computed) or free",
                                   labels=["state"])
        family.add_metric(["busy"], slots.busy)
        family.add_metric(["free"], max(0, slots.limit - slots.busy))
        yield family
        yield GaugeMetricFamily(f"{PREFIX}_queue_requests", "Requests waiting for a generation slot",
                                value=slots.waiting)
        yield GaugeMetricFamily(f"{PREFIX}_queue_clients", "Clients with a request waiting for a generation slot",
                                value=slots.waiting_clients)
        yield GaugeMetricFamily(f"{PREFIX}_retry_after_seconds",
                                "What a request refused now would be told to wait (Retry-After)",
                                value=slots.retry_after)
        yield from self.engine.queue_waits.collect()
        refused = CounterMetricFamily(f"{PREFIX}_refused", "Requests refused with 429 by the chat's capacity, by "
                                                           "cause", labels=["reason"])
        for reason in REFUSALS[:-1]:
            refused.add_metric([reason], slots.refused.get(reason, 0))
        refused.add_metric(["sessions_full"], sessions.refused)
        yield refused
        open_sessions = GaugeMetricFamily(f"{PREFIX}_sessions_open",
                                          "Kept-open sessions (WebSocket): idle, waiting for a slot, or generating",
                                          labels=["state"])
        for state, count in sessions.states.items():
            open_sessions.add_metric([state], count)
        yield open_sessions
        yield GaugeMetricFamily(f"{PREFIX}_sessions_limit", "Kept-open sessions at most (max_open_sessions)",
                                value=sessions.limit)
        expired = CounterMetricFamily(f"{PREFIX}_sessions_expired", "Kept-open sessions the chat ended, by cause",
                                      labels=["reason"])
        for reason in EXPIRIES:
            expired.add_metric([reason], sessions.expired.get(reason, 0))
        yield expired
        yield CounterMetricFamily(f"{PREFIX}_sessions_released",
                                  "Idle kept-open sessions that let go of their servers' caches for another session "
                                  "(each replays its text at its next answer)", value=sessions.released)
        yield GaugeMetricFamily(f"{PREFIX}_sessions_kept", "Sessions kept after an answer for a follow-up of the same "
                                "client (idle: they hold cache on their servers, compute nothing)", value=load.kept.kept)
        follow_ups = CounterMetricFamily(f"{PREFIX}_follow_ups", "Requests that came with the handle of the answer "
                                         "they follow, by model and outcome: continued (only new tokens sent) or why a "
                                         "fresh session started", labels=["model", "outcome"])
        for (model, reason), count in sorted(load.kept.outcomes.items()):
            follow_ups.add_metric([model, reason], count)
        yield follow_ups
        yield from self.engine.request_histograms.families()
        yield from self.engine.head_step_histograms.families()
        if self.engine.worker:  # several chat workers: which one this is (its tag)
            info = GaugeMetricFamily(f"{PREFIX}_worker_info", "This chat worker's tag (chat_worker)",
                                     labels=["worker"])
            info.add_metric([self.engine.worker], 1.0)
            yield info
        shared = self.engine.shared_load
        if shared is not None:  # several chat workers (chat_shared): how many this one counts, how fresh
            yield GaugeMetricFamily(f"{PREFIX}_shared_workers", "Other chat workers whose load this one counts "
                                    "(their records within the lease)", value=shared.workers)
            yield GaugeMetricFamily(f"{PREFIX}_shared_load_age_seconds", "Age of the oldest other worker's load "
                                    "record at the newest read (how stale routing's view of their load is)",
                                    value=max(shared.staleness, default=0.0))
            yield GaugeMetricFamily(f"{PREFIX}_shared_load_up", "1 when the newest publication and read of the "
                                    "shared load succeeded", value=0.0 if shared.failed else 1.0)
