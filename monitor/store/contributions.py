"""The contribution ledger in SQL (``core/contributions.py``): per server, model and hour — and
per server, model and UTC day, beside it — what it earned, summed as it is written: with each poll
(the interval since the poll before, by that poll's ``ledger_basis``: what its final assessment
said of each server, kept with the poll and rewritten with every later assessment of it) and with
each batch of request rows. Days older than the rollup retention are summed per server and model
into the all-time rows as they are pruned (each day exactly once), so "all time" is those plus the
days kept; hours older than it are dropped (their days hold them).

Every function takes a connection inside a transaction the caller opened. The last day is read from
the hours (the last 24 and the one going on); a week and a month from the days (whole UTC days and
the one going on: ``core.contributions.window_start``), a few rows per server, whatever the swarm's size.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.assessment import Assessment
from monitor.core.common import DAY, HOUR
from monitor.core.contributions import AMOUNTS, Accrual, Contribution, accrue_basis, by_day, contribution, rejudged
from monitor.store.engine import insert
from monitor.store.schema import ContributionDayRow, ContributionHourRow, ContributionTotalRow, Peer, Poll

MAX_ROWS = 20_000  # servers × models a window reads at most (the most verified first)


def record(conn: Connection, accruals: Sequence[Accrual]) -> None:
    """Adds the accruals to their hours and to their days."""
    if not accruals:
        return
    for table, key, grouped in ((ContributionHourRow.__table__, "hour", accruals),
                                (ContributionDayRow.__table__, "day", by_day(accruals))):
        stmt = insert(conn, table)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=["peer_id", "model", key],
            set_={k: table.c[k] + stmt.excluded[k] for k in AMOUNTS}),
            [{"peer_id": a.peer_id[:128], "model": a.model[:256], key: a.hour, **{k: getattr(a, k) for k in AMOUNTS}}
             for a in grouped])


def after_poll(conn: Connection, until: float) -> None:
    """Credits the latest successful poll before ``until`` (the poll about to be written) for the
    time until it, by its basis."""
    p = Poll.__table__.c
    last = conn.execute(sa.select(p.at, p.ledger_basis).where(p.ok, p.at < until).order_by(p.at.desc(), p.id.desc())
                        .limit(1)).first()
    if last is not None and last.ledger_basis:
        record(conn, accrue_basis(last.at, until, last.ledger_basis))


def rejudge(conn: Connection, poll_id: int, at: float, assessments: Mapping[str, Assessment]) -> None:
    """A later assessment of poll ``poll_id``: its basis judged anew (its servers and spans kept)."""
    t = Poll.__table__
    kept = conn.execute(sa.select(t.c.ledger_basis).where(t.c.id == poll_id)).scalar()
    if kept:
        conn.execute(sa.update(t).where(t.c.id == poll_id).values(ledger_basis=rejudged(kept, at, assessments)))


def _grouped(conn: Connection, table: sa.Table, since: Optional[float], model: Optional[str], peer_id: Optional[str],
             by_model: bool, key: str = "hour") -> dict[tuple, dict]:
    keys = [table.c.peer_id] + ([table.c.model] if by_model else [])
    query = sa.select(*keys, *[sa.func.sum(table.c[k]).label(k) for k in AMOUNTS]).group_by(*keys)
    if since is not None:
        query = query.where(table.c[key] >= since)
    if model is not None:
        query = query.where(table.c.model == model)
    if peer_id is not None:
        query = query.where(table.c.peer_id == peer_id)
    rows = conn.execute(query.order_by(sa.func.sum(table.c.verified).desc()).limit(MAX_ROWS)).mappings().all()
    return {tuple(r[k.name] for k in keys): dict(r) for r in rows}


def window(conn: Connection, since: Optional[float], *, model: Optional[str] = None,
           peer_id: Optional[str] = None, by_model: bool = False, days: bool = False) -> list[Contribution]:
    """Each server's contribution since ``since`` (None: all time), of ``model`` or summed over every
    model (``by_model``: one per server and model), of ``peer_id`` or of all; with its last
    announced public name. ``days``: read the days (``since`` a day's start), else the hours."""
    if since is None or days:
        found = _grouped(conn, ContributionDayRow.__table__, since, model, peer_id, by_model, key="day")
    else:
        found = _grouped(conn, ContributionHourRow.__table__, since, model, peer_id, by_model)
    if since is None:  # and the days pruned already
        for key, old in _grouped(conn, ContributionTotalRow.__table__, None, model, peer_id, by_model).items():
            kept = found.setdefault(key, {**old, **{k: 0 for k in AMOUNTS}})
            for k in AMOUNTS:
                kept[k] = (kept[k] or 0) + (old[k] or 0)
    names = _names(conn, [key[0] for key in found])
    return [contribution(key[0], key[1] if by_model else model, amounts, name=names.get(key[0]))
            for key, amounts in found.items()]


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
    """Days that ended before ``before``, summed into the all-time rows first (each day once), and
    hours older than ``before``; how many rows went."""
    days, totals, hours = ContributionDayRow.__table__, ContributionTotalRow.__table__, ContributionHourRow.__table__
    last_day = before - DAY  # (a day row that began after this still has hours to come)
    old = conn.execute(sa.select(days.c.peer_id, days.c.model, sa.func.min(days.c.day).label("first_hour"),
                                 (sa.func.max(days.c.day) + (DAY - HOUR)).label("last_hour"),
                                 *[sa.func.sum(days.c[k]).label(k) for k in AMOUNTS])
                       .where(days.c.day <= last_day).group_by(days.c.peer_id, days.c.model)).mappings().all()
    if old:
        stmt = insert(conn, totals)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=["peer_id", "model"],
            set_={**{k: totals.c[k] + stmt.excluded[k] for k in AMOUNTS},
                  "first_hour": sa.case((stmt.excluded.first_hour < totals.c.first_hour, stmt.excluded.first_hour),
                                        else_=totals.c.first_hour),
                  "last_hour": sa.case((stmt.excluded.last_hour > totals.c.last_hour, stmt.excluded.last_hour),
                                       else_=totals.c.last_hour)}), [dict(r) for r in old])
    gone = conn.execute(sa.delete(days).where(days.c.day <= last_day)).rowcount or 0
    return gone + (conn.execute(sa.delete(hours).where(hours.c.hour < before)).rowcount or 0)
