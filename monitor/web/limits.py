"""Per-client rate limits (Flask-Limiter): what an anonymous visitor can make the service do.

Reading pages costs one cached read; the expensive things are generations (the chat APIs: each
holds a place in the swarm for seconds to minutes) and live reachability checks (each dials a peer
through the DHT). Those are limited per client address (the real one behind ``proxy_hops`` proxies);
past a limit the answer is 429 with ``Retry-After``. Limits are settings (``chat_rate_limit``,
``reachability_rate_limit``) in Flask-Limiter's notation, e.g. ``"30 per minute; 300 per hour"``.
"""

from __future__ import annotations

from flask import Blueprint, Flask, current_app, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

limiter = Limiter(key_func=get_remote_address, headers_enabled=True, strategy="moving-window")


def init_app(app: Flask, settings) -> None:
    app.config["RATELIMIT_STORAGE_URI"] = settings.rate_limit_storage
    app.config["RATELIMIT_HEADERS_ENABLED"] = True
    limiter.init_app(app)


def _not_a_generation() -> bool:
    """GETs that only read (model lists, the chat page, its assets) are not counted; every POST and
    every WebSocket connection (which generates) is."""
    return request.method in ("GET", "HEAD", "OPTIONS") and request.headers.get("Upgrade", "").lower() != "websocket"


def _chat_rate_limit() -> str:
    return current_app.extensions["swarm_monitor"].settings.chat_rate_limit


def limit_chat(blueprint: Blueprint, settings) -> None:
    """Apply the app's ``chat_rate_limit`` to every generating request of a chat blueprint, all
    its routes counted together (one budget per client, not one per API).

    Flask-Limiter keeps blueprint limits per blueprint *name* for the whole process, so a limit
    string fixed here would also apply to every later app's "chat" blueprint (tests, several apps
    in one process). The limit is therefore one and the same object (deduplicated) and reads the
    serving app's setting per request."""
    limiter.shared_limit(_chat_rate_limit, scope="chat", exempt_when=_not_a_generation)(blueprint)
