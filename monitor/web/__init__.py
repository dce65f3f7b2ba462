"""The dashboard's Flask app: pages, JSON API, /metrics, and the static assets it needs offline.

``create_app`` wires blueprints around one store; it starts nothing else (no DHT, no scheduler),
so any number of web workers can serve the same store while one poller process writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import logging

from flask import Flask, Response, current_app, g, jsonify, render_template, request
from flask_htmx import HTMX
from werkzeug.exceptions import BadRequest, HTTPException, SecurityError
from werkzeug.middleware.proxy_fix import ProxyFix

from monitor.http_errors import openai_error_body
from monitor.settings import Settings
from monitor.web import security, timerange
from monitor.web.assets import vendored_urls
from monitor.web.cache import WebCache


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
    """What the views may use: settings, the store, the optional demo and reachability hooks, and
    the app's one cache (``monitor.web.cache``: everything kept between requests)."""

    settings: Settings
    store: Any
    demo_controls: Any = None
    reachability_check: Optional[Callable[[str], Any]] = None
    cache: WebCache = field(default_factory=WebCache)


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
    """The web app over ``store``, made in the steps below: configuration, the host check (the first
    hook), extensions (htmx, filters, operator auth, the app's own rate limiter), blueprints, what
    every template reads, response headers, error handlers. What the app keeps between requests is
    all in its one ``WebCache`` (``WebDeps.cache``), so apps in one process share nothing.

    ``reachability_check(peer_id) -> ReachabilityResult | None`` checks a peer live (the service wires
    it to the DHT); without it ``/api/v1/is_reachable`` answers from the latest stored check.
    ``demo_controls`` (servers/stop/start/throttle/unthrottle) adds the demo swarm panel.
    """
    app = Flask("monitor.web", template_folder=str(TEMPLATES), static_folder=str(STATIC), static_url_path="/static")
    _configure(app, settings)
    d = app.extensions["swarm_monitor"] = WebDeps(settings, store, demo_controls, reachability_check)
    _log_context(app)
    _refuse_foreign_hosts(app)
    limiter = _extensions(app, settings)
    _blueprints(app, d, limiter, chat_blueprints)
    _page_context(app, settings, demo_enabled=demo_controls is not None)
    _response_headers(app)
    _error_handlers(app)
    return app


def _configure(app: Flask, settings: Settings) -> None:
    """Bounds on what a request may carry, trusted host names, and the proxies in front."""
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


def _log_context(app: Flask) -> None:
    """Every log line of a request says which (``monitor.logs``: the method and path, as JSON logs
    show it). Before every other hook, so that what they log belongs to it too."""
    from monitor import logs

    @app.before_request
    def _log_about():
        g._log_token = logs.context.set({"request": f"{request.method} {request.path}"[:300]})

    @app.teardown_request
    def _log_done(_error=None):
        token = g.pop("_log_token", None)
        if token is not None:
            logs.context.reset(token)


def _refuse_foreign_hosts(app: Flask) -> None:
    """DNS rebinding: a foreign name resolving to us must not reach the app (Werkzeug checks the
    Host header against TRUSTED_HOSTS when it is read). First of the hooks: nothing runs before it."""

    @app.before_request
    def _trusted_host():
        try:
            request.host
        except SecurityError:  # plain text: no page can be built for a host we do not serve
            return Response("400 Bad Request: this host name is not served here (the operator can add it to "
                            "the trusted_hosts setting)\n", 400, mimetype="text/plain")


def _extensions(app: Flask, settings: Settings):
    """htmx, the templates' filters, operator auth (sessions, CSRF), cross-origin reads (CORS) and
    the app's rate limiter."""
    from monitor.web import auth, cors, filters, limits

    HTMX(app)
    filters.register(app)
    auth.init_app(app, settings)
    cors.init_app(app, settings)
    return limits.init_app(app, settings)


def _blueprints(app: Flask, d: WebDeps, limiter, chat_blueprints: Iterable) -> None:
    """Every page and API; the demo panel with the demo; the chat's, each within the chat's rate limit."""
    from monitor.web import alerts, api, demo, health, limits, metrics, mutes, my_server, pages, search

    for module in (pages, api, metrics, health, alerts, mutes, search, my_server):
        app.register_blueprint(module.bp)
    from monitor.web import badges, contributors, notes, openapi, owners, status

    for module in (badges, status, notes, openapi, contributors, owners):
        app.register_blueprint(module.bp)
    app.extensions[metrics.REGISTRY] = metrics.registry_for(d)
    limits.limit_reachability(app, limiter)
    if d.demo_controls is not None:
        app.register_blueprint(demo.bp)
    for blueprint in chat_blueprints:
        limits.limit_chat(limiter, blueprint)
        app.register_blueprint(blueprint)
        for collector in getattr(blueprint, "metric_collectors", ()):  # the chat's own load, on /metrics
            app.extensions[metrics.REGISTRY].register(collector)


def _page_context(app: Flask, settings: Settings, *, demo_enabled: bool) -> None:
    """What every template may read: the refresh period, the chat's links (found once: the page, and
    the partial that shows a model's client side in the chat's process), the demo."""
    chat_url = next((rule.rule for rule in app.url_map.iter_rules() if rule.rule in ("/chat", "/chat/")), None)
    client_side_url = next((rule.rule for rule in app.url_map.iter_rules() if rule.rule == "/chat/client-side"), None)
    common = {"refresh_seconds": settings.refresh_seconds, "nav_chat_url": chat_url, "demo_enabled": demo_enabled,
              "generation_period": settings.generation_check_period, "chat_client_side_url": client_side_url}

    @app.context_processor
    def _common():
        return common

    app.add_template_global(vendored_urls(Path(app.static_folder)), name="vendored")


def _response_headers(app: Flask) -> None:
    """Security headers on every answer; HTML varies with htmx's headers and is never stored."""

    @app.after_request
    def _headers(response):
        for name, value in security.SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if response.mimetype == "text/html":
            response.vary.add("HX-Request")
            response.vary.add("HX-Target")
            response.headers.setdefault("Cache-Control", "no-store")
        return response


def _error_handlers(app: Flask) -> None:
    """Errors for people (``_error_response``): HTTP errors with their headers, bad time ranges as
    400, an unavailable store as 503."""

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException):
        message = error.description or error.name
        body, code = _error_response(error.code, error.name, message)
        response = current_app.make_response((body, code))
        for name, value in error.get_headers():  # Allow, Retry-After, WWW-Authenticate ...
            if name.lower() != "content-type":
                response.headers[name] = value
        if error.code == 429 and getattr(g, "rate_limit_retry_after", None):  # a rate limit's (web.limits)
            response.headers["Retry-After"] = str(g.rate_limit_retry_after)
        return response

    @app.errorhandler(timerange.BadRange)
    def _bad_range(error):
        return _http_error(BadRequest(str(error)))

    from monitor.store import StoreError

    @app.before_request
    def _schema_is_this_versions():
        # a worker started before `swarm-monitor migrate` ran, or on an older schema, says so on
        # every page (StoreNotMigrated, below): one small query per request until the schema is
        # there, none after; static files still load (the error page needs its stylesheet)
        endpoint = request.endpoint or "static"
        if not (endpoint == "static" or endpoint.endswith(".static")):
            deps().store.check_schema()

    @app.errorhandler(StoreError)  # down, locked or unmigrated: the pages answer 503 with the reason
    def _store_down(error):
        log.warning("answering 503 for %s: %s", request.path, error)  # the cause, for the operator
        return _error_response(503, *_store_failure(error))


def _store_failure(error) -> tuple[str, str]:
    """(title, message) of a 503 for a store error: a schema that is missing or older than this
    version's says so and what to run (its revisions, never the database's URL); anything else is
    the database being away."""
    from monitor.store import StoreNotMigrated, StoreSchemaError

    if isinstance(error, StoreNotMigrated):
        title = "Database not set up" if error.revision is None else "Database schema out of date"
        return title, f"the monitor's database {error.state}: run `swarm-monitor migrate`"
    if isinstance(error, StoreSchemaError):
        return "Database schema out of date", ("the monitor's database lacks this version's tables or columns: "
                                               "run `swarm-monitor migrate`")
    return "Database unavailable", "the monitor's database is unavailable right now; this page works again once it is back"


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
