"""The chat over HTTP: the chat page, chat.petals.dev's API and the OpenAI API, in one
blueprint named "chat" (templates link its endpoints as ``chat.<view>``).

Thin views: each reads and checks its parameters (``params``; a bad one is a 400 that names
it), hands the work to ``chat.engine.ChatEngine`` and maps its errors to statuses (unknown model
404, model not fully served 503, busy 429 with Retry-After). What a visitor may send and keep is
bounded by ``limits.ChatLimits``. The blueprint carries the chat's Prometheus collector
(``metric_collectors``: slots, queue, open sessions), which the web app adds to its /metrics. Errors
the web server raises around a view (413 for a body too
large, 429 past the rate limit, 500) come in each API's own shape too; nobody gets a Python
traceback or an exception's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from flask import Blueprint, Response, g, render_template, request
from werkzeug.exceptions import HTTPException

from chat.engine import ChatEngine
from chat.http import openai_api, page, petals_api
from chat.metrics import ChatCollector
from chat.conversations import ConversationStore
from chat.http.limits import ChatLimits
from chat.http.responses import INTERNAL_ERROR, openai_error, petals_error

PACKAGE = Path(__file__).resolve().parent.parent  # chat/
TEMPLATES = PACKAGE.parent / "templates"
WRAPPED_CODES = (413, 429, 500)  # raised around the views (body size, rate limit, a crash)


def create_blueprint(engine: ChatEngine, limits: Optional[ChatLimits] = None,
                     conversations: Optional[ConversationStore] = None) -> Blueprint:
    """The chat page (/chat), the chat.petals.dev API (/api/v1/generate, ws /api/v2/generate) and
    the OpenAI API (/v1/...). The ws route needs a server that speaks WebSocket (werkzeug,
    gunicorn with threads). ``conversations``: where the chat page keeps its conversations (else
    in memory only)."""
    limits = limits or ChatLimits()
    bp = Blueprint("chat", __name__, template_folder=str(TEMPLATES), static_folder=str(PACKAGE / "static"),
                   static_url_path="/chat/static")
    petals_api.register(bp, engine, limits)
    openai_api.register(bp, engine, limits)
    page.register(bp, engine, limits, conversations)
    for code in WRAPPED_CODES:
        bp.register_error_handler(code, _http_error)
    # the chat's templates format durations as every page does, in an app of their own too
    from monitor.core import timefmt

    bp.add_app_template_filter(timefmt.duration, "duration")
    bp.metric_collectors = [ChatCollector(engine)]
    bp.before_request(_refuse_while_draining(engine))
    if engine.worker:
        bp.after_request(_worker_tag(engine.worker))
    return bp


WORKER_COOKIE = "swarm_monitor_chat_worker"
DRAIN_RETRY_AFTER = 1  # seconds: another worker takes the request (the proxy may retry at once)


def _refuse_while_draining(engine: ChatEngine):
    """While the worker drains, what would start an answer — a POST, a WebSocket — is refused with
    503 and ``Retry-After`` in its API's shape; what only reads goes on."""
    def refuse():
        if engine.draining and (request.method == "POST" or request.headers.get("Upgrade", "").lower() == "websocket"):
            message = "this chat worker is stopping (a restart or a deploy); retry: another one answers"
            headers = {"Retry-After": str(DRAIN_RETRY_AFTER)}
            if request.path.startswith("/v1/"):
                return openai_error(503, message, headers=headers)
            return petals_error(503, message, headers=headers)
        return None
    return refuse


def _worker_tag(worker: str):
    """Several chat workers behind a proxy: every chat answer says which worker it came from
    (``X-Chat-Worker``) and sets the cookie the proxy routes a browser's later requests by."""
    def tag(response: Response) -> Response:
        response.headers["X-Chat-Worker"] = worker
        if request.cookies.get(WORKER_COOKIE) != worker:
            response.set_cookie(WORKER_COOKIE, worker, httponly=True, samesite="Lax", secure=request.is_secure,
                                path="/")
        return response
    return tag


def _http_error(error: HTTPException) -> Response:
    """An HTTP error of a chat route in its API's shape (registered by code, so it comes before
    the web app's generic handler for these codes)."""
    message = _message(error)
    headers = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
    if error.code == 429 and getattr(g, "rate_limit_retry_after", None):  # the rate limit's (monitor.web.limits)
        headers["Retry-After"] = str(g.rate_limit_retry_after)
    if request.path.startswith("/v1/"):
        return openai_error(error.code, message, headers=headers)
    if request.path.startswith("/api/"):
        return petals_error(error.code, message, headers=headers)
    if request.method == "POST":  # the chat page's htmx requests: the fragment of its error box
        return page.error_fragment(message, error.code, headers)
    return Response(render_template("error.html", code=error.code, title=error.name, message=message),
                    status=error.code, headers=headers)


def _message(error: HTTPException) -> str:
    if error.code == 429:
        return (f"too many generation requests from your address (the limit is {error.description}); "
                f"wait as many seconds as the Retry-After header says, then try again")
    if error.code == 413:
        return "the request is too large for this server; send a shorter prompt"
    if error.code >= 500:
        return INTERNAL_ERROR
    return error.description or error.name
