"""Writes: what each poll, probe round, score refresh and chat request saw, and operators' peer policies.

Three kinds of process write: the poller (polls, diagnoses, probes, scores, rollups), the chat
(outcomes of its requests) and the web (peer policies set from a peer's page). Every function
here runs inside one write transaction (``Database.write``) that the caller opens, so a reader
never sees half of a poll.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR, finite, jsonable
from monitor.core.diagnosis import ModelHealth
from monitor.core.scores import PeerScore
from monitor.core.snapshot import ChatOutcome, ModelInfo, ProbeBatch, ServerRow, Snapshot
from monitor.store.engine import insert
from monitor.store.schema import (
    PEER_POLICIES,
    BlockCoverageRow,
    ChatOutcomeRow,
    LatestDiagnosisRow,
    LatestProbeRow,
    ModelStateChangeRow,
    ModelStatusRow,
    Peer,
    PeerPolicyRow,
    PeerScoreRow,
    Poll,
    ProbeRow,
    ServerObservationRow,
    ServerPingsRow,
    WatchedModel,
)

# next_pings (up to 10 peer ids + RTTs per server, ~0.75 kB) are kept this long: only the latest
# snapshot needs them, and per observation they would double the raw table.
PINGS_RETENTION = HOUR
_CHUNK = 200  # rows per multi-VALUES statement / ids per IN list (SQLite's variable limit)


# ---- polls -----------------------------------------------------------------------------------


def record_poll(conn: Connection, snapshot: Snapshot, healths: Sequence[ModelHealth]) -> int:
    """One successful poll: its servers, and per model the status row, the block coverage arrays
    and the diagnosis, all derived from the model's ``ModelHealth``. Returns the poll id."""
    at = snapshot.taken_at
    poll_id = conn.execute(sa.insert(Poll.__table__).values(
        at=at, duration=snapshot.duration, n_models=len(snapshot.models),
        n_servers=len(snapshot.servers), invalid_records=snapshot.invalid_records,
        errors=list(snapshot.errors), models=[m.dht_prefix for m in snapshot.models], ok=True,
    ).returning(Poll.__table__.c.id)).scalar_one()
    _upsert_models(conn, snapshot.models, at)
    _record_servers(conn, poll_id, at, snapshot.servers)
    if healths:
        statuses = [_status_row(health) for health in healths]
        conn.execute(sa.insert(ModelStatusRow.__table__), [{**s, "poll_id": poll_id, "at": at} for s in statuses])
        _record_state_changes(conn, at, statuses)
        conn.execute(sa.insert(BlockCoverageRow.__table__), [
            {"poll_id": poll_id, "model": health.model, "at": at,
             "servers": [int(b.online) for b in health.blocks],
             "throughput": [float(b.total_throughput) for b in health.blocks]}
            for health in healths
        ])
        replace_diagnoses(conn, poll_id, healths)  # (older ones go: they belong to an older poll)
    return poll_id


def record_failed_poll(conn: Connection, at: float, error: str, duration: float) -> int:
    """A poll that could not scrape: kept (with its error) so gaps are explained; no rows."""
    t = Poll.__table__
    return conn.execute(sa.insert(t).values(at=at, duration=duration, errors=[str(error)], models=[], ok=False)
                        .returning(t.c.id)).scalar_one()


def replace_diagnoses(conn: Connection, poll_id: int, healths: Iterable[ModelHealth]) -> None:
    """The diagnoses of poll ``poll_id`` replace every stored one (only the latest poll's are kept)."""
    t = LatestDiagnosisRow.__table__
    conn.execute(sa.delete(t))
    written = time.time()
    rows = [{"model": h.model, "poll_id": poll_id, "at": written, "diagnosis": h.to_dict()} for h in healths]
    if rows:
        conn.execute(sa.insert(t), rows)


def _status_row(health: ModelHealth) -> dict:
    return {"model": health.model, "state": health.state, "reasons": list(health.reasons),
            "coverage_pct": health.coverage_pct, "servers_online": health.servers_online,
            "min_redundancy": health.min_redundancy, "est_tokens_per_s": finite(health.est_tokens_per_s)}


def _record_servers(conn: Connection, poll_id: int, at: float, servers: Sequence[ServerRow]) -> None:
    keys = _upsert_seen_peers(conn, servers, at)
    observations, pings = [], []
    for row in servers:
        peer = keys[row.peer_id]
        observations.append({
            "poll_id": poll_id, "at": at, "model": row.model, "peer": peer, "state": row.state,
            "start": row.start, "end": row.end, "throughput": row.throughput,
            "inference_rps": row.inference_rps, "forward_rps": row.forward_rps,
            "network_rps": row.network_rps, "cache_tokens_left": row.cache_tokens_left,
            "version": row.version, "torch_dtype": row.torch_dtype, "quant_type": row.quant_type,
            "using_relay": row.using_relay, "public_name": row.public_name,
            "adapters": list(row.adapters) or None,
        })
        if row.next_pings:
            pings.append({"poll_id": poll_id, "at": at, "peer": peer, "model": row.model,
                          "next_pings": _pings_to_json(row.next_pings)})
    if observations:
        conn.execute(sa.insert(ServerObservationRow.__table__), observations)
    t = ServerPingsRow.__table__
    if pings:
        conn.execute(sa.insert(t), pings)
    conn.execute(sa.delete(t).where(t.c.at < at - PINGS_RETENTION))


def _record_state_changes(conn: Connection, at: float, statuses: list[dict]) -> None:
    t = ModelStateChangeRow.__table__
    c = t.c
    changes = []
    for status in statuses:
        before = conn.execute(sa.select(c.to_state).where(c.model == status["model"])
                              .order_by(c.at.desc(), c.id.desc()).limit(1)).scalar()
        if before != status["state"]:
            changes.append({"at": at, "model": status["model"], "from_state": before,
                            "to_state": status["state"], "reasons": status["reasons"]})
    if changes:
        conn.execute(sa.insert(t), changes)


def _upsert_models(conn: Connection, models: Sequence[ModelInfo], at: float) -> None:
    if not models:
        return
    table = WatchedModel.__table__
    t = table.c
    rows = {m.dht_prefix: {"dht_prefix": m.dht_prefix, "num_blocks": m.num_blocks, "repository": m.repository,
                           "name": m.name, "official": m.official, "first_seen": at, "last_seen": at}
            for m in models}
    stmt = insert(conn, table).values(list(rows.values()))
    ex = stmt.excluded
    conn.execute(stmt.on_conflict_do_update(index_elements=["dht_prefix"], set_={
        "num_blocks": sa.case((ex.num_blocks > 0, ex.num_blocks), else_=t.num_blocks),
        "repository": sa.func.coalesce(ex.repository, t.repository),
        "name": sa.func.coalesce(ex.name, t.name),
        "official": ex.official,
        "first_seen": sa.case((ex.first_seen < t.first_seen, ex.first_seen), else_=t.first_seen),
        "last_seen": sa.case((ex.last_seen > t.last_seen, ex.last_seen), else_=t.last_seen),
    }))


def _upsert_seen_peers(conn: Connection, servers: Sequence[ServerRow], at: float) -> dict[str, int]:
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
    conn.execute(stmt, [{"peer_id": p, "first_seen": at, "last_seen": at, "public_name": n}
                        for p, n in names.items()])
    return peer_keys(conn, names)


def peer_keys(conn: Connection, peer_ids: Iterable[str]) -> dict[str, int]:
    """Keys of these peers, adding the unknown ones (not marked seen: they were probed or chatted)."""
    table = Peer.__table__
    wanted = list(dict.fromkeys(peer_ids))
    keys: dict[str, int] = {}
    for chunk in _chunks(wanted):
        keys.update({p: k for k, p in conn.execute(sa.select(table.c.id, table.c.peer_id)
                                                   .where(table.c.peer_id.in_(chunk)))})
    missing = [p for p in wanted if p not in keys]
    for chunk in _chunks(missing):
        stmt = insert(conn, table).values([{"peer_id": p} for p in chunk])
        stmt = stmt.on_conflict_do_update(index_elements=["peer_id"], set_={"peer_id": stmt.excluded.peer_id})
        keys.update({p: k for k, p in conn.execute(stmt.returning(table.c.id, table.c.peer_id))})
    return keys


# ---- probes, chat outcomes, scores, policies -------------------------------------------------


def record_probes(conn: Connection, batch: ProbeBatch) -> None:
    at = batch.taken_at
    keys = peer_keys(conn, [r.peer_id for r in batch.results])
    rows = [{"at": at, "peer": keys[r.peer_id], "kind": r.kind, "ok": r.ok, "rtt": r.rtt,
             "error": r.error, "joining": r.joining, "address": r.address} for r in batch.results]
    conn.execute(sa.insert(ProbeRow.__table__), rows)
    latest = LatestProbeRow.__table__
    stmt = insert(conn, latest)
    stmt = stmt.on_conflict_do_update(
        index_elements=["peer"],
        set_={name: stmt.excluded[name] for name in ("at", "kind", "ok", "rtt", "error", "joining", "address")},
        where=latest.c.at <= stmt.excluded.at,  # a late batch does not replace a newer probe
    )
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
