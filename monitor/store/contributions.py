"""The contribution ledger in SQL (``core/contributions.py``): per server, model and hour what it
earned, summed as they are written — with each poll (the interval since the poll before, by that
poll's final stored assessment) and with each batch of request rows — and the same over all time.

Every function takes a connection inside a transaction the caller opened. Windows are whole hours
(a day is the last 24 hours and the one going on). The hourly rows go with the rollup retention;
the all-time rows stay.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.assessment import Assessment
from monitor.core.contributions import AMOUNTS, Accrual, accrue_poll, contribution, Contribution
from monitor.core.snapshot import ServerRow
from monitor.store.engine import insert
from monitor.store.schema import AssessmentRow, ContributionHourRow, ContributionTotalRow, Peer, Poll, ServerObservationRow

MAX_ROWS = 20_000  # servers × models a window reads at most (the most verified first)


def record(conn: Connection, accruals: Sequence[Accrual]) -> None:
    """Adds the accruals to their hours and to the all-time rows."""
    if not accruals:
        return
    rows = [{"peer_id": a.peer_id[:128], "model": a.model[:256], "hour": a.hour,
             **{k: getattr(a, k) for k in AMOUNTS}} for a in accruals]
    hours = ContributionHourRow.__table__
    stmt = insert(conn, hours)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["peer_id", "model", "hour"],
        set_={k: hours.c[k] + stmt.excluded[k] for k in AMOUNTS}), rows)
    totals = ContributionTotalRow.__table__
    by_key: dict[tuple, dict] = {}
    for row in rows:
        key = (row["peer_id"], row["model"])
        found = by_key.get(key)
        if found is None:
            by_key[key] = {**{k: v for k, v in row.items() if k != "hour"}, "first_hour": row["hour"],
                           "last_hour": row["hour"]}
        else:
            for k in AMOUNTS:
                found[k] += row[k]
            found["first_hour"], found["last_hour"] = min(found["first_hour"], row["hour"]), max(found["last_hour"],
                                                                                                 row["hour"])
    stmt = insert(conn, totals)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["peer_id", "model"],
        set_={**{k: totals.c[k] + stmt.excluded[k] for k in AMOUNTS},
              "first_hour": sa.case((stmt.excluded.first_hour < totals.c.first_hour, stmt.excluded.first_hour),
                                    else_=totals.c.first_hour),
              "last_hour": sa.case((stmt.excluded.last_hour > totals.c.last_hour, stmt.excluded.last_hour),
                                   else_=totals.c.last_hour)}), list(by_key.values()))


def after_poll(conn: Connection, until: float) -> None:
    """Credits the latest successful poll before ``until`` (the poll about to be written) for the
    time until it, by its servers and its final stored assessments."""
    p = Poll.__table__.c
    last = conn.execute(sa.select(p.id, p.at).where(p.ok, p.at < until).order_by(p.at.desc(), p.id.desc())
                        .limit(1)).first()
    if last is None:
        return
    o, peers, a = ServerObservationRow.__table__.c, Peer.__table__.c, AssessmentRow.__table__.c
    servers = [ServerRow(peer_id=r.peer_id, model=r.model, start=r.start, end=r.end, state=r.state)
               for r in conn.execute(sa.select(peers.peer_id, o.model, o.start, o.end, o.state)
                                     .join(Peer.__table__, peers.id == o.peer).where(o.poll_id == last.id))]
    assessments = {}
    for row in conn.execute(sa.select(a.model, a.assessment).where(a.poll_id == last.id)):
        try:
            assessments[row.model] = Assessment.from_dict(row.assessment)
        except (KeyError, TypeError, ValueError):  # an assessment that cannot be read earns its servers nothing
            continue
    record(conn, accrue_poll(last.at, until, servers, assessments))


def window(conn: Connection, since: Optional[float], *, model: Optional[str] = None,
           peer_id: Optional[str] = None, by_model: bool = False) -> list[Contribution]:
    """Each server's contribution since ``since`` (None: all time), of ``model`` or summed over every
    model (``by_model``: one per server and model), of ``peer_id`` or of all; with its last
    announced public name."""
    t = (ContributionTotalRow if since is None else ContributionHourRow).__table__
    keys = [t.c.peer_id] + ([t.c.model] if by_model else [])
    query = sa.select(*keys, *[sa.func.sum(t.c[k]).label(k) for k in AMOUNTS]).group_by(*keys)
    if since is not None:
        query = query.where(t.c.hour >= since)
    if model is not None:
        query = query.where(t.c.model == model)
    if peer_id is not None:
        query = query.where(t.c.peer_id == peer_id)
    rows = conn.execute(query.order_by(sa.func.sum(t.c.verified).desc()).limit(MAX_ROWS)).mappings().all()
    names = _names(conn, [r["peer_id"] for r in rows])
    return [contribution(r["peer_id"], r["model"] if by_model else model, r, name=names.get(r["peer_id"]))
            for r in rows]


def _names(conn: Connection, peer_ids: Iterable[str]) -> dict[str, str]:
    t = Peer.__table__.c
    wanted = list(dict.fromkeys(peer_ids))
    found = {}
    for i in range(0, len(wanted), 400):
        for peer_id, name in conn.execute(sa.select(t.peer_id, t.public_name).where(t.peer_id.in_(wanted[i:i + 400]))):
            if name:
                found[peer_id] = name
    return found


def prune(conn: Connection, before: float) -> int:
    """Hourly rows older than ``before`` (the all-time rows stay)."""
    t = ContributionHourRow.__table__
    return conn.execute(sa.delete(t).where(t.c.hour < before)).rowcount or 0
