"""The demo swarm panel: stop, start, throttle, corrupt and fail the embedded demo's servers from the overview.

Only registered when the service runs the demo. Actions are for operators (``auth``): a logged-in
browser (with its CSRF token) or a bearer token (``swarm-monitor chaos``).
"""

from __future__ import annotations

import logging

from flask import Blueprint, abort, render_template, request

from monitor.web import auth, deps

log = logging.getLogger(__name__)
bp = Blueprint("demo", __name__, url_prefix="/demo")

ACTIONS = ("stop", "start", "throttle", "unthrottle", "corrupt", "uncorrupt", "fail", "unfail")


def _panel(error: str | None = None, status: int = 200):
    """The panel; htmx swaps only 2xx answers, so an htmx request gets its error inside a 200."""
    if request.headers.get("HX-Request") == "true":
        status = 200
    return render_template("partials/demo_panel.html", demo_servers=deps().demo_controls.servers(),
                           demo_error=error), status


@bp.get("/panel")
def panel():
    return _panel()


@bp.post("/servers/<name>/<action>")
@auth.operator_required
def act(name: str, action: str):
    if action not in ACTIONS:
        abort(404, description=f"unknown demo action {action!r}; use one of {', '.join(ACTIONS)}")
    controls = deps().demo_controls
    try:
        getattr(controls, action)(name)
    except KeyError as e:
        return _panel(str(e.args[0]) if e.args else f"no demo server named {name!r}", 404)
    except Exception:  # noqa: BLE001 - show the failure in the panel, keep serving
        log.exception("demo action %s %s failed", action, name)
        return _panel(f"{action} {name} failed; the service's log says why", 500)
    return _panel()


@bp.post("/hostile")
@auth.operator_required
def hostile():
    """A made-up peer announces hostile records into the demo swarm (``DemoControls.hostile``)."""
    try:
        deps().demo_controls.hostile()
    except Exception:  # noqa: BLE001 - show the failure in the panel, keep serving
        log.exception("announcing hostile records failed")
        return _panel("announcing hostile records failed; the service's log says why", 500)
    return _panel()
