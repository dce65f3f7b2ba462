"""Spec: each chat parameter is defined once, and the document says what the checks do (README: API).

The chat's request models (``chat.http.api_models``) are what the OpenAPI document shows; the
views check a documented parameter with its field of those models (``Params.field``), adding only
bounds known at request time (a model's context, ``max_batch_rows``, ``max_logprobs``). Here: every
bound the document states is the one the check enforces, at its edge and just past it, and the
views read no documented parameter with bounds of their own. Pure: no swarm, no engine.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from chat.errors import InvalidRequest
from chat.http import api_models as m
from chat.http.params import Params

ROOT = Path(__file__).resolve().parent.parent
MODELS = (m.Sampling, m.ChatCompletionBody, m.CompletionBody, m.GenerateBody)
VIEWS = ("chat/http/openai_request.py", "chat/http/openai_api.py", "chat/http/petals_api.py", "chat/http/page.py")


def numeric_bounds():
    """(model, parameter, schema) of every documented parameter with a numeric bound."""
    for model in MODELS:
        for name, schema in model.model_json_schema()["properties"].items():
            kinds = [s for s in schema.get("anyOf", [schema]) if s.get("type") in ("integer", "number")]
            if kinds and {"minimum", "maximum", "exclusiveMinimum"} & set(kinds[0]):
                yield pytest.param(model, name, kinds[0], id=f"{model.__name__}.{name}")


def refused(model, name: str, value) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        Params({name: value}).field(model, name)
    assert caught.value.param == name and str(caught.value).startswith(f"{name} must be"), caught.value
    return caught.value


@pytest.mark.parametrize("model, name, schema", list(numeric_bounds()))
def test_every_documented_bound_is_the_checks_bound(model, name, schema):
    whole = schema["type"] == "integer"
    step = 1 if whole else 1e-9
    if "minimum" in schema:
        assert Params({name: schema["minimum"]}).field(model, name) == schema["minimum"]
        refused(model, name, schema["minimum"] - step)
    if "exclusiveMinimum" in schema:
        refused(model, name, schema["exclusiveMinimum"])
        assert Params({name: schema["exclusiveMinimum"] + step}).field(model, name) > schema["exclusiveMinimum"]
    if "maximum" in schema:
        assert Params({name: schema["maximum"]}).field(model, name) == schema["maximum"]
        refused(model, name, schema["maximum"] + step)
    if not whole:
        assert "must be a number" in str(refused(model, name, math.nan))


def test_bounds_known_at_request_time_narrow_the_documented_ones():
    assert Params({"n": 8}).field(m.Sampling, "n", hi=8) == 8
    assert str(refused(m.Sampling, "n", 0)) == "n must be at least 1, got 0"
    with pytest.raises(InvalidRequest, match="n must be between 1 and 8, got 9"):
        Params({"n": 9}).field(m.Sampling, "n", hi=8)
    with pytest.raises(InvalidRequest, match="max_tokens must be between 1 and 2048, got 0"):
        Params({"max_tokens": 0}).field(m.Sampling, "max_tokens", lo=1, hi=2048)


def test_the_sampling_parameters_every_api_shares_are_documented_alike():
    for name in ("top_p", "top_k", "repetition_penalty"):
        openai, petals = (model.model_json_schema()["properties"][name] for model in (m.Sampling, m.GenerateBody))
        bounds = [{k: v for k, v in s.items() if k in ("type", "minimum", "maximum", "exclusiveMinimum")}
                  for s in (openai, *petals.get("anyOf", [petals]))]
        assert bounds[0] == bounds[1], (name, bounds)


def test_the_views_read_no_documented_parameter_with_bounds_of_their_own():
    documented = {name for model in MODELS for name in model.model_fields} - {"stop"}  # (stop: Params.strings)
    own = {(view, name) for view in VIEWS
           for name in re.findall(r'params\.(?:integer|number|string|boolean)\(\s*"(\w+)"', (ROOT / view).read_text())}
    assert {(view, name) for view, name in own if name in documented} == set()
