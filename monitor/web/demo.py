"""The demo swarm panel: stop, start and throttle the embedded demo's servers from the overview.

Only registered when the service runs the demo. Actions are POSTs from our own pages (checked by
Origin / Sec-Fetch-Site), which is enough for a dashboard on localhost.
"""

from __future__ import annotations

from flask import Blueprint, abort, render_template, request

from monitor.web import deps, security

bp = Blueprint("demo", __name__, url_prefix="/demo")

ACTIONS = ("stop", "start", "throttle", "unthrottle")


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
def act(name: str, action: str):
    if not security.same_origin(request.headers, request.host_url):
        abort(403, description="demo actions are accepted only from this dashboard's own pages (same origin)")
    if action not in ACTIONS:
        abort(404, description=f"unknown demo action {action!r}; use one of {', '.join(ACTIONS)}")
    controls = deps().demo_controls
    try:
        getattr(controls, action)(name)
    except KeyError as e:
        return _panel(str(e.args[0]) if e.args else f"no demo server named {name!r}", 404)
    except Exception as e:  # noqa: BLE001 - show the failure in the panel, keep serving
        return _panel(f"{action} {name} failed: {type(e).__name__}: {e}", 500)
    return _panel()
