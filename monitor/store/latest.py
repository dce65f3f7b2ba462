"""Reads of the latest state: the latest poll as a ``Snapshot``, each peer's latest reachability check
and score, each model's latest status and diagnosis, and the marks that say whether any of it changed.

What the pages, the API, /metrics and the chat's router read on every request, so each is one or a
few indexed queries (the tables ``latest_reachability``, ``peer_scores`` and ``assessments`` hold one
row per peer or model for that reason). Every function takes a connection inside a read transaction.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.assessment import Assessment
from monitor.core.scores import PeerScore
from monitor.core.snapshot import ChatOutcome, ModelInfo, ReachabilityResult, ServerRow, Snapshot
from monitor.store.schema import (
    ChatOutcomeRow,
    GenerationCheckRow,
    AssessmentRow,
    LatestReachabilityRow,
    ModelStatusRow,
    MuteChangeRow,
    Peer,
    PeerPolicyRow,
    PeerScoreRow,
    Poll,
    ServerObservationRow,
    ServerPingsRow,
    WatchedModel,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PollSummary:
    id: int
    at: float
    duration: float
    n_models: int
    n_servers: int
    invalid_records: int
    errors: tuple[str, ...]
    ok: bool
    clamped_values: int = 0  # announced values bounded to what we store
    dropped_rows: int = 0  # rows the database refused (named in ``errors``)


@dataclass(frozen=True)
class LatestState:
    """What ``Store.latest_state`` reads in one transaction: the latest poll and what was judged of it."""

    snapshot: Optional[Snapshot]  # the latest successful poll
    reachability: dict  # peer id -> its latest ReachabilityResult
    assessments: dict  # model -> its newest Assessment of that poll
    scores: dict  # peer id -> its latest PeerScore
    generation: dict  # model -> its newest GenerationCheck
    last_poll: Optional[PollSummary]  # the latest poll, ok or failed


def last_poll(conn: Connection) -> Optional[PollSummary]:
    """The latest poll, failed or not."""
    t = Poll.__table__
    row = conn.execute(sa.select(t).order_by(t.c.at.desc(), t.c.id.desc()).limit(1)).mappings().first()
    if row is None:
        return None
    return PollSummary(id=row["id"], at=row["at"], duration=row["duration"], n_models=row["n_models"],
                       n_servers=row["n_servers"], invalid_records=row["invalid_records"],
                       errors=tuple(row["errors"] or ()), ok=bool(row["ok"]),
                       clamped_values=row["clamped_values"] or 0, dropped_rows=row["dropped_rows"] or 0)


def change_marks(conn: Connection) -> tuple:
    """Fingerprints of everything the pages derive from the latest state (the last poll, the last
    reachability round, the last score refresh, the last diagnosis, the last generation check, the last
    change to a silence or maintenance window), in one cheap query: a reader may reuse what it
    derived while they stay the same. Poll ids only grow; the per-peer and per-model tables are
    counted too, as rows can leave them."""
    def scalar(expression, table):
        return sa.select(expression).select_from(table).scalar_subquery()

    polls, mute_changes = Poll.__table__, MuteChangeRow.__table__
    per_peer_or_model = [row.__table__ for row in
                         (LatestReachabilityRow, PeerScoreRow, AssessmentRow, GenerationCheckRow)]
    query = sa.select(scalar(sa.func.max(polls.c.id), polls), scalar(sa.func.max(mute_changes.c.id), mute_changes), *(
        scalar(expression, table) for table in per_peer_or_model
        for expression in (sa.func.max(table.c.at), sa.func.count())))
    return tuple(conn.execute(query).one())


def latest_ok_poll(conn: Connection) -> Optional[Mapping[str, Any]]:
    p = Poll.__table__.c
    return conn.execute(sa.select(p.id, p.at, p.duration, p.invalid_records, p.errors, p.models).where(p.ok)
                        .order_by(p.at.desc(), p.id.desc()).limit(1)).mappings().first()


def latest_snapshot(conn: Connection) -> Optional[Snapshot]:
    """The latest successful poll, rebuilt from its rows (equal to the Snapshot recorded)."""
    poll = latest_ok_poll(conn)
    if poll is None:
        return None
    prefixes = list(poll["models"] or ())
    models = WatchedModel.__table__
    infos = {
        r.dht_prefix: ModelInfo(dht_prefix=r.dht_prefix, num_blocks=r.num_blocks, repository=r.repository,
                                name=r.name, official=bool(r.official))
        for r in conn.execute(sa.select(models).where(models.c.dht_prefix.in_(prefixes)))
    } if prefixes else {}
    pings_table = ServerPingsRow.__table__
    pings = {(r.peer, r.model): r.next_pings for r in conn.execute(
        sa.select(pings_table.c.peer, pings_table.c.model, pings_table.c.next_pings)
        .where(pings_table.c.poll_id == poll["id"]))}
    o, peers = ServerObservationRow.__table__.c, Peer.__table__
    rows = conn.execute(
        sa.select(peers.c.peer_id, o.peer, o.model, o.start, o.end, o.state, o.throughput,
                  o.inference_rps, o.forward_rps, o.network_rps, o.cache_tokens_left, o.version,
                  o.torch_dtype, o.quant_type, o.using_relay, o.public_name, o.adapters)
        .join(peers, peers.c.id == o.peer).where(o.poll_id == poll["id"]).order_by(o.id)
    ).all()
    servers = tuple(
        ServerRow(peer_id=r[0], model=r[2], start=r[3], end=r[4], state=r[5], throughput=r[6],
                  inference_rps=r[7], forward_rps=r[8], network_rps=r[9], cache_tokens_left=r[10],
                  version=r[11], torch_dtype=r[12], quant_type=r[13],
                  using_relay=None if r[14] is None else bool(r[14]), public_name=r[15],
                  adapters=tuple(r[16] or ()), next_pings=pings_from_json(pings.get((r[1], r[2]))))
        for r in rows
    )
    return Snapshot(
        taken_at=poll["at"], duration=poll["duration"],
        models=tuple(infos[p] for p in prefixes if p in infos), servers=servers,
        invalid_records=poll["invalid_records"], errors=tuple(poll["errors"] or ()),
    )


def latest_reachability(conn: Connection) -> dict[str, ReachabilityResult]:
    """Each peer's latest reachability check."""
    t, peers = LatestReachabilityRow.__table__.c, Peer.__table__
    query = sa.select(peers.c.peer_id, t.kind, t.ok, t.rtt, t.error, t.joining, t.address, t.at).join(
        peers, peers.c.id == t.peer)
    return {r[0]: reachability_result(*r) for r in conn.execute(query)}


def latest_model_status(conn: Connection) -> dict[str, dict]:
    """model -> the status recorded with the latest successful poll (plus its ``at``)."""
    poll = latest_ok_poll(conn)
    if poll is None:
        return {}
    t = ModelStatusRow.__table__
    rows = conn.execute(sa.select(t).where(t.c.poll_id == poll["id"]).order_by(t.c.id)).mappings().all()
    return {r["model"]: status_dict(r) for r in rows}


def latest_assessments(conn: Connection) -> dict[str, Assessment]:
    """model -> its newest assessment of the latest successful poll (none for older polls). One
    stored in a format this version cannot read is left out (and logged): the pages then say that
    model is not diagnosed."""
    poll = latest_ok_poll(conn)
    if poll is None:
        return {}
    t = AssessmentRow.__table__.c
    assessments = {}
    for model, data in conn.execute(sa.select(t.model, t.assessment).where(t.poll_id == poll["id"])):
        try:
            assessments[model] = Assessment.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("the stored assessment of %s is unreadable (%s: %s); left out", model, type(e).__name__, e)
    return assessments


def latest_scores(conn: Connection) -> dict[str, PeerScore]:
    t, peers = PeerScoreRow.__table__.c, Peer.__table__
    rows = conn.execute(sa.select(peers.c.peer_id, t.at, t.score, t.explanation, t.components)
                        .join(peers, peers.c.id == t.peer)).all()
    return {r[0]: PeerScore(peer_id=r[0], at=r[1], score=r[2], explanation=tuple(r[3] or ()),
                            components=_components(r[4])) for r in rows}


def recent_chat_outcomes(conn: Connection, since: float, limit: int) -> list[ChatOutcome]:
    """Chat outcomes since ``since`` (newest ``limit``, oldest first): the router's evidence."""
    t, peers = ChatOutcomeRow.__table__.c, Peer.__table__
    query = (sa.select(peers.c.peer_id, t.at, t.model, t.start, t.end, t.ok, t.seconds_per_token, t.error)
             .join(peers, peers.c.id == t.peer).where(t.at >= since).order_by(t.at.desc()).limit(limit))
    rows = conn.execute(query).all()
    return [ChatOutcome(at=r[1], peer_id=r[0], model=r[2], start=r[3], end=r[4], ok=bool(r[5]),
                        seconds_per_token=r[6], error=r[7]) for r in reversed(rows)]


def answered_since(conn: Connection, since: float) -> dict[str, float]:
    """peer id -> when it last answered a chat request since ``since`` (its newest successful span)."""
    t, peers = ChatOutcomeRow.__table__.c, Peer.__table__
    query = (sa.select(peers.c.peer_id, sa.func.max(t.at)).join(peers, peers.c.id == t.peer)
             .where(t.at >= since, t.ok).group_by(peers.c.peer_id))
    return {peer: float(at) for peer, at in conn.execute(query)}


def peer_policies(conn: Connection) -> dict[str, str]:
    """peer id -> "pinned" or "blocked", as operators set them from the dashboard."""
    t = PeerPolicyRow.__table__.c
    return {r[0]: r[1] for r in conn.execute(sa.select(t.peer_id, t.policy))}


def poll_counts(conn: Connection, since: float) -> dict[str, int]:
    """Polls since ``since`` that succeeded and failed, the malformed records they dropped, the
    announced values they bounded and the rows the database refused."""
    t = Poll.__table__.c
    sums = ("invalid_records", "clamped_values", "dropped_rows")
    query = sa.select(t.ok, sa.func.count(), *(sa.func.coalesce(sa.func.sum(t[name]), 0) for name in sums)).where(
        t.at >= since).group_by(t.ok)
    counts = {"ok": 0, "failed": 0, **{name: 0 for name in sums}}
    for ok, n, *totals in conn.execute(query):
        counts["ok" if ok else "failed"] += n
        for name, total in zip(sums, totals):
            counts[name] += int(total)
    return counts


def peer_ids(conn: Connection) -> list[str]:
    """Peers that have announced themselves as servers at least once, sorted."""
    t = Peer.__table__.c
    return list(conn.execute(sa.select(t.peer_id).where(t.first_seen.is_not(None)).order_by(t.peer_id)).scalars())


# ---- helpers the history shares --------------------------------------------------------------


def peer_key(conn: Connection, peer_id: str) -> Optional[int]:
    t = Peer.__table__.c
    return conn.execute(sa.select(t.id).where(t.peer_id == peer_id)).scalar()


def status_dict(r: Mapping[str, Any]) -> dict:
    """A ``model_status`` row as the readers get it."""
    return {"at": r["at"], "state": r["state"], "reasons": list(r["reasons"] or ()), "coverage_pct": r["coverage_pct"],
            "servers_online": r["servers_online"], "min_redundancy": r["min_redundancy"],
            "est_tokens_per_s": r["est_tokens_per_s"]}


def reachability_result(peer_id, kind, ok, rtt, error, joining, address, at=None) -> ReachabilityResult:
    return ReachabilityResult(peer_id=peer_id, kind=kind, ok=bool(ok), rtt=rtt, error=error, joining=bool(joining),
                              address=address, at=at)


def pings_from_json(pings: Optional[Mapping[str, Optional[float]]]) -> dict[str, float]:
    """The inverse of ``writes._pings_to_json``: a stored null is petals' infinite RTT."""
    return {peer: (math.inf if rtt is None else rtt) for peer, rtt in (pings or {}).items()}


def _components(stored: Any) -> dict[str, tuple[float, float, float]]:
    """``PeerScore.to_dict()``'s components (name -> {value, weight, points}) back as tuples."""
    try:
        return {name: (float(c["value"]), float(c["weight"]), float(c["points"])) for name, c in (stored or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}
