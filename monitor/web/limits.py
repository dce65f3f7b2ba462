"""Per-client rate limits (Flask-Limiter): what an anonymous visitor can make the service do.

Reading pages costs one cached read; the expensive things are generations (the chat APIs: each
holds a place in the swarm for seconds to minutes) and live reachability checks (each dials a peer
through the DHT). Those are limited per client address (the real one behind ``proxy_hops`` proxies);
past a limit the answer is 429 with ``Retry-After``. Limits are settings (``chat_rate_limit``,
``reachability_rate_limit``) in Flask-Limiter's notation, e.g. ``"30 per minute; 300 per hour"``.
"""

from __future__ import annotations

import time

from flask import Blueprint, Flask, current_app, g, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

REACHABILITY_SCOPE = "reachability"
# every view that can make the monitor dial a peer: one budget per client for all of them
REACHABILITY_VIEWS = ("api.is_reachable", "my_server.live_check")


def init_app(app: Flask, settings) -> Limiter:
    """The app's own limiter. Flask-Limiter keeps its storage and its limits on the ``Limiter``
    object, so each app gets one: two apps in one process never count against each other."""
    app.config["RATELIMIT_STORAGE_URI"] = settings.resolved_rate_limit_storage
    app.config["RATELIMIT_HEADERS_ENABLED"] = True
    # Flask-Limiter would set Retry-After on every response to at least its window's reset, so a
    # busy chat's "retry in 5 s" would say 60: its figure goes in a header of its own, and a 429 of
    # own says Retry-After from the limit that refused (``_note_breach``, read by the error handlers)
    app.config["RATELIMIT_HEADER_RETRY_AFTER"] = "X-RateLimit-Retry-After"
    limiter = Limiter(key_func=get_remote_address, headers_enabled=True, strategy="moving-window",
                      on_breach=_note_breach)
    limiter.init_app(app)
    return limiter


def _note_breach(limit) -> None:
    """The limit that refused this request: the error handlers' Retry-After (``g.rate_limit_retry_after``)."""
    g.rate_limit_retry_after = max(1, int(limit.reset_at - time.time()))


def _settings():
    return current_app.extensions["swarm_monitor"].settings


def limit_reachability(app: Flask, limiter: Limiter) -> None:
    """``reachability_rate_limit`` on every view of ``REACHABILITY_VIEWS``, all counted together
    (registered before: their blueprints are the app's)."""
    limit = limiter.shared_limit(lambda: _settings().reachability_rate_limit, scope=REACHABILITY_SCOPE)
    for endpoint in REACHABILITY_VIEWS:
        app.view_functions[endpoint] = limit(app.view_functions[endpoint])


def _not_a_generation() -> bool:
    """GETs that only read (model lists, the chat page, its assets) are not counted; every POST and
    every WebSocket connection (which generates) is."""
    return request.method in ("GET", "HEAD", "OPTIONS") and request.headers.get("Upgrade", "").lower() != "websocket"


def limit_chat(limiter: Limiter, blueprint: Blueprint) -> None:
    """``chat_rate_limit`` on every generating request of a chat blueprint, all its routes counted
    together (one budget per client, not one per API). The limit is read from the serving app's
    settings per request."""
    limiter.shared_limit(lambda: _settings().chat_rate_limit, scope="chat", exempt_when=_not_a_generation)(blueprint)
