"""The runner: runs a poller's table of jobs (``app/job_table.py``) on their triggers.

It alone owns what starts a job: APScheduler for the ``Every`` entries, the round threads of the
``Rounds`` entries (their workers started when the poller leads and its DHT client is up, closed
when it stops leading), the ``After`` entries (run right after the runs they follow, in the thread
that ran them, in the table's order), the leadership's callbacks (a poller that becomes leader runs
its interval jobs at once; a standby forgets what it polled and stops its rounds), and the database
retry policy every job's store calls go through (``with_db_retry``). ``OnRequest`` entries run
when the ``requests`` job carries out a request for them.

With a ``Leadership`` (``swarm-monitor poll`` and ``serve``: several pollers may share one
database), only the leader runs the jobs: each starts only while this poller holds the lease, every
write goes through a store fenced by it (a write of a poller that lost the lease is refused,
``NotLeader``), and a standby only runs the jobs that are not leader-only (``standby``: keep the
DHT client warm). The DHT client may not be up yet: the jobs that need it say so (a failed poll
with the client's reason, the bootstrap peers found unreachable) and run at once when it is.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable, Optional, Sequence

from apscheduler.schedulers.background import BackgroundScheduler

from monitor import logs
from monitor.app.job_context import JobContext, JobStats, StoreCall
from monitor.app.job_table import Every, Job, Rounds
from monitor.store import NotLeader, StoreDataError, StoreSchemaError, StoreUnavailable

log = logging.getLogger(__name__)

DB_RETRY_DELAY = 2.0


def with_db_retry(stats: JobStats, call: Callable[[], Any], job: str = "db") -> StoreCall:
    """Run a store call; if the database is unavailable, retry once after a pause, then give up.
    Any failure is counted and logged with its real cause: an unavailable database, data the
    database refused (not retried: it would fail the same way), a schema to migrate, or a bug
    (with its traceback)."""
    for attempt in (1, 2):
        try:
            return StoreCall(True, call())
        except NotLeader as e:  # the lease was lost meanwhile: nothing was written, nothing to count
            log.info("%s: %s", job, e)
            return StoreCall(False, None, e)
        except StoreUnavailable as e:
            if attempt == 1:
                time.sleep(DB_RETRY_DELAY)
                continue
            log.warning("%s: database unavailable, skipped: %s", job, e)
            error: BaseException = e
        except StoreDataError as e:
            log.warning("%s: not stored, the database refused the data: %s", job, e)
            error = e
        except StoreSchemaError as e:
            log.error("%s: not stored: %s", job, e)
            error = e
        except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, the scheduler goes on
            log.exception("%s failed", job)
            error = e
        stats.failed(job, error)
        return StoreCall(False, None, error)
    raise AssertionError("unreachable")


class Runner:
    """Runs ``jobs`` over ``ctx`` on their triggers (``start`` … ``shutdown``); ``run`` runs one now."""

    def __init__(self, ctx: JobContext, jobs: Sequence[Job]):
        self.ctx = ctx
        self.jobs = tuple(jobs)
        self.by_name = {job.name: job for job in self.jobs}
        self._scheduler: Optional[BackgroundScheduler] = None
        self._run_now = True
        self._started = False
        self._rounds_lock = threading.Lock()  # starting and stopping the rounds, one at a time
        ctx.table, ctx.run_job = self.by_name, self.run

    # ---- one run ---------------------------------------------------------------------------------
    def run(self, job: Job) -> Any:
        """Run ``job`` once now (its log lines say which job), then, while the runner runs, the jobs
        that follow it (``After``) whose condition its result meets."""
        with logs.about(job=job.name):
            result = job.run(self.ctx)
        if self._started and not self.ctx.stopping:
            for follower in self.jobs:
                if follower.follows(job.name, result) and follower.enabled(self.ctx.settings):
                    try:
                        self.run(follower)
                    except Exception as e:  # noqa: BLE001 - a follower's failure costs only itself
                        log.exception("%s (after %s) failed", follower.name, job.name)
                        self.ctx.stats.failed(follower.name, e)
        return result

    def _mine(self, job: Job) -> bool:
        """Whether this poller schedules the job at all (a standby's own job only beside a leadership)."""
        return job.enabled(self.ctx.settings) and (job.leader_only or self.ctx.leadership is not None)

    # ---- start and stop --------------------------------------------------------------------------
    def start(self, *, run_now: bool = True, leadership=None) -> BackgroundScheduler:
        """Schedule the interval jobs, start the alerter, take part in the leadership (``leadership``:
        the poller's, started here: a lone poller leads, and starts its rounds, at once) or start
        the rounds at once without one."""
        ctx = self.ctx
        self._run_now = run_now
        _quiet_runs()
        if ctx.settings.alerts.enabled:
            from monitor.app.alerter import running_alerter

            ctx.alerter = running_alerter(ctx)  # a standby neither judges nor sends: the leader does
        scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30})
        for job in self.jobs:
            every = job.trigger(Every)
            if every is not None and self._mine(job):
                first = {"next_run_time": _now()} if run_now and every.at_start else {}
                scheduler.add_job(partial(self.run, job), "interval", seconds=every.period(ctx.settings), id=job.name,
                                  **first)
        self._scheduler = scheduler
        self._started = True
        scheduler.start()
        if leadership is not None:
            leadership.on_lead, leadership.on_standby = self._became_leader, self._became_standby
            leadership.start()
        else:
            self.start_rounds()
        if ctx.dht_client is not None:
            ctx.dht_client.on_up(self._dht_up)
        return scheduler

    def start_rounds(self) -> None:
        """The ``Rounds`` jobs' workers, each on a thread of its own, while this poller leads and its
        DHT client is up."""
        ctx = self.ctx
        with self._rounds_lock:
            if ctx.dht is None or not ctx.leads() or ctx.stopping:
                return
            for job in self.jobs:
                rounds = job.trigger(Rounds)
                if rounds is not None and job.enabled(ctx.settings) and job.name not in ctx.workers:
                    worker = rounds.keep(ctx, run_now=self._run_now)
                    if worker is not None:
                        ctx.workers[job.name] = worker

    def stop_rounds(self) -> None:
        with self._rounds_lock:
            workers = list(self.ctx.workers.values())
            self.ctx.workers.clear()
        for worker in workers:  # each its thread (and a P2P replica, or an engine of its own)
            worker.close()

    def run_soon(self, names) -> None:
        """Run these scheduled jobs now (a poller that just became leader, or whose DHT client just came up)."""
        scheduler = self._scheduler
        if scheduler is None or not self._run_now:
            return
        for name in names:
            try:
                scheduler.modify_job(name, next_run_time=_now())
            except Exception:  # noqa: BLE001 - not scheduled here (alerts off), or the scheduler is stopping
                pass

    def _became_leader(self, term) -> None:
        self.start_rounds()
        self.run_soon(job.name for job in self.jobs if job.leader_only and (e := job.trigger(Every)) and e.at_start)

    def _became_standby(self, why: str) -> None:
        self.ctx.poll.forget()  # the next leader may have polled since
        self.stop_rounds()

    def _dht_up(self, dht) -> None:
        if self.ctx.dht is dht:  # (up before this poller started: its jobs use it from the start)
            return
        self.ctx.dht = dht
        self.start_rounds()
        self.run_soon(job.name for job in self.jobs if job.needs_dht and job.trigger(Every))

    def shutdown(self) -> None:
        """Stop the jobs: no new run starts, the runs under way end, the rounds stop."""
        self.ctx.stopping = True
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        self._started = False
        self.stop_rounds()


class _QuietRuns(logging.Filter):
    """APScheduler logs at INFO every job it adds and every run of every job: the poller's run every
    few seconds, and would drown what the poller says itself; its warnings and errors stay. The one
    filter on those loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO


_QUIET = _QuietRuns()


def _quiet_runs() -> None:
    for name in ("apscheduler.executors.default", "apscheduler.scheduler"):
        if _QUIET not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_QUIET)


def _now() -> datetime:
    return datetime.now(timezone.utc)
