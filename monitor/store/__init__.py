"""The SQL store: what every poll, check, probe and chat saw, and the few queries the views and scores need.

``Store`` is the one object callers use; the work is in the modules beside it:

- ``schema``: the SQLModel table classes (the schema; Alembic's ``migrations/`` must match them);
- ``engine``: the engine per dialect, read/write transactions, the guard that turns driver errors
  into ``StoreUnavailable`` / ``StoreSchemaError`` / ``StoreDataError``, writes that leave out
  only the rows the database refuses (``insert_rows``), migrations and the schema's revision
  check (``StoreNotMigrated``: no schema yet, or an older one);
- ``writes``: polls (with each model's ``Assessment``), reachability checks, chat outcomes, scores, policies;
- ``latest``: the latest snapshot, reachability checks, statuses, diagnoses, scores and change marks;
- ``history``: statuses, state changes, outages, block coverage and peer histories over a range;
- ``rollups``: hourly rollups and retention (and why 30 days of 500 servers fit in ~1 GB);
- ``hours``: the hour arithmetic and the rollup watermarks that rollups, history and aggregates share;
- ``aggregates``: what the peer scores need, counted by SQL;
- ``alert_log``: alerts pending or firing, every notice, and the outbox of deliveries to webhooks;
- ``leases``: the pollers' lease (who leads), the fence every write of a poller passes, their reports;
- ``mutes``: silences and maintenance windows, and who changed them when and why;
- ``notes``: operators' incident notes and their history; ``status_history``: the status page's reads.

Who writes: the poller (polls, diagnoses, checks, probes, scores, rollups), the chat (its requests'
outcomes) and the web (operators' peer policies); readers are the web, the chat's router and the
poller itself. One ``Store`` may be shared by threads and each process opens its own: every call
takes its own pooled connection and transaction, so the object holds no state but the engine.
SQLite's WAL mode lets readers read while one writer writes; writers wait for each other up to
``timeout`` seconds. A database that is down or locked makes a call raise ``StoreUnavailable``
within a few seconds instead of hanging, and the next call works again once the database is back.
Times are unix seconds (float) everywhere, as in ``core/snapshot.py``.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Optional, Sequence

from monitor.core import leadership
from monitor.core.assessment import Assessment
from monitor.core.compute_checks import ComputeCheck
from monitor.core.generation import GenerationCheck
from monitor.core.probes import ServerProbe
from monitor.core.requests import RequestRecord
from monitor.core.scores import PeerAggregates, PeerScore
from monitor.core.server_check import LastAnnouncement
from monitor.core.snapshot import ChatOutcome, PeerHistory, ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.store import aggregates, alert_log, history, hours, latest, peers, rollups, server_probes, writes
from monitor.store import compute_checks, contributions, generation_checks, job_requests, requests
from monitor.store import leases
from monitor.store import mutes
from monitor.store import notes, status_history
from monitor.store.engine import (Database, Migration, StoreDataError, StoreError, StoreNotMigrated, StoreSchemaError,
                                  StoreUnavailable, _sqlite_in_memory, head_revision)
from monitor.store.history import StateChange
from monitor.store.latest import LatestState, PollSummary
from monitor.store.leases import NotLeader
from monitor.store.schema import PEER_POLICIES, metadata

__all__ = ["PEER_POLICIES", "LatestState", "Migration", "NotLeader", "PollSummary", "StateChange", "Store", "StoreDataError", "StoreError",
           "StoreNotMigrated", "StoreSchemaError", "StoreUnavailable", "head_revision", "metadata"]

log = logging.getLogger(__name__)


class Store:
    def __init__(self, url: str, *, timeout: float = 5.0):
        """``timeout``: seconds a call may wait for a locked SQLite file or an unreachable server."""
        self.db = Database(url, timeout=timeout)
        self.engine = self.db.engine

    @classmethod
    def from_settings(cls, settings) -> "Store":
        return cls(settings.resolved_database_url)

    def close(self) -> None:
        self.db.close()

    def migrate(self, revision: str = "head") -> Migration:
        """Bring the schema to ``revision`` (Alembic upgrade; creates it in an empty database); keeps
        all data. Returns the revisions before and after."""
        return self.db.migrate(revision)

    def current_revision(self) -> Optional[str]:
        return self.db.current_revision()

    def check_schema(self) -> None:
        """Raise ``StoreNotMigrated`` (revision at, revision needed) unless the schema is this
        version's; free once it is. The web checks it before every request."""
        self.db.check_schema()

    def database_size_bytes(self) -> int:
        return self.db.size_bytes()

    # ---- writes ----------------------------------------------------------------------------

    def record_poll(self, snapshot: Snapshot, assessments: Sequence[Assessment] = ()) -> int:
        """Record one successful poll in one transaction; returns the poll id.

        ``assessments``: each polled model's assessment (``core.assess.assess``), from which the store
        keeps the model's status and per-block coverage for history, and the whole assessment for
        every reader (the web shows it without running petals). A row the database refuses
        costs that row, not the poll: it is left out, counted and named in the poll's errors (and
        logged). ``StoreDataError`` only if the poll itself cannot be stored."""
        with self.db.write("recording a poll") as conn:
            written = writes.record_poll(conn, snapshot, assessments)
            hours.follow_writes(conn, snapshot.taken_at)
        if written.dropped:
            log.warning("poll %s: %d rows were not stored: %s", written.poll_id, written.dropped,
                        "; ".join(written.error_lines()))
        return written.poll_id

    def record_assessments(self, assessments: Iterable[Assessment], *, taken_at: float) -> bool:
        """Replace the assessments of the poll taken at ``taken_at`` (the poller assesses it again
        after each later input: a reachability or probe round, a generation check), if it is still
        the latest successful poll; False if a newer poll came in meanwhile (its own stay)."""
        with self.db.write("recording assessments") as conn:
            return writes.record_assessments(conn, taken_at, assessments)

    def record_failed_poll(self, at: float, error: str, *, duration: float = 0.0) -> int:
        """A poll that could not scrape, or not be stored: kept with its cause so that the gap is
        explained (dashboard, /metrics); no rows."""
        with self.db.write("recording a failed poll") as conn:
            return writes.record_failed_poll(conn, at, error, duration)

    def record_reachability(self, batch: ReachabilityBatch) -> None:
        if batch.results:
            with self.db.write("recording reachability checks") as conn:
                writes.record_reachability(conn, batch)
                hours.follow_writes(conn, batch.taken_at)

    def record_server_probes(self, probes: Iterable[ServerProbe]) -> None:
        """Speed (and correctness) probes of servers' spans (``monitor/app/probing.py``)."""
        probes = list(probes)
        if probes:
            with self.db.write("recording server probes") as conn:
                server_probes.record(conn, probes)

    def record_compute_checks(self, checks: Iterable[ComputeCheck], *, now: Optional[float] = None) -> None:
        """Compute checks of servers (``monitor/app/compute_checking.py``); older ones pruned."""
        with self.db.write("recording compute checks") as conn:
            compute_checks.record(conn, list(checks), now=time.time() if now is None else now)

    def recent_compute_checks(self, since: float, *, peer_id: Optional[str] = None) -> list[ComputeCheck]:
        """Compute checks since ``since``, oldest first (of one peer if given)."""
        with self.db.read("reading compute checks") as conn:
            return compute_checks.recent(conn, since, peer_id=peer_id)

    def last_away(self, peer_ids: Sequence[str], since: float) -> dict[str, tuple[float, Optional[float]]]:
        """peer -> (the newest poll since ``since`` that did not see it ONLINE, the first that saw it
        back after it or None): ``compute_checks.last_away``."""
        with self.db.read("reading when servers were away") as conn:
            return compute_checks.last_away(conn, peer_ids, since)

    def record_chat_outcome(self, outcome: ChatOutcome) -> None:
        self.record_chat_outcomes([outcome])

    def record_chat_outcomes(self, outcomes: Iterable[ChatOutcome]) -> None:
        outcomes = list(outcomes)
        if outcomes:
            with self.db.write("recording chat outcomes") as conn:
                writes.record_chat_outcomes(conn, outcomes)

    def record_scores(self, scores: Iterable[PeerScore]) -> None:
        """Keep each peer's latest score (a score without ``at`` is stamped with the current time)."""
        scores = list(scores)
        if scores:
            with self.db.write("recording scores") as conn:
                writes.record_scores(conn, scores, default_at=time.time())

    def set_peer_policy(self, peer_id: str, policy: Optional[str], at: Optional[float] = None) -> None:
        """Pin or block a peer for the chat's routing; None clears it."""
        with self.db.write("setting a peer policy") as conn:
            writes.set_peer_policy(conn, peer_id, policy, time.time() if at is None else at)

    # ---- latest ----------------------------------------------------------------------------

    def last_poll(self) -> Optional[PollSummary]:
        """The latest poll, failed or not."""
        with self.db.read("reading the last poll") as conn:
            return latest.last_poll(conn)

    def change_marks(self) -> tuple:
        """A fingerprint of the latest state (poll, reachability checks, scores, diagnoses): while it stays the
        same, whatever a reader derived from that state still holds."""
        with self.db.read("reading change marks") as conn:
            return latest.change_marks(conn)

    def latest_snapshot(self) -> Optional[Snapshot]:
        """The latest successful poll, rebuilt from its rows (equal to the Snapshot recorded)."""
        with self.db.read("reading the latest snapshot") as conn:
            return latest.latest_snapshot(conn)

    def latest_reachability(self) -> dict[str, ReachabilityResult]:
        """Each peer's latest reachability check."""
        with self.db.read("reading the latest reachability checks") as conn:
            return latest.latest_reachability(conn)

    def latest_model_status(self) -> dict[str, dict]:
        """model -> the status recorded with the latest successful poll (plus its ``at``): ``state,
        reasons, coverage_pct, servers_online, min_redundancy, est_tokens_per_s``."""
        with self.db.read("reading the latest model status") as conn:
            return latest.latest_model_status(conn)

    def latest_assessments(self) -> dict[str, Assessment]:
        """model -> its newest assessment of the latest successful poll (none for older polls)."""
        with self.db.read("reading the latest assessments") as conn:
            return latest.latest_assessments(conn)

    def latest_state(self) -> LatestState:
        """The latest poll, its assessments, each peer's latest reachability check and score, each
        model's newest generation check and the last poll (ok or not), read in one transaction: a
        poll or an assessment landing meanwhile is seen whole or not at all."""
        with self.db.read("reading the latest state") as conn:
            snapshot = latest.latest_snapshot(conn)
            return LatestState(
                snapshot=snapshot, reachability=latest.latest_reachability(conn),
                assessments=latest.latest_assessments(conn) if snapshot is not None else {},
                scores=latest.latest_scores(conn), generation=generation_checks.latest(conn),
                last_poll=latest.last_poll(conn))

    def latest_scores(self) -> dict[str, PeerScore]:
        """peer id -> its latest score (``at``: when it was computed)."""
        with self.db.read("reading the latest scores") as conn:
            return latest.latest_scores(conn)

    def recent_chat_outcomes(self, since: float, *, limit: int = 5000) -> list[ChatOutcome]:
        """Chat outcomes since ``since`` (newest ``limit``, oldest first): the router's evidence."""
        with self.db.read("reading recent chat outcomes") as conn:
            return latest.recent_chat_outcomes(conn, since, limit)

    def answered_since(self, since: float) -> dict[str, float]:  # (``latest.answered_since``)
        with self.db.read("reading which servers answered requests") as conn:
            return latest.answered_since(conn, since)

    def recent_server_probes(self, since: float, *, until: Optional[float] = None, model: Optional[str] = None,
                             peer_id: Optional[str] = None, limit: int = 20_000) -> list[ServerProbe]:
        """Server probes since ``since`` (newest ``limit``, oldest first), of one model and/or peer
        if given: measured speeds and correctness verdicts (``core.measurements`` reads them)."""
        with self.db.read("reading server probes") as conn:
            return server_probes.recent(conn, since, until=until, model=model, peer_id=peer_id, limit=limit)

    def peer_policies(self) -> dict[str, str]:
        """peer id -> "pinned" or "blocked", as operators set them from the dashboard."""
        with self.db.read("reading peer policies") as conn:
            return latest.peer_policies(conn)

    def poll_counts(self, since: float) -> dict[str, int]:
        """Polls since ``since`` that succeeded and failed (``ok``, ``failed``), and the malformed
        records they dropped, the announced values they bounded and the rows the database refused
        (``invalid_records``, ``clamped_values``, ``dropped_rows``)."""
        with self.db.read("counting polls") as conn:
            return latest.poll_counts(conn, since)

    def peer_ids(self) -> list[str]:
        """Peers that have announced themselves as servers at least once, sorted."""
        with self.db.read("listing peers") as conn:
            return latest.peer_ids(conn)

    # ---- history ---------------------------------------------------------------------------

    def model_status_history(self, model: str, since: float, until: float) -> list[dict]:
        """Oldest first: one dict per poll where raw rows are kept, one per hour before that
        (see ``history.model_status_history`` for the keys)."""
        with self.db.read("reading model status history") as conn:
            return history.model_status_history(conn, model, since, until)

    def state_changes(self, model: str, since: float, until: float) -> list[StateChange]:
        """Oldest first; the first status ever recorded for a model counts as a change from None."""
        with self.db.read("reading state changes") as conn:
            return history.state_changes(conn, model, since, until)

    def outage_intervals(self, model: str, since: float, until: float) -> list[tuple[float, Optional[float]]]:
        """(start, end) of every stretch BROKEN that overlaps [since, until], oldest first; not
        clipped to the window; ``end`` None while it lasts."""
        with self.db.read("reading outages") as conn:
            return history.outage_intervals(conn, model, since, until)

    def block_coverage_series(self, model: str, since: float, until: float, *, value: str = "servers",
                              stat: str = "min") -> tuple[list[float], list[list[Optional[float]]]]:
        """(times, matrix[block][time]) for a blocks × time heatmap, oldest first.

        ``value``: "servers" (serving servers) or "throughput" (their total). Where raw rows are
        kept every poll is a column; before that every hour is one, with the hour's ``stat``
        ("min" or "mean") per block. Missing blocks are None."""
        with self.db.read("reading block coverage") as conn:
            return history.block_coverage_series(conn, model, since, until, value, stat)

    def peer_history(self, peer_id: str, since: float, until: float, *, merge_runs: bool = False) -> PeerHistory:
        """The peer's observations, reachability checks and chat outcomes in [since, until], oldest first.

        Observations include the polls that did not see it (``seen=False``) for the models it
        served; before raw retention they are hourly rows (``samples`` > 1, ``at`` = the hour).
        ``merge_runs``: also merge consecutive polls with the same state and span within each clock
        hour (``samples`` = polls), which keeps uptime and flaps exact at a fraction of the rows;
        consumers must then weigh by ``samples``. Reachability checks are raw only (within raw retention);
        the hourly ``hourly_reachability`` rollup is what the scores count (``peer_aggregates``)."""
        with self.db.read("reading peer history") as conn:
            key = latest.peer_key(conn, peer_id)
            found = None if key is None else history.histories(conn, since, until, [key], merge_runs).get(key)
        return found or PeerHistory(peer_id=peer_id)

    def peer_aggregates(self, now: float) -> list[PeerAggregates]:
        """What ``scores.score_all`` takes, for every peer observed or chatted with in the score
        window, counted by the database (``aggregates``): memory bounded by the number of peers."""
        with self.db.read("reading score aggregates") as conn:
            return aggregates.peer_aggregates(conn, now)

    # ---- finding a peer ---------------------------------------------------------------------

    def search_peers(self, query: str, *, limit: int = 20) -> list[peers.PeerMatch]:
        """Peers whose id is ``query`` or starts with it (ends with it, after ``…``), or whose
        public name contains it, exact matches first; at most ``limit`` (``peers.search``)."""
        with self.db.read("searching peers") as conn:
            return peers.search(conn, query, limit)

    def peer_record(self, peer_id: str) -> Optional[peers.PeerRecord]:
        """When the peer was first and last seen announcing itself, and its last public name."""
        with self.db.read("reading a peer") as conn:
            return peers.record(conn, peer_id)

    def serving_since(self, since: float) -> list[tuple[str, Optional[str], str, float]]:
        """(peer id, public name, model, when a poll last saw it ONLINE) of the servers since ``since``."""
        with self.db.read("reading the servers seen lately") as conn:
            return peers.serving_since(conn, since)

    def last_announcements(self, peer_id: str) -> list[LastAnnouncement]:
        """What the peer announced per model the last time a poll saw it, newest first."""
        with self.db.read("reading a peer's last announcements") as conn:
            return peers.last_announcements(conn, peer_id)

    # ---- alerts (store/alert_log.py) ----------------------------------------------------------

    def alerts(self) -> dict:
        """(rule, subject) -> every pending or firing ``core.alert_rules.Alert``."""
        with self.db.read("reading alerts") as conn:
            return alert_log.load_alerts(conn)

    def alerts_evaluated_at(self) -> Optional[float]:
        """When the poller's alert job last evaluated the rules (a heartbeat, a minute apart at most)."""
        with self.db.read("reading the alert job's heartbeat") as conn:
            return alert_log.evaluated_at(conn)

    def record_alert_evaluation(self, evaluation, webhooks_for, now: float, *, group_wait: float = 0.0) -> list[int]:
        """An evaluation's changed alerts, its notices and their deliveries (``webhooks_for(notice)``
        names the webhooks; first attempt ``group_wait`` from now), its held notices, and when it
        ran, in one transaction; returns the sent notices' ids."""
        with self.db.write("recording alerts") as conn:
            return alert_log.record_evaluation(conn, evaluation, webhooks_for, now, group_wait)

    def pending_alert_deliveries(self, *, limit: int = 100) -> list:
        """Pending deliveries (due now or waiting for a retry), with their notices, oldest first."""
        with self.db.read("reading pending alert deliveries") as conn:
            return alert_log.pending_deliveries(conn, limit)

    def record_alert_delivery(self, delivery_id: int, *, ok: bool, at: float, error: Optional[str] = None,
                              retry_at: Optional[float] = None) -> None:
        """One delivery attempt: delivered, to be retried at ``retry_at``, or (None) given up."""
        with self.db.write("recording an alert delivery") as conn:
            alert_log.record_attempt(conn, delivery_id, ok=ok, at=at, error=error, retry_at=retry_at)

    def alert_events(self, since: float, until: float, *, limit: int = 200) -> list:
        """Notices in [since, until], newest first, each with its deliveries (``StoredNotice``)."""
        with self.db.read("reading alert history") as conn:
            return alert_log.events(conn, since, until, limit)

    def alert_deliveries(self, *, status: Optional[str] = None, limit: int = 50) -> list:
        """The latest deliveries (of one status: pending, delivered, failed), newest first."""
        with self.db.read("reading alert deliveries") as conn:
            return alert_log.recent_deliveries(conn, status, limit)

    def alert_delivery_counts(self, since: float) -> dict[str, dict[str, int]]:
        """webhook -> status -> deliveries since ``since`` (and every pending one)."""
        with self.db.read("counting alert deliveries") as conn:
            return alert_log.delivery_counts(conn, since)

    def prune_alerts(self, before: float) -> dict[str, int]:
        """Delete notices (and their deliveries) older than ``before``, except undelivered ones."""
        with self.db.write("pruning alert history") as conn:
            return alert_log.prune(conn, before)

    # ---- rollups and retention -------------------------------------------------------------

    def rollup_and_prune(self, now: float, *, raw_retention_days: float, rollup_retention_days: float) -> dict:
        """Aggregate every completed hour not yet rolled up (and hours written into since they
        were), then delete raw rows older than ``raw_retention_days`` (whole hours, only rolled-up
        ones), rollups, chat outcomes and state changes older than ``rollup_retention_days``, and
        latest reachability checks, scores, models, peers and policies not seen within those retentions
        (``rollups.rollup_and_prune``). Idempotent; returns counts."""
        return rollups.rollup_and_prune(self.db, now, raw_retention_days=raw_retention_days,
                                        rollup_retention_days=rollup_retention_days)

    # ---- requests that a poller job run soon (store/job_requests.py) --------------------------

    def request_job(self, job: str, target: Optional[str] = None, *, by: str, why: Optional[str] = None,
                    min_interval: float = 0.0, at: Optional[float] = None) -> Optional[int]:
        """Ask the leading poller to run ``job`` soon (for ``target``, a peer id, if given); None if
        the same was asked within ``min_interval`` seconds (it runs once for all of them)."""
        with self.db.write("requesting a job") as conn:
            return job_requests.request(conn, job, target, at=time.time() if at is None else at, by=by, why=why,
                                        min_interval=min_interval)

    def pending_job_requests(self, *, limit: int = 100) -> list[job_requests.JobRequest]:
        with self.db.read("reading the job requests") as conn:
            return job_requests.pending(conn, limit=limit)

    def finish_job_requests(self, ids: Sequence[int], *, at: Optional[float] = None) -> None:
        """Mark these requests carried out, and forget those older than ``job_requests.DONE_KEPT``."""
        at = time.time() if at is None else at
        with self.db.write("finishing job requests") as conn:
            job_requests.finish(conn, ids, at=at)
            job_requests.prune(conn, at - job_requests.DONE_KEPT)

    # ---- generation checks (store/generation_checks.py) -------------------------------------

    def record_generation_checks(self, checks: Iterable[GenerationCheck]) -> None:
        """Generation checks of models (``monitor/app/generation_check.py``): one per model per round."""
        checks = list(checks)
        if checks:
            with self.db.write("recording generation checks") as conn:
                generation_checks.record(conn, checks)

    def latest_generation_checks(self) -> dict[str, GenerationCheck]:
        """model -> its newest generation check (whatever its age: ``core.generation.is_current``)."""
        with self.db.read("reading the latest generation checks") as conn:
            return generation_checks.latest(conn)

    def generation_check_history(self, model: str, since: float, until: Optional[float] = None, *,
                                 limit: int = 5000) -> list[GenerationCheck]:
        """The model's generation checks in [since, until] (newest ``limit``), oldest first: the
        model page's plot of time to first token and tokens per second."""
        with self.db.read("reading generation check history") as conn:
            return generation_checks.history(conn, model, since, until, limit=limit)

    # ---- the contribution ledger (store/contributions.py) -----------------------------------

    def contributions(self, since: Optional[float], *, model: Optional[str] = None, peer_id: Optional[str] = None,
                      by_model: bool = False, days: bool = False) -> list:
        """Each server's ``core.contributions.Contribution`` since ``since`` (None: all time; ``days``:
        by its days, ``since`` a day's start: ``core.contributions.window_start``)."""
        with self.db.read("reading the contribution ledger") as conn:
            return contributions.window(conn, since, model=model, peer_id=peer_id, by_model=by_model, days=days)

    # ---- request rows (store/requests.py) ---------------------------------------------------

    def record_requests(self, records: Iterable[RequestRecord]) -> int:
        """Requests the chat served (``core/requests.py``); returns how many were out of range."""
        records = list(records)
        if not records:
            return 0
        with self.db.write("recording requests") as conn:
            return requests.record(conn, records)

    def requests_since(self, since: float, *, model: Optional[str] = None, limit: int = requests.MAX_ROWS,
                       route: bool = True) -> list[RequestRecord]:
        """Requests at or after ``since`` (of ``model``), the newest ``limit``, oldest first."""
        with self.db.read("reading requests") as conn:
            return requests.since(conn, since, model=model, limit=limit, route=route)

    def requests_through(self, peer_id: str, since: float, *, limit: int = requests.MAX_ROWS) -> list[RequestRecord]:
        """Requests at or after ``since`` whose route went through ``peer_id``, oldest first."""
        with self.db.read("reading a server's requests") as conn:
            return requests.through(conn, peer_id, since, limit=limit)

    def request_hours(self, model: str, since: float, until: float) -> list[dict]:
        """A model's requests per hour (``store.requests.hourly``: raw rows, else the rollup)."""
        with self.db.read("reading requests per hour") as conn:
            return requests.hourly(conn, model, since, until)

    # ---- silences and maintenance windows (store/mutes.py) ----------------------------------

    def create_silence(self, silence, *, via: str) -> int:
        """A new silence (``core.muting.Silence``; its id is ignored), logged with who made it,
        ``via`` what (api token, browser session) and why; returns its id."""
        with self.db.write("creating a silence") as conn:
            return mutes.create_silence(conn, silence, via)

    def end_silence(self, silence_id: int, *, at: float, by: str, via: str, why: str):
        """End a silence at ``at`` (logged); the silence as it is now, None if unknown."""
        with self.db.write("ending a silence") as conn:
            return mutes.end_silence(conn, silence_id, at, by, via, why)

    def silences(self, *, ending_after: float, limit: int = 500) -> list:
        """Silences in force, to come, or ended after ``ending_after``, newest first."""
        with self.db.read("reading silences") as conn:
            return mutes.silences(conn, ending_after=ending_after, limit=limit)

    def create_maintenance_window(self, window, *, via: str) -> int:
        """A new maintenance window (``core.maintenance.MaintenanceWindow``; its id is ignored),
        logged as ``create_silence``; returns its id."""
        with self.db.write("creating a maintenance window") as conn:
            return mutes.create_window(conn, window, via)

    def end_maintenance_window(self, window_id: int, *, at: float, by: str, via: str, why: str):
        """End a maintenance window at ``at`` (a recurring one for good; logged); None if unknown."""
        with self.db.write("ending a maintenance window") as conn:
            return mutes.end_window(conn, window_id, at, by, via, why)

    def maintenance_windows(self, *, ending_after: Optional[float] = None, limit: int = 500) -> list:
        """Maintenance windows not over by ``ending_after`` (None: all of them, for a range's
        ``core.maintenance.covered_intervals``), newest first."""
        with self.db.read("reading maintenance windows") as conn:
            return mutes.windows(conn, ending_after=ending_after, limit=limit)

    def mute_changes(self, kind: str, item_ids: list[int]) -> dict:
        """``"silence"`` or ``"maintenance"``: item id -> its changes (who, when, via, why), oldest first."""
        with self.db.read("reading silence and maintenance changes") as conn:
            return mutes.changes(conn, kind, list(item_ids))

    # ---- pollers: the lease, the fence, who stands by (store/leases.py) ---------------------

    def claim_poller_lease(self, me, lease_seconds: float, *, role_problem: Optional[str] = None,
                           last_poll_at: Optional[float] = None, notify=None):
        """One claim of the pollers' lease by ``me`` (``core.leadership.PollerId``): renew it, take it
        if it is missing, expired or released (with its term, and the take-over's notice to the
        webhooks ``notify(notice)`` names), or leave another's valid one; and ``me``'s report (its
        role after the claim, ``role_problem``: what it cannot reach, its latest poll), in one
        transaction. Returns the ``core.leadership.Grant``."""
        with self.db.write("claiming the pollers' lease") as conn:
            grant = leases.claim(conn, leadership.LEASE_NAME, me, lease_seconds, notify=notify)
            leases.report(conn, me, leadership.LEADER if grant.held else leadership.STANDBY, problem=role_problem,
                          last_poll_at=last_poll_at, now=grant.now)
        return grant

    def release_poller_lease(self, holder: str, epoch: int) -> bool:
        """A leader that stops hands its lease over (a standby takes it at once, without a notice)."""
        with self.db.write("releasing the pollers' lease") as conn:
            return leases.release(conn, leadership.LEASE_NAME, holder, epoch)

    def poller_status(self, *, members_within: float = 86400.0):
        """Who leads, since when, the pollers seen within ``members_within`` seconds and the latest
        terms (take-overs), as ``core.leadership.PollerStatus``."""
        with self.db.read("reading the pollers' lease") as conn:
            now = leases.clock_now(conn)
            return leases.status(conn, leadership.LEASE_NAME, members_since=now - members_within)

    def poller_takeovers_since(self, since: float) -> int:
        """Take-overs (a standby replacing a leader) since ``since``."""
        with self.db.read("counting take-overs") as conn:
            return leases.takeovers_since(conn, leadership.LEASE_NAME, since)

    def prune_pollers(self, before: float) -> dict[str, int]:
        """Forget pollers not seen since ``before``, and older terms (the latest stays)."""
        with self.db.write("pruning pollers") as conn:
            return leases.prune(conn, before)

    def fenced(self, token, *, idle_limit: float) -> "Store":
        """A store on the same database whose every write first checks, in its own transaction,
        that ``token()`` (``(holder, epoch)``, or None) holds the pollers' lease, and otherwise
        raises ``NotLeader`` and writes nothing: the poller's jobs write through it. Its own engine
        (the process's other writers, the chat and the web, are not fenced); ``idle_limit``: seconds
        a write may sit idle on PostgreSQL (``leases.install_fence``)."""
        if _sqlite_in_memory(self.db.url):
            raise StoreError("an in-memory SQLite database cannot be shared by a fenced store: use a file")
        store = Store(self.db.url.render_as_string(hide_password=False), timeout=self.db.timeout)
        leases.install_fence(store.engine, leadership.LEASE_NAME, token, idle_limit=idle_limit)
        return store

    # ---- incident notes (store/notes.py) and the status page (store/status_history.py) ---------

    def post_note(self, scope: str, target: Optional[str], text: str, *, author: str, via: str,
                  at: Optional[float] = None) -> int:
        """A new open incident note (checked by ``core.incidents``' rules first); returns its id."""
        with self.db.write("posting an incident note") as conn:
            return notes.post(conn, scope, target, text, author, via, time.time() if at is None else at)

    def update_note(self, note_id: int, text: str, *, author: str, via: str, at: Optional[float] = None):
        """New text for a note, kept in its history; the note as it is now, None if unknown."""
        with self.db.write("updating an incident note") as conn:
            return notes.update(conn, note_id, text, author, via, time.time() if at is None else at)

    def resolve_note(self, note_id: int, *, text: Optional[str] = None, author: str, via: str,
                     at: Optional[float] = None):
        """Resolve a note (``text``: its last word); the note as it is now, None if unknown."""
        with self.db.write("resolving an incident note") as conn:
            return notes.resolve(conn, note_id, text, author, via, time.time() if at is None else at)

    def note(self, note_id: int):
        """One incident note (``core.incidents.Note``) with its history, None if unknown."""
        with self.db.read("reading an incident note") as conn:
            return notes.note(conn, note_id)

    def notes(self, *, resolved_since: Optional[float] = None, limit: int = 200) -> list:
        """Open notes, and those resolved since ``resolved_since``, newest change first."""
        with self.db.read("reading incident notes") as conn:
            return notes.notes(conn, resolved_since=resolved_since, limit=limit)

    def note_changes(self, since: float, *, limit: int = 100) -> list:
        """(note, change) of every change of a note since ``since``, newest first (the Atom feed)."""
        with self.db.read("reading incident note changes") as conn:
            return notes.changes(conn, since, limit=limit)

    def notes_mark(self) -> tuple:
        """A fingerprint of the notes: what shows them may be reused while it stays the same."""
        with self.db.read("reading the notes' mark") as conn:
            return notes.mark(conn)

    def status_points(self, models: Iterable[str], since: float, until: float, *, poll_hold: float) -> dict:
        """model -> its stored statuses in [since, until] as ``core.uptime.StatusPoint``s (hourly
        rows before raw retention, polls after, each standing at most ``poll_hold`` seconds)."""
        with self.db.read("reading the models' status history") as conn:
            return status_history.status_points(conn, models, since, until, poll_hold)
