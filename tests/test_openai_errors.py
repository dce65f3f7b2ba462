"""Spec: an error under /v1 has one shape, whoever answers it (README: Chat, OpenAI API).

Two parts of the app answer on OpenAI's paths: the chat's OpenAI views (unknown model, bad
parameter, model not served) and the web app's error handlers (a path no view serves, a method a
view does not take). OpenAI's clients read ``type`` and ``code``; both parts build their bodies
with ``monitor.http_errors``, so the same status gets the same ``type``, and ``code`` is a string
or null on every answer (never the HTTP status as a number). Through the real web app
(create_app) with the chat's blueprint on a real engine over the session swarm.
"""

from __future__ import annotations

import pytest

from chat.engine import ChatEngine
from chat.http import create_blueprint
from chat.http.limits import ChatLimits
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.http_errors import openai_error_body
from monitor.settings import ModelConfig, Settings
from monitor.store import Store
from monitor.web import create_app

GHOST = "ghost-llama"  # the tiny checkpoint under a name the coverage check says nobody serves
FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def app(swarm, tiny_model, tmp_path_factory):
    def assessment_check(dht_prefix):
        return (False, "no server announces it") if dht_prefix == GHOST else (True, "")

    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model),
                                    ModelConfig(dht_prefix=GHOST, path=tiny_model)],
                        assessment_check=assessment_check, slots=2, queue_size=0, queue_timeout=1)
    data_dir = tmp_path_factory.mktemp("openai-errors")
    store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
    store.migrate()
    settings = Settings(data_dir=data_dir)
    yield create_app(settings, store, chat_blueprints=[create_blueprint(engine, ChatLimits.from_settings(settings))])
    store.close()
    engine.close()


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == FIELDS, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def test_a_404_on_v1_looks_the_same_from_flask_and_from_the_chat(app):
    client = app.test_client()
    by_flask = error_of(client.get("/v1/no-such-endpoint"), 404)  # no view: the web app's handler
    by_chat = error_of(client.post("/v1/chat/completions", json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}), 404)  # the chat's view
    by_chat_models = error_of(client.get("/v1/models/no-such-model"), 404)
    assert by_flask["type"] == by_chat["type"] == by_chat_models["type"] == "invalid_request_error"
    assert by_flask["code"] is None and by_flask["param"] is None
    assert by_chat["code"] == by_chat_models["code"] == "model_not_found"
    assert "no-such-model" in by_chat["message"]


def test_every_v1_error_has_the_shape_of_its_status(app):
    """Errors of the web app (405, 404) and of the chat's views (400, 404, 503) are exactly the
    body ``monitor.http_errors`` builds for their status, whoever answered."""
    client = app.test_client()
    answers = {
        "flask 404": (client.get("/v1/no-such-endpoint"), 404),
        "flask 405": (client.get("/v1/completions"), 405),
        "chat 400": (client.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "hi", "top_p": 0}), 400),
        "chat 404": (client.post("/v1/completions", json={"model": "no-such-model", "prompt": "hi"}), 404),
        "chat 503": (client.post("/v1/completions", json={"model": GHOST, "prompt": "hi"}), 503),
    }
    for name, (response, status) in answers.items():
        error = error_of(response, status)
        expected = openai_error_body(status, error["message"], param=error["param"], code=error["code"])["error"]
        assert error == expected, name
    assert error_of(*answers["chat 400"])["param"] == "top_p"
    assert error_of(*answers["chat 503"])["type"] == "service_unavailable"
    assert GHOST in error_of(*answers["chat 503"])["message"]
