"""Cross-origin reads and chat (flask-cors): which other sites' pages may read our answers.

Status widgets, community pages and in-browser chat clients on other origins read health.petals.dev's
and chat.petals.dev's JSON (both run ``CORS(app)``); so may they ours:

- **read-only answers** — the JSON APIs under ``/api/``, the badges, the status page's Atom feed,
  ``/metrics`` and ``/healthz`` — to any origin (``Access-Control-Allow-Origin: *``), GET only;
- **the chat APIs** (chat.petals.dev's ``/api/v1/generate``, OpenAI's ``/v1/...``) to the origins
  the operator lists in ``chat_cors_origins`` (default any, as chat.petals.dev);
- **never with credentials**: no answer carries ``Access-Control-Allow-Credentials``, so another
  site's page can never read an answer made with a visitor's cookies; and an answer to anything
  but GET, HEAD or OPTIONS outside the chat APIs (operators' changes: notes, silences, policies)
  carries no CORS header at all, and a preflight for one allows no method, so a browser never
  lets another site's script send an operator's ``Authorization`` header here. Operators' pages
  stay behind their CSRF tokens and SameSite session cookie (``auth.py``) as before.

The WebSocket chat (``/api/v2/generate``) is not covered by CORS (browsers do not apply it to
WebSockets).
"""

from __future__ import annotations

import re

from flask import Flask, request
from flask_cors import CORS

READ_METHODS = ["GET", "HEAD", "OPTIONS"]
CHAT_METHODS = ["GET", "POST", "OPTIONS"]
CHAT_PATHS = re.compile(r"^/(api/v1/generate|v1/.*)$")
READ_PATHS = (r"^/api/.*", r"^/badges/.*", r"^/status/feed\.atom$", r"^/metrics$", r"^/healthz$")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-]+(:\d{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
HEADERS = ("Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Allow-Methods",
           "Access-Control-Allow-Headers", "Access-Control-Expose-Headers", "Access-Control-Max-Age")


def chat_origins(configured: list[str]) -> list[str] | str:
    """``chat_cors_origins`` as flask-cors takes it: "*" or exact origins (scheme://host[:port]);
    ValueError naming one that is neither."""
    if not configured or "*" in configured:
        return "*"
    found = []
    for origin in configured:
        if not _ORIGIN.match(origin.rstrip("/")):
            raise ValueError(f"chat_cors_origins: {origin[:100]!r} is not an origin like 'https://example.org' "
                             f"(scheme, host and port only) or '*'")
        found.append(origin.rstrip("/"))
    return found


def init_app(app: Flask, settings) -> None:
    """CORS on ``app``: read-only answers to any origin, the chat APIs to ``chat_cors_origins``."""

    origins = chat_origins(settings.chat_cors_origins)

    @app.after_request
    def _no_cors_for_changes(response):
        # registered before flask-cors' own hook, so it runs after it (Flask runs them in reverse)
        chat_path = CHAT_PATHS.match(request.path)
        if request.method not in READ_METHODS and not chat_path:
            for name in HEADERS:
                response.headers.pop(name, None)
        elif chat_path and origins != "*":
            response.vary.add("Origin")  # the answer depends on who asks: caches must know
        return response

    chat = {"origins": origins, "methods": CHAT_METHODS,
            "allow_headers": ["Content-Type", "Authorization"], "max_age": 600}
    read = {"origins": "*", "methods": READ_METHODS, "max_age": 600}
    resources = {CHAT_PATHS.pattern: chat, **{path: read for path in READ_PATHS}}
    CORS(app, resources=resources, supports_credentials=False, send_wildcard=True, vary_header=True)
