"""Silences and maintenance windows on the web: operators create and end them (Alerts page forms
and ``/api/v1/silences``, ``/api/v1/maintenance``); everyone else may at most read the silences
in force, and only if ``alerts.public_silences`` allows it.

This is the edge where what people typed enters: every field is checked once, by its rule in the
body's model (``api_models.SilenceBody``, ``WindowBody``, ``EndBody``: also what the API's document
shows), and combined here into the core's types (``core.muting.Silence``,
``core.maintenance.MaintenanceWindow``); anything out of bounds (a huge, negative or non-finite
duration, an end before the start, an unknown time zone, a bad matcher, a reason too long) is a 400
that says what to change. Every creation and ending is
logged by the store with who (the name the operator gives, ``by``), when, how (API token or
browser session) and why.

The two are handled alike (listed, created, ended, answered): one set of handlers serves both,
told what differs by a small table (``_Kind``: JSON keys, the store's methods, the words).

Operators prove who they are as everywhere (``web/auth.py``): scripts send the bearer token to the
API; browsers post the Alerts page's forms with their session and its CSRF token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from flask import Blueprint, abort, jsonify, redirect, request, url_for

from monitor.core import maintenance as mnt
from monitor.core import timefmt
from monitor.core.common import DAY
from monitor.core.maintenance import MaintenanceWindow, Recurrence
from monitor.core.muting import Silence
from monitor.api_doc import OPERATOR, OPTIONAL_OPERATOR, MonitorError, documented
from monitor.web import api_models as m
from monitor.web import auth, deps

bp = Blueprint("mutes", __name__)

RECENT = 7 * DAY  # ended silences and windows listed this long
LISTED = 200


# ---- reading fields: each one's rule is its model's (``api_models``); here, how they combine -------


def _fields() -> Mapping[str, Any]:
    """The request's JSON object or form (a form's ``weekdays``: every box ticked)."""
    if request.is_json:
        data = request.get_json(silent=True)
        if not isinstance(data, dict):
            raise m.BadInput("the body must be a JSON object")
        return data
    data = request.form.to_dict()
    if len(request.form.getlist("weekdays")) > 1:
        data["weekdays"] = request.form.getlist("weekdays")
    return data


def _via() -> str:
    scheme = request.headers.get("Authorization", "").partition(" ")[0].lower()
    return "api token" if scheme == "bearer" else "browser session"


# ---- silences ---------------------------------------------------------------------------------------


def silence_from(body: m.SilenceBody, now: float) -> Silence:
    """A new silence from a request's checked body."""
    starts, ends = body.span
    return Silence(id=0, matchers=body.silenced, starts_at=starts, ends_at=ends, comment=body.comment or body.reason,
                   created_by=body.author, created_at=now)


def silence_dict(s: Silence, now: float, changes=(), *, operator: bool) -> dict:
    return {"id": s.id, "matchers": [str(m) for m in s.matchers],
            "matcher_parts": [{"name": m.name, "op": m.op, "value": m.value} for m in s.matchers],
            "starts_at": s.starts_at, "ends_at": s.ends_at, "comment": s.comment,
            "status": "active" if s.active(now) else "pending" if s.starts_at > now else "expired",
            **({"created_by": s.created_by, "created_at": s.created_at, "ended_at": s.ended_at,
                "ended_by": s.ended_by, "changes": [change_dict(c) for c in changes]} if operator else {})}


def change_dict(c) -> dict:
    return {"at": c.at, "action": c.action, "by": c.by, "via": c.via, "why": c.why}


# ---- maintenance windows ----------------------------------------------------------------------------


def window_from(body: m.WindowBody, now: float) -> MaintenanceWindow:
    """A new maintenance window from a request's checked fields (BadInput says what is wrong with
    them together)."""
    starts, ends, duration, weekdays = body.starts_at or now, body.ends_at, body.duration, body.weekdays
    fields = dict(id=0, scope=body.scope, target=body.target, starts_at=starts, reason=body.reason, created_at=now,
                  created_by=body.author)
    if not (weekdays or body.at or body.cron):
        if (duration is None) == (ends is None):
            raise m.BadInput("a one-off window needs either `duration` (like \"2h\") or `ends_at`, not both; a "
                             "recurring one `weekdays` and `at`, or `cron`, with `duration`")
        ends = starts + duration if duration is not None else ends
        if ends <= max(starts, now):
            raise m.BadInput("the window must end after it starts, and in the future")
        if ends - starts > mnt.MAX_ONE_OFF:
            raise m.BadInput(f"a one-off window lasts at most {timefmt.duration(mnt.MAX_ONE_OFF)}")
        return MaintenanceWindow(**fields, ends_at=ends)
    if duration is None:
        raise m.BadInput("a recurring window needs `duration`: how long each occurrence lasts (like \"2h\")")
    try:
        if weekdays is not None and not isinstance(weekdays, list):
            raise ValueError("`weekdays` must be a list of days like [\"Sat\", \"Sun\"]")
        days = mnt.weekday_numbers(weekdays or [])
        recurrence = mnt.check_recurrence(Recurrence(duration=duration, timezone=body.timezone, weekdays=days,
                                                     at=body.at, cron=body.cron))
    except ValueError as e:
        raise m.BadInput(str(e)) from None
    if ends is not None and ends <= max(starts, now):
        raise m.BadInput("`ends_at` (the last day it applies) must be after `starts_at`, and in the future")
    return MaintenanceWindow(**fields, ends_at=ends, recurrence=recurrence)


def window_dict(w: MaintenanceWindow, now: float, changes=(), *, operator: bool = True) -> dict:
    rec = w.recurrence
    in_force = bool(mnt.active([w], now))
    return {"id": w.id, "scope": w.scope, "target": w.target, "reason": w.reason, "starts_at": w.starts_at,
            "ends_at": w.ends_at, "recurring": rec is not None,
            "recurrence": None if rec is None else {
                "duration": rec.duration, "timezone": rec.timezone, "cron": rec.cron, "at": rec.at,
                "weekdays": [mnt.WEEKDAYS[d] for d in rec.weekdays], "description": rec.describe()},
            "in_force": in_force, "current_end": mnt.current_end(w, now) if in_force else None,
            "next_start": mnt.next_start(w, now),
            "status": "active" if in_force else "expired" if w.ends_at is not None and w.ends_at <= now else "scheduled",
            **({"created_by": w.created_by, "created_at": w.created_at, "ended_at": w.ended_at, "ended_by": w.ended_by,
                "changes": [change_dict(c) for c in changes]} if operator else {})}


# ---- the two kinds: what differs between them ------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    """What the handlers below need to know of silences or of maintenance windows; the rest (how
    they are listed, created, ended and answered) is the same for both."""

    name: str  # the store's kind of mute change, and the key of one item in JSON
    noun: str  # for people
    plural: str  # the key of the list in JSON
    anchor: str  # the Alerts page's heading of its panel
    body: type[m.Body]  # what a request to create one sends
    parse: Callable[[Any, float], Any]  # its checked body, now -> a new item (BadInput: bad together)
    as_dict: Callable[..., dict]  # (item, now, changes, operator=...) -> its JSON
    listing: str  # the store's methods: list, create and end
    create: str
    end: str


SILENCES = _Kind(name="silence", noun="silence", plural="silences", anchor="silences-h", body=m.SilenceBody,
                 parse=silence_from,
                 as_dict=silence_dict, listing="silences", create="create_silence", end="end_silence")
MAINTENANCE = _Kind(name="maintenance", noun="maintenance window", plural="maintenance", anchor="maintenance-h",
                    body=m.WindowBody, parse=window_from, as_dict=window_dict, listing="maintenance_windows",
                    create="create_maintenance_window", end="end_maintenance_window")


def _listed(kind: _Kind, store, now: float, *, operator: bool) -> list[tuple[Any, list]]:
    """Operators: the items in force, to come, or ended in the last week, with their changes;
    others: those in force or to come."""
    found = getattr(store, kind.listing)(ending_after=now - RECENT if operator else now, limit=LISTED)
    changes = store.mute_changes(kind.name, [item.id for item in found]) if operator else {}
    return [(item, changes.get(item.id, [])) for item in found]


def listed_silences(store, now: float, *, operator: bool) -> list[tuple[Silence, list]]:
    return _listed(SILENCES, store, now, operator=operator)


def listed_windows(store, now: float, *, operator: bool) -> list[tuple[MaintenanceWindow, list]]:
    return _listed(MAINTENANCE, store, now, operator=operator)


# ---- handling them: the API and the Alerts page's forms -------------------------------------------


def _list(kind: _Kind):
    now = time.time()
    operator = auth.is_operator()
    return jsonify(**{kind.plural: [kind.as_dict(item, now, changes, operator=operator)
                                    for item, changes in _listed(kind, deps().store, now, operator=operator)]})


def _create(kind: _Kind) -> int:
    """A new item from the request's fields, stored; its id (BadInput says what is wrong)."""
    now = time.time()
    item = kind.parse(m.checked(kind.body, _fields(), now=now), now)
    return getattr(deps().store, kind.create)(item, via=_via())


def _api_create(kind: _Kind):
    try:
        new_id = _create(kind)
    except m.BadInput as e:
        abort(400, description=str(e))
    now = time.time()
    stored, changes = next(item for item in _listed(kind, deps().store, now, operator=True) if item[0].id == new_id)
    return jsonify(**{kind.name: kind.as_dict(stored, now, changes, operator=True)}), 201


def _end(kind: _Kind, item_id: int):
    """End a silence or window now (the request's optional ``reason`` and ``by``); the item, or a
    404 if there is no such item."""
    now = time.time()
    try:
        end = m.checked(m.EndBody, _fields() if request.content_length or request.form else {})
    except m.BadInput as e:
        abort(400, description=str(e))
    found = getattr(deps().store, kind.end)(item_id, at=now, by=end.author, via=_via(), why=end.why)
    if found is None:
        abort(404, description=f"there is no {kind.noun} {item_id}")
    return found


def _api_end(kind: _Kind, item_id: int):
    found = _end(kind, item_id)
    changes = deps().store.mute_changes(kind.name, [found.id]).get(found.id, [])
    return jsonify(**{kind.name: kind.as_dict(found, time.time(), changes, operator=True)})


def _form_create(kind: _Kind):
    try:
        _create(kind)
    except m.BadInput as e:
        abort(400, description=f"{e}. Go back and correct the form.")
    return _back(kind)


def _form_end(kind: _Kind, item_id: int):
    _end(kind, item_id)
    return _back(kind)


def _back(kind: _Kind):
    return redirect(url_for("alerts.page") + f"#{kind.anchor}", code=303)


def _readers_may_see_silences() -> None:
    if not auth.is_operator() and not deps().settings.alerts.public_silences:
        abort(401, description="operators only: this monitor does not show its silences to everyone "
                               "(alerts.public_silences); send 'Authorization: Bearer <token>'")


# ---- the routes --------------------------------------------------------------------------------------


@bp.get("/api/v1/silences")
@documented("Silences in force and to come (operators: also ended ones, with who and why)", "Alerts",
            {200: m.Silences, 401: MonitorError}, auth=OPTIONAL_OPERATOR,
            description="Anyone may read them if `alerts.public_silences` allows it; else operators only.")
def api_silences():
    """Silences in force and to come (operators: also those ended in the last 7 days, with who
    created and ended them, when and why)."""
    _readers_may_see_silences()
    return _list(SILENCES)


@bp.post("/api/v1/silences")
@documented("Create a silence", "Alerts", {201: m.OneSilence, 400: MonitorError}, body=m.SilenceBody, auth=OPERATOR)
@auth.operator_required
def api_create_silence():
    return _api_create(SILENCES)


@bp.route("/api/v1/silences/<int:silence_id>/end", methods=["POST"])
@bp.route("/api/v1/silences/<int:silence_id>", methods=["DELETE"])
@documented("End a silence now", "Alerts", {200: m.OneSilence, **m.ERRORS}, body=m.EndBody, auth=OPERATOR)
@auth.operator_required
def api_end_silence(silence_id: int):
    """End a silence now (JSON ``{"reason": ..., "by": ...}``, both optional)."""
    return _api_end(SILENCES, silence_id)


@bp.get("/api/v1/maintenance")
@documented("Maintenance windows not over (operators: also those over in the last 7 days)", "Alerts",
            {200: m.Windows}, auth=OPTIONAL_OPERATOR)
def api_maintenance():
    """Maintenance windows not over (operators: also those over in the last 7 days, with their
    changes); anyone may read them: the pages say "maintenance" to everyone anyway."""
    return _list(MAINTENANCE)


@bp.post("/api/v1/maintenance")
@documented("Create a maintenance window", "Alerts", {201: m.OneWindow, 400: MonitorError}, body=m.WindowBody,
            auth=OPERATOR)
@auth.operator_required
def api_create_window():
    return _api_create(MAINTENANCE)


@bp.route("/api/v1/maintenance/<int:window_id>/end", methods=["POST"])
@bp.route("/api/v1/maintenance/<int:window_id>", methods=["DELETE"])
@documented("End a maintenance window now (a recurring one for good)", "Alerts", {200: m.OneWindow, **m.ERRORS},
            body=m.EndBody, auth=OPERATOR)
@auth.operator_required
def api_end_window(window_id: int):
    """End a maintenance window now (a recurring one for good)."""
    return _api_end(MAINTENANCE, window_id)


# the Alerts page's forms (session + CSRF, or the bearer token)


@bp.post("/alerts/silences")
@auth.operator_required
def form_create_silence():
    return _form_create(SILENCES)


@bp.post("/alerts/silences/<int:silence_id>/end")
@auth.operator_required
def form_end_silence(silence_id: int):
    return _form_end(SILENCES, silence_id)


@bp.post("/alerts/maintenance")
@auth.operator_required
def form_create_window():
    return _form_create(MAINTENANCE)


@bp.post("/alerts/maintenance/<int:window_id>/end")
@auth.operator_required
def form_end_window(window_id: int):
    return _form_end(MAINTENANCE, window_id)


# ---- what the pages show: maintenance in force -------------------------------------------------------


def windows_in_force(now: Optional[float] = None) -> list[MaintenanceWindow]:
    """Maintenance windows in force now (for the overview, model and peer pages); never raises:
    a page renders without the mark while the database is away."""
    from monitor.store import StoreError

    now = time.time() if now is None else now
    try:
        return mnt.active(deps().store.maintenance_windows(ending_after=now), now)
    except StoreError:
        return []


def maintenance_for(windows: list[MaintenanceWindow], *, model: Optional[str] = None,
                    peers: tuple = ()) -> list[MaintenanceWindow]:
    return [w for w in windows if w.covers(models=(model,) if model else (), peers=peers)]


@bp.app_context_processor
def _maintenance_helpers():
    return {"maintenance_now": windows_in_force, "maintenance_for": maintenance_for,
            "maintenance_until": lambda w, now: mnt.current_end(w, now)}

