"""Badges: a model's or a server's state and uptime as an SVG image, or as shields.io's endpoint JSON.

Contributors put their server's status in a README or a Discord channel, model owners whether
their model is served (as Uptime Kuma's, Gatus' and healthchecks' badges)::

    /badges/models/<dht_prefix>/state.svg       healthy | degraded | broken | unknown | maintenance
    /badges/models/<dht_prefix>/uptime/7d.svg   uptime over 24h, 7d or 30d (maintenance left out)
    /badges/peers/<peer_id>/state.svg           online | joining | unreachable | offline | unknown | maintenance
    /badges/peers/<peer_id>/uptime/30d.svg
    /badges/peers/<peer_id>/contribution.svg    "1,234 verified block-hours" (``?window=day|week|month``; all time)
    (each also as .json: {"schemaVersion": 1, "label", "message", "color"} for
    https://img.shields.io/endpoint?url=...)

Readable without login, by any origin (``cors.py``); cacheable: an ``ETag`` (a ``304`` for a
matching ``If-None-Match``) and ``Cache-Control: public, max-age=60``. A model or peer this
monitor does not know — or an id that is not one — gets a grey "unknown" badge, never an error
page (an image tag shows nothing for an error). ``?label=`` replaces the left-hand text.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Optional
from urllib.parse import quote
from xml.sax.saxutils import escape

from flask import Blueprint, Response, abort, request, url_for

from monitor.core import maintenance, uptime
from monitor.core.incidents import check_author
from monitor.web import contributors, deps, queries, security, state_api, status

bp = Blueprint("badges", __name__, url_prefix="/badges")

MAX_AGE = 60
MAX_LABEL = 40
GREEN, AMBER, RED, GREY, BLUE, LABEL = "1f7a3f", "9a6700", "b3362a", "5f6b7a", "2f6fcb", "444c56"
COLORS = {"healthy": GREEN, "online": GREEN, "degraded": AMBER, "joining": AMBER, "broken": RED,
          "unreachable": RED, "offline": RED, "unknown": GREY, uptime.MAINTENANCE: BLUE, uptime.NO_DATA: GREY}
FORMATS = ("svg", "json")
PEER_STATE_ORDER = ("online", "joining", "unreachable", "offline")  # a server of several models: its best


def uptime_color(share: Optional[float]) -> str:
    if share is None:
        return GREY
    return GREEN if share >= 0.99 else AMBER if share >= 0.95 else RED


# ---- the image ---------------------------------------------------------------------------------

_NARROW, _WIDE = set("fijlrt.,:;|!'()[] 1I"), set("mwMW%@")


def text_width(text: str) -> int:
    """Pixels of ``text`` in 11 px Verdana, near enough to size the badge (shields does the same
    with a table of widths)."""
    width = 0.0
    for ch in text:
        width += 3.9 if ch in _NARROW else 10.0 if ch in _WIDE else 8.0 if ch.isupper() else 7.0 if ch.isdigit() \
            else 6.6
    return int(round(width))


def svg(label: str, message: str, color: str) -> str:
    """A flat badge: ``label`` on grey, ``message`` on ``color`` (hex without '#'); texts escaped."""
    lw, mw = text_width(label) + 12, text_width(message) + 12
    w = lw + mw
    title = escape(f"{label}: {message}")
    lab, msg = escape(label), escape(message)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="20" role="img" aria-label="{title}">'
            f"<title>{title}</title>"
            '<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/>'
            '<stop offset="1" stop-opacity=".1"/></linearGradient>'
            f'<clipPath id="r"><rect width="{w}" height="20" rx="3" fill="#fff"/></clipPath>'
            f'<g clip-path="url(#r)"><rect width="{lw}" height="20" fill="#{LABEL}"/>'
            f'<rect x="{lw}" width="{mw}" height="20" fill="#{color}"/><rect width="{w}" height="20" fill="url(#s)"/></g>'
            '<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">'
            f'<text x="{lw / 2:g}" y="14">{lab}</text><text x="{lw + mw / 2:g}" y="14">{msg}</text></g></svg>\n')


def shields(label: str, message: str, color: str) -> str:
    return json.dumps({"schemaVersion": 1, "label": label, "message": message, "color": color}) + "\n"


def _respond(label: str, message: str, color: str, fmt: str) -> Response:
    """The badge with its ETag and a short Cache-Control; 304 for a matching If-None-Match."""
    custom = (request.args.get("label") or "").strip()[:MAX_LABEL]
    if custom:
        try:
            label = check_author(custom)  # the rules of a name: printable, one line
        except ValueError:
            pass
    body = svg(label, message, color) if fmt == "svg" else shields(label, message, color)
    response = Response(body, mimetype="image/svg+xml" if fmt == "svg" else "application/json")
    response.set_etag(hashlib.sha256(body.encode()).hexdigest()[:32])
    response.headers["Cache-Control"] = f"public, max-age={MAX_AGE}"
    return response.make_conditional(request)


def _format(fmt: str) -> str:
    if fmt not in FORMATS:
        abort(404, description="badges are .svg or .json")
    return fmt


def _window(window: str) -> Optional[str]:
    return window if window in uptime.WINDOWS else None


# ---- models -------------------------------------------------------------------------------------


def _model(cur, dht_prefix: str):
    return cur.model(dht_prefix) if security.is_dht_prefix(dht_prefix) else None


@bp.get("/models/<dht_prefix>/state.<fmt>")
def model_state(dht_prefix: str, fmt: str):
    d, fmt = deps(), _format(fmt)
    cur = queries.current(d)
    model = _model(cur, dht_prefix)
    if model is None:
        return _respond(dht_prefix[:MAX_LABEL] if security.is_dht_prefix(dht_prefix) else "model", "unknown",
                        GREY, fmt)
    now = time.time()
    in_force = maintenance.active(status.model_windows(status.windows_since(d, now), dht_prefix), now)
    state = uptime.MAINTENANCE if in_force else state_api.monitor_state(cur.assessments.get(dht_prefix))
    return _respond(state_api.model_name(model)[:MAX_LABEL], state, COLORS.get(state, GREY), fmt)


@bp.get("/models/<dht_prefix>/uptime/<window>.<fmt>")
def model_uptime(dht_prefix: str, window: str, fmt: str):
    d, fmt, name = deps(), _format(fmt), _window(window)
    cur = queries.current(d)
    model = _model(cur, dht_prefix)
    if model is None or name is None:
        return _respond(f"uptime {window[:8]}", "unknown", GREY, fmt)
    found = next((s for s in status.model_statuses(d, cur, time.time()) if s.dht_prefix == dht_prefix), None)
    share = found.uptimes[name].share if found is not None else None
    return _respond(f"uptime {name}", uptime.percent(share), uptime_color(share), fmt)


# ---- peers --------------------------------------------------------------------------------------


def peer_state(d, cur, peer_id: str, now: float) -> Optional[str]:
    """The server's state now (its best over the models it serves), ``maintenance`` while a window
    covers it, ``offline`` when known but not in the latest poll; None: never seen here."""
    rows = [row for row in (cur.snapshot.servers if cur.snapshot else ()) if row.peer_id == peer_id]
    if not rows and peer_id not in cur.reachability and d.store.peer_record(peer_id) is None:
        return None
    names = tuple({row.public_name for row in rows if row.public_name})
    covering = status.peer_windows(status.windows_since(d, now), peer_id, {row.model for row in rows}, names)
    if maintenance.active(covering, now):
        return uptime.MAINTENANCE
    states = [state_api.row_state(row, cur.reachability.get(peer_id)) for row in rows]
    return min(states, key=PEER_STATE_ORDER.index) if states else "offline"


def _peer_label(cur, peer_id: str) -> str:
    name = next((row.public_name for row in (cur.snapshot.servers if cur.snapshot else ())
                 if row.peer_id == peer_id and row.public_name), None)
    return (name or "petals server")[:MAX_LABEL]


@bp.get("/peers/<peer_id>/state.<fmt>")
def peer_state_badge(peer_id: str, fmt: str):
    d, fmt = deps(), _format(fmt)
    if not security.is_peer_id(peer_id):
        return _respond("petals server", "unknown", GREY, fmt)
    cur = queries.current(d)
    state = peer_state(d, cur, peer_id, time.time())
    if state is None:
        return _respond("petals server", "unknown", GREY, fmt)
    return _respond(_peer_label(cur, peer_id), state, COLORS.get(state, GREY), fmt)


@bp.get("/peers/<peer_id>/uptime/<window>.<fmt>")
def peer_uptime(peer_id: str, window: str, fmt: str):
    d, fmt, name = deps(), _format(fmt), _window(window)
    if not security.is_peer_id(peer_id) or name is None:
        return _respond(f"uptime {window[:8]}", "unknown", GREY, fmt)
    cur = queries.current(d)
    now = time.time()
    if peer_state(d, cur, peer_id, now) is None:
        return _respond(f"uptime {name}", "unknown", GREY, fmt)
    share = status.peer_uptimes(d, cur, peer_id, now)[name].share
    return _respond(f"uptime {name}", uptime.percent(share), uptime_color(share), fmt)


@bp.get("/peers/<peer_id>/contribution.<fmt>")
def peer_contribution(peer_id: str, fmt: str):
    """Its verified block-hours (``?window=``: day, week, month or all time, the default): what the
    contribution ledger says it gave, measured (``web.contributors``)."""
    d, fmt = deps(), _format(fmt)
    window = request.args.get("window", "all")
    if not security.is_peer_id(peer_id) or window not in contributors.WINDOW_NAMES:
        return _respond("verified block-hours", "unknown", GREY, fmt)
    cur = queries.current(d)
    total = contributors.of_peer(d, cur, peer_id, time.time())["windows"][window]["total"]
    if total is None:
        return _respond("petals contribution", "unknown", GREY, fmt)
    label = "petals contribution" if window == "all" else f"petals contribution, {window}"
    hours = total["verified_block_hours"]
    return _respond(label, f"{hours:,.0f} verified block-hours", GREEN if hours > 0 else GREY, fmt)


def markdown(peer_id: str) -> list[tuple[str, str]]:
    """(what, Markdown to paste) for a server's README: its state and 7-day uptime, linking to its page."""
    page = url_for("pages.peer", peer_id=peer_id, _external=True)
    state = url_for("badges.peer_state_badge", peer_id=peer_id, fmt="svg", _external=True)
    week = url_for("badges.peer_uptime", peer_id=peer_id, window="7d", fmt="svg", _external=True)
    shield = url_for("badges.peer_state_badge", peer_id=peer_id, fmt="json", _external=True)
    given = url_for("badges.peer_contribution", peer_id=peer_id, fmt="svg", _external=True)
    return [("State", f"[![petals server status]({state})]({page})"),
            ("Uptime, 7 days", f"[![petals server uptime]({week})]({page})"),
            ("Contribution (verified block-hours)", f"[![petals server contribution]({given})]({page})"),
            ("shields.io", f"![petals server](https://img.shields.io/endpoint?url={quote(shield, safe='')})")]


@bp.app_template_global("badge_markdown")
def _badge_markdown(peer_id: str) -> list[tuple[str, str]]:
    return markdown(peer_id)
