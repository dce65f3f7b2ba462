"""The one declaration of a JSON route, for the OpenAPI document (``monitor.web.openapi``).

A view says once, next to itself (``@documented(...)``), what it is: a summary, its tag, its query
or body model, its answer model per status, and who may call it (``auth``). The web app assembles
the document from the routes it registered, reading each view's ``Operation``; the chat's views
declare theirs the same way. Like ``monitor.http_errors`` this module sits at the top of the
package, pure (pydantic only: no Flask, no torch), so that both the web and the chat may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from pydantic import BaseModel, ConfigDict

OPERATOR = "operator"  # the operator token (monitor.web.auth): ``Authorization: Bearer <token>``
OPTIONAL_OPERATOR = "operator?"  # anyone; an operator's bearer token shows more
SSE = "text/event-stream"


@dataclass(frozen=True)
class Answer:
    """One answer of an operation: its model, its media type, what it means."""

    model: Optional[type[BaseModel]]
    description: str = ""
    media_type: str = "application/json"


@dataclass(frozen=True)
class Operation:
    """What the document says of one view (every method and path it serves)."""

    summary: str
    tag: str
    answers: Mapping[int, Answer]
    query: Optional[type[BaseModel]] = None
    body: Optional[type[BaseModel]] = None
    form: bool = False  # the body may also come as a form (application/x-www-form-urlencoded)
    auth: Optional[str] = None  # OPERATOR, OPTIONAL_OPERATOR or None (anyone)
    description: str = ""
    stream: Optional[type[BaseModel]] = None  # with ``"stream": true``: the chunks of a text/event-stream
    path_params: Mapping[str, str] = field(default_factory=dict)  # name -> what it is


def documented(summary: str, tag: str, answers: Mapping[int, Any], **kwargs) -> Callable:
    """Declare a view's operation (``answers``: status -> a model, or an ``Answer``)."""
    operation = Operation(summary, tag, {status: a if isinstance(a, Answer) else Answer(a)
                                         for status, a in answers.items()}, **kwargs)

    def declare(view: Callable) -> Callable:
        setattr(view, "openapi", operation)  # read back by ``operations``
        return view

    return declare


def operation_of(view: Callable) -> Optional[Operation]:
    return getattr(view, "openapi", None)


class Open(BaseModel):
    """An answer model: the fields it always has; more may come (the API grows by adding)."""

    model_config = ConfigDict(extra="allow")


# ---- the error shapes: one per API family --------------------------------------------------------


class MonitorError(BaseModel):
    """The monitor API's error: what failed and what to send instead, and the status again."""

    error: str
    status: int


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class OpenAIError(BaseModel):
    """OpenAI's error shape, on every ``/v1`` path (``monitor.http_errors``), also inside a stream."""

    error: OpenAIErrorDetail
