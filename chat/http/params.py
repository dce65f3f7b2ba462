"""Request parameters, read and checked once for every chat API: typed values from a JSON body
or a form, each problem an ``InvalidRequest`` that names the parameter and what it should be.

The chat page (a form), chat.petals.dev's API (a form or JSON) and the OpenAI API (JSON) accept
the same parameters with the same bounds; only their defaults differ. Here is the HTTP edge where
untrusted input becomes values the engine can trust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from flask import request
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from chat.errors import InvalidRequest
from chat.http.api_models import (MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_TEXT_CHARS, REPETITION_PENALTY, TOP_K,
                                  TOP_P, Boolean, GenerateBody, Integer, Number, Text, checked, kind_of)

if TYPE_CHECKING:
    from chat.engine import ChatEngine

_MODELS_DEFAULT = object()


class Params:
    """Typed parameters from a JSON object (typed values) or a form (strings; "" means absent),
    each checked with its pydantic type (``chat.http.api_models``; a documented parameter with its
    request model's: ``field``). Every problem is an InvalidRequest naming the parameter and what it
    should be."""

    def __init__(self, data: Any, *, form: bool = False, where: str = "the request body",
                 session_header: Optional[str] = None):
        if not isinstance(data, Mapping):
            raise InvalidRequest(None, f"{where} must be a JSON object")
        self.data, self.form = data, form
        self.session_header = session_header  # ``X-Petals-Session`` (``openai_request.session_handle``)

    def raw(self, name: str) -> Any:
        value = self.data.get(name)
        if self.form and value == "":
            return None
        return value

    def present(self, name: str) -> bool:
        return self.raw(name) is not None

    def field(self, model: type[BaseModel], name: str, *, default: Any = _MODELS_DEFAULT, lo: Optional[float] = None,
              hi: Optional[float] = None) -> Any:
        """Parameter ``name`` checked with its field of the request ``model`` (type, bounds, and the
        bounds ``lo``/``hi`` known only now); absent: ``default``, else the model's (a field without
        one is required)."""
        default = model.model_fields[name].default if default is _MODELS_DEFAULT else default
        if default is PydanticUndefined and not self.present(name):
            raise InvalidRequest(name, f"{name} is required")
        return self._checked(name, kind_of(model, name, lo, hi), default)

    def _checked(self, name: str, kind: Any, default: Any) -> Any:
        value = self.raw(name)
        return default if value is None else checked(name, value, kind, form=self.form)

    def string(self, name: str, *, required: bool = False, default: Optional[str] = None,
               max_chars: Optional[int] = MAX_TEXT_CHARS) -> Optional[str]:
        """``max_chars`` None: the caller bounds it (prompts: ``ChatLimits.check_prompt_chars``)."""
        value = self.raw(name)
        if value is None:
            if required:
                raise InvalidRequest(name, f"{name} is required")
            return default
        return checked(name, value, Text(max_chars))

    def integer(self, name: str, *, default: Optional[int] = None, lo: Optional[int] = None,
                hi: Optional[int] = None) -> Optional[int]:
        return self._checked(name, Integer(lo, hi), default)

    def number(self, name: str, *, default: Optional[float] = None, lo: Optional[float] = None,
               hi: Optional[float] = None, lo_open: bool = False) -> Optional[float]:
        return self._checked(name, Number(lo, hi, lo_open=lo_open), default)

    def sampling(self, *, top_p: float, top_k: int, repetition_penalty: float) -> dict:
        """top_p, top_k and repetition_penalty, checked alike by every API; only the defaults differ."""
        return {"top_p": self._checked("top_p", TOP_P, top_p), "top_k": self._checked("top_k", TOP_K, top_k),
                "repetition_penalty": self._checked("repetition_penalty", REPETITION_PENALTY, repetition_penalty)}

    def boolean(self, name: str, *, default: bool = False) -> bool:
        value = self.raw(name)
        return default if value is None else checked(name, value, Boolean)

    def strings(self, name: str, *, max_items: int = MAX_STOP_SEQUENCES, allow_single: bool = True) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        if isinstance(value, str) and allow_single:
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(name, f"{name} must be {'a string or ' if allow_single else ''}a list of strings")
        if len(value) > max_items:
            raise InvalidRequest(name, f"{name} has {len(value)} entries; at most {max_items} are accepted")
        if any(len(v) > MAX_STOP_CHARS for v in value):
            raise InvalidRequest(name, f"each entry of {name} must be at most {MAX_STOP_CHARS} characters")
        return tuple(v for v in value if v)

    def model(self, engine: "ChatEngine") -> str:
        """The dht_prefix of the ``model`` parameter; optional while the engine has one model."""
        name = self.field(GenerateBody, "model")
        if name is None:
            if len(engine.models.names) == 1:
                return engine.models.names[0]
            raise InvalidRequest("model", f"model is required; one of {', '.join(engine.models.names)}")
        return engine.models.resolve(name)


def client_address() -> str:
    """Who is asking: the client's address (behind ``proxy_hops`` proxies, the one they forward),
    as the rate limits count it. Slots, queue places and open sessions are shared per address."""
    return request.remote_addr or "unknown"


def request_params() -> Params:
    """The current request's parameters: its JSON body, or its form / query values (and the
    ``X-Petals-Session`` header, a kept session's handle where a proxy can read it)."""
    header = request.headers.get("X-Petals-Session") or None
    header = header if header is None or len(header) <= 100 else None  # (not one of ours: chat.kept)
    if request.is_json:
        data = request.get_json(silent=True)
        if data is None:
            raise InvalidRequest(None, "the request body is not valid JSON")
        return Params(data, session_header=header)
    return Params(request.values.to_dict(), form=True, session_header=header)
