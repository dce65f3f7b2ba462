"""The chat's load on /metrics: generation slots, the queue and its waits, open sessions.

These live in the chat's process (the engine's ``Slots`` and ``OpenSessions``), not in the store,
so they are read from the engine at scrape time by a Prometheus collector that the chat's blueprint
carries (``metric_collectors``); the web app registers the collectors of the blueprints it is given
in its own registry, without importing the chat. A web worker without the chat shows none of these.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

PREFIX = "swarm_monitor_chat"
REFUSALS = ("queue_full", "client_share", "timeout", "sessions_full")
EXPIRIES = ("evicted", "idle", "lifetime")


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
