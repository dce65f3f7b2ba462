"""The scheduler: scrape, probe, generation check, score and rollup/retention jobs, and nothing else.

Each job is one method of ``Poller`` that can also run once by hand (``swarm-monitor report``,
tests). With a ``Leadership`` (``swarm-monitor poll`` and ``serve``: several pollers may share one
database), only the leader runs them: each job starts only while this poller holds the lease, every
write goes through a store fenced by it (``Store.fenced``: a write of a poller that lost the lease
is refused, ``NotLeader``), the probe rounds and generation checks run only while it leads, and a
standby only keeps its DHT client warm (``stand_by``). A poller that becomes leader polls at once.
The leader requests ``heartbeat_url`` after each stored poll (``app/heartbeat.py``). The servers a
poll finds ONLINE that this poller has not checked yet (all of them at its first poll, a server that
is back or new) are checked for reachability right after it, one batch at most, not a reachability
period later: the verdict stored for them may be older than this poller, or than their return.

The DHT client may not be up yet (no bootstrap peer answered at start: ``swarm.DhtClient`` retries
in the background): meanwhile each scrape is recorded as a failed poll and each reachability check
finds the bootstrap peers unreachable, both with the client's own words ("cannot reach any
bootstrap peer (…), retrying"), so the dashboard, /metrics and the alerts say so; polling starts by
itself once it is up. A job that fails logs, is counted, and leaves the last good state in the store untouched;
a database that is down or locked makes the poll retry once, then skip with the error recorded,
and writing resumes by itself when the database is back. A poll that is scraped but cannot be
stored (the database refuses its data, or is away) is recorded as a failed poll with that cause,
so the dashboard and /metrics say so; the log names the real cause (a refused value is not an
unavailable database).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Optional

from apscheduler.schedulers.background import BackgroundScheduler

from monitor.app import assessing
from monitor.app.job_table import BY_NAME, JOBS
from monitor.core import leadership as lease_rules, scores
from monitor.core.assess import scoring_inputs
from monitor.core.assessment import Assessment
from monitor.core.common import short_error
from monitor import swarm
from monitor.settings import Settings
from monitor.core.snapshot import ModelInfo, ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.store import NotLeader, StoreDataError, StoreError, StoreSchemaError, StoreUnavailable
from monitor.store.engine import data_error_text

log = logging.getLogger(__name__)

DB_RETRY_DELAY = 2.0
REQUESTS_PER_RUN = 100  # job requests carried out per run of the requests job (the rest wait for the next)


class StoreCall(NamedTuple):
    """What a store call under ``Poller._with_db_retry`` came to (indexable as (ok, value))."""

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


def watched_models(settings: Settings) -> list[ModelInfo]:
    return [
        ModelInfo(dht_prefix=m.dht_prefix, num_blocks=m.num_blocks or 0, repository=m.repository,
                  name=m.name, official=True)
        for m in settings.models
    ]


class Poller:
    """Polls one swarm into one store. One per process: the process's DHT client is shared.

    ``dht``: the hivemind DHT, or the process's ``swarm.DhtClient`` (which may not be up yet).
    ``leadership``: this poller's place among the pollers of the database (``app/leadership.py``,
    started and stopped with the poller); None: it leads alone, unfenced (specs, ``report``
    without it)."""

    def __init__(self, settings: Settings, store, dht, *, leadership=None, chat_engine=None):
        """``chat_engine``: the process's chat engine, if it serves a chat (the generation checks
        generate through it; else they make one of their own)."""
        self.settings = settings
        self.leadership = leadership
        self.store = store if leadership is None else store.fenced(
            leadership.token, idle_limit=lease_rules.write_idle_limit(leadership.lease_seconds))
        self.dht_client = dht if isinstance(dht, swarm.DhtClient) else None
        self.dht = dht.dht if self.dht_client is not None else dht  # None until the DHT client is up
        self.stats = JobStats()
        self.heartbeat = None
        if settings.heartbeat_url:
            from monitor.app.heartbeat import Heartbeat

            self.heartbeat = Heartbeat(settings.heartbeat_url, may_ping=self.leads, counted=self._count_heartbeat)
        self.prober = self.generation_checker = self.alerter = self.compute_checker = None
        self._run_now = True
        self._stopping = False
        self._rounds_lock = threading.Lock()  # starting and stopping the probe rounds, one at a time
        self._scheduler: Optional[BackgroundScheduler] = None
        self._last_snapshot: Optional[Snapshot] = None
        # servers a reachability check of this poller covered since it began to lead; None until
        # its first stored poll (a stored snapshot from before then may be a stale one)
        self._checked_servers: Optional[frozenset[str]] = None
        self.chat_engine = chat_engine
        # a poll's diagnosis and store, and a re-diagnosis after a probe round, one at a time: either
        # the poll is stored first (and is what the re-diagnosis diagnoses), or it is diagnosed after
        # (with the round's probes, stored before the re-diagnosis began)
        self._lock = threading.RLock()

    # ---- who runs the jobs -----------------------------------------------------------------------
    def leads(self) -> bool:
        """This poller runs the jobs now: it holds the lease (or polls alone, without one)."""
        return self.leadership is None or self.leadership.held()

    def swarm_problem(self) -> Optional[str]:
        """Why this poller cannot use the DHT now (None: it can)."""
        if self.dht is not None:
            return None
        return self.dht_client.problem if self.dht_client is not None else "no DHT client"

    # ---- jobs --------------------------------------------------------------------------------
    def poll_once(self) -> Optional[Snapshot]:
        """Scrape, diagnose, record. Returns the snapshot. A poll that cannot be stored is recorded
        as a failed poll with the cause (``unstored_cause``). Only while this poller leads; while
        the DHT client is not up, a failed poll with its reason."""
        if not self.leads():
            return None
        problem = self.swarm_problem()
        if problem is not None:
            self.stats.failed("scrape", swarm.BootstrapUnreachable(problem))
            self._with_db_retry(lambda: self.store.record_failed_poll(time.time(), problem), job="scrape")
            return None
        try:
            snapshot = swarm.scrape(
                self.dht, watched_models(self.settings),
                discover=self.settings.discover_models, batch_blocks=self.settings.scrape_batch_blocks,
            )
        except Exception as e:  # noqa: BLE001 - a failed scrape must not stop the scheduler
            log.exception("scrape failed")
            self.stats.failed("scrape", e)
            why = short_error(e, 1000)
            self._with_db_retry(lambda: self.store.record_failed_poll(time.time(), why), job="scrape")
            return None
        self.check_newly_online(snapshot)  # first: the poll is then assessed once, with their checks
        with self._lock:
            assessments = self.assess(snapshot, self._latest_reachability())
            stored = self._with_db_retry(lambda: self.store.record_poll(snapshot, assessments), job="scrape")
            if not stored.ok:
                if not isinstance(stored.error, NotLeader):  # (a poller that lost the lease records nothing)
                    self._record_unstored(snapshot, stored.error)
                return snapshot
            # without its diagnoses, the probe round re-reads the poll as stored (bounded) and diagnoses that
            self._last_snapshot = snapshot if assessments or not snapshot.models else None
        self.stats.ok("scrape")
        if self.leadership is not None:
            self.leadership.last_poll_at = snapshot.taken_at
        if self.heartbeat is not None:
            self.heartbeat.beat()
        return snapshot

    def _record_unstored(self, snapshot: Snapshot, error: Optional[BaseException]) -> None:
        """The poll was scraped but not stored: record it as failed, with the cause (if the database
        takes even that; the log has the cause either way)."""
        try:
            self.store.record_failed_poll(snapshot.taken_at, unstored_cause(error), duration=snapshot.duration)
        except StoreError as e:
            log.warning("scrape: the failed poll could not be recorded either: %s", e)

    def assess(self, snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult]) -> list[Assessment]:
        """Each polled model's assessment, as ``record_poll`` and ``record_assessments`` take it
        (``app.assessing.assess_poll``: with the recent probes and the newest generation checks)."""
        return assessing.assess_poll(self.store, self.settings, snapshot, reachability)

    def refresh_scores(self, now: Optional[float] = None) -> dict[str, scores.PeerScore]:
        """Score every peer from a week of history, counted by the database (``Store.peer_aggregates``)."""
        if not self.leads():
            return {}
        now = now or time.time()
        try:
            result = scores.score_all(self.store.peer_aggregates(now), now, **scoring_inputs(self.store.latest_assessments()))
            self.store.record_scores(result.values())
        except NotLeader as e:
            log.info("scores: %s", e)
            return {}
        except Exception as e:  # noqa: BLE001
            log.exception("score refresh failed")
            self.stats.failed("scores", e)
            return {}
        self.stats.ok("scores")
        return result

    def check_reachability_once(self) -> Optional[ReachabilityBatch]:
        """Check the latest poll's online servers and the bootstrap peers (only the latter, found
        unreachable with the DHT client's reason, while it is not up); only while this poller leads."""
        if not self.leads():
            return None
        problem = self.swarm_problem()
        snapshot = None if problem or self._checked_servers is None else (  # (before: the first poll checks them)
            self._last_snapshot or self._with_db_retry(self.store.latest_snapshot, job="reachability").value)
        online = sorted(_online(snapshot))
        try:
            started = time.time()
            batch = ReachabilityBatch(taken_at=started, duration=0.0, results=()) if problem else self._check(online)
            boot = swarm.check_bootstrap(self.dht, self.settings.resolved_initial_peers,
                                         timeout=self.settings.reachability_timeout, down=problem)
            batch = ReachabilityBatch(taken_at=batch.taken_at, duration=batch.duration,
                               results=tuple(batch.results) + tuple(boot))
        except Exception as e:  # noqa: BLE001
            log.exception("reachability check failed")
            self.stats.failed("reachability", e)
            return None
        self._note_bootstrap(boot)
        if self._store_checks(batch):
            self.stats.ok("reachability")
            if snapshot is not None:
                self._checked_servers = frozenset(online)
        return batch

    def check_newly_online(self, snapshot: Snapshot) -> Optional[ReachabilityBatch]:
        """Before a poll is assessed: the servers it found ONLINE that no reachability check of this
        poller has covered since they were last ONLINE (all at its first poll; a server back, or new)
        are checked at once, so that the poll is assessed once, with them (a failure from before a
        server left counts for nothing: ``compute_checks.since_away``); the next round is up to
        ``reachability_period`` away. At most one batch (``reachability_concurrency``) per poll,
        those with a stored failure first: peers announcing fresh ids every poll cost the scrape
        job one ``reachability_timeout`` at most, and the rest wait for the round."""
        online = _online(snapshot)
        self._checked_servers = None if self._checked_servers is None else self._checked_servers & online
        new = online - (self._checked_servers or frozenset())
        if not new:
            self._checked_servers = self._checked_servers or frozenset()
            return None
        chosen = checked_first(new, self._latest_reachability(), self.settings.reachability_concurrency)
        try:
            batch = self._check(chosen)
        except Exception as e:  # noqa: BLE001 - the next round checks them
            log.exception("reachability check of the newly online servers failed")
            self.stats.failed("reachability", e)
            return None
        if self._store_checks(batch, assess=False):
            self._checked_servers = (self._checked_servers or frozenset()) | frozenset(chosen)
        return batch

    def _store_checks(self, batch: ReachabilityBatch, assess: bool = True) -> bool:
        """Store a reachability batch and then (``assess``) assess the newest poll again with it (an
        unreachable peer changes the verdict); False if it could not be stored."""
        if not self._with_db_retry(lambda: self.store.record_reachability(batch), job="reachability").ok:
            return False
        if assess:
            self.assess_latest()
        return True

    def _check(self, servers: list[str]) -> ReachabilityBatch:
        """A reachability check of ``servers`` (peer ids), a failure checked once more (``to_confirm``)."""
        return swarm.check_servers_confirmed(self.dht, servers, timeout=self.settings.reachability_timeout,
                                             concurrency=self.settings.reachability_concurrency)

    def assess_latest(self) -> bool:
        """An input of the newest poll was stored (a reachability or probe round, a generation
        check): that poll — not the one a round started from, whose assessment a poll landing
        meanwhile would drop — is assessed again with it (``app.assessing.assess_latest``), retried
        while the database is away (a failure is counted as job "assess", not the input's: its
        results are stored). Under the poll's lock, so a poll assessed before the input was stored
        cannot land between this read and its write. False if there is no poll (or another process
        keeps storing newer ones)."""
        def assess() -> bool:
            with self._lock:
                return assessing.assess_latest(self.store, self.settings, self._last_snapshot)

        return bool(self._with_db_retry(assess, job="assess").value)

    def rollup_once(self, now: Optional[float] = None):
        if not self.leads():
            return None
        if self.leadership is not None:  # pollers long gone, terms older than the rollups
            self._with_db_retry(lambda: self.store.prune_pollers(
                (now or time.time()) - self.settings.rollup_retention_days * 86400), job="rollup")
        done = self._with_db_retry(lambda: self.store.rollup_and_prune(
            now or time.time(),
            raw_retention_days=self.settings.raw_retention_days,
            rollup_retention_days=self.settings.rollup_retention_days,
        ), job="rollup")
        if done.ok:
            self.stats.ok("rollup")
        return done.value

    def check_now(self, peers: list[str]) -> Optional[ReachabilityBatch]:
        """A reachability check of these servers now (requested through the store), then the newest
        poll assessed again with it; at most one batch (``reachability_concurrency``)."""
        if not self.leads() or self.swarm_problem() is not None or not peers:
            return None
        batch = self._check(sorted(peers)[:max(self.settings.reachability_concurrency, 1)])
        self._store_checks(batch)
        return batch

    def latest_snapshot(self) -> Optional[Snapshot]:
        """The newest poll this poller stored, else the newest in the store (a store failure raises)."""
        return self._last_snapshot or self.store.latest_snapshot()

    # ---- the jobs of the table (``app/job_table.py``), each run once -----------------------------
    job_scrape = poll_once
    job_reachability = check_reachability_once
    job_assess = assess_latest
    job_scores = refresh_scores
    job_rollup = rollup_once

    def job_probes(self) -> list:
        """One probe round of the servers that are due (all of them, to a prober of its own)."""
        from monitor.app.probing import run_round

        return run_round(self)

    def job_compute_checks(self) -> list:
        """One compute-check round of the servers that are due (all of them, to a checker of its own)."""
        from monitor.app.compute_checking import run_round

        return run_round(self)

    def compute_check_now(self, peers: list[str], by: Optional[str] = None) -> list:
        """A compute check of these servers now (requested through the store), then assessed."""
        from monitor.app.compute_checking import check_now

        return check_now(self, peers, by=by)

    def job_compute_check(self) -> list:
        """Out of turn, every ONLINE server of the newest poll (a request names its servers instead)."""
        return self.compute_check_now(sorted(_online(self.latest_snapshot())), by="operator")

    def job_generation_check(self) -> list:
        from monitor.app.generation_check import run_round

        return run_round(self)

    def _alerter(self):
        from monitor.app.alerter import Alerter

        return self.alerter or Alerter(self.settings, self.store, stats=self.stats)

    def job_alerts(self):
        return self._alerter().evaluate()

    def job_alert_delivery(self):
        return self._alerter().deliver()

    def job_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat()

    def job_requests(self) -> list:
        """Carry out what other processes asked for through the store (``Store.request_job``): each
        job once for all its pending requests — a reachability check of the servers named, any other
        job by its name — then mark them done. Only while this poller leads."""
        if not self.leads():
            return []
        pending = self._with_db_retry(lambda: self.store.pending_job_requests(limit=REQUESTS_PER_RUN),
                                      job="requests").value or []
        by_job: dict[str, list] = {}
        for request in pending:
            by_job.setdefault(request.job, []).append(request)
        for name, requests in by_job.items():
            targets = [r.target for r in requests if r.target]
            try:
                if name == "reachability" and len(targets) == len(requests):
                    self.check_now(targets)
                elif name == "compute-check" and len(targets) == len(requests):
                    self.compute_check_now(targets, by=requests[0].by)
                elif name == "probes" and targets and self.prober is not None:
                    self.prober.due_now(set(targets))  # (the rounds thread probes them next)
                elif name in BY_NAME and name != "requests":
                    BY_NAME[name].run(self)
                else:
                    log.warning("requests: no job named %r (asked by %s); dropped", name, requests[0].by)
            except Exception as e:  # noqa: BLE001 - one failed job costs its requests, not the others'
                log.exception("requests: job %s failed (asked by %s)", name, requests[0].by)
                self.stats.failed("requests", e)
        if pending:  # (done, failed or dropped alike: a request that fails is not retried forever)
            self._with_db_retry(lambda: self.store.finish_job_requests([r.id for r in pending]), job="requests")
            self.stats.ok("requests")
        return pending

    # ---- helpers -----------------------------------------------------------------------------
    def _latest_reachability(self) -> dict:
        return self._with_db_retry(self.store.latest_reachability, job="reachability-read").value or {}

    def _with_db_retry(self, call: Callable[[], Any], job: str = "db") -> StoreCall:
        """Run a store call; if the database is unavailable, retry once after a pause, then give
        up. Any failure is counted and logged with its real cause: an unavailable database, data
        the database refused (not retried: it would fail the same way), a schema to migrate, or a
        bug (with its traceback)."""
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
            self.stats.failed(job, error)
            return StoreCall(False, None, error)
        raise AssertionError("unreachable")

    # ---- scheduling --------------------------------------------------------------------------
    def start(self, *, run_now: bool = True) -> BackgroundScheduler:
        s = self.settings
        self._run_now = run_now
        _quiet_runs()
        scheduler = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
        )
        for job in JOBS:
            if job.scheduled and (job.leader_only or self.leadership is not None):
                first = {"next_run_time": _now_datetime()} if run_now and job.at_start else {}
                scheduler.add_job(partial(job.run, self), "interval", seconds=job.period(s), id=job.name, **first)
        from monitor.app.alerter import schedule_alerts  # Alerts: rules after every round, webhooks

        self.alerter = schedule_alerts(scheduler, self)  # a standby neither judges nor sends: the leader does
        scheduler.start()
        self._scheduler = scheduler
        if self.leadership is not None:
            self.leadership.on_lead, self.leadership.on_standby = self._became_leader, self._became_standby
            self.leadership.start()  # claims now: a lone poller leads (and starts its rounds) at once
        else:
            self._start_rounds()
        if self.dht_client is not None:
            self.dht_client.on_up(self._dht_up)
        return scheduler

    def _start_rounds(self) -> None:
        """The probe rounds and generation checks: threads of their own, while this poller leads
        and its DHT client is up."""
        from monitor.app.generation_check import start_generation_checks  # end to end, through the chat's engine
        from monitor.app.compute_checking import start_compute_checks  # does each server still compute
        from monitor.app.probing import start_probing  # measured speed and correctness

        with self._rounds_lock:
            if self.dht is None or not self.leads() or self._stopping:
                return
            if self.prober is None:
                self.prober = start_probing(self, run_now=self._run_now)
            if self.compute_checker is None:
                self.compute_checker = start_compute_checks(self, run_now=self._run_now)
            if self.generation_checker is None:
                self.generation_checker = start_generation_checks(self, run_now=self._run_now)

    def _stop_rounds(self) -> None:
        with self._rounds_lock:
            prober, checker, self.prober, self.generation_checker = self.prober, self.generation_checker, None, None
            computing, self.compute_checker = self.compute_checker, None
            if computing is not None:  # its thread, its P2P replica
                computing.close()
            if prober is not None:  # its probe loop and P2P replica
                prober.close()
            if checker is not None:  # its thread, and an engine of its own
                checker.close()

    def _run_soon(self, *jobs: str) -> None:
        """Run these jobs now (a poller that just became leader, or whose DHT client just came up)."""
        scheduler = self._scheduler
        if scheduler is None or not self._run_now:
            return
        for job in jobs:
            try:
                scheduler.modify_job(job, next_run_time=_now_datetime())
            except Exception:  # noqa: BLE001 - no such job (alerts off), or the scheduler is stopping
                pass

    def _became_leader(self, term) -> None:
        self._start_rounds()
        self._run_soon("scrape", "reachability", "alerts", "alert-delivery")

    def _became_standby(self, why: str) -> None:
        self._last_snapshot = None  # the next leader may have polled since
        self._checked_servers = None
        self._stop_rounds()

    def _dht_up(self, dht) -> None:
        if self.dht is dht:  # (up before this poller started: its jobs use it from the start)
            return
        self.dht = dht
        self._start_rounds()
        self._run_soon("scrape", "reachability", "standby")

    def stand_by(self) -> None:
        """A standby's job: keep the DHT client warm (connect to the bootstrap peers and ping their
        DHT) and say what it cannot reach, so that it can poll the moment it takes over."""
        if self.leads() or self.leadership is None:
            return
        problem = self.swarm_problem()
        boot = swarm.check_bootstrap(self.dht, self.settings.resolved_initial_peers,
                                     timeout=self.settings.reachability_timeout, down=problem)
        self._note_bootstrap(boot)

    def _note_bootstrap(self, boot) -> None:
        """What this poller reports it cannot reach: every bootstrap peer, or none of them."""
        if self.leadership is None:
            return
        down = [r for r in boot if not r.ok]
        if boot and len(down) == len(boot):
            self.leadership.problem = self.swarm_problem() or (
                f"cannot reach any bootstrap peer ({down[0].error or 'unreachable'})")
        else:
            self.leadership.problem = self.swarm_problem()

    job_standby = stand_by

    def _count_heartbeat(self, error: Optional[str]) -> None:
        if error is None:
            self.stats.ok("heartbeat")
        else:
            self.stats.failed("heartbeat", RuntimeError(error))

    def shutdown(self) -> None:
        """Stop the jobs (the lease still renewed, so what they are writing lands), then hand the
        lease over: a standby takes over at its next look, without a take-over notice."""
        self._stopping = True
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        self._stop_rounds()
        if self.leadership is not None:
            self.leadership.stop()
            self.leadership.release()
            self.store.close()  # the fenced store is the poller's own


class _QuietRuns(logging.Filter):
    """APScheduler logs at INFO every job it adds and every run of every job: the poller's and the
    alerts' (``schedule_alerts``, added to the same scheduler) run every few seconds, and would drown
    what the poller says itself; its warnings and errors stay. The one filter on those loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO


_QUIET = _QuietRuns()


def _quiet_runs() -> None:
    for name in ("apscheduler.executors.default", "apscheduler.scheduler"):
        if _QUIET not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_QUIET)


def unstored_cause(error: Optional[BaseException]) -> str:
    """Why a scraped poll was not stored, as its failed poll records it. Anyone may read it on the
    dashboard, so no database URL: what the database said about refused data, else what kind of
    failure it was (the poller's log has the rest)."""
    if isinstance(error, StoreDataError):
        return f"storing the poll failed: the database refused its data ({data_error_text(error.__cause__ or error)})"
    if isinstance(error, StoreUnavailable):
        return "storing the poll failed: the database was unavailable or locked (the poller's log says why)"
    if isinstance(error, StoreSchemaError):
        return "storing the poll failed: the database lacks this version's schema (restarting the poller migrates it)"
    return f"storing the poll failed: {short_error(error)}"


def checked_first(peers: frozenset[str], latest: Mapping[str, ReachabilityResult], limit: int) -> list[str]:
    """The ``limit`` of ``peers`` a poll checks at once: those whose stored verdict is a failure
    first (the verdict the check is there to correct), then the others, each group by peer id."""
    return sorted(peers, key=lambda peer: (peer not in latest or latest[peer].ok, peer))[:max(limit, 0)]


def _online(snapshot: Optional[Snapshot]) -> frozenset[str]:
    """The peers a poll found ONLINE."""
    return frozenset(row.peer_id for row in (snapshot.servers if snapshot else ()) if row.state == "ONLINE")


def _now_datetime():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
