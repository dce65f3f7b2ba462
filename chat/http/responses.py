"""What the chat APIs share in their answers: server-sent events, error statuses and bodies in
each API's shape, and the end of a streamed answer."""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping, Optional

from flask import Response, jsonify
from werkzeug.exceptions import HTTPException

from monitor.http_errors import openai_error_body

from chat.decoding import Finished
from chat.errors import Busy, ChatError, UnknownModel

logger = logging.getLogger(__name__)

# what a client is told when something unexpected broke; the details go to the operator's log
INTERNAL_ERROR = "internal error in the chat; try again later (the operator's log has the details)"


def sse(data: str, event: Optional[str] = None) -> str:
    """One server-sent event (``data`` may span lines)."""
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in lines) + "\n"


def error_status(error: ChatError) -> tuple[int, dict[str, str]]:
    """The HTTP status of an error, and its headers (Retry-After when busy)."""
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, Busy) else {}
    return error.status, headers


def openai_error(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Mapping[str, str]] = None) -> Response:
    """An error in OpenAI's shape (``monitor.http_errors``, the web app's /v1 errors' too)."""
    return _json(openai_error_body(status, message, param=param, code=code), status, headers)


def openai_chat_error_body(error: ChatError) -> dict:
    """A chat error's body in OpenAI's shape, alike as a response and inside a stream."""
    return openai_error_body(error.status, str(error), param=getattr(error, "param", None),
                             code="model_not_found" if isinstance(error, UnknownModel) else None)


def openai_chat_error(error: ChatError) -> Response:
    status, headers = error_status(error)
    return _json(openai_chat_error_body(error), status, headers)


def petals_error(status: int, message: str, *, param: Optional[str] = None,
                 headers: Optional[Mapping[str, str]] = None) -> Response:
    """An error in chat.petals.dev's shape: ``{"ok": false, "traceback": <a message for people>}``."""
    return _json({"ok": False, "traceback": message, "param": param}, status, headers)


def petals_chat_error(error: ChatError) -> Response:
    status, headers = error_status(error)
    return petals_error(status, str(error), param=getattr(error, "param", None), headers=headers)


def guarded(view: Callable[[], Response], *, chat_error: Callable[[ChatError], Response],
            internal_error: Callable[[], Response], what: str) -> Response:
    """``view()``, its refusals answered in its API's shape: a ChatError by ``chat_error``, an
    HTTP error (413 and the like) by the blueprint's handler, anything else logged for the
    operator (as ``what`` failed) and answered by ``internal_error`` (never an exception's text)."""
    try:
        return view()
    except ChatError as e:
        return chat_error(e)
    except HTTPException:
        raise
    except Exception:  # noqa: BLE001 - never an exception's text to the user
        logger.warning("%s failed", what, exc_info=True)
        return internal_error()


def _json(body: dict, status: int, headers: Optional[Mapping[str, str]]) -> Response:
    response = jsonify(body)
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
