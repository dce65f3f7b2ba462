"""Writes: what each poll, reachability round, score refresh and chat request saw, and operators' peer
policies (a probe round's rows: ``server_probes``).

Three kinds of process write: the poller (polls, diagnoses, reachability checks, scores, rollups), the
chat (outcomes of its requests) and the web (peer policies set from a peer's page). Every function
here runs inside one write transaction (``Database.write``) that the caller opens, so a reader
never sees half of a poll.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR, finite, jsonable, short_error, short_peer_id
from monitor.core.assessment import Assessment
from monitor.core.scores import PeerScore
from monitor.core.snapshot import ChatOutcome, ModelInfo, ReachabilityBatch, ServerRow, Snapshot
from monitor.core import contributions as ledger
from monitor.store import contributions
from monitor.store.engine import Refused, insert, insert_rows
from monitor.store.schema import (
    PEER_POLICIES,
    BlockCoverageRow,
    ChatOutcomeRow,
    AssessmentRow,
    LatestReachabilityRow,
    ModelStateChangeRow,
    ModelStatusRow,
    Peer,
    PeerPolicyRow,
    PeerScoreRow,
    Poll,
    ReachabilityCheckRow,
    ServerObservationRow,
    ServerPingsRow,
    WatchedModel,
)

# next_pings (up to 10 peer ids + RTTs per server, ~0.75 kB) are kept this long: only the latest
# snapshot needs them, and per observation they would double the raw table.
PINGS_RETENTION = HOUR
_CHUNK = 200  # rows per multi-VALUES statement / ids per IN list (SQLite's variable limit)
FAILED_POLL_ERROR_CHARS = 1000  # a failed poll's cause, one line
MAX_NAMED_REFUSALS = 10  # refused rows named one by one in a poll's errors; the rest are counted

log = logging.getLogger(__name__)

# assessments per poll are kept this long (``model_status`` keeps the states' history); pruned with
# every poll, so at 500 servers (~1 MiB a poll, BENCHMARKS.md "assessment") and 60 s polls they hold ~60 MiB
ASSESSMENT_RETENTION = 3600.0


# ---- polls -----------------------------------------------------------------------------------


@dataclass
class PollWritten:
    """What writing one poll stored, bounded and left out."""

    poll_id: int
    bounded: int = 0  # non-finite numbers stored as NULL (the DHT edge bounds the rest)
    dropped: int = 0  # rows the database refused (and rows that needed a refused row)
    refusals: list[str] = field(default_factory=list)  # one line per refused row: what, and why

    def finite(self, value: Optional[float]) -> Optional[float]:
        """The value if finite; NaN and infinities become NULL, counted."""
        kept = finite(value)
        if kept is None and value is not None:
            self.bounded += 1
        return kept

    def refused(self, refusals: Sequence[Refused], name: Callable[[dict], str]) -> None:
        self.dropped += len(refusals)
        self.refusals.extend(f"{name(r.row)} was not stored: the database refused it ({r.error})" for r in refusals)

    def error_lines(self) -> list[str]:
        """The refusals as the poll's errors: the first ``MAX_NAMED_REFUSALS`` named, the rest counted."""
        lines = self.refusals[:MAX_NAMED_REFUSALS]
        if self.dropped > len(lines):
            lines.append(f"{self.dropped - len(lines)} more rows of this poll were not stored "
                         f"(the database refused them)")
        return lines


def record_poll(conn: Connection, snapshot: Snapshot, assessments: Sequence[Assessment]) -> PollWritten:
    """One successful poll: its servers, and per model the status row, the block coverage arrays
    and the diagnosis, all derived from the model's ``Assessment``.

    A row the database refuses costs that row, not the poll (``engine.insert_rows``): it is left
    out, counted in ``polls.dropped_rows`` and named in ``polls.errors``; non-finite numbers are
    stored as NULL and counted in ``polls.clamped_values`` (with what the DHT edge bounded)."""
    at = snapshot.taken_at
    t = Poll.__table__
    errors = list(snapshot.errors)
    _credit_last_poll(conn, at)
    written = PollWritten(conn.execute(sa.insert(t).values(
        at=at, duration=finite(snapshot.duration) or 0.0, n_models=len(snapshot.models),
        n_servers=len(snapshot.servers), invalid_records=snapshot.invalid_records, errors=errors,
        models=[m.dht_prefix for m in snapshot.models], ok=True, clamped_values=snapshot.clamped_values,
        ledger_basis=ledger.basis(at, snapshot.servers, {h.model: h for h in assessments}),
    ).returning(t.c.id)).scalar_one())
    _upsert_models(conn, written, snapshot.models, at)
    _record_servers(conn, written, at, snapshot.servers)
    if assessments:
        _record_verdicts(conn, written, at, assessments)
    if written.bounded or written.dropped:
        conn.execute(sa.update(t).where(t.c.id == written.poll_id).values(
            clamped_values=snapshot.clamped_values + written.bounded, dropped_rows=written.dropped,
            errors=errors + written.error_lines()))
    return written


def _credit_last_poll(conn: Connection, until: float) -> None:
    """The contribution ledger earns the last poll's servers their time until this one; a ledger
    the database refuses costs the ledger that interval, never the poll (logged)."""
    try:
        with conn.begin_nested():
            contributions.after_poll(conn, until)
    except sa.exc.SQLAlchemyError as e:
        log.warning("the contribution ledger missed the interval until the poll at %s: %s", until, short_error(str(e)))


def record_failed_poll(conn: Connection, at: float, error: str, duration: float) -> int:
    """A poll that could not scrape or be stored: kept (with its error) so gaps are explained; no rows."""
    t = Poll.__table__
    return conn.execute(sa.insert(t).values(
        at=at, duration=finite(duration) or 0.0, errors=[short_error(error, FAILED_POLL_ERROR_CHARS)], models=[],
        ok=False).returning(t.c.id)).scalar_one()


def record_assessments(conn: Connection, taken_at: float, assessments: Iterable[Assessment]) -> bool:
    """A later assessment of the poll taken at ``taken_at`` (after a reachability or probe round, a
    generation check) replaces that poll's, if it is still the latest successful poll; a newer poll
    keeps its own (False)."""
    p = Poll.__table__.c
    latest = conn.execute(sa.select(p.id, p.at).where(p.ok).order_by(p.at.desc(), p.id.desc()).limit(1)).first()
    if latest is None or latest.at != taken_at:
        return False
    assessments = list(assessments)
    replace_assessments(conn, latest.id, assessments)
    contributions.rejudge(conn, latest.id, taken_at, {a.model: a for a in assessments})
    return True


def prune_assessments(conn: Connection, cutoff: float) -> int:
    """Delete assessments made before ``cutoff``, except the latest poll's (what every reader reads,
    however old: a poller stopped for a day still shows its last verdict)."""
    t, polls = AssessmentRow.__table__, Poll.__table__
    latest = sa.select(sa.func.max(polls.c.id)).where(polls.c.ok).scalar_subquery()
    return conn.execute(sa.delete(t).where(t.c.at < cutoff, t.c.poll_id != latest)).rowcount


def replace_assessments(conn: Connection, poll_id: int, assessments: Iterable[Assessment],
                        written: Optional[PollWritten] = None) -> None:
    """The assessments of poll ``poll_id`` (each model's replaces the one stored for that poll); one
    the database refuses is left out (the pages then say that model is not diagnosed)."""
    t = AssessmentRow.__table__
    at = time.time()
    rows = [{"model": a.model, "poll_id": poll_id, "at": a.assessed_at or at, "assessment": a.to_dict()}
            for a in assessments]
    conn.execute(sa.delete(t).where(t.c.poll_id == poll_id, t.c.model.in_([r["model"] for r in rows])))
    _, refused = insert_rows(conn, sa.insert(t), rows)
    if written is not None:
        written.refused(refused, lambda r: f"the assessment of model {r['model']}")
    elif refused:
        log.warning("poll %s: assessments not stored: %s", poll_id,
                    "; ".join(f"{r.row['model']}: {r.error}" for r in refused))


def _record_verdicts(conn: Connection, written: PollWritten, at: float, assessments: Sequence[Assessment]) -> None:
    """Per model: the status row (and a state change if it changed), the block coverage arrays and
    the whole diagnosis."""
    poll_id = written.poll_id
    statuses, refused = insert_rows(conn, sa.insert(ModelStatusRow.__table__), [
        {**_status_row(assessment, written), "poll_id": poll_id, "at": at} for assessment in assessments])
    written.refused(refused, lambda r: f"the status of model {r['model']}")
    _record_state_changes(conn, written, at, statuses)
    _, refused = insert_rows(conn, sa.insert(BlockCoverageRow.__table__), [
        {"poll_id": poll_id, "model": assessment.model, "at": at,
         "servers": [int(b.online) for b in assessment.blocks],
         "throughput": [written.finite(b.total_throughput) for b in assessment.blocks]}
        for assessment in assessments
    ])
    written.refused(refused, lambda r: f"the block coverage of model {r['model']}")
    replace_assessments(conn, poll_id, assessments, written)
    prune_assessments(conn, at - ASSESSMENT_RETENTION)  # (each poll: their size is bounded by polls, not hours)


def _status_row(assessment: Assessment, written: PollWritten) -> dict:
    return {"model": assessment.model, "state": assessment.state, "reasons": list(assessment.reasons),
            "coverage_pct": written.finite(assessment.coverage_pct), "servers_online": assessment.servers_online,
            "min_redundancy": assessment.min_redundancy, "est_tokens_per_s": finite(assessment.est_tokens_per_s)}


def _record_servers(conn: Connection, written: PollWritten, at: float, servers: Sequence[ServerRow]) -> None:
    keys = _upsert_seen_peers(conn, written, servers, at)
    ids = {key: peer for peer, key in keys.items()}
    observations, pings, orphans = [], [], 0
    for row in servers:
        peer = keys.get(row.peer_id)
        if peer is None:  # its peer row was refused (named): the rows that need it go too
            orphans += 1
            continue
        observations.append({
            "poll_id": written.poll_id, "at": at, "model": row.model, "peer": peer, "state": row.state,
            "start": row.start, "end": row.end, "throughput": written.finite(row.throughput),
            "inference_rps": written.finite(row.inference_rps), "forward_rps": written.finite(row.forward_rps),
            "network_rps": written.finite(row.network_rps), "cache_tokens_left": row.cache_tokens_left,
            "version": row.version, "torch_dtype": row.torch_dtype, "quant_type": row.quant_type,
            "using_relay": row.using_relay, "public_name": row.public_name,
            "adapters": list(row.adapters) or None,
        })
        if row.next_pings:
            pings.append({"poll_id": written.poll_id, "at": at, "peer": peer, "model": row.model,
                          "next_pings": _pings_to_json(row.next_pings)})
    written.dropped += orphans

    def server(r: dict) -> str:
        blocks = f" (blocks {r['start']}:{r['end']})" if "start" in r else ""
        return f"server {short_peer_id(ids.get(r['peer']))} of {r['model']}{blocks}"

    stored, refused = insert_rows(conn, sa.insert(ServerObservationRow.__table__), observations)
    written.refused(refused, server)
    stored_keys = {(r["peer"], r["model"]) for r in stored}
    t = ServerPingsRow.__table__
    pings = [p for p in pings if (p["peer"], p["model"]) in stored_keys]
    _, refused = insert_rows(conn, sa.insert(t), pings)
    written.refused(refused, lambda r: f"the next_pings of {server(r)}")
    conn.execute(sa.delete(t).where(t.c.at < at - PINGS_RETENTION))


def _record_state_changes(conn: Connection, written: PollWritten, at: float, statuses: list[dict]) -> None:
    t = ModelStateChangeRow.__table__
    c = t.c
    changes = []
    for status in statuses:
        before = conn.execute(sa.select(c.to_state).where(c.model == status["model"])
                              .order_by(c.at.desc(), c.id.desc()).limit(1)).scalar()
        if before != status["state"]:
            changes.append({"at": at, "model": status["model"], "from_state": before,
                            "to_state": status["state"], "reasons": status["reasons"]})
    _, refused = insert_rows(conn, sa.insert(t), changes)
    written.refused(refused, lambda r: f"the state change of model {r['model']}")


def _upsert_models(conn: Connection, written: PollWritten, models: Sequence[ModelInfo], at: float) -> None:
    table = WatchedModel.__table__
    t = table.c
    rows = {m.dht_prefix: {"dht_prefix": m.dht_prefix, "num_blocks": m.num_blocks, "repository": m.repository,
                           "name": m.name, "official": m.official, "first_seen": at, "last_seen": at}
            for m in models}
    stmt = insert(conn, table)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(index_elements=["dht_prefix"], set_={
        "num_blocks": sa.case((ex.num_blocks > 0, ex.num_blocks), else_=t.num_blocks),
        "repository": sa.func.coalesce(ex.repository, t.repository),
        "name": sa.func.coalesce(ex.name, t.name),
        "official": ex.official,
        "first_seen": sa.case((ex.first_seen < t.first_seen, ex.first_seen), else_=t.first_seen),
        "last_seen": sa.case((ex.last_seen > t.last_seen, ex.last_seen), else_=t.last_seen),
    })
    _, refused = insert_rows(conn, stmt, list(rows.values()))
    written.refused(refused, lambda r: f"model {r['dht_prefix']}")


def _upsert_seen_peers(conn: Connection, written: PollWritten, servers: Sequence[ServerRow],
                       at: float) -> dict[str, int]:
    """Mark the poll's peers seen (with their latest public name); returns their keys. A peer whose
    row the database refuses keeps its stored row if it has one, else it has no key."""
    names: dict[str, Optional[str]] = {}
    for row in servers:
        if names.get(row.peer_id) is None:
            names[row.peer_id] = row.public_name
    if not names:
        return {}
    table = Peer.__table__
    t = table.c
    stmt = insert(conn, table)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(index_elements=["peer_id"], set_={
        "first_seen": sa.case((t.first_seen.is_(None), ex.first_seen),
                              (ex.first_seen < t.first_seen, ex.first_seen), else_=t.first_seen),
        "last_seen": sa.case((t.last_seen.is_(None), ex.last_seen),
                             (ex.last_seen > t.last_seen, ex.last_seen), else_=t.last_seen),
        "public_name": sa.func.coalesce(ex.public_name, t.public_name),
    })
    # executemany: one statement compiled once (SQLAlchemy batches the rows itself); a
    # multi-row .values([...]) was compiled anew for every poll
    _, refused = insert_rows(conn, stmt, [{"peer_id": p, "first_seen": at, "last_seen": at, "public_name": n}
                                          for p, n in names.items()])
    written.refused(refused, lambda r: f"peer {short_peer_id(r['peer_id'])}")
    return _select_keys(conn, names)


def peer_keys(conn: Connection, peer_ids: Iterable[str]) -> dict[str, int]:
    """Keys of these peers, adding the unknown ones (not marked seen: they were only checked or chatted)."""
    table = Peer.__table__
    wanted = list(dict.fromkeys(peer_ids))
    keys = _select_keys(conn, wanted)
    missing = [p for p in wanted if p not in keys]
    for chunk in _chunks(missing):
        stmt = insert(conn, table).values([{"peer_id": p} for p in chunk])
        stmt = stmt.on_conflict_do_update(index_elements=["peer_id"], set_={"peer_id": stmt.excluded.peer_id})
        keys.update({p: k for k, p in conn.execute(stmt.returning(table.c.id, table.c.peer_id))})
    return keys


def _select_keys(conn: Connection, peer_ids: Iterable[str]) -> dict[str, int]:
    table = Peer.__table__
    keys: dict[str, int] = {}
    for chunk in _chunks(list(peer_ids)):
        keys.update({p: k for k, p in conn.execute(sa.select(table.c.id, table.c.peer_id)
                                                   .where(table.c.peer_id.in_(chunk)))})
    return keys


# ---- reachability checks, chat outcomes, scores, policies ------------------------------------


def record_reachability(conn: Connection, batch: ReachabilityBatch) -> None:
    """A reachability round; a check the database refuses costs that check (logged), not the round."""
    at = batch.taken_at
    keys = peer_keys(conn, [r.peer_id for r in batch.results])
    rows = [{"at": at, "peer": keys[r.peer_id], "kind": r.kind, "ok": r.ok, "rtt": finite(r.rtt),
             "error": r.error, "joining": r.joining, "address": r.address} for r in batch.results]
    rows, refused = insert_rows(conn, sa.insert(ReachabilityCheckRow.__table__), rows)
    if refused:
        log.warning("reachability round at %s: %d checks were not stored: %s", at, len(refused),
                    "; ".join(r.error for r in refused[:MAX_NAMED_REFUSALS]))
    latest = LatestReachabilityRow.__table__
    stmt = insert(conn, latest)
    stmt = stmt.on_conflict_do_update(
        index_elements=["peer"],
        set_={name: stmt.excluded[name] for name in ("at", "kind", "ok", "rtt", "error", "joining", "address")},
        where=latest.c.at <= stmt.excluded.at,  # a late batch does not replace a newer check
    )
    if rows:
        conn.execute(stmt, list({row["peer"]: row for row in rows}.values()))


def record_chat_outcomes(conn: Connection, outcomes: Sequence[ChatOutcome]) -> None:
    keys = peer_keys(conn, [o.peer_id for o in outcomes])
    conn.execute(sa.insert(ChatOutcomeRow.__table__), [
        {"at": o.at, "peer": keys[o.peer_id], "model": o.model, "start": o.start, "end": o.end,
         "ok": o.ok, "seconds_per_token": o.seconds_per_token, "error": o.error}
        for o in outcomes
    ])


def record_scores(conn: Connection, scores: Sequence[PeerScore], default_at: float) -> None:
    """Each peer's latest score replaces its previous one; a score without ``at`` gets ``default_at``."""
    keys = peer_keys(conn, [s.peer_id for s in scores])
    table = PeerScoreRow.__table__
    stmt = insert(conn, table)
    stmt = stmt.on_conflict_do_update(
        index_elements=["peer"],
        set_={name: stmt.excluded[name] for name in ("at", "score", "explanation", "components")},
    )
    conn.execute(stmt, [
        {"peer": keys[s.peer_id], "at": default_at if s.at is None else s.at, "score": float(s.score),
         "explanation": list(s.explanation), "components": jsonable(s.to_dict()["components"])}
        for s in scores
    ])


def set_peer_policy(conn: Connection, peer_id: str, policy: Optional[str], at: float) -> None:
    if policy is not None and policy not in PEER_POLICIES:
        raise ValueError(f"peer policy must be one of {PEER_POLICIES} or None, got {policy!r}")
    t = PeerPolicyRow.__table__
    conn.execute(sa.delete(t).where(t.c.peer_id == peer_id))
    if policy is not None:
        conn.execute(sa.insert(t).values(peer_id=peer_id, policy=policy, at=at))


# ---- helpers ---------------------------------------------------------------------------------


def _chunks(items: Sequence, size: int = _CHUNK) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _pings_to_json(pings: Mapping[str, float]) -> dict:
    """petals announces an unreachable next server as an infinite RTT; JSON (PostgreSQL's
    in particular) has no Infinity, so it is stored as null (``latest.pings_from_json`` undoes it)."""
    return {peer: (rtt if rtt is not None and math.isfinite(rtt) else None) for peer, rtt in pings.items()}
