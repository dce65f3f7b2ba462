"""Generation checks in SQL: every check of every model, with its figures, answer and route.

Written by the poller's generation check job (``monitor/app/generation_check.py``), one row per
model per check period; read by the poller (the diagnosis takes the latest check of each model),
the pages (the overview's line, the model page's plot of time to first token and tokens per
second) and the state API and /metrics. Raw rows only, kept as long as the other raw rows (the
retention prunes them with the polls). Every function takes a connection inside a transaction the
caller opened.
"""

from __future__ import annotations

from typing import Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import finite
from monitor.core.generation import GenerationCheck, RouteSpan
from monitor.store.schema import GenerationCheckRow

_TEXT_LIMITS = {"model": 256, "error": 300, "answer": 300, "expect": 200}
_NUMBERS = ("time_to_first_token", "tokens_per_second", "duration")
MAX_ROUTE_SPANS = 64  # spans kept per check (a route is a few; failures add one each)


def record(conn: Connection, checks: Sequence[GenerationCheck]) -> None:
    rows = []
    for check in checks:
        row = {"at": check.at, "ok": check.ok, "matched": check.matched, "tokens": max(0, int(check.tokens)),
               "route": [{"peer_id": span.peer_id, "start": span.start, "end": span.end,
                          "error": None if span.error is None else span.error[:300]}
                         for span in check.route[:MAX_ROUTE_SPANS]]}
        row.update({name: finite(getattr(check, name)) for name in _NUMBERS})
        row.update({name: (None if getattr(check, name) is None else str(getattr(check, name))[:limit])
                    for name, limit in _TEXT_LIMITS.items()})
        rows.append(row)
    if rows:
        conn.execute(sa.insert(GenerationCheckRow.__table__), rows)


def latest(conn: Connection) -> dict[str, GenerationCheck]:
    """model -> its newest check."""
    t = GenerationCheckRow.__table__
    newest = sa.select(sa.func.max(t.c.id)).group_by(t.c.model)
    rows = conn.execute(sa.select(t).where(t.c.id.in_(newest))).mappings().all()
    return {r["model"]: _check(r) for r in rows}


def history(conn: Connection, model: str, since: float, until: Optional[float] = None, *,
            limit: int = 5000) -> list[GenerationCheck]:
    """The model's checks in [since, until] (the newest ``limit``), oldest first."""
    t = GenerationCheckRow.__table__
    query = sa.select(t).where(t.c.model == model, t.c.at >= since)
    if until is not None:
        query = query.where(t.c.at <= until)
    rows = conn.execute(query.order_by(t.c.at.desc(), t.c.id.desc()).limit(limit)).mappings().all()
    return [_check(r) for r in reversed(rows)]


def prune(conn: Connection, before: float) -> int:
    """Delete checks older than ``before``; returns how many."""
    t = GenerationCheckRow.__table__
    return conn.execute(sa.delete(t).where(t.c.at < before)).rowcount or 0


def _check(r) -> GenerationCheck:
    route = tuple(RouteSpan(peer_id=str(span["peer_id"]), start=int(span["start"]), end=int(span["end"]),
                            error=span.get("error"))
                  for span in (r["route"] or ()))
    return GenerationCheck(
        model=r["model"], at=r["at"], ok=bool(r["ok"]), error=r["error"], answer=r["answer"], expect=r["expect"],
        matched=None if r["matched"] is None else bool(r["matched"]),
        time_to_first_token=r["time_to_first_token"], tokens_per_second=r["tokens_per_second"],
        tokens=r["tokens"], duration=r["duration"], route=route,
    )
