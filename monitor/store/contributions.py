"""The contribution ledger in SQL (``core/contributions.py``): per server, model and hour what it
earned, summed as it is written — with each poll (the interval since the poll before, by that
poll's ``ledger_basis``: what its final assessment said of each server, kept with the poll and
rewritten with every later assessment of it) and with each batch of request rows — and per UTC
day: the hourly rollup folds each hour into its day once it has ended (``fold``; a credit for an
hour already folded goes to both). Hours are kept ``HOURS_KEPT``; days older than the rollup
retention are summed per server and model into the all-time rows as they are pruned (each day
exactly once), so "all time" is those, the days kept and the hours not folded yet.

Every function takes a connection inside a transaction the caller opened. The last day is read from
the hours (the last 24 and the one going on); a week and a month from the days and the hours not
folded yet (whole UTC days and the one going on: ``core.contributions.window_start``), a few rows
per server, whatever the swarm's size. The poll's write adds to the hours only.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.assessment import Assessment
from monitor.core.common import DAY, HOUR
from monitor.core.contributions import (
    AMOUNTS, MAX_GAP, Accrual, Contribution, accrue_basis, by_day, contribution, rejudged,
)
from monitor.store.engine import insert
from monitor.store.hours import meta_float, set_meta
from monitor.store.schema import ContributionDayRow, ContributionHourRow, ContributionTotalRow, Peer, Poll

MAX_ROWS = 20_000  # servers × models a window reads at most (the most verified first)


FOLDED = "ledger_folded_until"  # store_meta: the hours before it are summed into the days
FOLD_AFTER = 2 * MAX_GAP  # seconds after an hour ends before it is folded (its last credits are in)
HOURS_KEPT = 2 * DAY  # hours older than this are dropped once folded: only the last day reads them


def _add(conn: Connection, table: sa.Table, key: str, accruals: Iterable[Accrual]) -> None:
    rows = [{"peer_id": a.peer_id[:128], "model": a.model[:256], key: a.hour, **{k: getattr(a, k) for k in AMOUNTS}}
            for a in accruals]
    if rows:
        stmt = insert(conn, table)
        conn.execute(stmt.on_conflict_do_update(index_elements=["peer_id", "model", key],
                                                set_={k: table.c[k] + stmt.excluded[k] for k in AMOUNTS}), rows)


def record(conn: Connection, accruals: Sequence[Accrual]) -> None:
    """Adds the accruals to their hours — and those of hours already folded into the days (a late
    request row, a poll after an outage) to their days too, so that every window counts them."""
    if not accruals:
        return
    folded = meta_float(conn, FOLDED, lock=True)  # (a fold and this write see each other: ``fold``)
    _add(conn, ContributionHourRow.__table__, "hour", accruals)
    if folded is not None:
        _add(conn, ContributionDayRow.__table__, "day", by_day(a for a in accruals if a.hour < folded))


def fold(conn: Connection, now: float) -> int:
    """The hours that ended at least ``FOLD_AFTER`` ago and are not folded yet, summed into their
    days (the hourly rollup's part; a week's and a month's leaderboards read the days); how many."""
    until = math.floor((now - FOLD_AFTER) / HOUR) * HOUR  # (hours before it have ended FOLD_AFTER ago)
    folded = meta_float(conn, FOLDED, lock=True)
    if folded is not None and until <= folded:
        return 0
    hours = ContributionHourRow.__table__
    query = sa.select(hours).where(hours.c.hour < until)
    if folded is not None:
        query = query.where(hours.c.hour >= folded)
    found = [Accrual(**{k: r[k] for k in ("peer_id", "model", "hour", *AMOUNTS)})
             for r in conn.execute(query).mappings()]
    _add(conn, ContributionDayRow.__table__, "day", by_day(found))
    set_meta(conn, FOLDED, repr(until))
    return len(found)


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
    announced public name. ``days``: by the days (``since`` a day's start) and the hours not folded
    into them yet; else by the hours alone (the last day)."""
    def plus(found: dict, more: dict) -> None:
        for key, amounts in more.items():
            kept = found.setdefault(key, {**amounts, **{k: 0 for k in AMOUNTS}})
            for k in AMOUNTS:
                kept[k] = (kept[k] or 0) + (amounts[k] or 0)

    hours = ContributionHourRow.__table__
    if since is None or days:
        folded = meta_float(conn, FOLDED)
        found = _grouped(conn, ContributionDayRow.__table__, since, model, peer_id, by_model, key="day")
        rest = since if folded is None else max(folded, since if since is not None else folded)
        plus(found, _grouped(conn, hours, rest, model, peer_id, by_model))
    else:
        found = _grouped(conn, hours, since, model, peer_id, by_model)
    if since is None:  # and the days summed for all time already
        plus(found, _grouped(conn, ContributionTotalRow.__table__, None, model, peer_id, by_model))
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


def prune(conn: Connection, before: float, now: float) -> int:
    """Days that ended before ``before`` (and were folded whole), summed into the all-time rows
    first (each day once); hours folded and older than ``HOURS_KEPT``. How many rows went."""
    days, totals, hours = ContributionDayRow.__table__, ContributionTotalRow.__table__, ContributionHourRow.__table__
    folded = meta_float(conn, FOLDED, lock=True)
    if folded is None:
        return 0
    last_day = min(before, folded) - DAY  # (a day row that began after this may still grow)
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
    drop_hours = min(folded, now - HOURS_KEPT)
    return gone + (conn.execute(sa.delete(hours).where(hours.c.hour < drop_hours)).rowcount or 0)
