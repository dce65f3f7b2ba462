"""The poller: one swarm polled into one store — the wiring of the job context, the table of jobs
and their runner.

The jobs are plain functions over a typed context (``app/job_context.py``), listed with their
triggers in ``app/job_table.py``; ``app/runner.py`` runs them (the scheduler, the rounds, the
jobs that follow others, the leadership's callbacks, the database retries). ``Poller`` builds the
context and the runner for a process, and offers each job once by hand (``swarm-monitor report``,
``job NAME --once``, specs). The leader requests ``heartbeat_url`` after each stored poll
(``app/heartbeat.py``). A job that fails logs, is counted, and leaves the last good state in the
store untouched; a database that is down or locked makes a job retry once, then skip with the error
recorded, and writing resumes by itself when the database is back.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping, Optional, Sequence

from apscheduler.schedulers.background import BackgroundScheduler

from monitor import swarm
from monitor.app import polling
from monitor.app.job_context import JobContext, JobStats, StoreCall
from monitor.app.job_table import JOBS, Job
from monitor.app.runner import Runner, with_db_retry
from monitor.core import leadership as lease_rules, scores
from monitor.core.assessment import Assessment
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.settings import Settings

__all__ = ["JobStats", "Poller", "StoreCall"]


class Poller:
    """Polls one swarm into one store. One per process: the process's DHT client is shared.

    ``dht``: the hivemind DHT, or the process's ``swarm.DhtClient`` (which may not be up yet).
    ``leadership``: this poller's place among the pollers of the database (``app/leadership.py``,
    started and stopped with the poller); None: it leads alone, unfenced (specs, ``report``
    without it). ``chat_engine``: the process's chat engine, if it serves a chat (the generation
    checks generate through it; else they make one of their own). ``jobs``: the table it runs."""

    def __init__(self, settings: Settings, store, dht, *, leadership=None, chat_engine=None,
                 jobs: Sequence[Job] = JOBS):
        stats = JobStats()
        dht_client = dht if isinstance(dht, swarm.DhtClient) else None
        self.leadership = leadership
        self.ctx = JobContext(
            settings=settings, stats=stats, db=partial(with_db_retry, stats), assess_step=polling.assess_step,
            store=store if leadership is None else store.fenced(
                leadership.token, idle_limit=lease_rules.write_idle_limit(leadership.lease_seconds)),
            leadership=leadership, dht_client=dht_client,
            dht=dht.dht if dht_client is not None else dht,  # None until the DHT client is up
            chat_engine=chat_engine)
        if settings.heartbeat_url:
            from monitor.app.heartbeat import Heartbeat

            self.ctx.heartbeat = Heartbeat(settings.heartbeat_url, may_ping=self.ctx.leads,
                                           counted=self._count_heartbeat)
        self.runner = Runner(self.ctx, jobs)

    # ---- what the context holds ------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def store(self):
        return self.ctx.store

    @property
    def stats(self) -> JobStats:
        return self.ctx.stats

    @property
    def compute_checker(self):
        return self.ctx.workers.get("compute-checks")

    @compute_checker.setter
    def compute_checker(self, checker) -> None:
        """(Specs: a checker of theirs as if the rounds ran it.)"""
        if checker is None:
            self.ctx.workers.pop("compute-checks", None)
        else:
            self.ctx.workers["compute-checks"] = checker

    @property
    def _last_snapshot(self) -> Optional[Snapshot]:
        return self.ctx.poll.last_snapshot

    def leads(self) -> bool:
        return self.ctx.leads()

    def latest_snapshot(self) -> Optional[Snapshot]:
        return self.ctx.latest_snapshot()

    # ---- each job once, by hand ------------------------------------------------------------------
    def run(self, name: str):
        """Run the table's job ``name`` once now, as the runner runs it."""
        return self.runner.run(self.runner.by_name[name])

    def poll_once(self) -> Optional[Snapshot]:
        """Scrape, assess, record (``polling.poll``); the snapshot, stored or not."""
        polled = self.run("scrape")
        return polled[0] if polled else None

    def check_reachability_once(self) -> Optional[ReachabilityBatch]:
        return self.run("reachability")

    def job_requests(self) -> list:
        return self.run("requests")

    def assess(self, snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult]) -> list[Assessment]:
        return polling.assess(self.ctx, snapshot, reachability)

    def assess_latest(self) -> bool:
        return self.ctx.assess_latest()

    def refresh_scores(self, now: Optional[float] = None) -> dict[str, scores.PeerScore]:
        return polling.scores(self.ctx, now)

    # ---- running -------------------------------------------------------------------------------
    def start(self, *, run_now: bool = True) -> BackgroundScheduler:
        return self.runner.start(run_now=run_now, leadership=self.leadership)

    def shutdown(self) -> None:
        """Stop the jobs (the lease still renewed, so what they are writing lands), then hand the
        lease over: a standby takes over at its next look, without a take-over notice."""
        self.runner.shutdown()
        if self.leadership is not None:
            self.leadership.stop()
            self.leadership.release()
            self.ctx.store.close()  # the fenced store is the poller's own

    def _count_heartbeat(self, error: Optional[str]) -> None:
        if error is None:
            self.stats.ok("heartbeat")
        else:
            self.stats.failed("heartbeat", RuntimeError(error))
