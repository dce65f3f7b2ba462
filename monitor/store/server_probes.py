"""Server probes in SQL: every speed probe of a server's span, with its correctness verdict.

Written by the poller's measuring job (``monitor/app/probing.py``) after each probe round; read by
the poller (the diagnosis takes measured speeds and wrong outputs), the chat's router (a measured
weight for every server) and the pages (announced vs measured, verdicts). Readers ask for a recent
window: with one probe per server per ``speed_probe_period`` that is a few rows per server.
Every function takes a connection inside a transaction the caller opened.
"""

from __future__ import annotations

from typing import Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import finite
from monitor.core.probes import ServerProbe
from monitor.store.schema import Peer, ServerProbeRow
from monitor.store.writes import peer_keys

_TEXT_LIMITS = {"error": 300, "error_kind": 16, "verdict": 16, "checked_against": 16, "detail": 300}
_NUMBERS = ("seconds_per_token", "rtt", "prefill_seconds", "duration", "error_ratio", "tolerance")


def record(conn: Connection, probes: Sequence[ServerProbe]) -> None:
    keys = peer_keys(conn, [p.peer_id for p in probes])
    rows = []
    for p in probes:
        row = {"at": p.at, "peer": keys[p.peer_id], "model": p.model[:256], "start": p.start, "end": p.end,
               "ok": p.ok}
        # non-finite numbers (an infinite error of NaN outputs) are stored as NULL: SQL and JSON hold no inf
        row.update({name: finite(getattr(p, name)) for name in _NUMBERS})
        row["room"] = p.room
        row.update({name: (None if getattr(p, name) is None else str(getattr(p, name))[:limit])
                    for name, limit in _TEXT_LIMITS.items()})
        rows.append(row)
    conn.execute(sa.insert(ServerProbeRow.__table__), rows)


def recent(conn: Connection, since: float, *, until: Optional[float] = None, model: Optional[str] = None,
           peer_id: Optional[str] = None, limit: int = 20_000) -> list[ServerProbe]:
    """Probes since ``since`` (newest ``limit``), oldest first; of one model and/or peer if given."""
    table, peers = ServerProbeRow.__table__, Peer.__table__
    t = table.c
    query = sa.select(peers.c.peer_id, table).join(peers, peers.c.id == t.peer).where(t.at >= since)
    if until is not None:
        query = query.where(t.at <= until)
    if model is not None:
        query = query.where(t.model == model)
    if peer_id is not None:
        query = query.where(peers.c.peer_id == peer_id)
    rows = conn.execute(query.order_by(t.at.desc(), t.id.desc()).limit(limit)).mappings().all()
    return [_probe(r) for r in reversed(rows)]


def prune(conn: Connection, before: float) -> int:
    """Delete probes older than ``before``; returns how many."""
    t = ServerProbeRow.__table__
    return conn.execute(sa.delete(t).where(t.c.at < before)).rowcount or 0


def _probe(r) -> ServerProbe:
    # a stored NULL error_ratio with a "wrong" verdict was an infinite error (non-finite outputs)
    error_ratio = r["error_ratio"]
    if error_ratio is None and r["verdict"] == "wrong" and r["tolerance"] is not None:
        error_ratio = float("inf")
    return ServerProbe(
        peer_id=r["peer_id"], model=r["model"], start=r["start"], end=r["end"], at=r["at"], ok=bool(r["ok"]),
        seconds_per_token=r["seconds_per_token"], rtt=r["rtt"], prefill_seconds=r["prefill_seconds"],
        duration=r["duration"], error=r["error"], error_kind=r["error_kind"], verdict=r["verdict"], error_ratio=error_ratio,
        tolerance=r["tolerance"], checked_against=r["checked_against"], detail=r["detail"], room=r["room"],
    )
