"""The chat APIs' parameters and answers as pydantic models: what the OpenAPI document shows
(``monitor.api_doc``) and what ``chat.http.params`` checks every parameter with (``Params.field``
reads a parameter's type, bounds and default from its request model: one definition of each).

The value types (``Integer``, ``Number``, ``Boolean``, ``Text``) are pydantic types with their bounds;
``invalid`` is the one place where pydantic's complaint about a value becomes our ``InvalidRequest``,
whose message names the parameter, what it should be and what it got (the same words on every
API). JSON values are checked strictly (a string is not a number; a whole float is an integer);
a form's values are strings, parsed. Bounds that depend on the model or the engine (a model's
context, ``max_batch_rows``, ``max_logprobs``) are checked where those are known (``params``,
``openai_request``); ``kind_of`` adds them to the model's. A parameter with structure (``messages``,
``models``) is checked by rules of ours, whose words ``invalid`` prefixes with where they apply
(``messages[0].content``).

The module itself is pure (pydantic only), but importing it loads its package, whose
``__init__`` builds the chat's blueprint over the engine (torch, petals): only the chat's own
processes import it. The web workers never do: ``monitor.web`` may not import ``chat``
(``tests/test_layers.py``); the chat's part of the document comes from the chat's blueprint,
registered in the same app, whose views carry their ``Operation``.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any, Literal, Optional, Union

import annotated_types
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      ValidationInfo, model_validator)
from pydantic_core import PydanticCustomError

from monitor.api_doc import Open, OpenAIError

from chat.errors import InvalidRequest

MAX_TEXT_CHARS = 200_000  # any one text parameter
MAX_STOP_SEQUENCES, MAX_STOP_CHARS = 4, 1000  # stop sequences: how many, how long each
MAX_MESSAGES, MAX_CONTENT_PARTS = 512, 64  # a chat's messages; the text parts of one message
MAX_FALLBACK_MODELS = 8  # models in a request's ``models`` list


def _whole(value: Any, info: ValidationInfo) -> Any:
    """A whole float is an integer; a form's integer is written as one ("1.0" is not)."""
    if isinstance(value, str) and (info.context or {}).get("form"):
        try:
            return int(value.strip())
        except ValueError:
            raise PydanticCustomError("int_parsing", "not an integer") from None
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _flag(value: Any) -> Any:
    """true/false, 1/0 (also as strings, as forms send them)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return value.strip().lower() in ("1", "true")
    return value


def _a_number(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        raise PydanticCustomError("float_nan", "not a number")
    return value


# (each type made once per bounds: its checker is built once, ``checked``)
@functools.lru_cache(maxsize=None)
def Integer(lo: Optional[int] = None, hi: Optional[int] = None, **doc) -> Any:
    return Annotated[int, Field(ge=lo, le=hi, **doc), BeforeValidator(_whole)]  # (bounds first: documented then)


@functools.lru_cache(maxsize=None)
def Number(lo: Optional[float] = None, hi: Optional[float] = None, *, lo_open: bool = False, **doc) -> Any:
    return Annotated[float, Field(gt=lo if lo_open else None, ge=None if lo_open else lo, le=hi, **doc),
                     AfterValidator(_a_number)]


Boolean = Annotated[bool, BeforeValidator(_flag), Field(strict=True)]


@functools.lru_cache(maxsize=None)
def Text(max_chars: Optional[int] = MAX_TEXT_CHARS, **doc) -> Any:
    return Annotated[str, Field(max_length=max_chars, **doc)]


# ---- pydantic's complaint -> our message, in one place ----------------------------------------------


def _kind(value: Any) -> str:
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), repr(value)[:40])


def _bounds(metadata) -> tuple[Optional[float], Optional[float], bool]:
    """(lo, hi, lo_open) of a value type's constraints."""
    lo = hi = None
    lo_open = False
    for item in metadata:
        for constraint in getattr(item, "metadata", [item]):
            if isinstance(constraint, annotated_types.Ge):
                lo = constraint.ge
            elif isinstance(constraint, annotated_types.Gt):
                lo, lo_open = constraint.gt, True
            elif isinstance(constraint, annotated_types.Le):
                hi = constraint.le
    return lo, hi, lo_open


def _as_number(value: Any) -> float:
    return float(value.strip()) if isinstance(value, str) else value


class Refusal(ValueError):
    """A rule's words about a value (``at``: where inside it, like "[2]"), said after where it is."""

    def __init__(self, words: str, at: str = ""):
        super().__init__(words)
        self.at = at


def _located(name: str, first: dict, cause: ValueError) -> InvalidRequest:
    """A rule's complaint at ``first["loc"]`` inside parameter ``name``: "messages[0].role must be …"."""
    where = name + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
    where += getattr(cause, "at", "")
    return InvalidRequest(where, f"{where} {cause}")


def invalid(name: str, error: ValidationError, metadata=(), *, form: bool = False) -> InvalidRequest:
    """The first complaint of ``error`` about parameter ``name`` (checked against a type with
    ``metadata``: its bounds), as the InvalidRequest every chat API answers with a 400."""
    first = error.errors()[0]
    kind, value = first["type"], first["input"]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, ValueError):
        return _located(name, first, cause)
    got = repr(value) if form and isinstance(value, str) else _kind(value)
    if kind == "string_type":
        return InvalidRequest(name, f"{name} must be a string, got {_kind(value)}")
    if kind == "string_too_long":
        return InvalidRequest(name, f"{name} is {len(value)} characters long; at most "
                                    f"{first['ctx']['max_length']} are accepted")
    if kind.startswith("int_"):
        return InvalidRequest(name, f"{name} must be an integer, got {got}")
    if kind == "float_nan" or (isinstance(value, float) and value != value and not kind.startswith("bool_")):
        return InvalidRequest(name, f"{name} must be a number, got nan")
    if kind.startswith("float_"):
        return InvalidRequest(name, f"{name} must be a number, got {got}")
    if kind.startswith("bool_"):
        return InvalidRequest(name, f"{name} must be true/false (or 1/0), got {value!r}")
    lo, hi, lo_open = _bounds(metadata)
    number = _as_number(value)
    if kind == "greater_than" and lo_open:
        return InvalidRequest(name, f"{name} must be greater than {lo:g}" + (f" and at most {hi:g}" if hi is not None
                                                                            else "") + f", got {number:g}")
    if kind in ("greater_than", "greater_than_equal", "less_than_equal"):
        bounds = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else (
            f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        return InvalidRequest(name, f"{name} must be {bounds}, got {number:g}")
    return InvalidRequest(name, f"{name}: {first['msg']}")  # (no value type of ours says anything else)


_adapters: dict = {}


def checked(name: str, value: Any, kind: Any, *, form: bool = False) -> Any:
    """``value`` of parameter ``name`` as type ``kind`` (an InvalidRequest if it is not one)."""
    adapter = _adapters.get(id(kind)) or _adapters.setdefault(id(kind), TypeAdapter(kind))
    try:
        return adapter.validate_python(value, strict=not form, context={"form": form})
    except ValidationError as e:
        raise invalid(name, e, getattr(kind, "__metadata__", ()), form=form) from None


@functools.lru_cache(maxsize=None)
def kind_of(model: type[BaseModel], name: str, lo: Optional[float] = None, hi: Optional[float] = None) -> Any:
    """The type parameter ``name`` is checked with: its field's in ``model`` (an absent value is the
    caller's: ``None`` taken out), with the bounds ``lo``/``hi`` known only now (a model's context)."""
    field = model.model_fields[name]
    kind = field.annotation
    if typing.get_origin(kind) is Union and type(None) in typing.get_args(kind):
        kind = Union[tuple(arg for arg in typing.get_args(kind) if arg is not type(None))]
    if field.metadata:
        kind = Annotated[(kind, *field.metadata)]
    return kind if lo is None and hi is None else Annotated[kind, Field(ge=lo, le=hi)]


# ---- request bodies: each parameter's type, default and bounds, for the document and the checks -------

_MODEL = Text(500, description="the model's name: its DHT prefix (or a name /v1/models lists)")
_STOP = Union[Text(MAX_STOP_CHARS), Annotated[list[Text(MAX_STOP_CHARS)], Field(max_length=MAX_STOP_SEQUENCES)]]
# the sampling parameters every API (and the chat page) takes alike; only their defaults differ
TOP_P = Number(0, 1, lo_open=True)
TOP_K = Integer(0, 100_000)
REPETITION_PENALTY = Number(0, 100, lo_open=True)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


def _messages(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty list of {role, content} objects")
    if len(value) > MAX_MESSAGES:
        raise ValueError(f"has {len(value)} entries; at most {MAX_MESSAGES} are accepted")
    return value


def _role(value: Any) -> str:
    role = "system" if value == "developer" else value  # (OpenAI's newer name for it)
    if role not in ("system", "user", "assistant"):
        raise ValueError(f"must be 'system', 'user' or 'assistant', got {role!r}")
    return role


def _content(value: Any) -> str:
    """A string, or text parts (joined)."""
    if isinstance(value, list):
        if len(value) > MAX_CONTENT_PARTS:
            raise ValueError(f"has {len(value)} parts; at most {MAX_CONTENT_PARTS} are accepted")
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise Refusal('must be a text part {"type": "text", "text": ...}', at=f"[{j}]")
        value = "".join(part["text"] for part in value)
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


class Message(BaseModel):
    """One message; its ``content`` checked and joined into one string."""

    role: Annotated[str, BeforeValidator(_role, json_schema_input_type=Literal["system", "developer", "user",
                                                                                 "assistant"])]
    content: Annotated[str, BeforeValidator(_content, json_schema_input_type=Union[
        str, Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)]])]

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("must be an object with role and content")
        return {"role": None, "content": None, **data}  # (an absent one is worded by its rule)


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(name, str) and 0 < len(name) <= 500 for name in value):
        raise ValueError("must be a list of model names")
    if len(value) > MAX_FALLBACK_MODELS:
        raise ValueError(f"names {len(value)} models; at most {MAX_FALLBACK_MODELS}")
    return value


class RouteChoices(BaseModel):
    """The request's own routing choices (``monitor.core.route_choice``) and its kept session."""

    model_config = ConfigDict(extra="forbid")
    only: Optional[list[str]] = Field(None, description="peer ids the route may use only")
    ignore: Optional[list[str]] = Field(None, description="peer ids the route must not use")
    sort: Optional[Literal["speed", "latency", "score"]] = None
    min_tokens_per_s: Optional[float] = None
    max_time_to_first_token: Optional[float] = None
    verified_only: Optional[bool] = None
    allow_fallbacks: Optional[bool] = True
    session: Optional[str] = Field(None, description="the handle an earlier answer's petals.session gave")


class Sampling(BaseModel):
    """What every OpenAI completion shares."""

    model: _MODEL
    models: Optional[Annotated[list[str], BeforeValidator(_names, json_schema_input_type=Annotated[
        list[Text(500)], Field(max_length=MAX_FALLBACK_MODELS)])]] = Field(
        None, description="models to fall back on, in order, when `model` is not served or cannot meet `petals`")
    n: Integer(1, description="answers per prompt (at most max_batch_rows in all)") = 1
    best_of: Integer(1, description="only 1 is supported: use n for several answers") = 1
    max_tokens: Optional[Integer(0, description="at most the model's context; 0 (with echo and logprobs): "
                                                "only score the prompt")] = None
    max_completion_tokens: Optional[Integer(0)] = None
    temperature: Number(0, 2) = 1.0
    top_p: TOP_P = 1.0
    top_k: TOP_K = 0
    repetition_penalty: REPETITION_PENALTY = 1.0
    presence_penalty: Number(-2, 2, description="only 0 is supported: use repetition_penalty") = 0.0
    frequency_penalty: Number(-2, 2, description="only 0 is supported: use repetition_penalty") = 0.0
    stop: Optional[_STOP] = None
    seed: Optional[Integer()] = Field(None, description="accepted, not used: the swarm's sampling is not reproducible")
    stream: Boolean = False
    stream_options: Optional[dict[str, bool]] = Field(None, description='{"include_usage": true}: a last chunk with usage')
    response_format: Optional[dict[Literal["type"], Literal["text"]]] = None
    petals: Optional[RouteChoices] = None


class ChatCompletionBody(Sampling):
    messages: Annotated[list[Message], BeforeValidator(_messages), Field(min_length=1, max_length=MAX_MESSAGES)]
    logprobs: Boolean = False
    top_logprobs: Optional[Integer(0, description="at most the chat's max_logprobs")] = None


class CompletionBody(Sampling):
    prompt: Union[str, list[int], list[Union[str, list[int]]]] = Field(
        description="a string, a list of token ids, or a list of those")
    echo: Boolean = False
    logprobs: Optional[Integer(0, description="alternatives per token, at most the chat's max_logprobs")] = None


class EstimateBody(BaseModel):
    """The body of a chat completion (with ``messages``) or a text completion (with ``prompt``)."""

    model_config = ConfigDict(extra="allow")
    model: _MODEL
    messages: Optional[list[Message]] = None
    prompt: Optional[Union[str, list[int], list[Union[str, list[int]]]]] = None


class GenerateBody(BaseModel):
    """chat.petals.dev's ``/api/v1/generate`` (a form or JSON)."""

    model: Optional[_MODEL] = Field(None, description="optional while the chat serves one model")
    inputs: str
    max_new_tokens: Optional[Integer(1, description="at most the model's context; or max_length")] = None
    max_length: Optional[Integer(1, description="the whole text's length in tokens")] = None
    do_sample: Boolean = False
    temperature: Optional[Number(0, 100, lo_open=True)] = None
    top_p: Optional[TOP_P] = None
    top_k: Optional[TOP_K] = None
    repetition_penalty: REPETITION_PENALTY = 1.0
    session: Optional[str] = Field(None, description="the handle of the answer these inputs follow")


# ---- answers ------------------------------------------------------------------------------------------


class Hop(Open):
    peer_id: str
    start: int
    end: int


class PetalsExtension(Open):
    """The ``petals`` part of an answer: its route and speed, its session's handle."""

    route: Optional[list[Hop]] = None
    tokens_per_second: Optional[float] = None
    time_to_first_token: Optional[float] = None
    waited: Optional[float] = Field(None, description="seconds it waited for a slot (what its forecast's wait was about)")
    session: Optional[str] = None
    continued: Optional[bool] = None
    fallbacks: Optional[list[dict]] = None


class Forecast(Open):
    """What a request would get now (README: Forecasts): medians, and ranges for eight in ten
    requests, calibrated on how the stored forecasts fared."""

    wait: float
    time_to_first_token: Optional[float]
    tokens_per_second: Optional[float]
    total: Optional[float]
    cache_room: Optional[bool]
    source: Literal["requests", "probes", "none"]
    based_on: int
    time_to_first_token_range: Optional[list[float]]
    tokens_per_second_range: Optional[list[float]]
    wait_range: Optional[list[float]]
    calibrated_on: int = Field(description="answered requests the ranges' calibration rests on (0: not calibrated yet)")
    gone_wrong: list[str] = Field(description="figures whose ranges held for under 65 % of the newest 100 requests")
    load: Optional[float] = Field(description="the requests it would generate beside on its busiest server, itself included")


class RouteChoiceVerdict(Open):
    meets: bool
    param: Optional[str] = None
    reason: Optional[str] = None


class EstimatePetals(Open):
    served: bool
    reason: Optional[str]
    forecast: Forecast
    planned_route: list[Hop]
    route_choice: Optional[RouteChoiceVerdict] = None


class Usage(Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(Open):
    index: int
    message: dict[str, str]
    logprobs: Optional[dict]
    finish_reason: Literal["stop", "length"]


class ChatCompletion(Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    petals: PetalsExtension


class TextChoice(Open):
    index: int
    text: str
    logprobs: Optional[dict]
    finish_reason: Literal["stop", "length"]


class TextCompletion(Open):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    petals: PetalsExtension


class ChunkChoice(Open):
    index: int
    logprobs: Optional[dict]
    finish_reason: Optional[Literal["stop", "length"]]


class Chunk(Open):
    """One server-sent event of a streamed answer (``data: <this>``; the last is ``data: [DONE]``);
    an error after the status line comes as an ``OpenAIError`` event."""

    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Optional[Usage] = None
    petals: Optional[PetalsExtension] = None


class ModelCard(Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    petals: dict


class ModelList(Open):
    object: Literal["list"]
    data: list[ModelCard]


class Estimate(Open):
    object: Literal["estimate"]
    model: str
    prompt_tokens: int
    max_tokens: int
    answers: int
    petals: EstimatePetals


class Generated(Open):
    ok: Literal[True]
    outputs: str
    token_count: int
    route: list[Hop]
    session: Optional[str]
    continued: bool


class PetalsError(BaseModel):
    """chat.petals.dev's error shape; ``traceback`` is a message for people, never a traceback."""

    ok: Literal[False]
    traceback: str
    param: Optional[str]


OPENAI_ERRORS = {400: OpenAIError, 404: OpenAIError, 413: OpenAIError, 429: OpenAIError, 503: OpenAIError}
PETALS_ERRORS = {400: PetalsError, 404: PetalsError, 413: PetalsError, 429: PetalsError, 503: PetalsError}
