"""Request rows in SQL: one per request the chat served (``core/requests.py``), no text.

Written by the chat (its own process, or the service's thread) in batches; read by the pages, the
stats API and /metrics (the newest ``MAX_ROWS`` in a window). Kept like the other raw rows: pruned
with the polls, after the rollup has made an ``hourly_requests`` row per model and hour of them
(``hour_rows``); ``hourly`` reads the hours rolled up from the rollup, the others from their
raw rows. Every function takes a connection inside a transaction the caller opened; one bad row
costs only itself (``clean``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR, finite
from monitor.core.assessment import RouteHop
from monitor.core.calibration import Given
from monitor.core.requests import APIS, MAX_HOPS, MAX_ROWS, OUTCOMES, RequestRecord, hour_figures
from monitor.core.contributions import accrue_requests
from monitor.store import contributions, hours
from monitor.store.schema import HourlyRequestsRow, Peer, RequestHopRow, RequestRow
from monitor.store.writes import peer_keys


def clean(record: RequestRecord) -> Optional[dict]:
    """The row to store, or None for a record out of its ranges."""
    if record.api not in APIS or record.outcome not in OUTCOMES or finite(record.at) is None or not record.model:
        return None
    route = [[str(peer)[:128], int(start), int(end)] for peer, start, end in record.route[:MAX_HOPS]
             if 0 <= int(start) < int(end) < 1 << 20]
    numbers = {name: finite(getattr(record, name)) for name in ("waited", "time_to_first_token", "tokens_per_second")}
    if any(value is not None and value < 0 for value in numbers.values()):
        return None
    return {"at": float(record.at), "model": str(record.model)[:256], "api": record.api, "outcome": record.outcome,
            "error_kind": None if record.error_kind is None else str(record.error_kind)[:32],
            "tokens": max(0, min(int(record.tokens), 1 << 30)), "failovers": max(0, min(int(record.failovers), 1 << 20)),
            "route": route, "follow_up": bool(record.follow_up), "continued": bool(record.continued),
            "tokens_not_resent": max(0, min(int(record.tokens_not_resent), 1 << 30)),
            "forecast": record.forecast.to_json() if isinstance(record.forecast, Given) else None, **numbers}


def record(conn: Connection, records: Sequence[RequestRecord]) -> int:
    """Stores the records in range, each with a hop row per server of its route; returns how many
    were left out."""
    rows = [row for row in map(clean, records) if row is not None]
    if not rows:
        return len(records)
    hours.follow_writes(conn, min(row["at"] for row in rows))  # a late row: its hour is rolled up again
    t = RequestRow.__table__
    ids = conn.execute(sa.insert(t).returning(t.c.id, sort_by_parameter_order=True), rows).scalars().all()
    keys = peer_keys(conn, [peer for row in rows for peer, _, _ in row["route"]])
    hops = [{"request": request, "at": row["at"], "peer": keys[peer], "start": start, "end": end}
            for request, row in zip(ids, rows) for peer, start, end in row["route"]]
    if hops:
        conn.execute(sa.insert(RequestHopRow.__table__), hops)
    kept = [r for r in records if clean(r) is not None]
    contributions.record(conn, accrue_requests(kept))  # the servers' tokens for real requests
    return len(records) - len(rows)


def since(conn: Connection, since_at: float, *, model: Optional[str] = None, limit: int = MAX_ROWS,
          route: bool = True, before: Optional[float] = None) -> list[RequestRecord]:
    """Requests at or after ``since_at`` (and before ``before``; of ``model``, if given), the newest
    ``limit``, oldest first (``route`` False: without their routes, which a model's own figures do
    not need)."""
    t = RequestRow.__table__
    query = sa.select(*[c for c in t.c if route or c.name != "route"]).where(t.c.at >= since_at)
    if before is not None:
        query = query.where(t.c.at < before)
    if model is not None:
        query = query.where(t.c.model == model)
    rows = conn.execute(query.order_by(t.c.at.desc(), t.c.id.desc()).limit(limit)).mappings().all()
    return [_record(r) for r in reversed(rows)]


def _record(r) -> RequestRecord:
    return RequestRecord(
        at=r["at"], model=r["model"], api=r["api"], outcome=r["outcome"], error_kind=r["error_kind"],
        route=tuple(RouteHop(str(p), int(s), int(e)) for p, s, e in (r.get("route") or ())), waited=r["waited"],
        time_to_first_token=r["time_to_first_token"], tokens=r["tokens"], tokens_per_second=r["tokens_per_second"],
        failovers=r["failovers"], follow_up=bool(r["follow_up"]), continued=bool(r["continued"]),
        tokens_not_resent=r["tokens_not_resent"] or 0, forecast=Given.from_json(r.get("forecast")))


def through(conn: Connection, peer_id: str, since_at: float, *, limit: int = MAX_ROWS) -> list[RequestRecord]:
    """Requests at or after ``since_at`` whose route went through ``peer_id`` (by its hop rows'
    index), the newest ``limit``, oldest first."""
    t, hops, peers = RequestRow.__table__, RequestHopRow.__table__, Peer.__table__
    wanted = (sa.select(hops.c.request).join(peers, peers.c.id == hops.c.peer)
              .where(peers.c.peer_id == peer_id, hops.c.at >= since_at))
    rows = conn.execute(sa.select(t).where(t.c.id.in_(wanted)).order_by(t.c.at.desc(), t.c.id.desc())
                        .limit(limit)).mappings().all()
    return [_record(r) for r in reversed(rows)]


def prune(conn: Connection, before: float) -> int:
    t, hops = RequestRow.__table__, RequestHopRow.__table__
    conn.execute(sa.delete(hops).where(hops.c.at < before))
    return conn.execute(sa.delete(t).where(t.c.at < before)).rowcount or 0


def hour_rows(conn: Connection, hour: float, end: float) -> list[dict]:
    """The rollup of [hour, end): an ``hourly_requests`` row per model (``hour_figures``)."""
    by_model: dict[str, list[RequestRecord]] = {}
    for record in since(conn, hour, before=end, limit=1 << 31, route=False):
        by_model.setdefault(record.model, []).append(record)
    return [{"model": model, "hour": hour, **hour_figures(records)} for model, records in by_model.items()]


def hourly(conn: Connection, model: str, since_at: float, until: float) -> list[dict]:
    """Per hour of [since_at, until] with requests of ``model``, oldest first: ``{"hour", **hour_figures}``
    — from the rollup for the hours rolled up (before the watermark), from the raw rows for the
    hours after it (the current hour, mostly), so a week is read in a few hundred rows."""
    rolled = HourlyRequestsRow.__table__
    done = hours.rolled_up_until(conn)
    found: dict[float, dict] = {}
    if done is not None:
        for r in conn.execute(sa.select(rolled).where(rolled.c.model == model, rolled.c.hour + HOUR > since_at,
                                                      rolled.c.hour <= until, rolled.c.hour < done)).mappings():
            found[r["hour"]] = {name: r[name] for name in r.keys() if name != "model"}
    start = max(hours.floor_hour(since_at), done if done is not None else hours.floor_hour(since_at))
    by_hour: dict[float, list[RequestRecord]] = {}
    for record in since(conn, start, model=model, route=False, before=until):
        by_hour.setdefault(hours.floor_hour(record.at), []).append(record)
    found.update({hour: {"hour": hour, **hour_figures(records)} for hour, records in by_hour.items()})
    return [found[hour] for hour in sorted(found)]
