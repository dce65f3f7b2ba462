"""The chat page's conversations and visitors in SQL (``chat/conversations.py`` decides what goes
in): every read and write names its visitor, so nothing of one visitor is reached through another's
id. Every function takes a connection inside a transaction the caller opened."""

from __future__ import annotations

import secrets
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.store.schema import ChatConversationRow, ChatVisitorRow, StoreMetaRow

SECRET_KEY = "chat_visitor_secret"  # store_meta: the key the chat page signs its visitor cookie with
LIST_COLUMNS = ("id", "title", "model", "chars", "created_at", "updated_at")


def visitor_secret(conn: Connection) -> str:
    """The chat page's own secret (made once, kept in ``store_meta``, shared by every web and chat
    worker): not derived from the operator's token, so rotating that token keeps every visitor's
    conversations. Workers that start at once agree on the first one's (the insert yields to it)."""
    meta = StoreMetaRow.__table__
    found = conn.execute(sa.select(meta.c.value).where(meta.c.key == SECRET_KEY)).scalar()
    if found:
        return found
    conn.execute(_insert(conn, meta).values(key=SECRET_KEY, value=secrets.token_urlsafe(32))
                 .on_conflict_do_nothing(index_elements=[meta.c.key]))
    return conn.execute(sa.select(meta.c.value).where(meta.c.key == SECRET_KEY)).scalar_one()


def _insert(conn: Connection, table):
    """The dialect's INSERT, which can yield to a row inserted meanwhile (``on_conflict_do_nothing``)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def without_nul(value):
    """``value`` with every NUL character of its strings (in lists and dicts too) replaced by U+FFFD:
    PostgreSQL's text holds none, and a model's answer, a question or an imported file may carry
    one — the conversation is kept, the character shown as unknown."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    if isinstance(value, dict):
        return {k: without_nul(v) for k, v in value.items()}
    return value


def new_visitors_from(conn: Connection, address: str, since: float) -> int:
    t = ChatVisitorRow.__table__
    return conn.execute(sa.select(sa.func.count()).select_from(t)
                        .where(t.c.address == address, t.c.created_at >= since)).scalar() or 0


def add_visitor(conn: Connection, visitor: str, address: str, now: float) -> None:
    conn.execute(sa.insert(ChatVisitorRow.__table__).values(id=visitor, address=address, created_at=now, last_seen=now))


def known_visitor(conn: Connection, visitor: str) -> bool:
    t = ChatVisitorRow.__table__
    return conn.execute(sa.select(t.c.id).where(t.c.id == visitor)).first() is not None


def count(conn: Connection, visitor: Optional[str] = None) -> int:
    """The visitor's conversations (None: everyone's)."""
    t = ChatConversationRow.__table__
    query = sa.select(sa.func.count()).select_from(t)
    if visitor is not None:
        query = query.where(t.c.visitor == visitor)
    return conn.execute(query).scalar() or 0


def listed(conn: Connection, visitor: str, *, query: str = "", limit: int = 100) -> list[dict]:
    """The visitor's conversations, the most recent first (``query``: those whose title or text holds
    it, case-insensitively)."""
    t = ChatConversationRow.__table__
    select = sa.select(*[t.c[name] for name in LIST_COLUMNS]).where(t.c.visitor == visitor)
    if query:
        pattern = "%" + query.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        select = select.where(sa.or_(sa.func.lower(t.c.title).like(pattern, escape="\\"),
                                     t.c.search_text.like(pattern, escape="\\")))
    rows = conn.execute(select.order_by(t.c.updated_at.desc(), t.c.id).limit(limit)).mappings().all()
    return [dict(row) for row in rows]


def get(conn: Connection, visitor: str, conversation: str) -> Optional[dict]:
    t = ChatConversationRow.__table__
    row = conn.execute(sa.select(t).where(t.c.id == conversation, t.c.visitor == visitor)).mappings().first()
    return dict(row) if row is not None else None


def save(conn: Connection, row: dict) -> bool:
    """Insert or replace the visitor's conversation ``row["id"]``; False, and nothing written, when
    that id is another visitor's (the update names the visitor)."""
    t = ChatConversationRow.__table__
    row = without_nul(row)
    updated = conn.execute(sa.update(t).where(t.c.id == row["id"], t.c.visitor == row["visitor"])
                           .values(**{k: v for k, v in row.items() if k not in ("id", "visitor", "created_at")}))
    if not updated.rowcount:
        if conn.execute(sa.select(t.c.id).where(t.c.id == row["id"])).first() is not None:
            return False
        conn.execute(sa.insert(t).values(**row))
    v = ChatVisitorRow.__table__
    conn.execute(sa.update(v).where(v.c.id == row["visitor"]).values(last_seen=row["updated_at"]))
    return True


def rename(conn: Connection, visitor: str, conversation: str, title: str) -> bool:
    t = ChatConversationRow.__table__
    return bool(conn.execute(sa.update(t).where(t.c.id == conversation, t.c.visitor == visitor)
                             .values(title=without_nul(title))).rowcount)


def delete(conn: Connection, visitor: str, conversation: Optional[str] = None) -> int:
    """Delete the visitor's conversation (None: all of them); returns how many."""
    t = ChatConversationRow.__table__
    where = [t.c.visitor == visitor] + ([t.c.id == conversation] if conversation is not None else [])
    return conn.execute(sa.delete(t).where(*where)).rowcount or 0


def prune(conn: Connection, before: float) -> int:
    """Conversations not continued since ``before``, and visitors not seen since then with none left."""
    t, v = ChatConversationRow.__table__, ChatVisitorRow.__table__
    gone = conn.execute(sa.delete(t).where(t.c.updated_at < before)).rowcount or 0
    conn.execute(sa.delete(v).where(v.c.last_seen < before, ~sa.exists().where(t.c.visitor == v.c.id)))
    return gone
