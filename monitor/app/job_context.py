"""What every poll-side job runs on: one typed context, built by the poller, read by plain functions.

A job is a plain function ``job(ctx) -> result`` (``app/job_table.py`` lists them with their
triggers). The context carries what a job may use — the settings, the store (fenced by the lease
when there is one), the DHT client, the leadership, the assess step, the database retry policy, the
counters — and nothing of the runner: a job neither schedules nor calls another job; it stores what
it found, asks the assess step to assess the newest poll again, or writes a request into the store
(``Store.request_job``) for the leader's ``requests`` job.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Protocol

from monitor.core.snapshot import Snapshot
from monitor.settings import Settings

class StoreCall(NamedTuple):
    """What a store call under the runner's retry policy came to (indexable as (ok, value))."""

    ok: bool
    value: Any = None
    error: Optional[BaseException] = None


@dataclass
class JobStats:
    """Counters since start; the last error per job, for logs, /metrics and the dashboard."""

    runs: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)

    def ok(self, job: str) -> None:
        self.runs[job] = self.runs.get(job, 0) + 1

    def failed(self, job: str, error: BaseException) -> None:
        self.runs[job] = self.runs.get(job, 0) + 1
        self.failures[job] = self.failures.get(job, 0) + 1
        self.last_error[job] = f"{type(error).__name__}: {error}"


class Leading(Protocol):
    """The leadership as jobs see it (``app/leadership.py`` ``Leadership``)."""

    last_poll_at: Optional[float]
    problem: Optional[str]

    def held(self) -> bool: ...


class Worker(Protocol):
    """A job that runs in rounds keeps one of these while its poller leads (its own thread)."""

    def run_once(self) -> Any: ...

    def close(self) -> None: ...


@dataclass
class PollState:
    """What the scrape job keeps between polls: the newest poll it stored, and the servers a
    reachability check of this poller covered since it began to lead (None until its first stored
    poll: a stored snapshot from before then may be a stale one). Both forgotten when it stops
    leading. ``lock``: a poll's assessment and store, and an assessment of the newest poll after
    another input, one at a time."""

    last_snapshot: Optional[Snapshot] = None
    checked_servers: Optional[frozenset[str]] = None
    lock: threading.RLock = field(default_factory=threading.RLock)

    def forget(self) -> None:
        self.last_snapshot = None
        self.checked_servers = None


@dataclass
class JobContext:
    """One poller's jobs' context. ``dht`` is None until the DHT client is up (``dht_client``
    retries in the background); ``workers`` holds the running round jobs' workers by job name
    (filled and emptied by the runner); ``db`` is the runner's retry policy for store calls;
    ``assess_step`` assesses the newest poll again with the newest stored inputs; ``table`` and
    ``run_job`` are what the ``requests`` job carries requests out by."""

    settings: Settings
    store: Any  # monitor.store.Store (fenced by the lease when there is one)
    stats: JobStats
    db: Callable[[Callable[[], Any], str], StoreCall]
    assess_step: Callable[["JobContext"], bool]
    leadership: Optional[Leading] = None
    dht_client: Any = None  # monitor.swarm.DhtClient, when the process has one
    dht: Any = None  # the hivemind DHT (None until up)
    chat_engine: Any = None  # the process's chat engine, if it serves a chat
    heartbeat: Any = None  # app.heartbeat.Heartbeat, when a heartbeat URL is set
    alerter: Any = None  # app.alerter.Alerter, while the poller runs with alerts on
    poll: PollState = field(default_factory=PollState)
    workers: dict[str, Worker] = field(default_factory=dict)
    stopping: bool = False
    table: Mapping[str, Any] = field(default_factory=dict)  # the jobs by name (``app/job_table.py``), for requests
    run_job: Optional[Callable[[Any], Any]] = None  # the runner's: run a table entry (and what follows it)

    def leads(self) -> bool:
        """This poller runs the jobs now: it holds the lease (or polls alone, without one)."""
        return self.leadership is None or self.leadership.held()

    def swarm_problem(self) -> Optional[str]:
        """Why this poller cannot use the DHT now (None: it can)."""
        if self.dht is not None:
            return None
        return self.dht_client.problem if self.dht_client is not None else "no DHT client"

    def latest_snapshot(self) -> Optional[Snapshot]:
        """The newest poll this poller stored, else the newest in the store (a store failure raises)."""
        return self.poll.last_snapshot or self.store.latest_snapshot()

    def assess_latest(self) -> bool:
        """The assess step: the newest poll assessed again with the newest stored inputs (False if
        there is no poll)."""
        return self.assess_step(self)

    def probe_soon(self, peers: Iterable[str]) -> None:
        """Ask the running probe rounds, if any, to probe these servers next."""
        prober = self.workers.get("probes")
        if prober is not None:
            prober.due_now(set(peers))  # type: ignore[attr-defined]
