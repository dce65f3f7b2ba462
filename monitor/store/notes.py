"""Incident notes in SQL: each note as it reads now (``incident_notes``) and every change of it
(``incident_note_updates``), written in one transaction so that the history never misses one.

Notes are written by operators through the web and kept for good (a few a week: the status
page's history and Atom feed read them); ``core/incidents.py`` holds the rules of their text.
"""

from __future__ import annotations

from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.incidents import POSTED, RESOLVED, UPDATED, Note, NoteUpdate
from monitor.store.schema import IncidentNoteRow, IncidentNoteUpdateRow


def _note(row, updates=()) -> Note:
    return Note(id=row.id, scope=row.scope, target=row.target, text=row.text, author=row.author,
                created_at=row.created_at, updated_at=row.updated_at, resolved_at=row.resolved_at,
                updates=tuple(updates))


def _log(conn: Connection, note_id: int, at: float, action: str, text: str, author: str, via: str) -> None:
    conn.execute(sa.insert(IncidentNoteUpdateRow.__table__).values(
        note_id=note_id, at=at, action=action, text=text, author=author, via=via[:32]))


def post(conn: Connection, scope: str, target: Optional[str], text: str, author: str, via: str, at: float) -> int:
    """A new open note; returns its id."""
    new_id = conn.execute(sa.insert(IncidentNoteRow.__table__).values(
        scope=scope, target=target, text=text, author=author, created_at=at, updated_at=at)).inserted_primary_key[0]
    _log(conn, new_id, at, POSTED, text, author, via)
    return int(new_id)


def update(conn: Connection, note_id: int, text: str, author: str, via: str, at: float) -> Optional[Note]:
    """New text for a note (a resolved one too: a correction); None if there is no such note."""
    t = IncidentNoteRow.__table__
    if not conn.execute(sa.update(t).where(t.c.id == note_id).values(text=text, updated_at=at)).rowcount:
        return None
    _log(conn, note_id, at, UPDATED, text, author, via)
    return note(conn, note_id)


def resolve(conn: Connection, note_id: int, text: Optional[str], author: str, via: str, at: float) -> Optional[Note]:
    """Resolve an open note (``text``: its last word, else it keeps its text); a resolved one
    stays as it was. None if there is no such note."""
    t = IncidentNoteRow.__table__
    row = conn.execute(sa.select(t).where(t.c.id == note_id)).first()
    if row is None:
        return None
    if row.resolved_at is None:
        final = text if text is not None else row.text
        conn.execute(sa.update(t).where(t.c.id == note_id).values(text=final, updated_at=at, resolved_at=at))
        _log(conn, note_id, at, RESOLVED, final, author, via)
    return note(conn, note_id)


def note(conn: Connection, note_id: int) -> Optional[Note]:
    """One note with its history."""
    t, u = IncidentNoteRow.__table__, IncidentNoteUpdateRow.__table__
    row = conn.execute(sa.select(t).where(t.c.id == note_id)).first()
    if row is None:
        return None
    updates = conn.execute(sa.select(u.c.at, u.c.action, u.c.text, u.c.author, u.c.via)
                           .where(u.c.note_id == note_id).order_by(u.c.at, u.c.id)).all()
    return _note(row, [NoteUpdate(*r) for r in updates])


def notes(conn: Connection, *, resolved_since: Optional[float], limit: int) -> list[Note]:
    """Open notes, and (``resolved_since``) those resolved since then, newest change first, each
    with its history."""
    t, u = IncidentNoteRow.__table__, IncidentNoteUpdateRow.__table__
    wanted = t.c.resolved_at.is_(None)
    if resolved_since is not None:
        wanted = sa.or_(wanted, t.c.resolved_at >= resolved_since)
    rows = conn.execute(sa.select(t).where(wanted).order_by(t.c.updated_at.desc(), t.c.id.desc()).limit(limit)).all()
    updates: dict[int, list[NoteUpdate]] = {}
    if rows:
        for r in conn.execute(sa.select(u.c.note_id, u.c.at, u.c.action, u.c.text, u.c.author, u.c.via)
                              .where(u.c.note_id.in_([row.id for row in rows])).order_by(u.c.at, u.c.id)):
            updates.setdefault(r.note_id, []).append(NoteUpdate(r.at, r.action, r.text, r.author, r.via))
    return [_note(row, updates.get(row.id, ())) for row in rows]


def changes(conn: Connection, since: float, *, limit: int) -> list[tuple[Note, NoteUpdate]]:
    """Every change of any note since ``since``, newest first, each with its note (as it is now,
    without history): the Atom feed's note entries."""
    t, u = IncidentNoteRow.__table__, IncidentNoteUpdateRow.__table__
    rows = conn.execute(sa.select(t, u.c.at.label("u_at"), u.c.action, u.c.text.label("u_text"),
                                  u.c.author.label("u_author"), u.c.via)
                        .join(u, u.c.note_id == t.c.id).where(u.c.at >= since)
                        .order_by(u.c.at.desc(), u.c.id.desc()).limit(limit)).all()
    return [(_note(r), NoteUpdate(r.u_at, r.action, r.u_text, r.u_author, r.via)) for r in rows]


def mark(conn: Connection) -> tuple:
    """(latest change, number of changes): whatever shows notes may be reused while it holds."""
    u = IncidentNoteUpdateRow.__table__
    return tuple(conn.execute(sa.select(sa.func.max(u.c.at), sa.func.count()).select_from(u)).one())
