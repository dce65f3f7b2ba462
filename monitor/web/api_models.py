"""The monitor API's queries, bodies and answers as pydantic models: what the OpenAPI document
shows (``monitor.web.openapi``) and, for the bodies and queries, what the views check their input
with (``checked``: pydantic's complaint becomes our 400, in one place). Answers are ``Open``: the
fields they always carry, more may come. No torch, no petals: web workers import it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from monitor.api_doc import MonitorError, Open
from monitor.core import incidents
from monitor.web import security

# ---- input: what a view checks, and the one translation of pydantic's complaints -------------------------


class BadInput(ValueError):
    """What is wrong with a request's fields, for the person who sent it (a 400)."""


def checked(model: type[BaseModel], data: Mapping[str, Any], **context) -> BaseModel:
    """``data`` as ``model`` (``context``: what its validators need, e.g. ``now``), or BadInput with
    the first complaint: a rule's own message (our validators say what is wrong and what to send),
    else pydantic's, prefixed by the field."""
    try:
        return model.model_validate(dict(data), context=context)
    except ValidationError as e:
        first = e.errors()[0]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, ValueError):
            raise BadInput(str(cause)) from None
        where = ".".join(str(part) for part in first["loc"])
        raise BadInput(f"`{where}`: {first['msg']}" if where else first["msg"]) from None


def _rule(check):
    """A core rule (ValueError with its message) as a field's validator."""
    return BeforeValidator(check)


class NotesQuery(BaseModel):
    days: Annotated[int, BeforeValidator(lambda raw: _days(raw))] = Field(
        7, description="resolved notes of the last days too (0 to 90)")


MAX_DAYS = 90


def _days(raw: Any) -> int:
    if not isinstance(raw, str) or not raw.isdigit() or not 0 <= int(raw) <= MAX_DAYS:
        raise ValueError(f"days must be a whole number from 0 to {MAX_DAYS}, got {str(raw)[:20]!r}")
    return int(raw)


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


def _by_rule() -> Any:
    """A required field whose absence its rule words (the rule runs on None too)."""
    return Field(None, validate_default=True, json_schema_extra=_no_default)

_TEXT = Annotated[str, _rule(incidents.check_text), Field(description="plain text (no markup), at most "
                                                                       f"{incidents.MAX_TEXT} characters")]
_AUTHOR = Annotated[str, _rule(incidents.check_author), Field(description="who says it (optional)")]


class NoteBody(BaseModel):
    """A new incident note (JSON or a form)."""

    scope: Literal["swarm", "model", "peer"]
    target: Optional[str] = Field(None, description="the model's DHT prefix, or the peer's id (none for the swarm)")
    text: _TEXT = _by_rule()
    author: _AUTHOR = Field(incidents.DEFAULT_AUTHOR, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _scope(cls, data: Any) -> Any:
        scope, target = incidents.check_scope(data.get("scope"), data.get("target") or None)
        if scope == incidents.MODEL and not security.is_dht_prefix(target):
            raise ValueError(security.not_dht_prefix(target))
        if scope == incidents.PEER and not security.is_peer_id(target):
            raise ValueError(security.not_peer_id(target))
        return {**data, "scope": scope, "target": target}


class NoteUpdate(BaseModel):
    """A note's new text."""

    text: _TEXT = _by_rule()
    author: _AUTHOR = Field(incidents.DEFAULT_AUTHOR, validate_default=True)


class NoteResolution(BaseModel):
    """A note's resolution, with an optional last word."""

    text: Annotated[Optional[str], BeforeValidator(
        lambda v: None if v is None or (isinstance(v, str) and not v.strip()) else incidents.check_text(v))] = None
    author: _AUTHOR = Field(incidents.DEFAULT_AUTHOR, validate_default=True)


# ---- bodies documented for the silences and maintenance windows (checked in ``mutes``) ----------------

_DURATION = Union[float, str]
_MOMENT = Union[float, str]


class SilenceBody(BaseModel):
    """A new silence: what it matches (``matchers`` and/or the shortcuts), for how long, and why."""

    matchers: Optional[Union[list[str], str]] = Field(None, description="matchers like 'model=\"llama\"' "
                                                                         "(a list, or one per line)")
    rule: Optional[str] = None
    model: Optional[str] = None
    peer: Optional[str] = Field(None, description="a peer id, or a public name")
    starts_at: Optional[_MOMENT] = Field(None, description="unix seconds or ISO 8601 (default: now)")
    duration: Optional[_DURATION] = Field(None, description='seconds, or like "2h" (60 s to 30 d); or ends_at')
    ends_at: Optional[_MOMENT] = None
    comment: Optional[str] = Field(None, description="why (required; also as `reason`), at most 500 characters")
    by: Optional[str] = Field(None, description="who (at most 100 characters)")


class WindowBody(BaseModel):
    """A new maintenance window: one-off (``duration`` or ``ends_at``) or recurring (``weekdays``
    and ``at``, or ``cron``, with ``duration``)."""

    scope: Literal["global", "model", "peer"]
    target: Optional[str] = Field(None, description="the model's DHT prefix, or the peer's id or public name")
    reason: str
    starts_at: Optional[_MOMENT] = None
    ends_at: Optional[_MOMENT] = None
    duration: Optional[_DURATION] = None
    timezone: str = "UTC"
    weekdays: Optional[Union[list[str], str]] = None
    at: Optional[str] = Field(None, description='"HH:MM", in `timezone`')
    cron: Optional[str] = None
    by: Optional[str] = None


class EndBody(BaseModel):
    """Why and by whom a silence or window ends (both optional)."""

    reason: Optional[str] = None
    by: Optional[str] = None


class RangeQuery(BaseModel):
    since: Optional[str] = Field(None, description="unix seconds or ISO 8601 (default: 24 h ago)")
    until: Optional[str] = Field(None, description="unix seconds or ISO 8601 (default: now)")


class AlertsQuery(RangeQuery):
    hours: Optional[int] = Field(None, description="the last hours instead of since/until")


class SearchQuery(BaseModel):
    q: str = Field(description="a peer id, its start or end, or a public name")


# ---- answers ---------------------------------------------------------------------------------------------


class ServerRow(Open):
    peer_id: str
    state: Literal["online", "joining", "offline", "unreachable"]
    span: dict
    score: Optional[float]


class ModelReport(Open):
    """One model, in health.petals.dev's shape with our additions."""

    dht_prefix: str
    name: str
    num_blocks: int
    state: Literal["healthy", "broken"]
    monitor_state: Literal["healthy", "degraded", "broken"]
    server_rows: list[ServerRow]
    reasons: list[str]


class State(Open):
    """health.petals.dev's ``/api/v1/state`` with our additions."""

    bootstrap_states: list[str]
    top_contributors: dict[str, int]
    model_reports: list[ModelReport]
    reachability_issues: list[dict]
    last_updated: float
    update_period: float
    update_duration: Optional[float]
    bootstrap_peers: list[dict]
    scores: dict[str, Optional[dict]]
    recommendations: dict[str, dict]
    poll: dict
    poller: dict


class ModelSummary(Open):
    dht_prefix: str
    name: str
    state: Literal["healthy", "broken"]
    monitor_state: Literal["healthy", "degraded", "broken"]
    coverage_pct: Optional[float]


class Models(Open):
    models: list[ModelSummary]
    last_updated: float


class ModelDetail(ModelReport):
    diagnosis: Optional[dict]
    last_updated: float


class ModelHistory(Open):
    model: str
    since: float
    until: float
    limits: dict


class PeerNow(Open):
    peer_id: str
    spans: list[dict]
    probe: Optional[dict] = Field(description="its latest reachability check")
    score: Optional[dict]
    last_updated: Optional[float]


class PeerHistory(Open):
    peer_id: str
    since: float
    until: float
    first_seen: Optional[float]
    limits: dict


class RequestStats(Open):
    """Statistics of the chat's request rows (see README: Chat)."""


class Report(Open):
    peer_id: str
    status: str
    headline: str
    checks: list[dict]
    recommendations: list[dict]


class RoutingView(Open):
    """The routing view clients route by (``swarm_monitor_client``); ETag, 304 when unchanged."""


class Reachable(BaseModel):
    """health.petals.dev's answer (also its 400 for a bad peer id)."""

    success: bool
    message: Optional[str]
    your_ip: Optional[str]


class SearchResults(Open):
    query: str
    results: list[dict]
    more: bool


class AlertsNow(Open):
    enabled: bool
    active: list[dict]
    events: list[dict]
    deliveries: dict
    rules: list[dict]


class Silence(Open):
    id: int
    matchers: list[str]
    starts_at: float
    ends_at: float
    comment: str
    status: Literal["active", "pending", "expired"]


class Silences(BaseModel):
    silences: list[Silence]


class OneSilence(BaseModel):
    silence: Silence


class Window(Open):
    id: int
    scope: Literal["global", "model", "peer"]
    target: Optional[str]
    reason: str
    recurring: bool
    in_force: bool
    status: Literal["active", "scheduled", "expired"]


class Windows(BaseModel):
    maintenance: list[Window]


class OneWindow(BaseModel):
    maintenance: Window


class Note(Open):
    id: int
    scope: Literal["swarm", "model", "peer"]
    target: Optional[str]
    text: str
    author: str
    open: bool
    updates: list[dict]


class Notes(BaseModel):
    notes: list[Note]


class OneNote(BaseModel):
    note: Note


class Health(BaseModel):
    ok: bool
    database: str
    last_poll: Optional[float]
    last_poll_ok: Optional[bool]
    poller_stale: bool


class Document(Open):
    """This document."""

    openapi: str
    info: dict
    paths: dict


ERRORS = {400: MonitorError, 404: MonitorError}
