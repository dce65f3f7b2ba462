"""The chat workers' own reports (``ChatWorkerRow``): each writes one row of itself every few
seconds (``chat.feedback.WorkerBeat``), the overview reads those seen lately. Plain functions over
a connection inside a transaction the caller opened."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.store.engine import insert
from monitor.store.schema import ChatWorkerRow

KEEP = 86400.0  # seconds a worker that stopped reporting is kept (and shown as gone)
MAX_SHOWN = 50


@dataclass(frozen=True)
class ChatWorker:
    worker: str
    host: str
    pid: int
    started_at: float
    beat_at: float
    tag: Optional[str] = None
    slots: int = 0
    busy: int = 0
    waiting: int = 0
    sessions_open: int = 0
    servers_used: int = 0
    draining: bool = False
    stopped: bool = False


def record(conn: Connection, beat: ChatWorker) -> None:
    """This worker's report (its row, replaced), and rows of workers silent for ``KEEP`` gone."""
    table = ChatWorkerRow.__table__
    row = {**asdict(beat), "worker": beat.worker[:120], "host": beat.host[:200], "tag": (beat.tag or None) and beat.tag[:32]}
    stmt = insert(conn, table)
    conn.execute(stmt.on_conflict_do_update(index_elements=["worker"],
                                            set_={k: stmt.excluded[k] for k in row if k != "worker"}), [row])
    conn.execute(sa.delete(table).where(table.c.beat_at < beat.beat_at - KEEP))


def recent(conn: Connection, since: float) -> list[ChatWorker]:
    """The workers that reported since ``since``, the newest report first."""
    table = ChatWorkerRow.__table__
    rows = conn.execute(sa.select(table).where(table.c.beat_at >= since).order_by(table.c.beat_at.desc())
                        .limit(MAX_SHOWN)).mappings().all()
    return [ChatWorker(**dict(r)) for r in rows]
