"""Rollups and retention: raw rows are kept ``raw_retention_days``, hourly rollups after that.

Every completed hour is aggregated into the ``hourly_*`` tables (``rolled_up_until`` in
``store_meta`` is the watermark); then raw rows older than the raw retention (whole, rolled-up
hours only: never past the watermark) and rollups, chat outcomes and state changes older than the
rollup retention go. The watermark follows the writes: a poll or reachability round stored into an hour
already rolled up (it finished after the rollup ran) moves it back (``hours.follow_writes``), so the
next rollup redoes that hour with every row. The "now" tables are pruned too: latest reachability checks,
scores and watched models not refreshed within the raw retention, and peers (and their routing
policies) not seen within the rollup retention that no row refers to any more.
The history readers use a rollup hour only where no raw rows are left (``hours.rollup_window``), so a
query over any range sees each poll exactly once.

Why it fits in ~1 GB for 30 days × 60 s polls × 500 servers: peers are interned, per-block
coverage is one row per (poll, model) with JSON arrays (not one row per block: 4 models × 80
blocks would be 320 rows per poll, and the 24 h heatmap reads 1440 rows, not 460 k), and
``next_pings`` are kept an hour only. Measured on SQLite (tests/test_store.py): 113 kB of raw rows
per poll of 500 servers (74 of them observations, 33 reachability checks), 127 kB of rollups per hour: 30 days
≈ 0.44 GB.
"""

from __future__ import annotations

import bisect
import math
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import DAY, HOUR
from monitor.core.assessment import STATE_SEVERITY
from monitor.core.snapshot import JOINING, ONLINE
from monitor.store import aggregates, contributions, generation_checks, requests, server_probes
from monitor.store.engine import Database, count_if
from monitor.store.writes import ASSESSMENT_RETENTION, prune_assessments
from monitor.store.hours import PRUNED, WATERMARK, floor_hour, mean, raw_pruned_until, rolled_up_until, set_meta
from monitor.store.schema import (
    BlockCoverageRow,
    ChatOutcomeRow,
    HourlyBlockCoverageRow,
    LatestReachabilityRow,
    HourlyModelStatusRow,
    HourlyObservationsRow,
    HourlyPollsRow,
    HourlyReachabilityRow,
    HourlyRequestsRow,
    ModelStateChangeRow,
    ModelStatusRow,
    Peer,
    PeerPolicyRow,
    PeerScoreRow,
    Poll,
    ReachabilityCheckRow,
    RequestRow,
    ServerObservationRow,
    ServerPingsRow,
    WatchedModel,
)

HOURLY_TABLES = (HourlyPollsRow, HourlyObservationsRow, HourlyModelStatusRow, HourlyBlockCoverageRow,
                 HourlyReachabilityRow, HourlyRequestsRow)


def rollup_and_prune(db: Database, now: float, *, raw_retention_days: float,
                     rollup_retention_days: float) -> dict[str, int]:
    """Aggregate every completed hour not yet rolled up (one transaction per hour), then delete raw
    rows older than ``raw_retention_days`` (whole hours, only rolled-up ones), rollups, chat
    outcomes and state changes older than ``rollup_retention_days``, and what the "now" tables
    hold of peers and models not seen within those retentions. Idempotent; returns counts."""
    current_hour = floor_hour(now)
    hours = 0
    while True:
        with db.write("rolling up") as conn:
            if not _rollup_next_hour(conn, current_hour):
                break
        hours += 1
    counts: dict[str, int] = {"hours_rolled_up": hours}
    with db.write("folding the contribution ledger's hours into days") as conn:
        counts["contribution_hours_folded"] = contributions.fold(conn, now)
    raw_cutoff = min(floor_hour(now - raw_retention_days * DAY), current_hour)
    rollup_cutoff = floor_hour(now - rollup_retention_days * DAY)
    with db.write("pruning raw rows") as conn:
        counts.update(_prune_raw(conn, raw_cutoff))
    with db.write("pruning rollups") as conn:
        counts.update(_prune_rollups(conn, rollup_cutoff, now))
    with db.write("pruning the latest state") as conn:
        counts.update(_prune_now(conn, raw_cutoff, rollup_cutoff))
        counts["assessments"] = prune_assessments(conn, now - ASSESSMENT_RETENTION)
    return counts


def _rollup_next_hour(conn: Connection, current_hour: float) -> bool:
    """Roll up the first hour with data at or after the watermark if it is complete (before
    ``current_hour``) and move the watermark past it; returns False when nothing is left to roll
    up (the watermark then moves to ``current_hour``). The watermark row is locked first, so a late
    write either lands before this reads the hour's rows or sees the new watermark after it."""
    after = rolled_up_until(conn, lock=True)
    hour = _next_hour_with_data(conn, after)
    if hour is None or hour >= current_hour:
        set_meta(conn, WATERMARK, repr(max(after or current_hour, current_hour)))
        return False
    _rollup_hour(conn, hour)
    set_meta(conn, WATERMARK, repr(hour + HOUR))
    return True


def _prune_raw(conn: Connection, cutoff: float) -> dict[str, int]:
    """Delete polls (with everything recorded per poll) and reachability checks older than ``cutoff``, but never
    past the watermark: raw rows go only once they are rolled up."""
    done = rolled_up_until(conn, lock=True)
    if done is None:
        return {}
    cutoff = min(cutoff, done)
    pruned = raw_pruned_until(conn)
    if pruned is None or cutoff > pruned:
        set_meta(conn, PRUNED, repr(cutoff))
    polls = Poll.__table__
    old_polls = sa.select(polls.c.id).where(polls.c.at < cutoff).scalar_subquery()
    counts = {}
    for row in (ServerObservationRow, ServerPingsRow, ModelStatusRow, BlockCoverageRow):
        table = row.__table__
        counts[table.name] = conn.execute(sa.delete(table).where(table.c.poll_id.in_(old_polls))).rowcount
    counts["polls"] = conn.execute(sa.delete(polls).where(polls.c.at < cutoff)).rowcount
    checks = ReachabilityCheckRow.__table__
    counts[checks.name] = conn.execute(sa.delete(checks).where(checks.c.at < cutoff)).rowcount
    counts["server_probes"] = server_probes.prune(conn, cutoff)  # (raw only, no rollup)
    counts["generation_checks"] = generation_checks.prune(conn, cutoff)  # (raw only, no rollup)
    counts["requests"] = requests.prune(conn, cutoff)  # (rolled up: hourly_requests)
    counts["hourly_reachability.rtt_bins"] = aggregates.prune(conn, cutoff)  # (kept as long as raw rows)
    return counts


def _prune_rollups(conn: Connection, cutoff: float, now: float) -> dict[str, int]:
    """Delete rollups, chat outcomes and state changes older than ``cutoff`` (each model's last
    state change stays: it says what state the model is in)."""
    counts = {}
    for row in HOURLY_TABLES:
        table = row.__table__
        counts[table.name] = conn.execute(sa.delete(table).where(table.c.hour < cutoff)).rowcount
    outcomes = ChatOutcomeRow.__table__
    counts["chat_outcomes"] = conn.execute(sa.delete(outcomes).where(outcomes.c.at < cutoff)).rowcount
    counts["contribution_ledger"] = contributions.prune(conn, cutoff, now)  # (the all-time rows stay)
    changes = ModelStateChangeRow.__table__
    latest_change = sa.select(sa.func.max(changes.c.id)).group_by(changes.c.model)
    counts["model_state_changes"] = conn.execute(sa.delete(changes).where(
        changes.c.at < cutoff, changes.c.id.not_in(latest_change))).rowcount
    return counts


def _prune_now(conn: Connection, raw_cutoff: float, rollup_cutoff: float) -> dict[str, int]:
    """The "now" tables keep only what was seen lately: latest reachability checks, scores and watched models
    not refreshed since ``raw_cutoff``; peers not seen since ``rollup_cutoff`` that no row refers to
    (found from the schema's foreign keys, so tables added later are respected); routing policies
    set before ``rollup_cutoff`` for peers no longer known."""
    counts = {}
    for row in (LatestReachabilityRow, PeerScoreRow):
        table = row.__table__
        counts[table.name] = conn.execute(sa.delete(table).where(table.c.at < raw_cutoff)).rowcount
    models = WatchedModel.__table__
    counts[models.name] = conn.execute(sa.delete(models).where(models.c.last_seen < raw_cutoff)).rowcount
    peers = Peer.__table__
    unreferenced = [~sa.exists().where(column == peers.c.id) for column in _columns_referring_to(peers.c.id)]
    counts[peers.name] = conn.execute(sa.delete(peers).where(
        sa.func.coalesce(peers.c.last_seen, peers.c.first_seen, 0.0) < rollup_cutoff, *unreferenced)).rowcount
    policies = PeerPolicyRow.__table__
    counts[policies.name] = conn.execute(sa.delete(policies).where(
        policies.c.at < rollup_cutoff, policies.c.peer_id.not_in(sa.select(peers.c.peer_id)))).rowcount
    return counts


def _columns_referring_to(key: sa.Column) -> list[sa.Column]:
    """Every column of the schema with a foreign key to ``key``."""
    return [fk.parent for table in key.table.metadata.sorted_tables for fk in table.foreign_keys
            if fk.column is key]


# ---- one hour --------------------------------------------------------------------------------


def _rollup_hour(conn: Connection, hour: float) -> None:
    """Aggregate the raw rows of [hour, hour + 1 h) into the hourly tables (replacing any)."""
    end = hour + HOUR
    for row in HOURLY_TABLES:
        table = row.__table__
        conn.execute(sa.delete(table).where(table.c.hour == hour))
    p = Poll.__table__.c
    polls = conn.execute(sa.select(p.id, p.at, p.ok, p.duration).where(p.at >= hour, p.at < end)).all()
    if polls:
        conn.execute(sa.insert(HourlyPollsRow.__table__).values(
            hour=hour, polls=len(polls), ok_polls=sum(1 for r in polls if r.ok),
            mean_duration=sum(r.duration or 0 for r in polls) / len(polls)))
    ok_times = sorted(r.at for r in polls if r.ok)
    in_hour = sa.select(p.id).where(p.at >= hour, p.at < end, p.ok).scalar_subquery()
    ok_polls = sorted((r.at, r.id) for r in polls if r.ok)
    pairs = [(before, after_at) for (_, before), (after_at, _) in zip(ok_polls, ok_polls[1:])]
    _insert_rows(conn, HourlyObservationsRow, _observation_rows(conn, hour, in_hour, ok_times, pairs))
    _insert_rows(conn, HourlyModelStatusRow, _status_rows(conn, hour, in_hour))
    _insert_rows(conn, HourlyBlockCoverageRow, _block_rows(conn, hour, in_hour))
    _insert_rows(conn, HourlyReachabilityRow, _reachability_rows(conn, hour, end))
    _insert_rows(conn, HourlyRequestsRow, requests.hour_rows(conn, hour, end))


def _insert_rows(conn: Connection, row, rows: list[dict]) -> None:
    if rows:
        conn.execute(sa.insert(row.__table__), rows)


def _observation_rows(conn: Connection, hour: float, in_hour, ok_times: list[float],
                      pairs: list[tuple[int, float]]) -> list[dict]:
    """Per (peer, model): the hour's counts, and its flaps between the hour's consecutive ok polls
    (``pairs``: poll id, time of the next; ``aggregates.departures``), for the scores."""
    o, peers = ServerObservationRow.__table__.c, Peer.__table__
    groups = conn.execute(
        sa.select(o.peer, o.model, sa.func.max(peers.c.first_seen), sa.func.count(),
                  count_if(o.state == ONLINE), count_if(o.state == JOINING),
                  sa.func.avg(o.throughput), sa.func.avg(o.inference_rps), sa.func.min(o.start),
                  sa.func.max(o.end))
        .join(peers, peers.c.id == o.peer).where(o.poll_id.in_(in_hour)).group_by(o.peer, o.model)
    ).all()
    rows = []
    for peer, model, first_seen, samples, online, joining, thr, rps, start, stop in groups:
        # ok polls in the hour since the peer first appeared: the ones that could have seen it
        since_first = len(ok_times) - bisect.bisect_left(ok_times, first_seen if first_seen is not None else hour)
        rows.append({"peer": peer, "model": model, "hour": hour, "polls": max(since_first, samples),
                     "samples": samples, "online": int(online or 0), "joining": int(joining or 0),
                     "mean_throughput": thr, "mean_inference_rps": rps, "min_start": start, "max_end": stop})
    flaps = aggregates.departures(conn, pairs)
    for row in rows:
        row["flap_chances"], row["flaps"] = flaps.get((row["peer"], row["model"]), (0, 0))
    return rows


def _status_rows(conn: Connection, hour: float, in_hour) -> list[dict]:
    s = ModelStatusRow.__table__.c
    by_model: dict[str, list] = {}
    for r in conn.execute(sa.select(s.model, s.state, s.reasons, s.coverage_pct, s.servers_online,
                                    s.min_redundancy, s.est_tokens_per_s)
                          .where(s.poll_id.in_(in_hour)).order_by(s.at)):
        by_model.setdefault(r.model, []).append(r)
    rows = []
    for model, items in by_model.items():
        states: dict[str, int] = {}
        reasons: list[str] = []
        for r in items:
            states[r.state] = states.get(r.state, 0) + 1
            reasons.extend(x for x in (r.reasons or ()) if x not in reasons)
        rows.append({
            "model": model, "hour": hour, "samples": len(items), "states": states,
            "worst_state": max(states, key=lambda st: STATE_SEVERITY.get(st, 1)), "reasons": reasons[:20],
            "mean_coverage_pct": mean(r.coverage_pct for r in items),
            "mean_servers_online": mean(r.servers_online for r in items),
            "min_redundancy": min((r.min_redundancy for r in items if r.min_redundancy is not None), default=None),
            "mean_tokens_per_s": mean(r.est_tokens_per_s for r in items),
        })
    return rows


def _block_rows(conn: Connection, hour: float, in_hour) -> list[dict]:
    b = BlockCoverageRow.__table__.c
    by_model: dict[str, list] = {}
    for r in conn.execute(sa.select(b.model, b.servers, b.throughput).where(b.poll_id.in_(in_hour))):
        by_model.setdefault(r.model, []).append(r)
    rows = []
    for model, items in by_model.items():
        servers = _columns([r.servers or [] for r in items])
        throughput = _columns([r.throughput or [] for r in items])
        rows.append({"model": model, "hour": hour, "samples": len(items),
                     "min_servers": [min(c, default=None) for c in servers],
                     "mean_servers": [mean(c) for c in servers],
                     "min_throughput": [min(c, default=None) for c in throughput],
                     "mean_throughput": [mean(c) for c in throughput]})
    return rows


def _reachability_rows(conn: Connection, hour: float, end: float) -> list[dict]:
    """Per peer: reachability checks, ok, JOINING, the mean RTT, and for the scores the RTT histogram and the
    latest failure's error (``aggregates.reachability_bins``)."""
    rows = []
    for peer, found in aggregates.reachability_bins(conn, [(hour, end)], math.inf).items():
        timed = sum(n for _, n, _ in found["bins"])
        rows.append({"peer": peer, "hour": hour, "n": found["n"], "ok": found["ok"], "joining": found["joining"],
                     "mean_rtt": sum(total for _, _, total in found["bins"]) / timed if timed else None,
                     "rtt_bins": [x for index, n, total in found["bins"] for x in (index, n, round(total, 6))],  # flat
                     "last_error": found["error"][1] if found["error"] else None})
    return rows


def _next_hour_with_data(conn: Connection, after: Optional[float]) -> Optional[float]:
    """The start of the first hour at or after ``after`` that has polls, reachability checks or requests."""
    candidates = []
    for column in (Poll.__table__.c.at, ReachabilityCheckRow.__table__.c.at, RequestRow.__table__.c.at):
        query = sa.select(sa.func.min(column))
        if after is not None:
            query = query.where(column >= after)
        value = conn.execute(query).scalar()
        if value is not None:
            candidates.append(value)
    return floor_hour(min(candidates)) if candidates else None


def _columns(arrays: list[list]) -> list[list]:
    """Per block, the values of every poll that reported that block."""
    n = max((len(a) for a in arrays), default=0)
    return [[a[i] for a in arrays if i < len(a) and a[i] is not None] for i in range(n)]
