"""The monitor API's queries, bodies and answers as pydantic models: what the OpenAPI document
shows (``monitor.web.openapi``) and, for the bodies and queries, what the views check their input
with (``checked``: pydantic's complaint becomes our 400, in one place). Answers are ``Open``: the
fields they always carry, more may come. No torch, no petals: web workers import it.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Callable, Literal, Mapping, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic.json_schema import SkipJsonSchema

from monitor.api_doc import MonitorError, Open
from monitor.core import incidents, maintenance as mnt, muting, timefmt
from monitor.core.common import DAY
from monitor.durations import parse_duration
from monitor.web import security

# ---- input: what a view checks, and the one translation of pydantic's complaints -------------------------


class BadInput(ValueError):
    """What is wrong with a request's fields, for the person who sent it (a 400)."""


def checked(model: type[BaseModel], data: Mapping[str, Any], **context) -> BaseModel:
    """``data`` as ``model`` (``context``: what its validators need, e.g. ``now``; ``given``: ``data``
    itself, for a rule that reads another name), or BadInput with the first complaint (the fields in
    their order): a rule's own message (our validators say what is wrong and what to send), else
    pydantic's, prefixed by the field."""
    try:
        return model.model_validate(dict(data), context={"given": data, **context})
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


def _required_by_rule(schema: dict, model: type[BaseModel]) -> None:
    """The document lists as required the fields whose rule refuses their absence (``_by_rule``)."""
    required = [name for name, f in model.model_fields.items() if f.is_required() or f.json_schema_extra is _no_default]
    if required:
        schema["required"] = required


class Body(BaseModel):
    """A request body (or query) checked by its model."""

    model_config = ConfigDict(json_schema_extra=_required_by_rule)

_TEXT = Annotated[str, _rule(incidents.check_text), Field(description="plain text (no markup), at most "
                                                                       f"{incidents.MAX_TEXT} characters")]
_AUTHOR = Annotated[str, _rule(incidents.check_author), Field(description="who says it (optional)")]


class NoteBody(Body):
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


class NoteUpdate(Body):
    """A note's new text."""

    text: _TEXT = _by_rule()
    author: _AUTHOR = Field(incidents.DEFAULT_AUTHOR, validate_default=True)


class NoteResolution(Body):
    """A note's resolution, with an optional last word."""

    text: Annotated[Optional[str], BeforeValidator(
        lambda v: None if v is None or (isinstance(v, str) and not v.strip()) else incidents.check_text(v))] = None
    author: _AUTHOR = Field(incidents.DEFAULT_AUTHOR, validate_default=True)


# ---- silences and maintenance windows: each field's rule, in the order they are checked -----------
# A blank value is an absent one (forms send ""). The rules that need more than their own field
# read those validated before them (``info.data``: the time zone, the scope) or the request's
# moment (``checked(..., now=...)``); a silence's rules over several fields are steps among them
# (``Step``: a complaint comes in the order the fields are read); a window's, all after its last
# field, are ``mutes.window_from``'s.

MAX_SILENCE = 30 * DAY
MAX_AHEAD = 366 * DAY  # how far from now a silence or window may start or end
REASON_CHARS, BY_CHARS = 500, 100
_TIME = "unix seconds or ISO 8601 like 2026-12-01T14:00Z"


def _given(value: Any) -> bool:
    return not (value is None or (isinstance(value, str) and not value.strip()))


def _line(name: str, value: Any, limit: int, *, required: bool = False, default: Optional[str] = None
         ) -> Optional[str]:
    """``value`` as one line of text of at most ``limit`` characters, else what is wrong with it."""
    if not _given(value):
        if required:
            raise ValueError(f"`{name}` is required")
        return default
    if not isinstance(value, str):
        raise ValueError(f"`{name}` must be text")
    value = value.strip()
    if len(value) > limit:
        raise ValueError(f"`{name}` is {len(value)} characters long; at most {limit}")
    if any(ord(c) < 32 and c not in "\t" for c in value):
        raise ValueError(f"`{name}` must be one line of text")
    return value


def Line(limit: int, default: Optional[str] = None, *, required: bool = False, unless: Optional[str] = None,
         **doc) -> Any:
    """A field of one line of text; ``unless``: not read at all when that field (before it) was given."""

    def rule(value: Any, info: ValidationInfo) -> Optional[str]:
        if unless and info.data.get(unless):
            return None
        return _line(info.field_name, value, limit, required=required, default=default)

    text = Annotated[str, Field(max_length=limit)]
    return Annotated[Optional[text], BeforeValidator(rule, json_schema_input_type=Optional[text]),
                     Field(default, validate_default=True, **doc,
                           **({"json_schema_extra": _no_default} if required and not unless else {}))]


def _seconds(name: str, value: Any, low: float, high: float) -> Optional[float]:
    """A duration: seconds, or "90s", "5m", "2h", "1d"."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"`{name}` must be a duration")
    try:
        found = float(parse_duration(value.strip() if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a duration: seconds, or a number with s, m, h or d like \"2h\"") from None
    if not math.isfinite(found) or not low <= found <= high:
        raise ValueError(f"`{name}` must be between {timefmt.duration(low)} and {timefmt.duration(high)}")
    return found


def _moment(value: Any, info: ValidationInfo) -> Optional[float]:
    """A moment: unix seconds, or ISO 8601 ("2026-12-01T14:00", "…Z", "…+01:00"; without an offset,
    in the body's ``timezone``), within a year of now."""
    name = info.field_name
    if value is None or value == "":
        return None
    too_long = isinstance(value, str) and len(value) > 40
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or too_long:
        raise ValueError(f"`{name}` must be a time" + ("" if isinstance(value, bool) else f": {_TIME}"))
    try:
        at = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"`{name}` must be a time: {_TIME}") from None
        at = (parsed if parsed.tzinfo else parsed.replace(tzinfo=mnt.zone(info.data.get("timezone") or "UTC"))
              ).timestamp()
    if not math.isfinite(at) or abs(at - info.context["now"]) > MAX_AHEAD:
        raise ValueError(f"`{name}` must be within a year of now")
    return at


_MOMENT = Annotated[Optional[float], BeforeValidator(_moment, json_schema_input_type=Union[float, str, None])]
_LIST = Optional[Union[list[str], str]]


def _matchers(raw: Any) -> tuple[muting.Matcher, ...]:
    """A list of 'name="value"' strings, or text with one per line."""
    if isinstance(raw, str):
        raw = [text for text in raw.splitlines() if text.strip()]
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ValueError("`matchers` must be a list of matchers like 'model=\"llama\"'")
    if len(raw) > muting.MAX_MATCHERS:
        raise ValueError(f"at most {muting.MAX_MATCHERS} matchers")
    try:
        return tuple(muting.parse_matcher(item) for item in raw)
    except ValueError as e:
        raise ValueError(f"matchers: {e}") from None


def _window_duration(value: Any, info: ValidationInfo) -> Optional[float]:
    """A one-off window's whole length, or a recurring one's occurrence (``weekdays``, ``at``, ``cron``)."""
    recurring = any(info.data.get(name) for name in ("weekdays", "at", "cron"))
    return _seconds("duration", value, 60, mnt.MAX_DURATION if recurring else mnt.MAX_ONE_OFF)


def _scope(value: Any) -> str:
    scope = _line("scope", value, 16, required=True)
    if scope not in mnt.SCOPES:
        raise ValueError(f"`scope` must be one of {', '.join(mnt.SCOPES)}")
    return scope


def _target(value: Any, info: ValidationInfo) -> Optional[str]:
    """The window's model or peer: ``target``, or the field named after its scope."""
    scope = info.data.get("scope")
    if scope in (None, mnt.GLOBAL):  # (none: the scope's own error comes first)
        return None
    target = _line("target", value, 256) or _line(scope, info.context["given"].get(scope), 256)
    if scope == mnt.MODEL and (target is None or not security.is_dht_prefix(target)):
        raise ValueError("a model's window needs `target`: the model's DHT prefix")
    if scope == mnt.PEER and (target is None or len(target) > 128):
        raise ValueError("a peer's window needs `target`: the peer's id or public name (at most 128 characters)")
    return target


def _zone(value: Any) -> str:
    name = _line("timezone", value, 64, default="UTC")
    mnt.zone(name)
    return name


class _Authored(Body):
    """Who does it (``by``, also as ``created_by``; default "operator")."""

    by: Line(BY_CHARS, description="who (at most 100 characters)")
    created_by: Line(BY_CHARS, "operator", unless="by")

    @property
    def author(self) -> str:
        return self.by or self.created_by


def Step(rule: Callable[[Mapping[str, Any], Mapping[str, Any]], Any], *reads: str) -> Any:
    """Not an input: a rule over fields before it together (``rule(fields, context)``, reading the
    fields ``reads``), checked at its place among theirs; its answer is kept under its name. What is
    sent under that name is ignored; while a field it reads is bad (missing from ``info.data``), it
    waits: that field's complaint comes first."""

    def check(_: Any, info: ValidationInfo) -> Any:
        return rule(info.data, info.context) if set(reads) <= info.data.keys() else None

    return SkipJsonSchema[Annotated[Any, BeforeValidator(check), Field(None, validate_default=True, exclude=True)]]


def _silenced(fields: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[muting.Matcher, ...]:
    """What a silence matches: ``matchers`` plus the shortcuts ``rule``, ``model`` and ``peer`` (an
    id, or a public name)."""
    found = [*fields["matchers"], *(muting.matcher(label, "=", fields[label]) for label in ("rule", "model")
                                    if fields[label] is not None)]
    peer = fields["peer"]
    if peer is not None:
        found.append(muting.matcher("peer" if security.is_peer_id(peer) else "peer_name", "=", peer))
    if not found:
        raise ValueError("say what to silence: a `rule`, a `model`, a `peer`, or `matchers`")
    if len(found) > muting.MAX_MATCHERS:
        raise ValueError(f"at most {muting.MAX_MATCHERS} matchers")
    if all(each.matches({}) for each in found):
        raise ValueError("these matchers match every alert; name a rule, model or peer (for the whole swarm, "
                         "use a global maintenance window)")
    return tuple(found)


def _silence_span(fields: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[float, float]:
    """(start, end) of a silence: from ``starts_at`` (default now) for ``duration``, or to ``ends_at``."""
    now, duration, ends = context["now"], fields["duration"], fields["ends_at"]
    starts = fields["starts_at"] or now
    if (duration is None) == (ends is None):
        raise ValueError("give either `duration` (like \"2h\") or `ends_at`, not both")
    ends = starts + duration if duration is not None else ends
    if ends <= max(starts, now):
        raise ValueError("the silence must end after it starts, and in the future")
    if ends - starts > MAX_SILENCE:
        raise ValueError(f"a silence lasts at most {timefmt.duration(MAX_SILENCE)}")
    return starts, ends


class SilenceBody(_Authored):
    """A new silence: what it matches (``matchers`` and/or the shortcuts), for how long, and why."""

    matchers: Annotated[Any, BeforeValidator(_matchers, json_schema_input_type=_LIST)] = Field(
        None, validate_default=True, description="matchers like 'model=\"llama\"' (a list, or one per line)")
    rule: Line(256)
    model: Line(256)
    peer: Line(128, description="a peer id, or a public name")
    silenced: Step(_silenced, "matchers", "rule", "model", "peer")
    starts_at: _MOMENT = Field(None, description=f"{_TIME} (default: now)")
    duration: Annotated[Optional[float], BeforeValidator(lambda value: _seconds("duration", value, 60, MAX_SILENCE),
                                                         json_schema_input_type=Union[float, str, None])] = Field(
        None, description='seconds, or like "2h" (60 s to 30 d); or ends_at')
    ends_at: _MOMENT = None
    span: Step(_silence_span, "starts_at", "duration", "ends_at")
    comment: Line(REASON_CHARS, description="why (required; also as `reason`)")
    reason: Line(REASON_CHARS, required=True, unless="comment")


class WindowBody(_Authored):
    """A new maintenance window: one-off (``duration`` or ``ends_at``) or recurring (``weekdays``
    and ``at``, or ``cron``, with ``duration``)."""

    scope: Annotated[str, BeforeValidator(_scope, json_schema_input_type=Literal["global", "model", "peer"])] = \
        _by_rule()
    target: Annotated[Optional[str], BeforeValidator(_target, json_schema_input_type=Optional[str])] = Field(
        None, validate_default=True, description="the model's DHT prefix, or the peer's id or public name "
                                                 "(also as `model` or `peer`)")
    timezone: Annotated[str, BeforeValidator(_zone, json_schema_input_type=str)] = Field(
        "UTC", validate_default=True, description="an IANA time zone: of `at`, and of times without an offset")
    reason: Line(REASON_CHARS, required=True)
    starts_at: _MOMENT = Field(None, description=f"{_TIME} (default: now)")
    ends_at: _MOMENT = Field(None, description="a one-off window's end; a recurring one's last day")
    weekdays: Annotated[Any, BeforeValidator(
        lambda days: [day for day in days.replace(",", " ").split() if day] if isinstance(days, str) else days,
        json_schema_input_type=_LIST)] = Field(None, description='days like ["Sat", "Sun"] (or "Sat, Sun")')
    at: Line(5, description='"HH:MM", in `timezone`')
    cron: Line(100)
    duration: Annotated[Optional[float], BeforeValidator(_window_duration, json_schema_input_type=Union[
        float, str, None])] = Field(None, description='seconds, or like "2h": the window (a one-off: at most '
                                                      '30 d), or each occurrence (at most 7 d)')


class EndBody(Body):
    """Why and by whom a silence or window ends (both optional)."""

    reason: Line(REASON_CHARS, description='why (also as `comment`; default: "ended early")')
    comment: Line(REASON_CHARS, "ended early", unless="reason")
    by: Line(BY_CHARS)
    created_by: Line(BY_CHARS, "operator", unless="by")

    @property
    def why(self) -> str:
        return self.reason or self.comment

    @property
    def author(self) -> str:
        return self.by or self.created_by


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
    measured_contributors: list[dict] = []  # the week's most verified servers (web.contributors), beside the claims
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
