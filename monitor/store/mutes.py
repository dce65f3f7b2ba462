"""Silences and maintenance windows in SQL, and the log of every change made to them.

Operators create and end them on the Alerts page or through the API (``monitor/web/mutes.py``);
the poller's alert job reads the ones not over yet before every evaluation; the pages read them
to say "maintenance". Nothing is ever deleted by an operator: ending one sets its end to that
moment, and ``mute_changes`` keeps who did what, when, how (API token or browser session) and why.

Every function takes a connection inside a transaction (``Database.read`` / ``write``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.maintenance import MaintenanceWindow, Recurrence
from monitor.core.muting import Matcher, Silence
from monitor.store.schema import MaintenanceWindowRow, MuteChangeRow, SilenceRow

SILENCE, MAINTENANCE = "silence", "maintenance"
CREATED, ENDED = "created", "ended"


@dataclass(frozen=True)
class MuteChange:
    """One change to a silence or a maintenance window."""

    at: float
    kind: str  # silence | maintenance
    item_id: int
    action: str  # created | ended
    by: str
    via: str
    why: str


def _cut(text: Optional[str], limit: int) -> Optional[str]:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def _log(conn: Connection, at: float, kind: str, item_id: int, action: str, by: str, via: str, why: str) -> None:
    conn.execute(sa.insert(MuteChangeRow.__table__).values(at=at, kind=kind, item_id=item_id, action=action,
                                                           by=_cut(by, 100), via=_cut(via, 32), why=_cut(why, 500)))


# ---- silences ------------------------------------------------------------------------------------


def _silence(row) -> Silence:
    return Silence(id=row.id, matchers=tuple(Matcher(*m) for m in row.matchers or ()), starts_at=row.starts_at,
                   ends_at=row.ends_at, comment=row.comment, created_by=row.created_by, created_at=row.created_at,
                   ended_at=row.ended_at, ended_by=row.ended_by)


def create_silence(conn: Connection, silence: Silence, via: str) -> int:
    """Store a new silence (its ``id`` is ignored) and log it; returns its id."""
    t = SilenceRow.__table__
    new_id = conn.execute(sa.insert(t).values(
        matchers=[[m.name, m.op, m.value] for m in silence.matchers], starts_at=silence.starts_at,
        ends_at=silence.ends_at, comment=_cut(silence.comment, 500), created_by=_cut(silence.created_by, 100),
        created_at=silence.created_at)).inserted_primary_key[0]
    _log(conn, silence.created_at, SILENCE, new_id, CREATED, silence.created_by, via, silence.comment)
    return new_id


def silences(conn: Connection, *, ending_after: float, limit: int) -> list[Silence]:
    """Silences whose end is after ``ending_after`` (in force, to come, or ended since), newest first."""
    t = SilenceRow.__table__
    rows = conn.execute(sa.select(t).where(t.c.ends_at > ending_after).order_by(t.c.id.desc()).limit(limit))
    return [_silence(row) for row in rows]


def silence(conn: Connection, silence_id: int) -> Optional[Silence]:
    t = SilenceRow.__table__
    row = conn.execute(sa.select(t).where(t.c.id == silence_id)).first()
    return _silence(row) if row is not None else None


def end_silence(conn: Connection, silence_id: int, at: float, by: str, via: str, why: str) -> Optional[Silence]:
    """End a silence now (one to come is ended before it starts); the silence as it is now, or
    None if there is none with that id. One already over stays as it was (nothing logged)."""
    t = SilenceRow.__table__
    found = silence(conn, silence_id)
    if found is None or found.ends_at <= at:
        return found
    conn.execute(sa.update(t).where(t.c.id == silence_id).values(
        ends_at=max(at, found.starts_at), ended_at=at, ended_by=_cut(by, 100)))
    _log(conn, at, SILENCE, silence_id, ENDED, by, via, why)
    return silence(conn, silence_id)


# ---- maintenance windows -------------------------------------------------------------------------


def _window(row) -> MaintenanceWindow:
    recurrence = None
    if row.duration is not None:
        recurrence = Recurrence(duration=row.duration, timezone=row.timezone or "UTC",
                                weekdays=tuple(row.weekdays or ()), at=row.at_time, cron=row.cron)
    return MaintenanceWindow(id=row.id, scope=row.scope, target=row.target, starts_at=row.starts_at,
                             ends_at=row.ends_at, reason=row.reason, recurrence=recurrence, created_at=row.created_at,
                             created_by=row.created_by, ended_at=row.ended_at, ended_by=row.ended_by)


def create_window(conn: Connection, window: MaintenanceWindow, via: str) -> int:
    """Store a new maintenance window (its ``id`` is ignored) and log it; returns its id."""
    t = MaintenanceWindowRow.__table__
    rec = window.recurrence
    new_id = conn.execute(sa.insert(t).values(
        scope=window.scope, target=_cut(window.target, 256), starts_at=window.starts_at, ends_at=window.ends_at,
        reason=_cut(window.reason, 500), duration=rec.duration if rec else None, timezone=rec.timezone if rec else None,
        weekdays=list(rec.weekdays) if rec and rec.weekdays else None, at_time=rec.at if rec else None,
        cron=rec.cron if rec else None, created_by=_cut(window.created_by, 100),
        created_at=window.created_at)).inserted_primary_key[0]
    _log(conn, window.created_at, MAINTENANCE, new_id, CREATED, window.created_by, via, window.reason)
    return new_id


def windows(conn: Connection, *, ending_after: Optional[float], limit: int) -> list[MaintenanceWindow]:
    """Windows not over by ``ending_after`` (None: every window), newest first."""
    t = MaintenanceWindowRow.__table__
    query = sa.select(t)
    if ending_after is not None:
        query = query.where(sa.or_(t.c.ends_at.is_(None), t.c.ends_at > ending_after))
    return [_window(row) for row in conn.execute(query.order_by(t.c.id.desc()).limit(limit))]


def window(conn: Connection, window_id: int) -> Optional[MaintenanceWindow]:
    t = MaintenanceWindowRow.__table__
    row = conn.execute(sa.select(t).where(t.c.id == window_id)).first()
    return _window(row) if row is not None else None


def end_window(conn: Connection, window_id: int, at: float, by: str, via: str, why: str
               ) -> Optional[MaintenanceWindow]:
    """End a window now (a recurring one: no occurrence after this); as ``end_silence``."""
    t = MaintenanceWindowRow.__table__
    found = window(conn, window_id)
    if found is None or (found.ends_at is not None and found.ends_at <= at):
        return found
    conn.execute(sa.update(t).where(t.c.id == window_id).values(
        ends_at=max(at, found.starts_at), ended_at=at, ended_by=_cut(by, 100)))
    _log(conn, at, MAINTENANCE, window_id, ENDED, by, via, why)
    return window(conn, window_id)


# ---- the log ---------------------------------------------------------------------------------------


def changes(conn: Connection, kind: str, item_ids: list[int]) -> dict[int, list[MuteChange]]:
    """item id -> its changes, oldest first."""
    if not item_ids:
        return {}
    t = MuteChangeRow.__table__
    found: dict[int, list[MuteChange]] = {}
    query = sa.select(t).where(t.c.kind == kind, t.c.item_id.in_(item_ids)).order_by(t.c.at, t.c.id)
    for row in conn.execute(query):
        found.setdefault(row.item_id, []).append(
            MuteChange(at=row.at, kind=row.kind, item_id=row.item_id, action=row.action, by=row.by, via=row.via,
                       why=row.why))
    return found
