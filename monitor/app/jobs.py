"""The scheduler: scrape, probe, score and rollup/retention jobs, and nothing else.

Each job is one method of ``Poller`` that can also run once by hand (``swarm-monitor poll --once``,
tests). A job that fails logs, is counted, and leaves the last good state in the store untouched;
a database that is down or locked makes the poll retry once, then skip with the error recorded,
and writing resumes by itself when the database is back.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from apscheduler.schedulers.background import BackgroundScheduler

from monitor.core import coverage, scores
from monitor.core.common import WEEK
from monitor.core.diagnosis import ModelHealth
from monitor import swarm
from monitor.app.settings import Settings
from monitor.core.snapshot import ModelInfo, ProbeBatch, ProbeResult, Snapshot

log = logging.getLogger(__name__)

SCORE_WINDOW = WEEK  # scores look at a week of history (and at scores.PROBE_WINDOW of probes)
DB_RETRY_DELAY = 2.0


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
        self._lock = threading.Lock()

    # ---- jobs --------------------------------------------------------------------------------
    def poll_once(self) -> Optional[Snapshot]:
        """Scrape, diagnose, record. Returns the snapshot."""
        try:
            snapshot = swarm.scrape(
                self.dht, watched_models(self.settings),
                discover=self.settings.discover_models, batch_blocks=self.settings.scrape_batch_blocks,
            )
        except Exception as e:  # noqa: BLE001 - a failed scrape must not stop the scheduler
            log.exception("scrape failed")
            self.stats.failed("scrape", e)
            self._with_db_retry(lambda: self.store.record_failed_poll(time.time(), f"{type(e).__name__}: {e}"),
                                job="scrape")
            return None
        healths = self.analyse(snapshot, self._latest_probes())
        ok, _ = self._with_db_retry(lambda: self.store.record_poll(snapshot, healths), job="scrape")
        if not ok:
            return snapshot
        self._last_snapshot = snapshot
        self.stats.ok("scrape")
        return snapshot

    def analyse(self, snapshot: Snapshot, probes: Mapping[str, ProbeResult]) -> list[ModelHealth]:
        """Each polled model's diagnosis, as ``record_poll`` and ``record_diagnoses`` take it."""
        return [
            coverage.diagnose(
                model, snapshot.rows_for(model.dht_prefix), probes,
                min_tokens_per_s=self.settings.min_tokens_per_s,
                min_cache_tokens=self.settings.min_cache_tokens,
            )
            for model in snapshot.models
        ]

    def refresh_scores(self, now: Optional[float] = None) -> dict[str, scores.PeerScore]:
        """Score every peer from a week of history (its own job: it reads much more than a poll)."""
        now = now or time.time()
        try:
            histories = self.store.peer_histories(now - SCORE_WINDOW, now, merge_runs=True,
                                                  probes_since=now - scores.PROBE_WINDOW)
            result = scores.score_swarm(histories, now)
            self.store.record_scores(result.values())
        except Exception as e:  # noqa: BLE001
            log.exception("score refresh failed")
            self.stats.failed("scores", e)
            return {}
        self.stats.ok("scores")
        return result

    def probe_once(self) -> Optional[ProbeBatch]:
        snapshot = self._last_snapshot or self._with_db_retry(self.store.latest_snapshot, job="probe")[1]
        online = sorted({row.peer_id for row in (snapshot.servers if snapshot else ()) if row.state == "ONLINE"})
        try:
            batch = swarm.probe_servers(self.dht, online, timeout=self.settings.probe_timeout,
                                        concurrency=self.settings.probe_concurrency)
            boot = swarm.probe_bootstrap(self.dht, self.settings.resolved_initial_peers,
                                         timeout=self.settings.probe_timeout)
            batch = ProbeBatch(taken_at=batch.taken_at, duration=batch.duration,
                               results=tuple(batch.results) + tuple(boot))
        except Exception as e:  # noqa: BLE001
            log.exception("probe failed")
            self.stats.failed("probe", e)
            return None
        if self._with_db_retry(lambda: self.store.record_probes(batch), job="probe")[0]:
            self.stats.ok("probe")
            if snapshot is not None:  # unreachable peers change the diagnosis: redo it with these probes
                self._with_db_retry(lambda: self.rediagnose(snapshot), job="probe")
        return batch

    def rediagnose(self, snapshot: Snapshot) -> None:
        """Diagnose the latest poll's snapshot again with the latest probes, and store that."""
        self.store.record_diagnoses(self.analyse(snapshot, self.store.latest_probes()))

    def rollup_once(self, now: Optional[float] = None):
        ok, result = self._with_db_retry(lambda: self.store.rollup_and_prune(
            now or time.time(),
            raw_retention_days=self.settings.raw_retention_days,
            rollup_retention_days=self.settings.rollup_retention_days,
        ), job="rollup")
        if ok:
            self.stats.ok("rollup")
        return result

    # ---- helpers -----------------------------------------------------------------------------
    def _latest_probes(self) -> dict:
        return self._with_db_retry(self.store.latest_probes, job="probe-read")[1] or {}

    def _with_db_retry(self, call, job: str = "db") -> tuple[bool, object]:
        """Run a store call; on failure retry once after a pause, then give up (recorded).
        Returns (succeeded, result)."""
        for attempt in (1, 2):
            try:
                return True, call()
            except Exception as e:  # noqa: BLE001 - database down or locked
                if attempt == 2:
                    log.warning("%s: database unavailable, skipped: %s", job, e)
                    self.stats.failed(job, e)
                    return False, None
                time.sleep(DB_RETRY_DELAY)

    # ---- scheduling --------------------------------------------------------------------------
    def start(self, *, run_now: bool = True) -> BackgroundScheduler:
        s = self.settings
        scheduler = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
        )
        first = {"next_run_time": _now_datetime()} if run_now else {}
        scheduler.add_job(self.poll_once, "interval", seconds=s.scrape_period, id="scrape", **first)
        scheduler.add_job(self.probe_once, "interval", seconds=s.probe_period, id="probe", **first)
        scheduler.add_job(self.refresh_scores, "interval", seconds=s.score_period, id="scores", **first)
        scheduler.add_job(self.rollup_once, "interval", seconds=s.rollup_period, id="rollup")
        scheduler.start()
        self._scheduler = scheduler
        return scheduler

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None


def _now_datetime():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
