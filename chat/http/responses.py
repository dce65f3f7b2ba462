"""What the chat APIs share in their answers: server-sent events, error statuses and bodies in
each API's shape, and the end of a streamed answer."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from flask import Response, jsonify

from chat.decoding import Finished
from chat.errors import Busy, ChatError, UnknownModel

# what a client is told when something unexpected broke; the details go to the operator's log
INTERNAL_ERROR = "internal error in the chat; try again later (the operator's log has the details)"

_OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
                 413: "invalid_request_error", 429: "rate_limit_exceeded", 503: "service_unavailable"}


def sse(data: str, event: Optional[str] = None) -> str:
    """One server-sent event (``data`` may span lines)."""
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in lines) + "\n"


def error_status(error: ChatError) -> tuple[int, dict[str, str]]:
    """The HTTP status of an error, and its headers (Retry-After when busy)."""
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, Busy) else {}
    return error.status, headers


def openai_error_body(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Mapping[str, str]] = None) -> Response:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    response = jsonify(openai_error_body(status, message, param=param, code=code))
    response.status_code = status
    response.headers.update(headers or {})
    return response


def openai_chat_error(error: ChatError) -> Response:
    status, headers = error_status(error)
    return openai_error(status, str(error), param=getattr(error, "param", None),
                        code="model_not_found" if isinstance(error, UnknownModel) else None, headers=headers)


def petals_error(status: int, message: str, *, param: Optional[str] = None,
                 headers: Optional[Mapping[str, str]] = None) -> Response:
    """An error in chat.petals.dev's shape: ``{"ok": false, "traceback": <a message for people>}``."""
    response = jsonify(ok=False, traceback=message, param=param)
    response.status_code = status
    response.headers.update(headers or {})
    return response


def last_finished(events: Iterable[object]) -> Optional[Finished]:
    """Run an answer to its end; its Finished event."""
    finished = None
    for event in events:
        if isinstance(event, Finished):
            finished = event
    return finished
