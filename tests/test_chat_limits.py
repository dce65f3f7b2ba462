"""Spec: what one anonymous visitor can make the chat do is bounded, and what the chat tells them
is for people (README: Security, Chat). Through the real web app (create_app: limiter, CSRF,
error handlers), a real engine on the session swarm, and a real HTTP server for WebSockets.

- prompts are refused by their length in characters before they are tokenized, token id lists by
  the model's context before they are read; long arrays (messages, content parts) are bounded;
- every chat API answers 429 with Retry-After past ``chat_rate_limit``, in its own error shape;
- a WebSocket session is closed after ``ws_idle_timeout`` silent seconds and after
  ``ws_max_lifetime`` seconds, with a message and a close frame that say why, and its place freed;
- on the chat page one visitor cannot stream, stop or continue another's turn; conversations are
  capped per visitor and in all without dropping an answer being written;
- errors carry no internals (paths, exception texts; petals' own error text, without a swarm:
  ``test_chat_errors.py``).
"""

from __future__ import annotations

import itertools
import json
import re
import time

import pytest
from simple_websocket import Client as WsClient, ConnectionClosed

from chat.engine import ChatEngine
from chat.http import create_blueprint
from chat.http.limits import ChatLimits
from monitor.settings import ModelConfig, Settings
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.store import Store
from monitor.web import create_app
from support import close_ws, no_internals, read_sse, serve

BROKEN = "broken-checkpoint"  # configured with a folder that holds no model: tokenizing it fails
LIMIT = 1000  # max_prompt_chars here
CONTEXT = 512  # the tiny model's
_addresses = (f"127.0.0.{i}" for i in itertools.count(10))


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("not-a-model")


@pytest.fixture(scope="module")
def engine(swarm, tiny_model, broken_dir):
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model),
                                    ModelConfig(dht_prefix=BROKEN, path=broken_dir)],
                        slots=2, queue_size=0, queue_timeout=1, retry_after=3)
    engine.sequence_manager(TINY_DHT_PREFIX)  # loaded now: the WebSocket timings below exclude it
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def make_app(engine, tmp_path_factory):
    """``make_app(**settings)``: the dashboard app with the chat, its limits from those settings."""
    stores = []

    def make(**overrides):
        data_dir = tmp_path_factory.mktemp("chat-limits")
        store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
        store.migrate()
        stores.append(store)
        values = dict(data_dir=data_dir, max_prompt_chars=LIMIT, max_request_bytes=65536, chat_rate_limit="20 per minute",
                      ws_idle_timeout=1.5, ws_max_lifetime=4)
        settings = Settings(**{**values, **overrides})
        blueprint = create_blueprint(engine, ChatLimits.from_settings(settings))
        return create_app(settings, store, chat_blueprints=[blueprint])

    yield make
    for store in stores:
        store.close()


@pytest.fixture(scope="module")
def app(make_app):
    return make_app()


def client_from(app, address=None):
    """A test client with its own address (rate limits are per address) and cookie jar (a visitor)."""
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address or next(_addresses)
    return client


def visitor(app, address=None):
    """A browser on the chat page: its session cookie and the CSRF token htmx sends."""
    client = client_from(app, address)
    html = client.get("/chat").get_data(as_text=True)
    client.environ_base["HTTP_X_CSRFTOKEN"] = re.search(r'<meta name="csrf-token" content="([^"]+)"', html).group(1)
    return client


def ask(client, **form):
    return client.post("/chat/turns", data={"model": TINY_DHT_PREFIX, "temperature": "0", "max_new_tokens": "4",
                                            **form})


def stream_of(response) -> str:
    return re.search(r'data-chat-stream="([^"]+)"', response.get_data(as_text=True)).group(1)


def conversation_of(response) -> str:
    return re.search(r'id="conversation-id" value="([^"]+)"', response.get_data(as_text=True)).group(1)


def events(client, url) -> list[tuple[str, str]]:
    response = client.get(url)
    return list(read_sse(_Lines(response)))


class _Lines:
    """A test-client response as read_sse reads a requests response."""

    def __init__(self, response):
        self.text = response.get_data(as_text=True)

    def iter_content(self, chunk_size=None, decode_unicode=True):
        return iter([self.text])


# ---- prompts and arrays ---------------------------------------------------------------------------


def test_an_oversized_prompt_is_refused_by_its_length_before_it_is_tokenized(app, broken_dir):
    """The broken checkpoint cannot tokenize anything: a 400 naming the limit proves the check
    comes first; the same request with a short prompt reaches the tokenizer and fails (500)."""
    client = client_from(app)
    long = "x" * (LIMIT + 1)
    refusals = {
        "completions": client.post("/v1/completions", json={"model": BROKEN, "prompt": long}),
        "chat": client.post("/v1/chat/completions", json={"model": BROKEN, "messages": [
            {"role": "user", "content": "y" * 600}, {"role": "user", "content": "z" * 600}]}),
        "v1 generate": client.post("/api/v1/generate", data={"model": BROKEN, "inputs": long, "max_new_tokens": "2"}),
    }
    for name, response in refusals.items():
        assert response.status_code == 400, (name, response.get_data(as_text=True))
        body = response.get_json()
        message = body["error"]["message"] if "error" in body else body["traceback"]
        assert str(LIMIT) in message and "characters" in message, (name, message)
    assert refusals["completions"].get_json()["error"]["param"] == "prompt"
    assert refusals["chat"].get_json()["error"]["param"] == "messages"
    assert "1200 characters" in refusals["chat"].get_json()["error"]["message"]  # all messages together
    assert refusals["v1 generate"].get_json()["ok"] is False

    page = visitor(app)
    for field in ("message", "system"):
        response = ask(page, model=BROKEN, **{"message": "hi", field: long})
        assert response.status_code == 400 and str(LIMIT) in response.get_data(as_text=True)
        assert response.headers["HX-Retarget"] == "#chat-error"

    # a short prompt gets as far as the tokenizer, which cannot load: an error without internals
    short = {"completions": client.post("/v1/completions", json={"model": BROKEN, "prompt": "x"}),
             "v1 generate": client.post("/api/v1/generate", data={"model": BROKEN, "inputs": "x", "max_new_tokens": "2"})}
    assert short["completions"].status_code == 500 and short["completions"].get_json()["error"]["message"]
    assert short["v1 generate"].status_code == 500 and short["v1 generate"].get_json()["traceback"]
    for response in short.values():
        no_internals(response.get_data(as_text=True), broken_dir)


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": [1] * 600}, "prompt", ["600 token ids", str(CONTEXT)]),
    ({"prompt": [[1, 2]] * 17}, "prompt", ["17 prompts", "16"]),
    ({"messages": [{"role": "user", "content": "a"}] * 513}, "messages", ["513 entries", "512"]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 65}]}, "messages[0].content",
     ["65 parts", "64"]),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(i): 1 for i in range(300)}}, "logit_bias",
     ["not supported"]),
], ids=["token-ids", "batch", "messages", "content-parts", "logit-bias"])
def test_long_arrays_and_token_id_lists_are_refused_with_400_naming_them(app, body, param, words):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    response = client_from(app).post(path, json={"model": TINY_DHT_PREFIX, "max_tokens": 2, **body})
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error["message"]


# ---- rate limits and the shapes of errors ------------------------------------------------------------


def test_every_chat_api_answers_429_with_retry_after_past_the_rate_limit(app):
    """20 per minute per address here; refused requests count too (they cost tokenizer time)."""
    address = next(_addresses)
    client = client_from(app, address)
    bad = {"model": TINY_DHT_PREFIX, "prompt": "hi", "temperature": 9}
    answers = [client.post("/v1/completions", json=bad).status_code for _ in range(20)]
    assert answers == [400] * 20
    assert client.get("/v1/models").status_code == 200  # reading is not limited

    limited = {
        "openai": client.post("/v1/completions", json=bad),
        "v1 generate": client.post("/api/v1/generate", data={"inputs": "hi", "max_new_tokens": "1"}),
        "websocket": client.get("/api/v2/generate", headers={"Upgrade": "websocket", "Connection": "Upgrade"}),
    }
    page = visitor(app, address)
    limited["page"] = ask(page, message="hi")
    for name, response in limited.items():
        assert response.status_code == 429, name
        assert int(response.headers["Retry-After"]) > 0, name
    error = limited["openai"].get_json()["error"]
    assert error["type"] == "rate_limit_exceeded" and "too many" in error["message"]
    assert limited["v1 generate"].get_json()["ok"] is False and "too many" in limited["v1 generate"].get_json()["traceback"]
    assert limited["page"].headers["X-Chat-Error"] == "1" and "too many" in limited["page"].get_data(as_text=True)
    # another address is not affected
    assert client_from(app).post("/v1/completions", json=bad).status_code == 400


def test_every_v1_error_has_openai_shape(app):
    client = client_from(app)
    answers = {
        404: client.get("/v1/no-such-endpoint"),
        405: client.get("/v1/chat/completions"),
        413: client.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "x" * 70_000}),
        400: client.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "hi", "top_p": 0}),
        500: client.post("/v1/completions", json={"model": BROKEN, "prompt": "hi"}),
    }
    for status, response in answers.items():
        assert response.status_code == status
        error = response.get_json()["error"]
        assert set(error) >= {"message", "type", "code"} and error["message"], (status, error)
        no_internals(error["message"])


def test_chat_errors_carry_no_internals(app, broken_dir):
    client = client_from(app)
    models = {m["id"]: m for m in client.get("/v1/models").get_json()["data"]}
    assert models[BROKEN]["petals"]["served"] is False
    assert models[BROKEN]["petals"]["reason"] == "could not check its servers right now; try again in a minute"
    chat = client.post("/v1/chat/completions", json={"model": BROKEN, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 500
    page = client.get("/chat").get_data(as_text=True)
    for text in (chat.get_data(as_text=True), page, json.dumps(models)):
        no_internals(text, broken_dir)


# ---- WebSocket time limits ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ws_url(app):
    with serve(app) as url:
        yield url.replace("http://", "ws://") + "/api/v2/generate"


def ws_open(ws_url, max_length=64):
    ws = WsClient.connect(ws_url)
    ws.send(json.dumps({"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": max_length}))
    assert json.loads(ws.receive(timeout=60)) == {"ok": True}
    return ws


def closed_with(ws) -> str:
    """The close frame's reason, once the server closed the connection."""
    with pytest.raises(ConnectionClosed):
        while True:
            ws.receive(timeout=10)
    return ws.close_message or ""


def test_an_idle_websocket_is_closed_with_the_reason_and_frees_its_place(make_app, engine):
    with serve(make_app(ws_max_lifetime=600)) as url:
        ws = ws_open(url.replace("http://", "ws://") + "/api/v2/generate")
        opened = time.monotonic()
        try:
            reply = json.loads(ws.receive(timeout=10))
            waited = time.monotonic() - opened
            reason = closed_with(ws)
        finally:
            close_ws(ws)
    assert reply["ok"] is False and "no request for 1.5 s" in reply["traceback"] and "idle" in reply["traceback"]
    assert reply["traceback"].startswith("Session ") and " expired: " in reply["traceback"]  # chat.petals.dev reopens
    assert 1.2 < waited < 5
    assert "idle" in reason
    time.sleep(0.5)
    assert sum(engine.load().sessions.states.values()) == 0  # its place is free again


def test_a_busy_websocket_is_closed_at_its_maximum_lifetime(ws_url):
    opened = time.monotonic()  # the lifetime counts from the connection
    ws = ws_open(ws_url, max_length=200)
    replies = []
    try:
        message = {"type": "generate", "inputs": "Once upon a time", "max_new_tokens": 1}
        while time.monotonic() - opened < 10:
            try:
                ws.send(json.dumps(message))
            except ConnectionClosed:  # the lifetime ended while we paused: its message is waiting
                pass
            replies.append(json.loads(ws.receive(timeout=30)))
            message = {"type": "generate", "max_new_tokens": 1}
            if not replies[-1]["ok"]:
                break
            time.sleep(0.5)  # less than the idle timeout: only the lifetime can end it
        ended = time.monotonic() - opened
        reason = closed_with(ws)
    finally:
        close_ws(ws)
    assert all(r["ok"] for r in replies[:-1]) and len(replies) >= 2
    assert replies[-1]["ok"] is False and "maximum lifetime of 4 s" in replies[-1]["traceback"]
    assert 3.8 < ended < 9
    assert "maximum lifetime" in reason


def test_a_websocket_is_closed_at_its_maximum_lifetime_also_mid_answer(make_app):
    """Streaming a 500-token answer (greedy: no EOS before the session's end) with a 2 s lifetime:
    the answer is cut where the lifetime ends, the client told why."""
    with serve(make_app(ws_max_lifetime=2)) as url:
        opened = time.monotonic()
        ws = ws_open(url.replace("http://", "ws://") + "/api/v2/generate", max_length=512)
        try:
            ws.send(json.dumps({"type": "generate", "inputs": "Once upon a time", "max_new_tokens": 1,
                                "stop_sequence": "\x00never"}))
            replies = [json.loads(ws.receive(timeout=30))]
            while replies[-1]["ok"] and not replies[-1]["stop"]:
                replies.append(json.loads(ws.receive(timeout=30)))
            ended = time.monotonic() - opened
            reason = closed_with(ws)
        finally:
            close_ws(ws)
    streamed = sum(r.get("token_count", 0) for r in replies[:-1])
    assert 0 < streamed < 500 and not any(r.get("stop") for r in replies[:-1])
    assert replies[-1]["ok"] is False and "maximum lifetime of 2 s" in replies[-1]["traceback"]
    assert 1.8 < ended < 6 and "maximum lifetime" in reason


def test_a_websocket_failure_is_told_without_internals(ws_url, broken_dir):
    ws = WsClient.connect(ws_url)
    try:
        ws.send(json.dumps({"type": "open_inference_session", "model": BROKEN, "max_length": 16}))
        reply = json.loads(ws.receive(timeout=30))
    finally:
        close_ws(ws)
    assert reply["ok"] is False and "try again" in reply["traceback"]
    no_internals(reply["traceback"], broken_dir)


def test_websocket_inputs_are_bounded_like_every_prompt(ws_url):
    ws = ws_open(ws_url)
    try:
        ws.send(json.dumps({"type": "generate", "inputs": "x" * (LIMIT + 1), "max_new_tokens": 1}))
        reply = json.loads(ws.receive(timeout=30))
    finally:
        close_ws(ws)
    assert reply["ok"] is False and str(LIMIT) in reply["traceback"] and "inputs" in reply["traceback"]


# ---- the chat page's visitors ----------------------------------------------------------------------


def test_a_visitor_cannot_stream_stop_or_continue_anothers_turn(app):
    alice, mallory = visitor(app), visitor(app)
    turn = ask(alice, message="Tell me a story.", max_new_tokens="8")
    assert turn.status_code == 200
    url, conversation = stream_of(turn), conversation_of(turn)
    stop = re.search(r'hx-post="([^"]+/stop)"', turn.get_data(as_text=True)).group(1)

    assert mallory.get(url).status_code == 204  # as if unknown: her stream stays Alice's
    assert mallory.post(stop).status_code == 404
    hijack = ask(mallory, message="What did she ask?", conversation_id=conversation)
    assert hijack.status_code == 200 and conversation_of(hijack) != conversation  # a conversation of her own

    answer = events(alice, url)  # Alice's answer is whole: neither read nor stopped by Mallory
    assert sum(1 for event, _ in answer if event == "token") > 1
    done = [data for event, data in answer if event == "done"]
    assert len(done) == 1 and "stopped" not in done[0]
    assert alice.get(url).status_code == 204  # streamed once


def test_conversations_are_capped_per_visitor_and_in_all_never_dropping_an_answer_being_written(make_app):
    app = make_app(chat_conversations_per_visitor=2, chat_max_visitors=2)
    alice, bob, carol, dave = (visitor(app) for _ in range(4))
    first, second = ask(alice, message="one"), ask(alice, message="two")  # two answers waiting for their streams
    assert first.status_code == second.status_code == 200
    third = ask(alice, message="three")
    assert third.status_code == 429 and "conversations waiting" in third.get_data(as_text=True)

    bob_turn = ask(bob, message="hello", max_new_tokens="1")
    assert any(event == "done" for event, _ in events(bob, stream_of(bob_turn)))  # Bob is idle now
    assert ask(carol, message="hi").status_code == 200  # room made by forgetting Bob, not Alice
    full = ask(dave, message="hi")
    assert full.status_code == 429 and "visitors" in full.get_data(as_text=True) and full.headers["Retry-After"]
    again = ask(bob, message="again", conversation_id=conversation_of(bob_turn))
    assert again.status_code == 429  # Bob was forgotten: he is a new visitor, and nobody else is idle

    assert sum(1 for event, _ in events(alice, stream_of(first)) if event == "token") >= 1  # never dropped
    replaced = ask(alice, message="three")  # the finished conversation makes room for a new one
    assert replaced.status_code == 200 and conversation_of(replaced) != conversation_of(first)
