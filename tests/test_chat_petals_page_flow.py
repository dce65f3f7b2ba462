"""Spec: chat.petals.dev's own page chats here without an error shown, under real use (README: Chat
capacity) — on the session swarm, through the real web app and a real WebSocket server.

``PetalsPage`` (``ChatPage`` of ``monitor/harness/petals_page.py``) is chat.petals.dev's
``static/chat.js`` (petals-infra/chat.petals.dev), message for message: it opens a session of
``max_length`` 512, sends the conversation from its last position (human turns end with the
model's separator, earlier answers with its stop token), streams an answer with
``max_new_tokens`` 1 until the stop sequence, and on a failure while its user waits it retries by
itself when the message says ``Session … expired`` (a new session, the whole conversation again)
or ``Maximum length exceeded`` (a session four times as long, up to the model's longest), else
shows the error box. While its user reads, a message or a closed socket only resets its session.

- a conversation past 512 tokens: open 512 → generate → "Maximum length exceeded" → open 2048 →
  generate, and the answer comes (the tiny model with its context declared 4096 tokens: a RoPE
  Llama, the same weights; the servers allot up to 2048);
- five pages, room for four open sessions: the fifth chats at once, the least recently used idle
  page's session is closed with "Session … expired" (its page told at once), and all four go on
  chatting without an error shown, each reopening when its idle session made room for another.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request

import pytest

from chat.capacity import Capacity
from chat.engine import ChatEngine
from chat.http import create_blueprint
from chat.http.limits import ChatLimits
from monitor.harness import petals_page as chatjs
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig, Settings
from monitor.store import Store
from monitor.web import create_app
from support import serve, wait_until

LONG_CONTEXT = 4096
# the page's description of a model (its ``models`` table); "e" ends the tiny model's answers soon
MODEL = chatjs.PageModel(stop_token="e")
TURN = "Tell me more about the servers of the swarm and the blocks they hold. "  # ~32 tiny-tokenizer tokens


class PetalsPage(chatjs.ChatPage):
    """chat.petals.dev's chat page (CHATBOT regime, ``monitor/harness/petals_page.py``) for the tiny
    model: ``say`` is the user pressing Enter."""

    def __init__(self, ws_url: str, address: str, model: str = TINY_DHT_PREFIX):
        super().__init__(ws_url, address, model, MODEL)

    def say(self, text: str, timeout: float = 120) -> str:
        """Type ``text`` and press Enter; the answer, once the page shows it whole (or the error box)."""
        self.ask(text, timeout)
        return self.answer


@pytest.fixture(scope="module")
def long_model(tiny_model, tmp_path_factory):
    """The tiny checkpoint with its context declared LONG_CONTEXT tokens (the client's copy)."""
    path = tmp_path_factory.mktemp("tiny-long") / "model"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def make_server(swarm, long_model, tmp_path_factory):
    """``make_server(capacity)``: the chat over the session swarm, behind one trusted proxy (each
    page has its own address), on a real server; yields its WebSocket URL and its engine."""
    made = []

    def make(capacity: Capacity):
        data_dir = tmp_path_factory.mktemp("page-flow")
        store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
        store.migrate()
        engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=long_model)], capacity=capacity)
        settings = Settings(data_dir=data_dir, chat_rate_limit="1000 per minute", proxy_hops=1)
        app = create_app(settings, store, chat_blueprints=[create_blueprint(engine, ChatLimits.from_settings(settings))])
        server = serve(app)
        url = server.__enter__()
        made.append((server, engine, store))
        return url.replace("http://", "ws://") + "/api/v2/generate", engine

    yield make
    for server, engine, store in made:
        server.__exit__(None, None, None)
        engine.close()
        store.close()


def test_a_conversation_past_512_tokens_grows_its_session_as_chat_petals_devs_page_does(make_server):
    ws_url, engine = make_server(Capacity())
    page = PetalsPage(ws_url, "10.3.0.1")
    try:
        first = page.say(TURN * 7)  # ~230 tokens: fits the page's first session of 512
        assert first.startswith("Assistant:") and page.sent == [("open", 512), ("generate",)]
        second = page.say(TURN * 23)  # a turn of ~700 tokens: the conversation is now far past 512
    finally:
        page.close()
    assert len(engine.encode(TINY_DHT_PREFIX, TURN * 23)) >= 700
    assert page.shown == [], page.shown  # no error box
    # the turn that outgrew the session was answered on the same socket (a longer session replayed the
    # text so far: ChatSession.grow), so the page never had to reopen one
    assert page.sent == [("open", 512), ("generate",), ("generate",)], page.sent
    assert page.received_errors == [], page.received_errors
    # and the answer came, ending in the stop token (the tiny model may choose it first: an empty answer)
    assert second.startswith("Assistant:") and "".join(page.streamed).endswith(MODEL.stop_token), page.streamed
    conversation = "".join(text for _, text in page.replicas)
    assert len(engine.encode(TINY_DHT_PREFIX, conversation)) > 512
    # the OpenAI API: each request's session is as long as it needs, the user's two turns (~960 tokens)
    # answered in one request. (Not the page's whole conversation: the tiny model's answers are random
    # text that can run to its session's end and re-encode into twice the tokens, past the servers'
    # 2048, which is rightly a 400.)
    http_url = ws_url.replace("ws://", "http://").rsplit("/api/v2/generate", 1)[0]
    prompt = TURN * 7 + TURN * 23
    body = json.dumps({"model": TINY_DHT_PREFIX, "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(http_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert answer["usage"]["prompt_tokens"] > 700 and answer["usage"]["completion_tokens"] >= 1, answer["usage"]


def test_five_pages_and_room_for_four_sessions_every_page_keeps_chatting_without_an_error(make_server):
    ws_url, engine = make_server(Capacity(slots=4, open_sessions=4, sessions_per_client=2))
    pages = [PetalsPage(ws_url, f"10.4.0.{i}") for i in range(1, 6)]
    try:
        for page in pages[:4]:
            page.say("Hello there")
        assert wait_until(lambda: engine.load().sessions.states["idle"] == 4, 10)  # (just after their last token)
        assert engine.load().slots.busy == 0
        began = time.monotonic()
        pages[4].say("Hello, I am new")  # a fifth: the least recently used idle session makes room
        took = time.monotonic() - began
        assert engine.load().sessions.expired.get("evicted") == 1
        evicted = pages[0]  # the least recently used
        assert wait_until(lambda: not evicted.ws.connected, 10), "its owner was not told at once"
        for page in pages[:4]:
            assert page.say("And what else?").startswith("Assistant:")
    finally:
        for page in pages:
            page.close()
    assert took < 30
    assert all(page.shown == [] for page in pages), [page.shown for page in pages]
    assert re.match(r"Session [0-9a-f]+ expired: it was idle for \d+ s", evicted.received_errors[0])
    assert evicted.sent == [("open", 512), ("generate",), ("open", 512), ("generate",)], evicted.sent
    for page in pages[:4]:  # each reopened when its session had made room (told while reading, or on asking)
        assert page.sent[:2] == [("open", 512), ("generate",)] and page.sent[-2:] == [("open", 512), ("generate",)]
        assert all(re.match(r"Session [0-9a-f]+ expired: ", m) for m in page.received_errors), page.received_errors
