"""What the chat APIs share in their answers: server-sent events, error statuses and headers,
and the end of a streamed answer."""

from __future__ import annotations

from typing import Iterable, Optional

from chat.decoding import Finished
from chat.errors import Busy, ChatError


def sse(data: str, event: Optional[str] = None) -> str:
    """One server-sent event (``data`` may span lines)."""
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in lines) + "\n"


def error_status(error: ChatError) -> tuple[int, dict[str, str]]:
    """The HTTP status of an error, and its headers (Retry-After when busy)."""
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, Busy) else {}
    return error.status, headers


def last_finished(events: Iterable[object]) -> Optional[Finished]:
    """Run an answer to its end; its Finished event."""
    finished = None
    for event in events:
        if isinstance(event, Finished):
            finished = event
    return finished
