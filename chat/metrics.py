"""The chat's load on /metrics: generation slots, the queue and its waits, open sessions; and
histograms of what its real requests got (``RequestHistograms``: time to first token and decode
tokens/s per model, requests by model, API and outcome), counted as each request's row is made.

These live in the chat's process (the engine's ``Slots`` and ``OpenSessions``), not in the store,
so they are read from the engine at scrape time by a Prometheus collector that the chat's blueprint
carries (``metric_collectors``); the web app registers the collectors of the blueprints it is given
in its own registry, without importing the chat. A web worker without the chat shows none of these.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, Iterator, Sequence

from monitor.core.requests import APIS, FIRST_TOKEN_BUCKETS, OK, OUTCOMES, SPEED_BUCKETS, RequestRecord

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

PREFIX = "swarm_monitor_chat"
REFUSALS = ("queue_full", "client_share", "timeout", "sessions_full")
EXPIRIES = ("evicted", "idle", "lifetime")


OTHER_MODEL = "other"  # the label of a model the engine does not serve (none: the label stays bounded)


class _Histogram:
    """Cumulative bucket counts and the sum of the values observed (Prometheus' histogram)."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds, self.counts, self.total = tuple(bounds), [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, int]]:
        running, found = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            found.append((bound, running))
        return found


class RequestHistograms:
    """What the chat's real requests got, counted in this process as each request's row is made
    (``observe``: the engine's request sink passes every row through): requests by model, API and
    outcome; time to first token and decode tokens/s of the answered ones, per model. Label values
    are bounded: the engine's models, ``APIS``, ``OUTCOMES``. Like the slots, the counts are this
    process's: several chat workers each show their own (sum them in Prometheus)."""

    def __init__(self, models: Sequence[str]):
        self.models = tuple(models)
        self._lock = threading.Lock()
        self.requests = {(m, a, o): 0 for m in (*self.models, OTHER_MODEL) for a in APIS for o in OUTCOMES}
        self.first_token = {m: _Histogram(FIRST_TOKEN_BUCKETS) for m in (*self.models, OTHER_MODEL)}
        self.speed = {m: _Histogram(SPEED_BUCKETS) for m in (*self.models, OTHER_MODEL)}

    def observe(self, record: RequestRecord) -> None:
        model = record.model if record.model in self.models else OTHER_MODEL
        if record.api not in APIS or record.outcome not in OUTCOMES:
            return
        with self._lock:
            self.requests[(model, record.api, record.outcome)] += 1
            if record.outcome == OK and record.time_to_first_token is not None and record.time_to_first_token >= 0:
                self.first_token[model].observe(record.time_to_first_token)
            if record.outcome == OK and record.tokens_per_second is not None and record.tokens_per_second >= 0:
                self.speed[model].observe(record.tokens_per_second)

    def families(self) -> Iterator:
        with self._lock:
            requests = CounterMetricFamily(f"{PREFIX}_requests", "Requests the chat served, by model, API and "
                                           "outcome (ok, error, cancelled: left by its client)",
                                           labels=["model", "api", "outcome"])
            for (model, api, outcome), count in self.requests.items():
                if model != OTHER_MODEL or count:
                    requests.add_metric([model, api, outcome], count)
            first = HistogramMetricFamily(f"{PREFIX}_request_first_token_seconds", "Time to the first token of "
                                          "the chat's answered requests (after their slot wait)", labels=["model"])
            speed = HistogramMetricFamily(f"{PREFIX}_request_tokens_per_second", "Decode tokens per second of the "
                                          "chat's answered requests", labels=["model"])
            for family, histograms in ((first, self.first_token), (speed, self.speed)):
                for model, histogram in histograms.items():
                    if model != OTHER_MODEL or sum(histogram.counts):
                        family.add_metric([model], histogram.buckets(), sum_value=histogram.total)
        yield from (requests, first, speed)


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
        waits = HistogramMetricFamily(f"{PREFIX}_queue_wait_seconds",
                                      "Seconds from a request to its generation slot (0 when one was free)")
        waits.add_metric([], slots.waits, sum_value=slots.waits_sum)
        yield waits
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
        yield from self.engine.request_histograms.families()
