"""Compute checks in SQL (``core/compute_checks.py``): one token through one block of a server.

Written by the leader's compute-check rounds (``monitor/app/compute_checking.py``), a row per
check, pruned past ``RETENTION`` with every write; read by the assessment (the window of each
verdict) and the peer page. Every function takes a connection inside a transaction the caller
opened.
"""

from __future__ import annotations

from typing import Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import finite
from monitor.core.compute_checks import RETENTION, ComputeCheck
from monitor.store.schema import ComputeCheckRow, Peer
from monitor.store.writes import peer_keys

_TEXT_LIMITS = {"error": 300, "error_kind": 16, "requested_by": 64}


def record(conn: Connection, checks: Sequence[ComputeCheck], *, now: float) -> None:
    """Store the checks and drop those older than ``RETENTION``."""
    if checks:
        keys = peer_keys(conn, [c.peer_id for c in checks])
        conn.execute(sa.insert(ComputeCheckRow.__table__), [
            {"at": c.at, "peer": keys[c.peer_id], "model": c.model[:256], "block": c.block, "ok": c.ok,
             "duration": finite(c.duration),
             **{name: (None if getattr(c, name) is None else str(getattr(c, name))[:limit])
                for name, limit in _TEXT_LIMITS.items()}}
            for c in checks])
    t = ComputeCheckRow.__table__
    conn.execute(sa.delete(t).where(t.c.at < now - RETENTION))


def recent(conn: Connection, since: float, *, peer_id: Optional[str] = None, limit: int = 50_000) -> list[ComputeCheck]:
    """Checks since ``since`` (newest ``limit``), oldest first; of one peer if given."""
    table, peers = ComputeCheckRow.__table__, Peer.__table__
    t = table.c
    query = sa.select(peers.c.peer_id, table).join(peers, peers.c.id == t.peer).where(t.at >= since)
    if peer_id is not None:
        query = query.where(peers.c.peer_id == peer_id)
    rows = conn.execute(query.order_by(t.at.desc(), t.id.desc()).limit(limit)).mappings().all()
    return [ComputeCheck(peer_id=r["peer_id"], model=r["model"], block=r["block"], at=r["at"], ok=bool(r["ok"]),
                         duration=r["duration"], error=r["error"], error_kind=r["error_kind"],
                         requested_by=r["requested_by"]) for r in reversed(rows)]


def last_away(conn: Connection, peer_ids: Sequence[str], since: float) -> dict[str, tuple[float, Optional[float]]]:
    """peer -> its last time away among the successful polls since ``since``: (the newest poll that
    did not see it ONLINE, for any model — it had left, or was starting again; the first poll that
    saw it ONLINE after that one, None while none has). ``core.compute_checks.away_ended`` makes
    of it when the time away ended, the poll being assessed included."""
    from monitor.core.snapshot import ONLINE
    from monitor.store.schema import Poll, ServerObservationRow

    wanted = list(dict.fromkeys(peer_ids))[:1000]
    if not wanted:
        return {}
    polls, obs, peers = Poll.__table__, ServerObservationRow.__table__, Peer.__table__
    times = dict(conn.execute(sa.select(polls.c.id, polls.c.at).where(polls.c.ok, polls.c.at >= since)).all())
    if not times:
        return {}
    online: dict[int, set[str]] = {poll: set() for poll in times}
    for poll_id, peer_id in conn.execute(
            sa.select(obs.c.poll_id, peers.c.peer_id).join(peers, peers.c.id == obs.c.peer)
            .where(obs.c.poll_id.in_(list(times)), obs.c.state == ONLINE, peers.c.peer_id.in_(wanted))):
        online[poll_id].add(peer_id)
    found: dict[str, tuple[float, Optional[float]]] = {}
    for peer in wanted:
        away_at = back_at = None
        for poll_id, at in sorted(times.items(), key=lambda item: item[1]):
            if peer not in online[poll_id]:
                away_at, back_at = at, None
            elif away_at is not None and back_at is None:
                back_at = at
        if away_at is not None:
            found[peer] = (away_at, back_at)
    return found
