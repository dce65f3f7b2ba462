"""The dashboard's Flask app: pages, JSON API, /metrics, and the static assets it needs offline.

``create_app`` wires blueprints around one store; it starts nothing else (no DHT, no scheduler),
so any number of web workers can serve the same store while one poller process writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from flask import Flask, current_app, jsonify, render_template, request
from flask_htmx import HTMX
from werkzeug.exceptions import BadRequest, HTTPException

from monitor.settings import Settings
from monitor.web import security, timerange

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATES = PROJECT_ROOT / "templates"
STATIC = PROJECT_ROOT / "static"


@dataclass
class WebDeps:
    """What the views may use: settings, the store, and the optional demo and probe hooks."""

    settings: Settings
    store: Any
    demo_controls: Any = None
    reachability_check: Optional[Callable[[str], Any]] = None


def deps() -> WebDeps:
    return current_app.extensions["swarm_monitor"]


def create_app(
    settings: Settings,
    store,
    *,
    extra_blueprints: Iterable = (),
    demo_controls=None,
    reachability_check: Optional[Callable[[str], Any]] = None,
) -> Flask:
    """The web app over ``store``.

    ``reachability_check(peer_id) -> ProbeResult | None`` checks a peer live (the service wires it
    to a DHT probe); without it ``/api/v1/is_reachable`` answers from the latest stored probe.
    ``demo_controls`` (servers/stop/start/throttle/unthrottle) adds the demo swarm panel.
    """
    from monitor.web import api, assets, demo, filters, metrics, pages

    app = Flask("monitor.web", template_folder=str(TEMPLATES), static_folder=str(STATIC), static_url_path="/static")
    app.config["SEND_FILE_MAX_AGE_DEFAULT"] = 3600
    app.json.sort_keys = False
    app.extensions["swarm_monitor"] = WebDeps(settings, store, demo_controls, reachability_check)
    HTMX(app)
    filters.register(app)

    app.register_blueprint(assets.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(metrics.bp)
    if demo_controls is not None:
        app.register_blueprint(demo.bp)
    for blueprint in extra_blueprints:
        app.register_blueprint(blueprint)

    chat_url = next((rule.rule for rule in app.url_map.iter_rules() if rule.rule in ("/chat", "/chat/")), None)
    common = {"refresh_seconds": settings.refresh_seconds, "nav_chat_url": chat_url,
              "demo_enabled": demo_controls is not None}

    @app.context_processor
    def _common():
        return common

    @app.after_request
    def _headers(response):
        for name, value in security.SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if response.mimetype == "text/html":
            response.vary.add("HX-Request")
            response.vary.add("HX-Target")
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException):
        message = error.description or error.name
        if _wants_json():
            return jsonify(error=message, status=error.code), error.code
        return render_template("error.html", code=error.code, title=error.name, message=message), error.code

    @app.errorhandler(timerange.BadRange)
    def _bad_range(error):
        return _http_error(BadRequest(str(error)))

    from monitor.web.queries import StoreUnavailableError

    @app.errorhandler(StoreUnavailableError)
    def _store_down(error):
        message = (f"the database is unavailable ({error}); the page will work again once it is back — "
                   f"check {settings.resolved_database_url.split('@')[-1]!r} is reachable")
        if _wants_json():
            return jsonify(error=message, status=503), 503
        return render_template("error.html", code=503, title="Database unavailable", message=message), 503

    return app


def _wants_json() -> bool:
    """API clients get JSON errors; browsers get the error page."""
    if request.path.startswith(("/api/", "/v1/")) or request.path in ("/metrics", "/healthz"):
        return True
    return request.accept_mimetypes.best == "application/json"
