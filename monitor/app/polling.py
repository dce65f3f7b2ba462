"""The poll's own jobs, each a plain function over the job context (``app/job_context.py``).

- ``scrape`` (``poll``): read every block's servers from the DHT, check the servers it finds ONLINE that this
  poller has not checked yet (all of them at its first poll, a server that is back or new: one batch
  at most, not a reachability period later), assess the poll with them, store both. While the DHT
  client is not up, a failed poll with its reason ("cannot reach any bootstrap peer (…),
  retrying"); a poll scraped but not stored is recorded as failed with the cause.
- ``reachability``: check the newest poll's ONLINE servers and the bootstrap peers, then assess
  again (``check_servers``: a reachability check of servers named by a request).
- ``assess``: the assess step, on request (other processes ask "assess now" through the store).
- ``scores``, ``rollup``, ``heartbeat``, ``standby``; ``requests``: carry out what other processes
  asked for through the store, by the table's entries (``jobs``: name → ``Job``, given by the caller).

Every store write goes through ``ctx.db`` (the runner's retry policy: a database that is down is
retried once, then the job skips with the error recorded); a job that fails logs, is counted, and
leaves the last good state in the store untouched. Only the leader runs them (``ctx.leads``).
"""

from __future__ import annotations

import logging
import time
from typing import Mapping, Optional

from monitor import swarm
from monitor.app import assessing
from monitor.app.job_context import JobContext
from monitor.core import scores as scoring
from monitor.core.assess import scoring_inputs
from monitor.core.common import short_error
from monitor.core.snapshot import ModelInfo, ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.settings import Settings
from monitor.store import NotLeader, StoreDataError, StoreError, StoreSchemaError, StoreUnavailable
from monitor.store.engine import data_error_text

log = logging.getLogger(__name__)

REQUESTS_PER_RUN = 100  # job requests carried out per run of the requests job (the rest wait for the next)


def watched_models(settings: Settings) -> list[ModelInfo]:
    return [
        ModelInfo(dht_prefix=m.dht_prefix, num_blocks=m.num_blocks or 0, repository=m.repository,
                  name=m.name, official=True)
        for m in settings.models
    ]


# ---- scrape ----------------------------------------------------------------------------------------
def poll(ctx: JobContext) -> Optional[tuple[Snapshot, bool]]:
    """Scrape, assess, record: (the snapshot, whether it was stored); None when this poller does not
    lead or nothing was scraped (a failed poll is recorded with its reason)."""
    if not ctx.leads():
        return None
    problem = ctx.swarm_problem()
    if problem is not None:
        ctx.stats.failed("scrape", swarm.BootstrapUnreachable(problem))
        ctx.db(lambda: ctx.store.record_failed_poll(time.time(), problem), "scrape")
        return None
    try:
        snapshot = swarm.scrape(ctx.dht, watched_models(ctx.settings), discover=ctx.settings.discover_models,
                                batch_blocks=ctx.settings.scrape_batch_blocks)
    except Exception as e:  # noqa: BLE001 - a failed scrape must not stop the scheduler
        log.exception("scrape failed")
        ctx.stats.failed("scrape", e)
        why = short_error(e, 1000)
        ctx.db(lambda: ctx.store.record_failed_poll(time.time(), why), "scrape")
        return None
    check_newly_online(ctx, snapshot)  # first: the poll is then assessed once, with their checks
    with ctx.poll.lock:
        assessments = assess(ctx, snapshot, latest_reachability(ctx))
        stored = ctx.db(lambda: ctx.store.record_poll(snapshot, assessments), "scrape")
        if not stored.ok:
            if not isinstance(stored.error, NotLeader):  # (a poller that lost the lease records nothing)
                record_unstored(ctx, snapshot, stored.error)
            return snapshot, False
        # without its assessments, the probe round re-reads the poll as stored (bounded) and assesses that
        ctx.poll.last_snapshot = snapshot if assessments or not snapshot.models else None
    ctx.stats.ok("scrape")
    if ctx.leadership is not None:
        ctx.leadership.last_poll_at = snapshot.taken_at
    return snapshot, True


def stored_poll(result) -> bool:
    """Whether a run of ``poll`` stored its poll (what the heartbeat follows)."""
    return bool(result) and bool(result[1])


def record_unstored(ctx: JobContext, snapshot: Snapshot, error: Optional[BaseException]) -> None:
    """The poll was scraped but not stored: record it as failed, with the cause (if the database
    takes even that; the log has the cause either way)."""
    try:
        ctx.store.record_failed_poll(snapshot.taken_at, unstored_cause(error), duration=snapshot.duration)
    except StoreError as e:
        log.warning("scrape: the failed poll could not be recorded either: %s", e)


def assess(ctx: JobContext, snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult]) -> list:
    """Each polled model's assessment, as ``record_poll`` and ``record_assessments`` take it
    (``app.assessing.assess_poll``: with the recent probes and the newest generation checks)."""
    return assessing.assess_poll(ctx.store, ctx.settings, snapshot, reachability)


def assess_step(ctx: JobContext) -> bool:
    """The assess step (``JobContext.assess_latest``): an input of the newest poll was stored (a
    reachability or probe round, a generation check): that poll — not the one a round started from,
    whose assessment a poll landing meanwhile would drop — is assessed again with it
    (``app.assessing.assess_latest``), retried while the database is away (a failure is counted as
    job "assess", not the input's: its results are stored). Under the poll's lock, so a poll
    assessed before the input was stored cannot land between this read and its write. False if
    there is no poll (or another process keeps storing newer ones)."""
    def assess_now() -> bool:
        with ctx.poll.lock:
            return assessing.assess_latest(ctx.store, ctx.settings, ctx.poll.last_snapshot)

    return bool(ctx.db(assess_now, "assess").value)


def assess_job(ctx: JobContext) -> bool:
    """The ``assess`` job: the assess step, once."""
    return ctx.assess_latest()


# ---- reachability ----------------------------------------------------------------------------------
def reachability(ctx: JobContext) -> Optional[ReachabilityBatch]:
    """Check the latest poll's online servers and the bootstrap peers (only the latter, found
    unreachable with the DHT client's reason, while it is not up); only while this poller leads."""
    if not ctx.leads():
        return None
    problem = ctx.swarm_problem()
    snapshot = None if problem or ctx.poll.checked_servers is None else (  # (before: the first poll checks them)
        ctx.poll.last_snapshot or ctx.db(ctx.store.latest_snapshot, "reachability").value)
    online = sorted(online_servers(snapshot))
    try:
        started = time.time()
        batch = ReachabilityBatch(taken_at=started, duration=0.0, results=()) if problem else _check(ctx, online)
        boot = swarm.check_bootstrap(ctx.dht, ctx.settings.resolved_initial_peers,
                                     timeout=ctx.settings.reachability_timeout, down=problem)
        batch = ReachabilityBatch(taken_at=batch.taken_at, duration=batch.duration,
                                  results=tuple(batch.results) + tuple(boot))
    except Exception as e:  # noqa: BLE001
        log.exception("reachability check failed")
        ctx.stats.failed("reachability", e)
        return None
    note_bootstrap(ctx, boot)
    if _store_checks(ctx, batch):
        ctx.stats.ok("reachability")
        if snapshot is not None:
            ctx.poll.checked_servers = frozenset(online)
    return batch


def check_newly_online(ctx: JobContext, snapshot: Snapshot) -> Optional[ReachabilityBatch]:
    """Before a poll is assessed: the servers it found ONLINE that no reachability check of this
    poller has covered since they were last ONLINE (all at its first poll; a server back, or new)
    are checked at once, so that the poll is assessed once, with them (a failure from before a
    server left counts for nothing: ``compute_checks.since_away``); the next round is up to
    ``reachability_period`` away. At most one batch (``reachability_concurrency``) per poll,
    those with a stored failure first: peers announcing fresh ids every poll cost the scrape
    job one ``reachability_timeout`` at most, and the rest wait for the round."""
    online = online_servers(snapshot)
    checked = ctx.poll.checked_servers
    checked = None if checked is None else checked & online
    ctx.poll.checked_servers = checked
    new = online - (checked or frozenset())
    if not new:
        ctx.poll.checked_servers = checked or frozenset()
        return None
    chosen = checked_first(new, latest_reachability(ctx), ctx.settings.reachability_concurrency)
    try:
        batch = _check(ctx, chosen)
    except Exception as e:  # noqa: BLE001 - the next round checks them
        log.exception("reachability check of the newly online servers failed")
        ctx.stats.failed("reachability", e)
        return None
    if _store_checks(ctx, batch, assess=False):
        ctx.poll.checked_servers = (ctx.poll.checked_servers or frozenset()) | frozenset(chosen)
    return batch


def check_servers(ctx: JobContext, peers: list[str], by: Optional[str] = None) -> Optional[ReachabilityBatch]:
    """A reachability check of these servers now (requested through the store), then the newest
    poll assessed again with it; at most one batch (``reachability_concurrency``)."""
    if not ctx.leads() or ctx.swarm_problem() is not None or not peers:
        return None
    batch = _check(ctx, sorted(peers)[:max(ctx.settings.reachability_concurrency, 1)])
    _store_checks(ctx, batch)
    return batch


def _store_checks(ctx: JobContext, batch: ReachabilityBatch, assess: bool = True) -> bool:
    """Store a reachability batch and then (``assess``) assess the newest poll again with it (an
    unreachable peer changes the verdict); False if it could not be stored."""
    if not ctx.db(lambda: ctx.store.record_reachability(batch), "reachability").ok:
        return False
    if assess:
        ctx.assess_latest()
    return True


def _check(ctx: JobContext, servers: list[str]) -> ReachabilityBatch:
    """A reachability check of ``servers`` (peer ids), a failure checked once more (``to_confirm``)."""
    return swarm.check_servers_confirmed(ctx.dht, servers, timeout=ctx.settings.reachability_timeout,
                                         concurrency=ctx.settings.reachability_concurrency)


def latest_reachability(ctx: JobContext) -> dict:
    return ctx.db(ctx.store.latest_reachability, "reachability-read").value or {}


def note_bootstrap(ctx: JobContext, boot) -> None:
    """What this poller reports it cannot reach: every bootstrap peer, or none of them."""
    if ctx.leadership is None:
        return
    down = [r for r in boot if not r.ok]
    if boot and len(down) == len(boot):
        ctx.leadership.problem = ctx.swarm_problem() or (
            f"cannot reach any bootstrap peer ({down[0].error or 'unreachable'})")
    else:
        ctx.leadership.problem = ctx.swarm_problem()


def standby(ctx: JobContext) -> None:
    """A standby's job: keep the DHT client warm (connect to the bootstrap peers and ping their
    DHT) and say what it cannot reach, so that it can poll the moment it takes over."""
    if ctx.leads() or ctx.leadership is None:
        return
    boot = swarm.check_bootstrap(ctx.dht, ctx.settings.resolved_initial_peers,
                                 timeout=ctx.settings.reachability_timeout, down=ctx.swarm_problem())
    note_bootstrap(ctx, boot)


# ---- scores, rollup, heartbeat ---------------------------------------------------------------------
def scores(ctx: JobContext, now: Optional[float] = None) -> dict[str, scoring.PeerScore]:
    """Score every peer from a week of history, counted by the database (``Store.peer_aggregates``)."""
    if not ctx.leads():
        return {}
    now = now or time.time()
    try:
        result = scoring.score_all(ctx.store.peer_aggregates(now), now,
                                   **scoring_inputs(ctx.store.latest_assessments()))
        ctx.store.record_scores(result.values())
    except NotLeader as e:
        log.info("scores: %s", e)
        return {}
    except Exception as e:  # noqa: BLE001
        log.exception("score refresh failed")
        ctx.stats.failed("scores", e)
        return {}
    ctx.stats.ok("scores")
    return result


def rollup(ctx: JobContext, now: Optional[float] = None):
    """Hourly rollups and pruning past the retention (and pollers and terms older than the rollups)."""
    if not ctx.leads():
        return None
    settings = ctx.settings
    if ctx.leadership is not None:
        ctx.db(lambda: ctx.store.prune_pollers((now or time.time()) - settings.rollup_retention_days * 86400),
               "rollup")
    done = ctx.db(lambda: ctx.store.rollup_and_prune(
        now or time.time(), raw_retention_days=settings.raw_retention_days,
        rollup_retention_days=settings.rollup_retention_days), "rollup")
    if done.ok:
        ctx.stats.ok("rollup")
    return done.value


def heartbeat(ctx: JobContext) -> None:
    """Ping the heartbeat URL (``app/heartbeat.py``: in the background, only while leading)."""
    if ctx.heartbeat is not None:
        ctx.heartbeat.beat()


# ---- requests --------------------------------------------------------------------------------------
def carry_out_requests(ctx: JobContext, jobs: Mapping, run) -> list:
    """Carry out what other processes asked for through the store (``Store.request_job``): each job
    once for all its pending requests — with the servers they name when the job takes servers
    (``Job.for_servers``) and every request names some, else the job as a whole (``run(job)``) —
    then mark them done. Only while this poller leads."""
    if not ctx.leads():
        return []
    pending = ctx.db(lambda: ctx.store.pending_job_requests(limit=REQUESTS_PER_RUN), "requests").value or []
    by_job: dict[str, list] = {}
    for request in pending:
        by_job.setdefault(request.job, []).append(request)
    for name, requests in by_job.items():
        targets = [r.target for r in requests if r.target]
        job = jobs.get(name)
        try:
            if job is None or name == "requests":
                log.warning("requests: no job named %r (asked by %s); dropped", name, requests[0].by)
            elif job.for_servers is not None and targets and len(targets) == len(requests):
                job.for_servers(ctx, targets, requests[0].by)
            else:
                run(job)
        except Exception as e:  # noqa: BLE001 - one failed job costs its requests, not the others'
            log.exception("requests: job %s failed (asked by %s)", name, requests[0].by)
            ctx.stats.failed("requests", e)
    if pending:  # (done, failed or dropped alike: a request that fails is not retried forever)
        ctx.db(lambda: ctx.store.finish_job_requests([r.id for r in pending]), "requests")
        ctx.stats.ok("requests")
    return pending


def requests(ctx: JobContext) -> list:
    """The ``requests`` job: ``carry_out_requests`` by the poller's table, each job run as the runner runs it."""
    return carry_out_requests(ctx, ctx.table, ctx.run_job)


# ---- helpers ---------------------------------------------------------------------------------------
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


def online_servers(snapshot: Optional[Snapshot]) -> frozenset[str]:
    """The peers a poll found ONLINE."""
    return frozenset(row.peer_id for row in (snapshot.servers if snapshot else ()) if row.state == "ONLINE")
