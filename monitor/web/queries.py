"""The store reads the pages, the API and /metrics share.

Each model's diagnosis comes from the store, as the poller wrote it for the latest poll, probe
round and generation check; nothing here computes a figure itself, and nothing imports petals (a
web worker stays a small process). Several web workers read the same store, so they always agree
with each other, with the alerts and with the chat. A model the store holds no diagnosis for is
shown as not diagnosed.

A page refreshes every few seconds, a poll lands every minute: ``current`` asks the store only
whether anything changed (``Store.change_marks``) and otherwise reuses the state the app read
(kept in its ``WebCache``, ``monitor.web.cache``), along with everything derived from it
(``Current.derive``: the state dict, charts).
"""

from __future__ import annotations

import threading
import time

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from monitor.settings import Settings
from monitor.core.assess import judged_reachability
from monitor.core.common import DAY, is_stale
from monitor.core.assessment import Assessment
from monitor.core.generation import GenerationCheck
from monitor.core.scores import PeerScore
from monitor.core.snapshot import ONLINE, ModelInfo, PeerHistory, ReachabilityResult, Snapshot
from monitor.store import PollSummary, StoreError
from monitor.web import state_api

MAX_DERIVED = 64  # values kept per state; beyond that (a poller stopped for hours) start afresh


@dataclass
class Current:
    """The latest poll, its reachability checks and scores, each model's diagnosis and generation check."""

    snapshot: Optional[Snapshot]
    reachability: dict[str, ReachabilityResult] = field(default_factory=dict)  # each peer's latest check
    scores: dict[str, PeerScore] = field(default_factory=dict)
    assessments: dict[str, Assessment] = field(default_factory=dict)
    generation: dict[str, GenerationCheck] = field(default_factory=dict)  # model -> its newest generation check
    last_poll: Optional[PollSummary] = None
    unavailable: Optional[str] = None  # the database is unavailable: this is the last state read
    marks: tuple = ()  # the store's change marks when this was read
    _derived: dict = field(default_factory=dict, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def models(self) -> tuple[ModelInfo, ...]:
        return self.snapshot.models if self.snapshot else ()

    def model(self, dht_prefix: str) -> Optional[ModelInfo]:
        return next((m for m in self.models if m.dht_prefix == dht_prefix), None)

    def derive(self, key, compute: Callable[[], Any]):
        """``compute()``, once per state and key: every page load until the next change reuses it.
        Callers must not mutate what they get."""
        with self._lock:
            if key in self._derived:
                return self._derived[key]
        value = compute()
        with self._lock:
            if len(self._derived) >= MAX_DERIVED:
                self._derived.clear()
            self._derived[key] = value
        return value


def with_undiagnosed(snapshot: Snapshot, assessments: dict[str, Assessment]) -> dict[str, Assessment]:
    """Each model's stored assessment, as the poller wrote it after the latest poll and its later
    inputs. A model without one (a poll stored by an older version, or one whose assessment was
    lost) is shown as not diagnosed: the web never assesses by itself (that would import petals and
    torch, and could disagree with what the chat and the alerts read)."""
    for model in snapshot.models:
        if model.num_blocks >= 1 and model.dht_prefix not in assessments:
            assessments[model.dht_prefix] = Assessment.not_diagnosed(
                model.dht_prefix, model.num_blocks, "the poller stored this poll without a diagnosis; "
                "it diagnoses again after its next poll or probe round")
    return assessments


def current(d) -> Current:
    """The latest state of ``d.store`` (``d``: the app's ``WebDeps``), read once per store change and
    kept in the app's cache (``WebCache.latest``); while the database is down or locked, the last
    state this app read, marked ``unavailable`` with the reason (raises only if nothing was ever read)."""
    settings = d.settings
    return d.cache.latest.get(
        (settings.min_tokens_per_s, settings.min_cache_tokens),  # the thresholds it is diagnosed with
        d.store.change_marks,
        lambda marks: _read_current(d.store, settings, marks),
        lambda last, error: replace(last, unavailable=str(error)),
    )


def _read_current(store, settings: Settings, marks: tuple) -> Current:
    state = store.latest_state()  # one transaction: a poll landing meanwhile is seen whole or not at all
    if state.snapshot is None:  # (the bootstrap peers' checks still count: a DHT client that cannot start finds them down)
        return Current(snapshot=None, reachability=state.reachability, last_poll=state.last_poll, marks=marks)
    return Current(
        snapshot=state.snapshot,
        reachability=judged_reachability(state.reachability, state.assessments),  # as the assessments judged it
        scores=state.scores,  # written by the poller's score job; none before it ran
        assessments=with_undiagnosed(state.snapshot, state.assessments),
        generation=state.generation,
        last_poll=state.last_poll,
        marks=marks,
    )


def state_dict(cur: Current, settings: Settings) -> dict:
    """The /api/v1/state document (shared, read-only: computed once per state)."""
    initial_peers = settings.resolved_initial_peers
    return cur.derive(("state", tuple(initial_peers), settings.scrape_period), lambda: state_api.build_state(
        cur.snapshot,
        assessments=cur.assessments,
        reachability=cur.reachability,
        scores=cur.scores,
        initial_peers=initial_peers,
        update_period=settings.scrape_period,
        generation=cur.generation,
    ))


def model_report(cur: Current, settings: Settings, dht_prefix: str) -> dict:
    """One model's report, as in the state document (shared, read-only)."""
    return next(r for r in state_dict(cur, settings)["model_reports"] if r["dht_prefix"] == dht_prefix)


def poll_info(cur: Current, settings: Settings, now: float) -> dict:
    """What the pages say about polling: when, how long, how many servers, and whether the poller
    seems to have stopped (``common.is_stale``) or failed."""
    snapshot, last = cur.snapshot, cur.last_poll
    latest_at = last.at if last is not None else (snapshot.taken_at if snapshot else None)
    servers = {row.peer_id for row in snapshot.servers} if snapshot else set()
    online = {row.peer_id for row in snapshot.servers if row.state == ONLINE} if snapshot else set()
    failed = last is not None and not last.ok
    return {
        "at": snapshot.taken_at if snapshot else None,
        "duration": snapshot.duration if snapshot else None,
        "period": settings.scrape_period,
        "stale": latest_at is not None and is_stale(latest_at, now, settings.scrape_period),
        "servers": len(servers),
        "servers_online": len(online),
        "invalid_records": snapshot.invalid_records if snapshot else 0,
        "error": "; ".join(last.errors) or "unknown error" if failed else None,
        "error_at": last.at if failed else None,
        # the latest poll was stored, but without rows the database refused (its errors name them)
        "dropped_rows": last.dropped_rows if last is not None and last.ok else 0,
        "errors": list(last.errors) if last is not None and last.ok else [],
        "clamped_values": last.clamped_values if last is not None and last.ok else 0,
        "unavailable": cur.unavailable,
    }


def coverage_history(store, dht_prefix: str, since: float, until: float) -> tuple[list[float], list]:
    """(times, coverage %) of the model's recorded statuses, oldest first."""
    history = store.model_status_history(dht_prefix, since, until)
    return [h["at"] for h in history], [h["coverage_pct"] for h in history]


def block_rows(assessment: Assessment) -> list[dict]:
    return [{"index": b.index, "online": b.online, "throughput": b.total_throughput} for b in assessment.blocks]


def state_changes(store, dht_prefix: str, since: float, until: float, limit: int = 50) -> list:
    """Newest first, at most ``limit``."""
    return list(reversed(store.state_changes(dht_prefix, since, until)))[:limit]


def outages(store, dht_prefix: str, since: float, until: float) -> list:
    return store.outage_intervals(dht_prefix, since, until)


def coverage_series(store, dht_prefix: str, since: float, until: float):
    return store.block_coverage_series(dht_prefix, since, until)


def known_peer(store, peer_id: str, history: Optional[PeerHistory] = None) -> bool:
    """Seen as a server, checked for reachability, or chatted through — ever (or in ``history``, when given)."""
    if history is not None and (history.observations or history.reachability or history.outcomes or history.first_seen):
        return True
    return peer_id in set(store.peer_ids()) or peer_id in store.latest_reachability()


def model_history(store, dht_prefix: str, since: float, until: float) -> Optional[dict]:
    """Everything recorded about a model in [since, until]; None if the model was never recorded."""
    status = store.model_status_history(dht_prefix, since, until)
    if not status and not store.state_changes(dht_prefix, 0, until):
        return None
    times, servers = store.block_coverage_series(dht_prefix, since, until, value="servers")
    _, throughput = store.block_coverage_series(dht_prefix, since, until, value="throughput")
    return {
        "status": status,
        "state_changes": [change._asdict() for change in store.state_changes(dht_prefix, since, until)],
        "outages": [{"start": start, "end": end} for start, end in store.outage_intervals(dht_prefix, since, until)],
        "block_coverage": {"times": times, "servers": servers, "throughput": throughput},
    }


@dataclass(frozen=True)
class PollStats:
    last_poll: Optional[PollSummary]  # the latest poll, successful or failed
    database_size_bytes: Optional[int]
    last_day: dict  # polls ok / failed, invalid records, clamped values, dropped rows over the last 24 h


def poll_stats(store) -> PollStats:
    return PollStats(
        last_poll=store.last_poll(),
        database_size_bytes=store.database_size_bytes(),
        last_day=store.poll_counts(time.time() - DAY),
    )


CHAT_WORKER_ALIVE = 30.0  # seconds: a chat worker that reported within this is alive (it reports every 10 s)
CHAT_WORKERS_SHOWN = 3600.0  # and one silent longer is shown as gone for an hour


def chat_workers(d, cur: Current, now: float) -> list[dict]:
    """The chat workers that reported within the hour (``monitor.store.chat_workers``), each
    alive or gone, read once per store change and ``LIVE_SECONDS``."""
    from monitor.store import chat_workers as workers

    def read() -> list[dict]:
        try:
            with d.store.db.read("reading the chat workers") as conn:
                found = workers.recent(conn, now - CHAT_WORKERS_SHOWN)
        except StoreError:
            return []
        return [{**vars(w), "alive": not w.stopped and now - w.beat_at <= CHAT_WORKER_ALIVE} for w in found]

    return d.cache.now(cur.marks, now, ("chat-workers",), read)


def pollers(d, cur: Current, now: float) -> dict:
    """Who polls the store (``state_api.poller_section`` of ``Store.poller_status``), read once per
    store change and ``LIVE_SECONDS``: a standby's report or a lease that runs out shows within
    seconds, without a query per page view."""
    def read() -> dict:
        try:
            status = d.store.poller_status()
        except StoreError:
            status = None
        return state_api.poller_section(status, database=d.store.db.dialect)

    return d.cache.now(cur.marks, now, ("pollers",), read)
