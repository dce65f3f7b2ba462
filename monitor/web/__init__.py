"""The dashboard's Flask app: pages, JSON API, /metrics, and the static assets it needs offline.

``create_app`` wires blueprints around one store; it starts nothing else (no DHT, no scheduler),
so any number of web workers can serve the same store while one poller process writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import logging

from flask import Flask, Response, current_app, jsonify, render_template, request
from flask_htmx import HTMX
from werkzeug.exceptions import BadRequest, HTTPException, SecurityError
from werkzeug.middleware.proxy_fix import ProxyFix

from monitor.http_errors import openai_error_body
from monitor.settings import Settings
from monitor.web import security, timerange



def assets_dir(name: str) -> Path:
    """``templates`` or ``static``: inside the installed package (a wheel carries them there, see
    setup.py), else the checkout's top-level folder (an editable install, the tests)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"the web app's {name}/ folder is missing from the installation; reinstall the package")


log = logging.getLogger(__name__)
TEMPLATES = assets_dir("templates")
STATIC = assets_dir("static")


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
    chat_blueprints: Iterable = (),
    demo_controls=None,
    reachability_check: Optional[Callable[[str], Any]] = None,
) -> Flask:
    """The web app over ``store``.

    ``reachability_check(peer_id) -> ReachabilityResult | None`` checks a peer live (the service wires it
    to a DHT probe); without it ``/api/v1/is_reachable`` answers from the latest stored probe.
    ``demo_controls`` (servers/stop/start/throttle/unthrottle) adds the demo swarm panel.
    """
    from monitor.web import alerts, api, assets, auth, demo, filters, limits, metrics, pages, search

    app = Flask("monitor.web", template_folder=str(TEMPLATES), static_folder=str(STATIC), static_url_path="/static")
    app.config.update(
        SEND_FILE_MAX_AGE_DEFAULT=3600,
        MAX_CONTENT_LENGTH=settings.max_request_bytes,  # larger bodies: 413 before they are read
        MAX_FORM_MEMORY_SIZE=settings.max_request_bytes,
        TRUSTED_HOSTS=settings.resolved_trusted_hosts,
        # WebSocket messages are bounded like bodies; pings find dead peers
        SOCK_SERVER_OPTIONS={"max_message_size": settings.max_request_bytes, "ping_interval": 25},
    )
    if settings.proxy_hops:
        hops = settings.proxy_hops
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops, x_prefix=hops)
    app.json.sort_keys = False
    app.extensions["swarm_monitor"] = WebDeps(settings, store, demo_controls, reachability_check)
    @app.before_request
    def _trusted_host():
        # DNS rebinding: a foreign name resolving to us must not reach the app (Werkzeug checks
        # the Host header against TRUSTED_HOSTS when it is read)
        try:
            request.host
        except SecurityError:  # plain text: no page can be built for a host we do not serve
            return Response("400 Bad Request: this host name is not served here (the operator can add it to "
                            "the trusted_hosts setting)\n", 400, mimetype="text/plain")

    HTMX(app)
    filters.register(app)
    auth.init_app(app, settings)
    limits.init_app(app, settings)

    app.register_blueprint(assets.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(alerts.bp)  # /alerts, /api/v1/alerts (#15)
    app.register_blueprint(search.bp)  # /search, /api/v1/search, live checks (#13)
    if demo_controls is not None:
        app.register_blueprint(demo.bp)
    for blueprint in chat_blueprints:
        limits.limit_chat(blueprint, settings)
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
        body, code = _error_response(error.code, error.name, message)
        response = current_app.make_response((body, code))
        for name, value in error.get_headers():  # Allow, Retry-After, WWW-Authenticate ...
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(timerange.BadRange)
    def _bad_range(error):
        return _http_error(BadRequest(str(error)))

    from monitor.web.queries import StoreUnavailableError

    @app.errorhandler(StoreUnavailableError)
    def _store_down(error):
        log.warning("answering 503 for %s: %s", request.path, error)  # the cause, for the operator
        return _error_response(503, "Database unavailable", "the monitor's database is unavailable right now; "
                                    "this page works again once it is back")

    return app


def _error_response(code: int, title: str, message: str):
    """Errors for people: what failed and what to do, never internals. OpenAI's shape on /v1."""
    if request.path.startswith("/v1/"):
        return jsonify(openai_error_body(code, message)), code
    if _wants_json():
        return jsonify(error=message, status=code), code
    return render_template("error.html", code=code, title=title, message=message), code


def _wants_json() -> bool:
    """API clients get JSON errors; browsers get the error page."""
    if request.path.startswith(("/api/", "/v1/")) or request.path in ("/metrics", "/healthz"):
        return True
    return request.accept_mimetypes.best == "application/json"
