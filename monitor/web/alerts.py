"""Alerts on the web: the /alerts page (active alerts, history, deliveries, silences, maintenance
windows), ``/api/v1/alerts``, and the overview's small "active alerts" panel. Silences and
maintenance windows are created and ended in ``monitor/web/mutes.py``.

Thin: the poller's alert jobs (``monitor/app/alerter.py``) evaluate and deliver; these views only
read what they stored. Webhook URLs never appear (they often carry a secret): only webhook names,
and the error of a failed delivery only to operators (it may name the host).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Optional

from flask import Blueprint, jsonify, request

from monitor.api_doc import OPTIONAL_OPERATOR, MonitorError, documented
from monitor.core.alert_rules import HEARTBEAT
from monitor.core.alert_rules import FIRING, PENDING, Alert, Notice
from monitor.core.common import DAY, HOUR
from monitor.store import StoreError
from monitor.core import muting
from monitor.web import api_models as m
from monitor.web import auth, deps, mutes, timerange
from monitor.web.render import render

log = logging.getLogger(__name__)
bp = Blueprint("alerts", __name__)

HISTORY_LIMIT = 500  # notices per page or API answer
FAILED_SHOWN = 20


@dataclass
class ActiveAlerts:
    """What the overview's panel shows: firing and pending alerts, and deliveries that failed."""

    firing: list[Alert] = field(default_factory=list)
    pending: list[Alert] = field(default_factory=list)
    failed_deliveries: int = 0
    unavailable: bool = False


def active_alerts() -> ActiveAlerts:
    """Firing alerts (most severe first) and failed deliveries of the last day; never raises (the
    overview must render while the database is away)."""
    store = deps().store
    try:
        alerts = [shown(a) for a in store.alerts().values()]
        counts = store.alert_delivery_counts(time.time() - DAY)
    except StoreError as e:
        log.warning("active alerts unavailable: %s", e)
        return ActiveAlerts(unavailable=True)
    order = {"critical": 0, "warning": 1}
    alerts.sort(key=lambda a: (order.get(a.severity, 2), a.since))
    return ActiveAlerts(firing=[a for a in alerts if a.status == FIRING],
                        pending=[a for a in alerts if a.status == PENDING],
                        failed_deliveries=sum(c.get("failed", 0) for c in counts.values()))


@bp.app_context_processor
def _overview_helpers():
    return {"active_alerts": active_alerts}


def _private_silences() -> bool:
    return not auth.is_operator() and not deps().settings.alerts.public_silences


def _hide(reason: Optional[str]) -> Optional[str]:
    """A silence's reason names it and its comment: only "silence" for those who may not read silences."""
    return "silence" if reason is not None and muting.hold_kind(reason) == muting.SILENCE else reason


def shown(item):
    """An alert or notice as this visitor may see it: a silence behind a hold is only named
    "silence" unless they may read silences (operators; everyone with ``public_silences``)."""
    if not _private_silences():
        return item
    if isinstance(item, Alert):
        return replace(item, held=tuple(_hide(why) for why in item.held))
    return replace(item, held=_hide(item.held))


def held_dicts(reasons) -> list[dict]:
    """Why an alert is held: ``{"by": "silence" | "maintenance" | "inhibited", "reason": ...}``."""
    return [{"by": muting.hold_kind(why), "reason": why} for why in reasons]


def alert_dict(alert: Alert) -> dict:
    return {"rule": alert.rule, "kind": alert.kind, "subject": alert.subject, "label": alert.label,
            "status": alert.status, "state": alert.state, "severity": alert.severity, "summary": alert.summary,
            "details": list(alert.details), "since": alert.since, "fired_at": alert.fired_at,
            "notified_at": alert.notified_at, "next_state": alert.next_state,
            "labels": {name: list(values) for name, values in alert.labels.items()},
            "held": held_dicts(alert.held), "announced_state": alert.announced_state,
            # a model's: the servers behind it, each with its cause and whether the receivers were told
            "causes": [{"peer": c.peer, "name": c.name, "cause": c.why, "since": c.since, "told": c.told}
                       for c in alert.causes]}


def notice_dict(notice_id: int, notice: Notice, deliveries=(), *, operator: bool = False) -> dict:
    return {"id": notice_id, "at": notice.at, "event": notice.event, "rule": notice.rule, "kind": notice.kind,
            "subject": notice.subject, "label": notice.label, "state": notice.state,
            "previous_state": notice.previous_state, "severity": notice.severity, "summary": notice.summary,
            "details": list(notice.details), "since": notice.since, "held": notice.held,
            "deliveries": [delivery_dict(d, operator=operator) for d in deliveries]}


def delivery_dict(delivery, *, operator: bool = False) -> dict:
    return {"webhook": delivery.webhook, "status": delivery.status, "attempts": delivery.attempts,
            "created_at": delivery.created_at, "last_attempt_at": delivery.last_attempt_at,
            "next_attempt_at": delivery.next_attempt_at, "delivered_at": delivery.delivered_at,
            **({"last_error": delivery.last_error} if operator else {})}


def rule_dicts(settings) -> list[dict]:
    """The rules in force (what each watches, how long it waits), without their webhooks' URLs."""
    return [{"name": r.name, "kind": r.kind, "for_seconds": r.for_seconds, "repeat_seconds": r.repeat_seconds,
             "models": list(r.models), "peers": list(r.peers), "below": r.below,
             **({"periods": r.periods} if r.kind == "monitor_stale" else {}),
             "webhooks": [h.name for h in settings.alerts.webhooks_for(r.name)]}
            for r in settings.alerts.rules_in_force(settings.scrape_period)]


def evaluation_deadline(settings) -> float:
    """Seconds after which the rules' last evaluation is late: the poller evaluates them at least
    every ``check_period`` and tells the store at least every minute."""
    return 3 * max(settings.alerts.check_period, HEARTBEAT)


def _window() -> tuple[float, float, Optional[float]]:
    """(since, until, hours) from ``?hours=`` (the page) or ``?since=&until=`` (the API)."""
    now = time.time()
    if "since" in request.args or "until" in request.args:
        window = timerange.time_range(request.args, now)  # BadRange: 400 (create_app)
        return window.since, window.until, None
    hours = timerange.window(request.args.get("hours"))
    return now - hours * HOUR, now, hours


@bp.get("/alerts")
def page():
    d = deps()
    since, until, hours = _window()
    operator = auth.is_operator()
    context = dict(
        now=time.time(), hours=hours or 24, windows=timerange.WINDOWS, active=active_alerts(),
        history=[replace(e, notice=shown(e.notice)) for e in d.store.alert_events(since, until, limit=HISTORY_LIMIT)],
        failed=d.store.alert_deliveries(status="failed", limit=FAILED_SHOWN),
        counts=d.store.alert_delivery_counts(time.time() - DAY),
        rules=rule_dicts(d.settings), webhooks=[h.name for h in d.settings.alerts.webhooks],
        enabled=d.settings.alerts.enabled, operator=operator, history_limit=HISTORY_LIMIT,
        evaluated_at=d.store.alerts_evaluated_at(), late_after=evaluation_deadline(d.settings),
        silences=(mutes.listed_silences(d.store, time.time(), operator=operator)
                  if operator or d.settings.alerts.public_silences else None),
        maintenance=mutes.listed_windows(d.store, time.time(), operator=operator),
        weekdays=mutes.mnt.WEEKDAYS, inhibit=d.settings.alerts.inhibit_in_force(),
    )
    return render("alerts.html", {"alerts-live": "partials/alerts_live.html"}, **context)


@bp.get("/api/v1/alerts")
@documented("Active alerts, notices in a range, deliveries and rules", "Alerts", {200: m.AlertsNow, 400: MonitorError},
            query=m.AlertsQuery, auth=OPTIONAL_OPERATOR)
def api():
    """``active`` (pending and firing), ``events`` (notices in the window, newest first, with their
    deliveries), ``deliveries`` (per webhook: pending, delivered, failed in the last 24 h), ``rules``."""
    d = deps()
    since, until, _ = _window()
    operator = auth.is_operator()
    active = sorted((shown(a) for a in d.store.alerts().values()), key=lambda a: (a.status != FIRING, a.since))
    events = [replace(e, notice=shown(e.notice)) for e in d.store.alert_events(since, until, limit=HISTORY_LIMIT)]
    return jsonify(
        enabled=d.settings.alerts.enabled, evaluated_at=d.store.alerts_evaluated_at(),
        active=[alert_dict(a) for a in active],
        events=[notice_dict(e.id, e.notice, e.deliveries, operator=operator) for e in events],
        since=since, until=until, limit=HISTORY_LIMIT,
        deliveries=d.store.alert_delivery_counts(time.time() - DAY),
        rules=rule_dicts(d.settings),
    )
