"""The scheduler: scrape, probe, generation check, score and rollup/retention jobs, and nothing else.

Each job is one method of ``Poller`` that can also run once by hand (``swarm-monitor poll --once``,
tests). A job that fails logs, is counted, and leaves the last good state in the store untouched;
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
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, NamedTuple, Optional

from apscheduler.schedulers.background import BackgroundScheduler

from monitor.core import coverage, generation, scores
from monitor.core.common import short_error
from monitor.core.diagnosis import ModelHealth
from monitor import swarm
from monitor.settings import Settings
from monitor.core.snapshot import ModelInfo, ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.store import StoreDataError, StoreError, StoreSchemaError, StoreUnavailable
from monitor.store.engine import data_error_text

log = logging.getLogger(__name__)

DB_RETRY_DELAY = 2.0


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
    """Polls one swarm into one store. One per process: the process's DHT client is shared."""

    def __init__(self, settings: Settings, store, dht):
        self.settings = settings
        self.store = store
        self.dht = dht
        self.stats = JobStats()
        self._scheduler: Optional[BackgroundScheduler] = None
        self._last_snapshot: Optional[Snapshot] = None
        self.chat_engine = None  # the process's chat engine, if it serves a chat: the generation checks use it
        # a poll's diagnosis and store, and a re-diagnosis after a probe round, one at a time: either
        # the poll is stored first (and is what the re-diagnosis diagnoses), or it is diagnosed after
        # (with the round's probes, stored before the re-diagnosis began)
        self._lock = threading.RLock()

    # ---- jobs --------------------------------------------------------------------------------
    def poll_once(self) -> Optional[Snapshot]:
        """Scrape, diagnose, record. Returns the snapshot. A poll that cannot be stored is recorded
        as a failed poll with the cause (``unstored_cause``)."""
        try:
            snapshot = swarm.scrape(
                self.dht, watched_models(self.settings),
                discover=self.settings.discover_models, batch_blocks=self.settings.scrape_batch_blocks,
            )
        except Exception as e:  # noqa: BLE001 - a failed scrape must not stop the scheduler
            log.exception("scrape failed")
            self.stats.failed("scrape", e)
            self._with_db_retry(lambda: self.store.record_failed_poll(time.time(), short_error(e, 1000)),
                                job="scrape")
            return None
        with self._lock:
            snapshot, healths = self.analyse_poll(snapshot)
            stored = self._with_db_retry(lambda: self.store.record_poll(snapshot, healths), job="scrape")
            if not stored.ok:
                self._record_unstored(snapshot, stored.error)
                return snapshot
            # without its diagnoses, the probe round re-reads the poll as stored (bounded) and diagnoses that
            self._last_snapshot = snapshot if healths or not snapshot.models else None
        self.stats.ok("scrape")
        return snapshot

    def analyse_poll(self, snapshot: Snapshot) -> tuple[Snapshot, list[ModelHealth]]:
        """The poll's diagnoses with the latest reachability checks. If diagnosing fails (a bug, or
        a value the DHT edge should have bounded), the poll is still stored, with the failure in
        its errors and, for each model, a diagnosis that says so (``ModelHealth.not_diagnosed``):
        every reader shows "not diagnosed: …", none diagnoses by itself."""
        try:
            return snapshot, self.analyse(snapshot, self._latest_reachability())
        except Exception as e:  # noqa: BLE001 - the analysis must not cost the poll
            log.exception("diagnosing the poll failed; storing it as not diagnosed")
            self.stats.failed("diagnose", e)
            error = f"diagnosing the poll failed: {short_error(e)}"
            return replace(snapshot, errors=snapshot.errors + (error,)), [
                ModelHealth.not_diagnosed(m.dht_prefix, m.num_blocks, short_error(e)) for m in snapshot.models]

    def _record_unstored(self, snapshot: Snapshot, error: Optional[BaseException]) -> None:
        """The poll was scraped but not stored: record it as failed, with the cause (if the database
        takes even that; the log has the cause either way)."""
        try:
            self.store.record_failed_poll(snapshot.taken_at, unstored_cause(error), duration=snapshot.duration)
        except StoreError as e:
            log.warning("scrape: the failed poll could not be recorded either: %s", e)

    def analyse(self, snapshot: Snapshot, probes: Mapping[str, ReachabilityResult]) -> list[ModelHealth]:
        """Each polled model's diagnosis, as ``record_poll`` and ``record_diagnoses`` take it: with
        the recent probes' verdicts (measured speeds, wrong outputs, failing servers) and the
        model's newest generation check, if it is current."""
        from monitor.app.probing import measured_view

        recent = measured_view(self.store, self.settings)
        checks = self._current_generation_checks(recent.now)
        return [
            coverage.diagnose(
                model, snapshot.rows_for(model.dht_prefix), probes,
                min_tokens_per_s=self.settings.min_tokens_per_s,
                min_cache_tokens=self.settings.min_cache_tokens,
                measured=recent.speeds(model.dht_prefix), wrong=recent.wrong(model.dht_prefix),
                disagreeing=recent.disagreeing(model.dht_prefix), failing=recent.failing(model.dht_prefix),
                generation=checks.get(model.dht_prefix),
            )
            for model in snapshot.models
        ]

    def _current_generation_checks(self, now: float) -> dict:
        """model -> its newest generation check, where it still says something about now (empty if
        the store cannot say: the diagnosis then goes without, rather than not at all)."""
        try:
            latest = self.store.latest_generation_checks()
        except StoreError as e:
            log.warning("generation checks not read, diagnosing without them: %s", e)
            return {}
        period = self.settings.generation_check_period
        return {model: check for model, check in latest.items() if generation.is_current(check, now, period)}

    def refresh_scores(self, now: Optional[float] = None) -> dict[str, scores.PeerScore]:
        """Score every peer from a week of history, counted by the database (``Store.peer_aggregates``)."""
        now = now or time.time()
        try:
            from monitor.app.probing import scoring_inputs  # (#14) speed and correctness probes

            result = scores.score_all(self.store.peer_aggregates(now), now, **scoring_inputs(self.store, self.settings, now))
            self.store.record_scores(result.values())
        except Exception as e:  # noqa: BLE001
            log.exception("score refresh failed")
            self.stats.failed("scores", e)
            return {}
        self.stats.ok("scores")
        return result

    def check_reachability_once(self) -> Optional[ReachabilityBatch]:
        snapshot = self._last_snapshot or self._with_db_retry(self.store.latest_snapshot, job="reachability").value
        online = sorted({row.peer_id for row in (snapshot.servers if snapshot else ()) if row.state == "ONLINE"})
        try:
            batch = swarm.check_servers(self.dht, online, timeout=self.settings.reachability_timeout,
                                        concurrency=self.settings.reachability_concurrency)
            boot = swarm.check_bootstrap(self.dht, self.settings.resolved_initial_peers,
                                         timeout=self.settings.reachability_timeout)
            batch = ReachabilityBatch(taken_at=batch.taken_at, duration=batch.duration,
                               results=tuple(batch.results) + tuple(boot))
        except Exception as e:  # noqa: BLE001
            log.exception("reachability check failed")
            self.stats.failed("reachability", e)
            return None
        if self._with_db_retry(lambda: self.store.record_reachability(batch), job="reachability").ok:
            self.stats.ok("reachability")
            # unreachable peers change the diagnosis: redo it with these probes
            self.after_probe_round()
        return batch

    def rediagnose(self, snapshot: Snapshot) -> bool:
        """Diagnose ``snapshot`` again with the latest probes, and store that against its poll if
        it is still the newest stored one (False if a newer poll came in: its diagnoses stay)."""
        return self.store.record_diagnoses(self.analyse(snapshot, self.store.latest_reachability()),
                                           taken_at=snapshot.taken_at)

    def after_probe_round(self) -> None:
        """A probe round (reachability or server probes) stored its results: the newest poll is
        diagnosed again with them, retried while the database is away (a failure is counted as
        the probe job's, not the round's: its probes are stored)."""
        self._with_db_retry(self.rediagnose_latest, job="diagnose")

    def rediagnose_latest(self) -> bool:
        """After a probe round (reachability or server probes) stored its results: diagnose the
        newest stored poll again with them — not the poll the round started from, whose
        re-diagnosis a poll landing meanwhile would drop (the round's findings then waited for a
        later round). Under the poll's lock, so a poll diagnosed before the round's results were
        stored cannot land between this read and its write. False if there is no poll (or another
        process keeps storing newer ones)."""
        with self._lock:
            snapshot = self._last_snapshot
            for _ in range(3):
                if snapshot is None:
                    snapshot = self.store.latest_snapshot()
                    if snapshot is None:
                        return False
                if self.rediagnose(snapshot):
                    return True
                snapshot = None  # a newer poll, stored by another process: read it
            return False

    def rollup_once(self, now: Optional[float] = None):
        done = self._with_db_retry(lambda: self.store.rollup_and_prune(
            now or time.time(),
            raw_retention_days=self.settings.raw_retention_days,
            rollup_retention_days=self.settings.rollup_retention_days,
        ), job="rollup")
        if done.ok:
            self.stats.ok("rollup")
        return done.value

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
        scheduler = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
        )
        first = {"next_run_time": _now_datetime()} if run_now else {}
        scheduler.add_job(self.poll_once, "interval", seconds=s.scrape_period, id="scrape", **first)
        scheduler.add_job(self.check_reachability_once, "interval", seconds=s.reachability_period, id="reachability", **first)
        scheduler.add_job(self.refresh_scores, "interval", seconds=s.score_period, id="scores", **first)
        scheduler.add_job(self.rollup_once, "interval", seconds=s.rollup_period, id="rollup")
        from monitor.app.alerter import schedule_alerts  # Alerts (#15): rules after every round, webhooks

        self.alerter = schedule_alerts(scheduler, self)
        from monitor.app.probing import start_probing  # Measured speed and correctness (#14)

        self.prober = start_probing(self, run_now=run_now)
        from monitor.app.generation_check import start_generation_checks  # end to end, through the chat's engine

        self.generation_checker = start_generation_checks(self, run_now=run_now)
        scheduler.start()
        self._scheduler = scheduler
        return scheduler

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if getattr(self, "prober", None) is not None:  # (#14) its probe loop and P2P replica
            self.prober.close()
            self.prober = None
        if getattr(self, "generation_checker", None) is not None:  # its thread, and an engine of its own
            self.generation_checker.close()
            self.generation_checker = None


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


def _now_datetime():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
