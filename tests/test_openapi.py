"""Spec: the JSON API is described by an OpenAPI 3.1 document made from the code (README: API).

``GET /api/openapi.json`` is a valid OpenAPI 3.1 document; every JSON route the app registers is in
it or on a short, reasoned exclusion list (the spec fails on a new undocumented one); operator
routes are under the operator's bearer scheme and refuse anonymous calls with the documented 401;
real answers of every documented monitor route — and error answers of the chat's routes, which
need no swarm — match the document's schemas; the models the web workers import need no torch;
``/api/docs`` renders the operations in Chromium under our CSP with no console error. The chat's
successful answers (and their SSE chunks) need the swarm: ``test_openapi_chat.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from flask import Blueprint, jsonify
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from monitor.web import auth, create_app
from monitor.web.openapi import JSON_PATHS, build, path_of
from support import PEERS, TINY, serve

# JSON paths the document leaves out, and why (pages, static files and the demo are not JSON paths)
EXCLUDED = {
    "/api/prometheus": "Prometheus' text format, not JSON (README: Metrics)",
    "/api/v2/generate": "a WebSocket: OpenAPI cannot describe it (README: Chat APIs)",
    "/api/docs": "the HTML page that reads this document",
}


def undocumented(app, document) -> list[str]:
    """The JSON rules (method and path) of ``app`` that are neither in ``document`` nor excluded."""
    missing = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(JSON_PATHS) or rule.rule in EXCLUDED:
            continue
        path, _ = path_of(rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            if method.lower() not in document["paths"].get(path, {}):
                missing.append(f"{method} {rule.rule}")
    return missing


def matches(document: dict, path: str, method: str, response, *, media: str = "application/json"):
    """``response`` (a test client's) is one the document allows: its status is listed, its body
    fits that status's schema. The body, parsed."""
    operation = document["paths"][path][method]
    status = str(response.status_code)
    assert status in operation["responses"], f"{method} {path}: {status} is not documented: {response.data[:300]}"
    content = operation["responses"][status].get("content")
    if content is None:
        assert not response.data, response.data[:300]
        return None
    body = response.get_json() if media == "application/json" else response.data
    schema = {**content[media]["schema"], "components": document["components"]}
    errors = sorted(OAS31Validator(schema).iter_errors(body), key=lambda e: list(e.path))
    assert not errors, f"{method} {path} {status}: " + "; ".join(
        f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in errors[:5])
    return body


@pytest.fixture
def documented(populated):
    app, store, settings, now = populated
    document = app.test_client().get("/api/openapi.json").get_json()
    return app, store, document, auth.resolve_token(settings, create=False)


def test_the_document_is_valid_openapi_and_served_cached(documented):
    app, _, document, _ = documented
    validate(document)
    assert document["openapi"].startswith("3.1")
    client = app.test_client()
    first = client.get("/api/openapi.json")
    assert first.headers["Cache-Control"].startswith("public, max-age=") and first.headers["ETag"]
    assert client.get("/api/openapi.json", headers={"If-None-Match": first.headers["ETag"]}).status_code == 304
    assert document["components"]["securitySchemes"]["operator"] == {**document["components"]["securitySchemes"][
        "operator"], "type": "http", "scheme": "bearer"}


def test_every_json_route_is_documented_or_excluded_for_a_reason(populated, tmp_path):
    """With the chat's blueprint (an engine without a swarm: routes only) and the demo's panel: a
    route that is neither fails the spec, as one added below without a declaration does."""
    from chat.engine import ChatEngine
    from chat.http import create_blueprint
    from monitor.settings import ModelConfig

    _, store, settings, _ = populated
    engine = ChatEngine(None, [ModelConfig(dht_prefix="m")])
    try:
        app = create_app(settings, store, chat_blueprints=[create_blueprint(engine)], demo_controls=object())
        document = build(app)
        validate(document)
        assert undocumented(app, document) == []
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/estimate", "/api/v1/generate",
                "/api/v1/state", "/api/v1/silences", "/api/v1/notes", "/healthz"} <= set(document["paths"])
        assert not [p for p in document["paths"] if p.startswith(("/demo", "/notes", "/alerts", "/chat"))]
        assert all(path in {r.rule for r in app.url_map.iter_rules()} for path in EXCLUDED)  # no stale entry

        extra = Blueprint("extra", __name__)
        extra.add_url_rule("/api/v1/undeclared", "undeclared", lambda: jsonify(ok=True))
        other = create_app(settings, store, chat_blueprints=[extra])
        assert undocumented(other, build(other)) == ["GET /api/v1/undeclared"]
    finally:
        engine.close()


def test_operator_routes_are_under_the_bearer_scheme_and_refuse_anonymous_calls(documented):
    app, _, document, _ = documented
    client = app.test_client()
    guarded = [(path, method) for path, ops in document["paths"].items() for method, op in ops.items()
               if op.get("security") == [{"operator": []}]]
    assert {("/api/v1/silences", "post"), ("/api/v1/maintenance", "post"), ("/api/v1/notes", "post"),
            ("/api/v1/notes/{note_id}/resolve", "post"), ("/api/v1/silences/{silence_id}", "delete")} <= set(guarded)
    for path, method in guarded:
        url = path.replace("{silence_id}", "1").replace("{window_id}", "1").replace("{note_id}", "1")
        refused = client.open(url, method=method.upper(), json={})
        assert refused.status_code == 401, (path, method, refused.status_code)
        matches(document, path, method, refused)
    readers = [(path, method) for path, ops in document["paths"].items() for method, op in ops.items()
               if op.get("security") not in (None, [{"operator": []}])]
    assert ("/api/v1/silences", "get") in readers


def test_real_answers_of_the_monitor_routes_match_the_document(documented):
    app, store, document, token = documented
    client = app.test_client()
    bearer = {"Authorization": f"Bearer {token}"}
    first, prefix = PEERS["first"], TINY.dht_prefix
    get = {
        "/api/v1/state": "/api/v1/state", "/api/v1/models": "/api/v1/models",
        "/api/v1/models/{dht_prefix}": f"/api/v1/models/{prefix}",
        "/api/v1/models/{dht_prefix}/history": f"/api/v1/models/{prefix}/history",
        "/api/v1/models/{prefix}/stats": f"/api/v1/models/{prefix}/stats",
        "/api/v1/peers/{peer_id}": f"/api/v1/peers/{first}",
        "/api/v1/peers/{peer_id}/history": f"/api/v1/peers/{first}/history",
        "/api/v1/peers/{peer_id}/stats": f"/api/v1/peers/{first}/stats",
        "/api/v1/peers/{peer_id}/report": f"/api/v1/peers/{first}/report",
        "/api/v1/routing/{prefix}": f"/api/v1/routing/{prefix}",
        "/api/v1/is_reachable/{peer_id}": f"/api/v1/is_reachable/{first}",
        "/api/v1/search": "/api/v1/search?q=first", "/api/v1/alerts": "/api/v1/alerts",
        "/api/v1/maintenance": "/api/v1/maintenance", "/api/v1/notes": "/api/v1/notes?days=30",
        "/healthz": "/healthz", "/api/openapi.json": "/api/openapi.json",
    }
    for path, url in get.items():
        matches(document, path, "get", client.get(url))
    matches(document, "/api/v1/silences", "get", client.get("/api/v1/silences", headers=bearer))

    # errors, in the monitor's shape
    for path, url, status in [
        ("/api/v1/models/{dht_prefix}", "/api/v1/models/no-such-model", 404),
        ("/api/v1/models/{dht_prefix}", "/api/v1/models/bad%20prefix", 400),
        ("/api/v1/peers/{peer_id}", "/api/v1/peers/not-a-peer", 400),
        ("/api/v1/routing/{prefix}", "/api/v1/routing/no-such-model", 404),
        ("/api/v1/is_reachable/{peer_id}", "/api/v1/is_reachable/not-a-peer", 400),
        ("/api/v1/notes", "/api/v1/notes?days=365", 400),
        ("/api/v1/notes/{note_id}", "/api/v1/notes/12345", 404),
    ]:
        response = client.get(url)
        assert response.status_code == status, (url, response.status_code)
        matches(document, path, "get", response)
    assert client.get(f"/api/v1/routing/{prefix}", headers={
        "If-None-Match": client.get(f"/api/v1/routing/{prefix}").headers["ETag"]}).status_code == 304

    # what operators change: created, read back, ended, each answer as documented
    silence = matches(document, "/api/v1/silences", "post", client.post("/api/v1/silences", headers=bearer, json={
        "peer": first, "duration": "2h", "comment": "restarting"}))["silence"]
    matches(document, "/api/v1/silences", "post", client.post("/api/v1/silences", headers=bearer, json={"peer": first}))
    matches(document, "/api/v1/silences/{silence_id}/end", "post",
            client.post(f"/api/v1/silences/{silence['id']}/end", headers=bearer, json={"reason": "done"}))
    matches(document, "/api/v1/silences/{silence_id}", "delete", client.delete("/api/v1/silences/99999", headers=bearer))
    window = matches(document, "/api/v1/maintenance", "post", client.post("/api/v1/maintenance", headers=bearer, json={
        "scope": "model", "target": prefix, "duration": "1h", "reason": "upgrade"}))["maintenance"]
    matches(document, "/api/v1/maintenance/{window_id}", "delete",
            client.delete(f"/api/v1/maintenance/{window['id']}", headers=bearer))
    note = matches(document, "/api/v1/notes", "post", client.post("/api/v1/notes", headers=bearer, json={
        "scope": "model", "target": prefix, "text": "upgrading", "author": "ops"}))["note"]
    matches(document, "/api/v1/notes", "post", client.post("/api/v1/notes", headers=bearer, json={"scope": "moon"}))
    matches(document, "/api/v1/notes/{note_id}", "post",
            client.post(f"/api/v1/notes/{note['id']}", headers=bearer, json={"text": "half done"}))
    matches(document, "/api/v1/notes/{note_id}/resolve", "post",
            client.post(f"/api/v1/notes/{note['id']}/resolve", headers=bearer, json={}))
    matches(document, "/api/v1/notes/{note_id}", "get", client.get(f"/api/v1/notes/{note['id']}"))


def test_a_schema_that_does_not_fit_the_answer_fails(documented):
    """The check above can fail: the state answer is not a list of notes."""
    app, _, document, _ = documented
    response = app.test_client().get("/api/v1/state")
    wrong = {**document, "paths": {"/api/v1/state": {"get": {"responses": {"200": {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Notes"}}}}}}}}}
    with pytest.raises(AssertionError, match="notes"):
        matches(wrong, "/api/v1/state", "get", response)


def test_the_models_web_workers_import_need_no_torch():
    code = ("import sys; import monitor.web, monitor.web.openapi, monitor.web.api_models; "
            "print(json.dumps(sorted(m for m in ('torch', 'petals', 'hivemind', 'chat') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_chat_routes_error_answers_match_the_document(populated, tiny_model):
    """Refusals need no swarm: bad parameters (400, naming them), an unknown model (404), a model
    nobody serves (503), in OpenAI's shape on /v1 and chat.petals.dev's on its API."""
    from chat.engine import ChatEngine
    from chat.http import create_blueprint
    from monitor.harness.tiny_model import TINY_DHT_PREFIX
    from monitor.settings import ModelConfig

    _, store, settings, _ = populated
    engine = ChatEngine(None, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        assessment_check=lambda model: (False, "no server announces it in this spec"))
    try:
        app = create_app(settings, store, chat_blueprints=[create_blueprint(engine)])
        document = app.test_client().get("/api/openapi.json").get_json()
        client = app.test_client()
        chat = {"model": TINY_DHT_PREFIX, "messages": [{"role": "user", "content": "hi"}]}
        for path, body, status, param in [
            ("/v1/chat/completions", {**chat, "temperature": 3}, 400, "temperature"),
            ("/v1/chat/completions", {**chat, "top_p": 0}, 400, "top_p"),
            ("/v1/chat/completions", {**chat, "stream": "yes"}, 400, "stream"),
            ("/v1/chat/completions", {**chat, "model": "no-such-model"}, 404, None),
            ("/v1/chat/completions", chat, 503, None),
            ("/v1/chat/completions", {**chat, "stream": True}, 503, None),
            ("/v1/completions", {"model": TINY_DHT_PREFIX, "prompt": 123}, 400, "prompt"),
            ("/v1/completions", {"model": TINY_DHT_PREFIX, "prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens"),
            ("/v1/estimate", {"model": TINY_DHT_PREFIX, "prompt": "hi", "n": 0}, 400, "n"),
        ]:
            response = client.post(path, json=body)
            assert response.status_code == status, (path, body, response.get_data(as_text=True))
            error = matches(document, path, "post", response)["error"]
            assert error["param"] == param, error
        for form, status in [({"model": TINY_DHT_PREFIX, "inputs": "hi", "max_new_tokens": "abc"}, 400),
                             ({"model": TINY_DHT_PREFIX, "inputs": "hi", "max_new_tokens": "4"}, 503),
                             ({"model": "nope", "inputs": "hi", "max_new_tokens": "4"}, 404)]:
            response = client.post("/api/v1/generate", data=form)
            assert response.status_code == status, response.get_data(as_text=True)
            assert matches(document, "/api/v1/generate", "post", response)["ok"] is False
        matches(document, "/v1/models", "get", client.get("/v1/models"))
        matches(document, "/v1/models/{name}", "get", client.get(f"/v1/models/{TINY_DHT_PREFIX}"))
        matches(document, "/v1/models/{name}", "get", client.get("/v1/models/no-such-model"))
        matches(document, "/v1/estimate", "post", client.post("/v1/estimate", json={
            "model": TINY_DHT_PREFIX, "prompt": "hi", "max_tokens": 4}))
    finally:
        engine.close()


def test_the_api_page_renders_the_operations_under_the_csp(populated, browser):
    app = populated[0]
    with serve(app) as base:
        page = browser.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        outside = []
        page.on("request", lambda r: None if r.url.startswith(base) or r.url.startswith("data:") else outside.append(r.url))
        response = page.goto(f"{base}/api/docs")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_selector(".opblock", timeout=15_000)
        summaries = page.locator(".opblock-summary-path").all_inner_texts()
        assert any("/api/v1/state" in text for text in summaries), summaries[:10]
        assert any("/api/v1/silences" in text for text in summaries), summaries[:10]
        time.sleep(0.2)
        assert not errors, errors
        assert not outside, outside
        page.close()
