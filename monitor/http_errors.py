"""The one shape of an error on OpenAI's paths (``/v1/...``), whoever answers it.

Two parts of the house answer under ``/v1``: the chat's OpenAI views (``chat.http``) and, for
paths no view serves or errors raised around the views, the web app's error handlers
(``monitor.web``). OpenAI's clients read ``type`` and ``code`` to decide what went wrong, so both
build their bodies here, and a 404 looks the same whether Flask or the chat refused it. The web
may not import the chat (nor the chat the web): this module sits at the top of the package, pure
(no Flask), so that both may.
"""

from __future__ import annotations

from typing import Optional

# OpenAI's ``type`` by HTTP status; other statuses: invalid_request_error below 500, else server_error
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def openai_error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    return OPENAI_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def openai_error_body(status: int, message: str, *, param: Optional[str] = None,
                      code: Optional[str] = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``: ``message`` for people; ``param`` the
    request parameter at fault (None: the request as a whole); ``code`` a short machine-readable
    string such as ``"model_not_found"``, or None (never the HTTP status: that is the status line's)."""
    return {"error": {"message": message, "type": openai_error_type(status), "param": param, "code": code}}
