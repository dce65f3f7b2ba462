"""The JSON API described: an OpenAPI 3.1 document assembled from the routes the app registered
(``GET /api/openapi.json``), and a page that reads it (``GET /api/docs``, Swagger UI, vendored).

Each JSON view declares itself once, next to itself (``monitor.api_doc.documented``); the
document has every rule of every declared view, its models' schemas (pydantic's, under
``components/schemas``) and the operator token as a security scheme. A view without a declaration
is not in it: pages, static files, the demo's controls. The answer is built once per app and kept
(``WebCache``-free: it changes only with the code), with an ETag.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from typing import Any

from flask import Blueprint, Flask, Response, current_app, render_template, request
from pydantic import BaseModel

from monitor.api_doc import OPERATOR, OPTIONAL_OPERATOR, Answer, Operation, documented, operation_of
from monitor.web import api_models as m

bp = Blueprint("openapi", __name__)

REF = "#/components/schemas/{model}"
JSON_PATHS = ("/api/", "/v1/", "/healthz")  # where JSON is answered; a declared view's other rules serve pages
MAX_AGE = 3600
_PARAM = re.compile(r"<(?:(?P<conv>[a-z]+)(?:\([^)]*\))?:)?(?P<name>\w+)>")
SECURITY_SCHEMES = {
    "operator": {"type": "http", "scheme": "bearer",
                 "description": "the operator token (`admin_token`, or the file `<data_dir>/admin_token`); "
                                "browsers log in at /login instead"},
}


def path_of(rule: str) -> tuple[str, list[tuple[str, str]]]:
    """A Flask rule as an OpenAPI path, and its (name, converter) parameters."""
    params = [(found["name"], found["conv"] or "string") for found in _PARAM.finditer(rule)]
    return _PARAM.sub(lambda found: "{" + found["name"] + "}", rule), params


class _Schemas:
    """Every model's schema once, under components/schemas (pydantic's $defs lifted there)."""

    def __init__(self):
        self.found: dict[str, dict] = {}

    def ref(self, model: type[BaseModel]) -> dict:
        if model.__name__ not in self.found:
            schema = model.model_json_schema(ref_template=REF)
            for name, sub in schema.pop("$defs", {}).items():
                self.found.setdefault(name, sub)
            self.found[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}


def _operation(op: Operation, method: str, endpoint: str, params: list[tuple[str, str]], schemas: _Schemas) -> dict:
    found: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "operationId": f"{endpoint}.{method}"}
    if op.description:
        found["description"] = op.description
    parameters = [{"name": name, "in": "path", "required": True,
                   "schema": {"type": "integer"} if conv == "int" else {"type": "string"},
                   **({"description": op.path_params[name]} if name in op.path_params else {})}
                  for name, conv in params]
    if op.query is not None:
        schema = op.query.model_json_schema(ref_template=REF)
        for name, prop in schema.get("properties", {}).items():
            parameters.append({"name": name, "in": "query", "required": name in schema.get("required", ()),
                               "schema": prop, **({"description": prop["description"]} if "description" in prop
                                                   else {})})
    if parameters:
        found["parameters"] = parameters
    if op.body is not None and method in ("post", "put", "patch"):
        content = {"application/json": {"schema": schemas.ref(op.body)}}
        if op.form:
            content["application/x-www-form-urlencoded"] = {"schema": schemas.ref(op.body)}
        found["requestBody"] = {"required": method == "post" and not _all_optional(op.body), "content": content}
    found["responses"] = {str(status): _answer(status, answer, op, schemas) for status, answer in op.answers.items()}
    if op.auth == OPERATOR:
        found["security"] = [{"operator": []}]
        found["responses"].setdefault("401", _answer(401, Answer(m.MonitorError), op, schemas))
    elif op.auth == OPTIONAL_OPERATOR:
        found["security"] = [{}, {"operator": []}]
    return found


def _all_optional(model: type[BaseModel]) -> bool:
    return not any(field.is_required() for field in model.model_fields.values())


WORDS = {200: "OK", 201: "created", 304: "not modified (If-None-Match)", 400: "a bad parameter: the message names it",
         401: "operators only", 404: "not found", 413: "the request is too large", 429: "too many requests: wait "
         "as long as Retry-After says", 503: "unavailable now: the message says why"}


def _answer(status: int, answer: Answer, op: Operation, schemas: _Schemas) -> dict:
    found: dict[str, Any] = {"description": answer.description or WORDS.get(status, str(status))}
    if answer.model is not None:
        found["content"] = {answer.media_type: {"schema": schemas.ref(answer.model)}}
        if status == 200 and op.stream is not None:
            found["content"]["text/event-stream"] = {"schema": {"type": "string"},
                                                     "x-chunk": schemas.ref(op.stream)}
    return found


def _version() -> str:
    try:
        return importlib.metadata.version("petals-swarm-monitor")
    except importlib.metadata.PackageNotFoundError:  # (a checkout that is not installed)
        return "unknown"


def build(app: Flask) -> dict:
    """The document of every declared view among ``app``'s routes."""
    schemas, paths = _Schemas(), {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        op = operation_of(app.view_functions[rule.endpoint])
        if op is None or not rule.rule.startswith(JSON_PATHS):  # (/notes: the same view, for the pages' forms)
            continue
        path, params = path_of(rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(op, method.lower(), rule.endpoint, params, schemas)
    tags = sorted({o["tags"][0] for ops in paths.values() for o in ops.values()})
    return {
        "openapi": "3.1.0",
        "info": {"title": "Swarm monitor for Petals", "version": _version(),
                 "description": "The monitor's JSON API, chat.petals.dev's HTTP API and OpenAI's API, as this "
                                "server serves them. Inputs are checked against the models below; an error "
                                "names the parameter at fault."},
        "tags": [{"name": tag} for tag in tags],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.found.items())), "securitySchemes": SECURITY_SCHEMES},
    }


def document_body(app: Flask) -> bytes:
    body = app.extensions.get("openapi_document")
    if body is None:
        body = app.extensions["openapi_document"] = json.dumps(build(app), separators=(",", ":")).encode()
    return body


@bp.get("/api/openapi.json")
@documented("This document", "Monitor", {200: m.Document})
def document():
    body = document_body(current_app._get_current_object())
    response = Response(body, mimetype="application/json")
    response.set_etag(hashlib.sha256(body).hexdigest()[:32])
    response.headers["Cache-Control"] = f"public, max-age={MAX_AGE}"
    return response.make_conditional(request)


@bp.get("/api/docs")
def page():
    """The document, readable (Swagger UI; its initialiser is static/api_docs.js: no inline script)."""
    return render_template("api_docs.html")
