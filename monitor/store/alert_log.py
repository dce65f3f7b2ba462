"""Alerts in SQL: the evaluator's memory (``alerts``), every notice (``alert_events``) and the
outbox of deliveries to webhooks (``alert_deliveries``).

A notice and its deliveries are written in the same transaction as the alert's new state, so a
poller that dies at any point either did both (and the deliveries are sent after its restart) or
neither (and the next evaluation decides again): nothing is lost, nothing is announced twice.
A delivery is marked delivered only after the webhook answered 2xx; if the process dies between
the two, the notice goes out once more (at least once), carrying the same ``id`` so a receiver
can tell.

Every function takes a connection inside a transaction (``Database.read`` / ``write``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.alert_rules import Alert, Cause, Evaluation, Notice
from monitor.core.common import jsonable
from monitor.store.engine import insert
from monitor.store.schema import AlertDeliveryRow, AlertEventRow, AlertRow, StoreMetaRow

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"  # a delivery's status
EVALUATED_AT = "alerts_evaluated_at"  # store_meta key: the alert job's latest evaluation (a heartbeat)
DELIVERY_STATUSES = (PENDING, DELIVERED, FAILED)
MAX_CAUSES = 500  # a model alert's lost servers kept (a whole swarm's)


@dataclass(frozen=True)
class Delivery:
    """One notice to one webhook, and how sending it went."""

    id: int
    event_id: int
    webhook: str
    status: str  # pending | delivered | failed
    attempts: int
    created_at: float
    next_attempt_at: Optional[float] = None
    last_attempt_at: Optional[float] = None
    delivered_at: Optional[float] = None
    last_error: Optional[str] = None
    notice: Optional[Notice] = None  # the notice itself (due and recent deliveries)


@dataclass(frozen=True)
class StoredNotice:
    """A notice from the history, with how its deliveries went."""

    id: int
    notice: Notice
    deliveries: tuple[Delivery, ...] = ()


def _cut(text: Optional[str], limit: int) -> Optional[str]:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def _alert_values(alert: Alert) -> dict:
    return {"rule": _cut(alert.rule, 100), "subject": _cut(alert.subject, 256), "kind": alert.kind,
            "label": _cut(alert.label, 400), "status": alert.status, "state": alert.state,
            "severity": alert.severity, "summary": _cut(alert.summary, 400), "details": jsonable(alert.details),
            "since": alert.since, "fired_at": alert.fired_at, "notified_at": alert.notified_at,
            "next_state": alert.next_state, "next_since": alert.next_since, "models": jsonable(alert.models),
            "peer": _cut(alert.peer, 128), "peer_name": _cut(alert.peer_name, 200),
            "held": jsonable([_cut(why, 300) for why in alert.held]), "announced_state": alert.announced_state,
            "causes": jsonable([[c.peer, c.name, c.why, c.since, c.told] for c in alert.causes[:MAX_CAUSES]]),
            "clear_since": alert.clear_since}


def _alert(row) -> Alert:
    return Alert(rule=row.rule, kind=row.kind, subject=row.subject, label=row.label, status=row.status,
                 state=row.state, severity=row.severity, summary=row.summary, since=row.since,
                 details=tuple(row.details or ()), fired_at=row.fired_at, notified_at=row.notified_at,
                 next_state=row.next_state, next_since=row.next_since, models=tuple(row.models or ()),
                 peer=row.peer, peer_name=row.peer_name, held=tuple(row.held or ()),
                 announced_state=row.announced_state, causes=tuple(_cause(c) for c in (row.causes or ())),
                 clear_since=row.clear_since)


def _cause(stored) -> Cause:
    """[peer, name, why, since, told]; a row of before the causes had reasons ([peer, name]) was
    told when its alert fired."""
    if len(stored) < 5:
        return Cause(stored[0], stored[1], told=True)
    peer, name, why, since, told = stored[:5]
    return Cause(peer, name, why or "", since=since, told=bool(told))


def _notice(fields, prefix: str = "") -> Notice:
    """A notice from an ``alert_events`` row's mapping (its columns named ``prefix`` + name)."""
    def get(name):
        return fields[prefix + name]

    return Notice(rule=get("rule"), kind=get("kind"), subject=get("subject"), label=get("label"), event=get("event"),
                  state=get("state"), severity=get("severity"), summary=get("summary"), at=get("at"),
                  since=get("since"), details=tuple(get("details") or ()), previous_state=get("previous_state"),
                  models=tuple(get("models") or ()), peer=get("peer"), peer_name=get("peer_name"), held=get("held"),
                  causes=tuple((c[0], c[1], c[2]) for c in (get("causes") or ()) if len(c) >= 3))


def load_alerts(conn: Connection) -> dict[tuple[str, str], Alert]:
    """Every pending or firing alert, by (rule, subject)."""
    t = AlertRow.__table__
    return {(row.rule, row.subject): _alert(row) for row in conn.execute(sa.select(t).order_by(t.c.since))}


def evaluated_at(conn: Connection) -> Optional[float]:
    """When the alert job last evaluated the rules (written at most a minute apart), or None."""
    t = StoreMetaRow.__table__
    value = conn.execute(sa.select(t.c.value).where(t.c.key == EVALUATED_AT)).scalar()
    return float(value) if value is not None else None


def record_evaluation(conn: Connection, evaluation: Evaluation, webhooks_for: Callable[[Notice], Iterable[str]],
                      now: float, group_wait: float = 0.0) -> list[int]:
    """Store what one evaluation changed: alerts upserted and deleted, its notices, and one pending
    delivery per notice and webhook (due ``group_wait`` from now), the notices it held (history
    only, no delivery), and when it ran. Returns the sent notices' ids."""
    meta = insert(conn, StoreMetaRow.__table__).values(key=EVALUATED_AT, value=repr(now))
    conn.execute(meta.on_conflict_do_update(index_elements=["key"], set_={"value": meta.excluded.value}))
    alerts = AlertRow.__table__
    for key in evaluation.removed:
        conn.execute(sa.delete(alerts).where(alerts.c.rule == key[0], alerts.c.subject == key[1]))
    for alert in evaluation.changed:
        conn.execute(sa.delete(alerts).where(alerts.c.rule == alert.rule, alerts.c.subject == alert.subject))
        conn.execute(sa.insert(alerts).values(**_alert_values(alert)))
    ids = []
    events, deliveries = AlertEventRow.__table__, AlertDeliveryRow.__table__
    for notice in (*evaluation.notices, *evaluation.held):
        event_id = conn.execute(sa.insert(events).values(
            at=notice.at, rule=_cut(notice.rule, 100), subject=_cut(notice.subject, 256), kind=notice.kind,
            label=_cut(notice.label, 400), event=notice.event, state=notice.state,
            previous_state=notice.previous_state, severity=notice.severity, summary=_cut(notice.summary, 400),
            details=jsonable(notice.details), since=notice.since, models=jsonable(notice.models),
            peer=_cut(notice.peer, 128), peer_name=_cut(notice.peer_name, 200), held=_cut(notice.held, 300),
            causes=jsonable([[peer, name, why] for peer, name, why in notice.causes[:MAX_CAUSES]]) or None,
        )).inserted_primary_key[0]
        if notice.held is not None:
            continue
        ids.append(event_id)
        for webhook in webhooks_for(notice):
            conn.execute(sa.insert(deliveries).values(event_id=event_id, webhook=webhook, status=PENDING, attempts=0,
                                                      created_at=now, next_attempt_at=now + group_wait))
    return ids


def _delivery(row, notice: Optional[Notice] = None) -> Delivery:
    return Delivery(id=row.id, event_id=row.event_id, webhook=row.webhook, status=row.status, attempts=row.attempts,
                    created_at=row.created_at, next_attempt_at=row.next_attempt_at,
                    last_attempt_at=row.last_attempt_at, delivered_at=row.delivered_at, last_error=row.last_error,
                    notice=notice)


def _with_notices(conn: Connection, where, order, limit: int) -> list[Delivery]:
    d, e = AlertDeliveryRow.__table__, AlertEventRow.__table__
    query = sa.select(d, *[c.label(f"e_{c.name}") for c in e.c]).join(e, e.c.id == d.c.event_id)
    rows = conn.execute(query.where(where).order_by(*order).limit(limit)).all()
    return [_delivery(row, _notice(row._mapping, "e_")) for row in rows]


def pending_deliveries(conn: Connection, limit: int) -> list[Delivery]:
    """Pending deliveries (due or waiting for a retry), oldest notice first."""
    d = AlertDeliveryRow.__table__
    return _with_notices(conn, d.c.status == PENDING, (d.c.event_id, d.c.id), limit)


def recent_deliveries(conn: Connection, status: Optional[str], limit: int) -> list[Delivery]:
    """The latest deliveries (of one status, or any), newest first."""
    d = AlertDeliveryRow.__table__
    where = d.c.status == status if status else sa.true()
    return _with_notices(conn, where, (d.c.id.desc(),), limit)


def record_attempt(conn: Connection, delivery_id: int, *, ok: bool, at: float, error: Optional[str],
                   retry_at: Optional[float]) -> None:
    """One attempt's outcome: delivered; or failed, to be retried at ``retry_at`` (None: given up)."""
    d = AlertDeliveryRow.__table__
    status = DELIVERED if ok else (PENDING if retry_at is not None else FAILED)
    conn.execute(sa.update(d).where(d.c.id == delivery_id).values(
        status=status, attempts=d.c.attempts + 1, last_attempt_at=at, delivered_at=at if ok else None,
        next_attempt_at=retry_at if not ok else None, last_error=None if ok else _cut(error or "failed", 300)))


def events(conn: Connection, since: float, until: float, limit: int) -> list[StoredNotice]:
    """Notices in [since, until], newest first, each with its deliveries."""
    e, d = AlertEventRow.__table__, AlertDeliveryRow.__table__
    rows = conn.execute(sa.select(e).where(e.c.at >= since, e.c.at <= until)
                        .order_by(e.c.at.desc(), e.c.id.desc()).limit(limit)).all()
    ids = [row.id for row in rows]
    by_event: dict[int, list[Delivery]] = {}
    if ids:
        for row in conn.execute(sa.select(d).where(d.c.event_id.in_(ids)).order_by(d.c.id)):
            by_event.setdefault(row.event_id, []).append(_delivery(row))
    return [StoredNotice(row.id, _notice(row._mapping), tuple(by_event.get(row.id, ()))) for row in rows]


def delivery_counts(conn: Connection, since: float) -> dict[str, dict[str, int]]:
    """webhook -> status -> deliveries created since ``since`` (every pending one, whenever made)."""
    d = AlertDeliveryRow.__table__
    query = (sa.select(d.c.webhook, d.c.status, sa.func.count())
             .where(sa.or_(d.c.created_at >= since, d.c.status == PENDING)).group_by(d.c.webhook, d.c.status))
    counts: dict[str, dict[str, int]] = {}
    for webhook, status, n in conn.execute(query):
        counts.setdefault(webhook, dict.fromkeys(DELIVERY_STATUSES, 0))[status] = n
    return counts


def prune(conn: Connection, before: float) -> dict[str, int]:
    """Delete notices older than ``before`` and their deliveries (never a pending one's notice)."""
    e, d = AlertEventRow.__table__, AlertDeliveryRow.__table__
    pending = sa.select(d.c.event_id).where(d.c.status == PENDING)
    old = sa.select(e.c.id).where(e.c.at < before, e.c.id.not_in(pending))
    deliveries = conn.execute(sa.delete(d).where(d.c.event_id.in_(old))).rowcount
    notices = conn.execute(sa.delete(e).where(e.c.at < before, e.c.id.not_in(pending))).rowcount
    return {"alert_events": notices, "alert_deliveries": deliveries}
