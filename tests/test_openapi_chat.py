"""Spec: the chat's successful answers match the OpenAPI document (README: API), whole and streamed.

Through the real web app with the chat's blueprint over the session swarm: a chat completion, a
text completion, chat.petals.dev's ``/api/v1/generate`` and an estimate, each checked against its
documented 200; a streamed chat completion's every ``data:`` event against the documented chunk
(``x-chunk`` of its text/event-stream), up to ``[DONE]``.
"""

from __future__ import annotations

import json

import pytest
from openapi_schema_validator import OAS31Validator

from chat.engine import ChatEngine
from chat.http import create_blueprint
from chat.http.limits import ChatLimits
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig, Settings
from monitor.store import Store
from monitor.web import create_app
from test_openapi import matches


@pytest.fixture(scope="module")
def app(swarm, tiny_model, tmp_path_factory):
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)])
    data_dir = tmp_path_factory.mktemp("openapi-chat")
    store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
    store.migrate()
    settings = Settings(data_dir=data_dir)
    yield create_app(settings, store, chat_blueprints=[create_blueprint(engine, ChatLimits.from_settings(settings))])
    store.close()
    engine.close()


def test_whole_answers_match_the_document(app):
    client = app.test_client()
    document = client.get("/api/openapi.json").get_json()
    chat = {"model": TINY_DHT_PREFIX, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    matches(document, "/v1/chat/completions", "post", client.post("/v1/chat/completions", json={**chat, "n": 2}))
    matches(document, "/v1/completions", "post", client.post("/v1/completions", json={
        "model": TINY_DHT_PREFIX, "prompt": ["hi", [1, 2, 3]], "max_tokens": 3, "logprobs": 2}))
    matches(document, "/api/v1/generate", "post", client.post("/api/v1/generate", data={
        "model": TINY_DHT_PREFIX, "inputs": "hi", "max_new_tokens": "3"}))
    matches(document, "/v1/estimate", "post", client.post("/v1/estimate", json=chat))


def test_every_streamed_chunk_matches_the_document(app):
    client = app.test_client()
    document = client.get("/api/openapi.json").get_json()
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
                       ("/v1/completions", {"prompt": "hi", "echo": True})]:
        response = client.post(path, json={"model": TINY_DHT_PREFIX, "max_tokens": 4, "stream": True,
                                           "stream_options": {"include_usage": True}, **body})
        assert response.status_code == 200 and response.mimetype == "text/event-stream"
        stream = document["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
        validator = OAS31Validator({**stream["x-chunk"], "components": document["components"]})
        events = [line[len("data: "):] for line in response.get_data(as_text=True).splitlines()
                  if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) > 2, events
        for event in events[:-1]:
            errors = list(validator.iter_errors(json.loads(event)))
            assert not errors, (event, [e.message for e in errors])
