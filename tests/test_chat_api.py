"""Specs of the chat's APIs, through a real HTTP server on 127.0.0.1 and the session swarm.

Greedy answers through every API equal local transformers' greedy output for the same prompt;
bad inputs get a 4xx naming the parameter; unknown models 404; a model that is not fully served
503 naming its missing blocks; a full engine 429 with Retry-After; the chat page streams an answer,
shows its route and can stop it.
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from flask import Flask
from openai import OpenAI
from simple_websocket import Client as WsClient

from chat.http import create_blueprint
from chat.engine import ChatEngine, GenerationParams
from monitor.core.coverage import BROKEN
from monitor.swarm.routing import diagnose
from monitor.settings import ModelConfig
from monitor.core.snapshot import ModelInfo
from monitor.swarm import scrape
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import MESSAGES, close_ws, read_sse, serve

GHOST = "ghost-llama"  # same checkpoint, announced by nobody: never served
PROMPT = "The capital of France is"
@pytest.fixture(scope="module")
def unserved():
    """Models the coverage check reports broken, with the reason it gives (tests add entries)."""
    return {}


@pytest.fixture(scope="module")
def engine(swarm, tiny_model, unserved):
    def assessment_check(dht_prefix):
        """The monitor's own verdict (scrape + diagnose), unless a test says otherwise."""
        if dht_prefix in unserved:
            return False, unserved[dht_prefix]
        model = ModelInfo(dht_prefix, TINY_NUM_BLOCKS)
        health = diagnose(model, scrape(swarm.dht, [model], discover=False).servers)
        return health.state != BROKEN, "; ".join(health.reasons)

    engine = ChatEngine(
        swarm.dht,
        [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model, name="Tiny Llama"),
         ModelConfig(dht_prefix=GHOST, path=tiny_model)],
        assessment_check=assessment_check, slots=2, queue_size=0, queue_timeout=1, retry_after=7,
    )
    yield engine


@pytest.fixture(scope="module")
def base_url(engine):
    app = Flask(__name__)
    app.register_blueprint(create_blueprint(engine))
    with serve(app) as url:
        yield url


def openai_client(base_url):
    return OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


# ---- greedy output equals local transformers, through every API ----------------------------------


def test_openai_chat_completion_equals_local_greedy(base_url, local):
    tokenizer, greedy = local
    ids, expected = greedy(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True), 16)

    reply = openai_client(base_url).chat.completions.create(
        model=TINY_DHT_PREFIX, messages=MESSAGES, temperature=0, max_tokens=16)

    assert reply.choices[0].message.content == expected
    assert reply.usage.completion_tokens == len(ids)
    route = reply.model_extra["petals"]["route"]
    assert route and route[0]["start"] == 0 and route[-1]["end"] == 8


def test_openai_chat_completion_streams_the_same_text(base_url, local):
    tokenizer, greedy = local
    _, expected = greedy(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True), 16)

    chunks = list(openai_client(base_url).chat.completions.create(
        model=TINY_DHT_PREFIX, messages=MESSAGES, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True}))

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1, "not streamed token by token"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (["length"], ["stop"])
    assert chunks[-1].usage.completion_tokens > 0


def test_openai_completion_equals_local_greedy_streamed_or_not(base_url, local):
    tokenizer, greedy = local
    _, expected = greedy(tokenizer(PROMPT)["input_ids"], 20)
    client = openai_client(base_url)

    whole = client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPT, temperature=0, max_tokens=20)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=TINY_DHT_PREFIX, prompt=PROMPT, temperature=0, max_tokens=20, stream=True))

    assert whole.choices[0].text == expected
    assert streamed == expected


def test_openai_lists_models_and_says_which_are_served(base_url, unserved):
    models = {m.id: m for m in openai_client(base_url).models.list()}
    assert set(models) == {TINY_DHT_PREFIX, GHOST}
    assert models[TINY_DHT_PREFIX].model_extra["petals"]["served"] is True
    assert models[GHOST].model_extra["petals"]["served"] is False
    assert models[GHOST].model_extra["petals"]["reason"]


def test_http_v1_generate_equals_local_greedy(base_url, local):
    tokenizer, greedy = local
    _, expected = greedy(tokenizer(PROMPT)["input_ids"], 12, skip_special_tokens=False)

    as_form = requests.post(f"{base_url}/api/v1/generate",
                            data={"model": TINY_DHT_PREFIX, "inputs": PROMPT, "max_new_tokens": "12"}, timeout=60)
    as_json = requests.post(f"{base_url}/api/v1/generate",
                            json={"model": TINY_DHT_PREFIX, "inputs": PROMPT, "max_new_tokens": 12, "do_sample": 0},
                            timeout=60)

    for response in (as_form, as_json):
        assert response.status_code == 200, response.text
        assert response.json()["ok"] is True
        assert response.json()["outputs"] == expected


def ws_connect(base_url):
    return WsClient.connect(base_url.replace("http://", "ws://") + "/api/v2/generate")


def ws_ask(ws, message):
    ws.send(json.dumps(message))
    return json.loads(ws.receive(timeout=60))


def test_ws_v2_streams_token_by_token_past_the_opened_max_length_and_equals_local_greedy(base_url, engine, local):
    """chat.petals.dev's streaming: replies of max_new_tokens tokens until the stop sequence shows
    up; this one never does, so the answer reaches the session's max_length (48) — and goes on, in a
    longer session the text so far is replayed into, up to the longest the model's servers accept
    (its context here), where petals' "Maximum length exceeded" ends it — or to EOS."""
    tokenizer, greedy = local
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    limit = engine.admission.session_limit(TINY_DHT_PREFIX)
    ws = ws_connect(base_url)
    try:
        assert ws_ask(ws, {"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 48}) == {"ok": True}
        ws.send(json.dumps({"type": "generate", "inputs": PROMPT, "max_new_tokens": 1, "stop_sequence": "\x00never"}))
        replies = []
        while not replies or (replies[-1]["ok"] and not replies[-1]["stop"]):
            replies.append(json.loads(ws.receive(timeout=60)))
    finally:
        close_ws(ws)
    expected_ids, expected = greedy(prompt_ids, limit - len(prompt_ids), skip_special_tokens=False)
    if tokenizer.eos_token_id in expected_ids:
        expected_ids = expected_ids[: expected_ids.index(tokenizer.eos_token_id) + 1]
        expected = tokenizer.decode(expected_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert replies[-1]["ok"] and replies[-1]["stop"]
    else:  # the longest session the servers accept ended before the stop sequence: petals' words
        assert replies[-1]["ok"] is False and replies[-1]["traceback"].startswith("Maximum length exceeded")
        replies.pop()
    assert all(r["ok"] for r in replies)
    assert "".join(r["outputs"] for r in replies) == expected
    assert sum(r["token_count"] for r in replies) == len(expected_ids)
    assert len(replies) > len(expected_ids) // 2, "not streamed token by token"
    assert len(prompt_ids) + len(expected_ids) > 48 or tokenizer.eos_token_id in expected_ids, "never outgrew 48"


def test_ws_v2_one_reply_without_stop_sequence_and_continues_the_session(base_url, local):
    tokenizer, greedy = local
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    ids, _ = greedy(prompt_ids, 12, skip_special_tokens=False)
    ws = ws_connect(base_url)
    try:
        assert ws_ask(ws, {"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 40})["ok"]
        first = ws_ask(ws, {"type": "generate", "inputs": PROMPT, "max_new_tokens": 6})
        second = ws_ask(ws, {"type": "generate", "max_new_tokens": 6})  # no inputs: go on
    finally:
        close_ws(ws)
    assert first["ok"] and first["stop"] is True and first["token_count"] == 6
    assert second["ok"] and second["stop"] is True
    assert first["outputs"] + second["outputs"] == tokenizer.decode(ids, skip_special_tokens=False,
                                                                    clean_up_tokenization_spaces=False)


def test_ws_a_turn_that_outgrows_its_session_is_answered_on_the_same_socket(base_url, local):
    """chat.petals.dev's page opens a session of some max_length and sends turns; a turn longer
    than what is left is answered on the same socket — a longer session replays the text so far —
    exactly as a session opened long enough would have answered it."""
    tokenizer, greedy = local
    long_turn = " ".join([PROMPT] * 6)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    turn_ids = tokenizer(long_turn, add_special_tokens=False)["input_ids"]
    ws = ws_connect(base_url)
    try:
        assert ws_ask(ws, {"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 24})["ok"]
        first = ws_ask(ws, {"type": "generate", "inputs": PROMPT, "max_new_tokens": 4})
        assert len(prompt_ids) + 4 + len(turn_ids) > 24  # the next turn does not fit in what was opened
        second = ws_ask(ws, {"type": "generate", "inputs": long_turn, "max_new_tokens": 4})
        third = ws_ask(ws, {"type": "generate", "max_new_tokens": 3})  # and the grown session goes on
    finally:
        close_ws(ws)
    assert first["ok"] and second["ok"] and third["ok"], (first, second, third)
    assert second["token_count"] == 4 and third["token_count"] == 3
    first_ids, _ = greedy(prompt_ids, 4, skip_special_tokens=False)
    context = prompt_ids + first_ids + turn_ids
    expected_ids, _ = greedy(context, 7, skip_special_tokens=False)
    assert second["outputs"] + third["outputs"] == tokenizer.decode(expected_ids, skip_special_tokens=False,
                                                                    clean_up_tokenization_spaces=False)


# ---- refusals -------------------------------------------------------------------------------------

CHAT = {"model": TINY_DHT_PREFIX, "messages": [{"role": "user", "content": "hi"}]}
CMPL = {"model": TINY_DHT_PREFIX, "prompt": "hi"}
V1 = {"model": TINY_DHT_PREFIX, "inputs": "hi", "max_new_tokens": "4"}

BAD_INPUTS = [
    # (path, json body or None, form or None, status, words the message must contain)
    ("/v1/chat/completions", {**CHAT, "model": "no-such-model"}, None, 404, ["no-such-model"]),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, None, 400, ["model"]),
    ("/v1/chat/completions", {**CHAT, "messages": []}, None, 400, ["messages"]),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, None, 400, ["messages"]),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, None, 400, ["messages[0].role"]),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, None, 400, ["messages[0].content"]),
    ("/v1/chat/completions", {**CHAT, "temperature": 3}, None, 400, ["temperature"]),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, None, 400, ["temperature"]),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, None, 400, ["top_p"]),
    ("/v1/chat/completions", {**CHAT, "top_k": -1}, None, 400, ["top_k"]),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, None, 400, ["max_tokens"]),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, None, 400, ["max_tokens", "512"]),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2.5}, None, 400, ["max_tokens"]),
    ("/v1/chat/completions", {**CHAT, "n": 17}, None, 400, ["n", "16"]),
    ("/v1/chat/completions", {**CHAT, "stop": 5}, None, 400, ["stop"]),
    ("/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, None, 400, ["stop"]),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": 1}, None, 400, ["presence_penalty"]),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, None, 400, ["stream"]),
    ("/v1/chat/completions", [1, 2], None, 400, ["JSON object"]),
    ("/v1/chat/completions", None, {"model": TINY_DHT_PREFIX}, 400, ["JSON"]),
    ("/v1/chat/completions", {**CHAT, "model": GHOST}, None, 503, [GHOST, "0:8"]),
    ("/v1/completions", {**CMPL, "prompt": 123}, None, 400, ["prompt"]),
    ("/v1/completions", {**CMPL, "prompt": [10**6]}, None, 400, ["prompt"]),
    ("/v1/completions", {**CMPL, "prompt": "word " * 600}, None, 400, ["prompt", "512"]),
    ("/v1/completions", {**CMPL, "suffix": "x"}, None, 400, ["suffix"]),
    ("/v1/completions", {**CMPL, "best_of": 3}, None, 400, ["best_of"]),
    ("/api/v1/generate", None, {"model": TINY_DHT_PREFIX, "max_new_tokens": "4"}, 400, ["inputs"]),
    ("/api/v1/generate", None, {**V1, "max_new_tokens": "abc"}, 400, ["max_new_tokens"]),
    ("/api/v1/generate", None, {**V1, "max_length": "20"}, 400, ["max_new_tokens", "max_length"]),
    ("/api/v1/generate", None, {"model": TINY_DHT_PREFIX, "inputs": "hi"}, 400, ["max_new_tokens"]),
    ("/api/v1/generate", None, {**V1, "do_sample": "maybe"}, 400, ["do_sample"]),
    ("/api/v1/generate", None, {**V1, "do_sample": "1", "temperature": "-1"}, 400, ["temperature"]),
    ("/api/v1/generate", None, {**V1, "top_k": "-5"}, 400, ["top_k"]),
    ("/api/v1/generate", None, {**V1, "repetition_penalty": "0"}, 400, ["repetition_penalty"]),
    ("/api/v1/generate", None, {**V1, "model": "nope"}, 404, ["nope"]),
    ("/api/v1/generate", {**V1, "max_new_tokens": True}, None, 400, ["max_new_tokens"]),
    ("/api/v1/generate", None, {**V1, "model": GHOST}, 503, [GHOST, "0:8"]),
]


@pytest.mark.parametrize("path,body,form,status,words", BAD_INPUTS,
                         ids=[f"{p}:{sorted((b or f or {}).items())[:3] if isinstance(b or f, dict) else b}"[:80]
                              for p, b, f, _, _ in BAD_INPUTS])
def test_bad_input_gets_the_right_status_and_names_the_parameter(base_url, path, body, form, status, words):
    response = requests.post(base_url + path, json=body, data=form, timeout=60) if body is not None else \
        requests.post(base_url + path, data=form, timeout=60)
    assert response.status_code == status, response.text
    data = response.json()
    message = data["error"]["message"] if path.startswith("/v1/") else data["traceback"]
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert "Traceback" not in response.text and 'File "' not in response.text
    if path.startswith("/api/v1/"):
        assert data["ok"] is False


WS_BAD = [
    ([{"type": "generate", "inputs": "hi", "max_new_tokens": 1}], "type"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 0}], "max_length"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX}], "max_length"),
    ([{"type": "open_inference_session", "model": "nope", "max_length": 10}], "nope"),
    ([{"type": "open_inference_session", "model": GHOST, "max_length": 10}], "0:8"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 20},
      {"type": "generate", "inputs": "hi", "max_new_tokens": 2, "repetition_penalty": 0}], "repetition_penalty"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 20},
      {"type": "generate", "inputs": "hi", "max_new_tokens": 2, "stop_sequence": "capital of",
       "extra_stop_sequences": ["x"]}], "stop_sequence"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 20},
      {"type": "generate", "max_new_tokens": 2}], "inputs"),
    ([{"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 8},
      {"type": "generate", "inputs": PROMPT, "max_length": 3}], "max_length"),
]


@pytest.mark.parametrize("messages,word", WS_BAD, ids=[w for _, w in WS_BAD])
def test_ws_bad_input_gets_a_short_error_naming_the_parameter(base_url, messages, word):
    ws = ws_connect(base_url)
    try:
        for message in messages:
            reply = ws_ask(ws, message)
            if not reply["ok"]:
                break
    finally:
        close_ws(ws)
    assert reply["ok"] is False
    assert word in reply["traceback"]
    assert "Traceback" not in reply["traceback"] and len(reply["traceback"]) < 400


def test_a_model_the_assessment_calls_broken_is_refused_before_generation(base_url, unserved):
    unserved[TINY_DHT_PREFIX] = "blocks 4:8 have no server"
    try:
        response = requests.post(f"{base_url}/v1/completions", json={**CMPL, "max_tokens": 2}, timeout=30)
    finally:
        del unserved[TINY_DHT_PREFIX]
    assert response.status_code == 503
    assert "blocks 4:8 have no server" in response.json()["error"]["message"]


def test_a_full_engine_answers_429_with_retry_after(base_url, engine):
    ids = engine.encode(TINY_DHT_PREFIX, PROMPT)
    held = [engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=400)) for _ in range(2)]  # both slots
    try:
        busy = requests.post(f"{base_url}/v1/completions", json={**CMPL, "max_tokens": 2}, timeout=30)
        busy_v1 = requests.post(f"{base_url}/api/v1/generate", data=V1, timeout=30)
    finally:
        for answer in held:
            answer.close()
    for response in (busy, busy_v1):
        assert response.status_code == 429
        assert 1 <= int(response.headers["Retry-After"]) <= 600
    # the wait it says is the one it estimates from how long slots were held (not a constant)
    assert f"retry in {busy.headers['Retry-After']} s" in busy.json()["error"]["message"]
    after = requests.post(f"{base_url}/v1/completions", json={**CMPL, "max_tokens": 2}, timeout=60)
    assert after.status_code == 200, after.text


# ---- the chat page ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page_url(engine, tmp_path_factory):
    """The chat blueprint inside the real dashboard app (base layout, static files, headers)."""
    from monitor.settings import Settings
    from monitor.store import Store
    from monitor.web import create_app

    data_dir = tmp_path_factory.mktemp("chat-page")
    store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
    store.migrate()
    app = create_app(Settings(data_dir=data_dir), store, chat_blueprints=[create_blueprint(engine)])
    with serve(app) as url:
        yield url
    store.close()


def browser_session(page_url):
    """A session like the chat page's: its cookie, and the CSRF token htmx sends with every POST."""
    web = requests.Session()
    html = web.get(f"{page_url}/chat", timeout=60).text
    web.headers["X-CSRFToken"] = re.search(r'<meta name="csrf-token" content="([^"]+)"', html).group(1)
    return web


def post_turn(page_url, session, **form):
    return session.post(f"{page_url}/chat/turns", data=form, timeout=30)


def stream_url(html):
    return re.search(r'data-chat-stream="([^"]+)"', html).group(1)


def test_chat_page_offers_only_served_models_and_says_why_not(page_url):
    html = requests.get(f"{page_url}/chat", timeout=60).text
    assert re.search(rf'<option value="{TINY_DHT_PREFIX}"\s+selected>Tiny Llama', html)
    assert re.search(rf'<option value="{GHOST}" disabled', html)
    assert f'href="/models/{GHOST}"' in html and "0:8" in html
    assert "<script>" not in html  # no inline scripts
    assert 'name="temperature"' in html and 'name="max_new_tokens"' in html


def test_chat_page_streams_a_multi_turn_conversation_with_its_route(page_url, local, swarm):
    tokenizer, greedy = local
    web = browser_session(page_url)
    params = dict(model=TINY_DHT_PREFIX, system="Be brief.", temperature="0", top_p="1", top_k="0",
                  repetition_penalty="1", max_new_tokens="12")

    first = post_turn(page_url, web, message="Hello <b>world</b>", **params)
    assert first.status_code == 200, first.text
    assert "Hello &lt;b&gt;world&lt;/b&gt;" in first.text  # the user's text is escaped
    conversation_id = re.search(r'id="conversation-id" value="([^"]+)"', first.text).group(1)
    events = list(read_sse(web.get(page_url + stream_url(first.text), stream=True, timeout=120)))
    answer = "".join(data for event, data in events if event == "token")
    done = [data for event, data in events if event == "done"]

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello <b>world</b>"}]
    _, expected = greedy(tokenizer.apply_chat_template(messages, add_generation_prompt=True), 12)
    assert answer.replace("\r\n", "\n") == expected.replace("\r", "\n")
    assert sum(1 for event, _ in events if event == "token") > 1
    assert len(done) == 1 and "tokens/s" in done[0] and "Route of this answer" in done[0]
    used = {swarm.peer_id(n)[-10:] for n in ("first-half", "second-half", "full")}
    assert any(peer in done[0] for peer in used)
    assert web.get(page_url + stream_url(first.text), timeout=10).status_code == 204  # no replays

    second = post_turn(page_url, web, message="And again?", conversation_id=conversation_id, **params)
    events = list(read_sse(web.get(page_url + stream_url(second.text), stream=True, timeout=120)))
    # the conversation's session was kept (chat.kept): the second turn continues it, so the model reads
    # the first answer as the tokens it generated, then the new turn's text
    ids_1 = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    new_1, _ = greedy(ids_1, 12)
    before = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    messages += [{"role": "assistant", "content": expected}, {"role": "user", "content": "And again?"}]
    since = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)[len(before):]
    rest = since[len(tokenizer.decode(new_1[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)):]
    _, expected_2 = greedy(ids_1 + new_1[:-1] + tokenizer.encode(rest, add_special_tokens=False), 12)
    assert "".join(d for e, d in events if e == "token").replace("\r\n", "\n") == expected_2.replace("\r", "\n")
    assert "continued" in next(d for e, d in events if e == "done")


def test_chat_page_leaves_out_the_oldest_turns_that_no_longer_fit_and_says_so(page_url, engine, local):
    """The tiny model's 512 tokens: a conversation of long turns keeps its system prompt and the newest
    turns that fit with room for the answer; the page notes how many messages were left out, every
    answer shows the context it used, and a single message longer than the limit is refused."""
    tokenizer, greedy = local
    web = browser_session(page_url)
    params = dict(model=TINY_DHT_PREFIX, system="Be brief.", temperature="0", top_p="1", top_k="0",
                  repetition_penalty="1", max_new_tokens="8")
    long = "the blocks of the swarm " * 8
    assert 60 <= len(engine.encode(TINY_DHT_PREFIX, long)) <= 200, len(engine.encode(TINY_DHT_PREFIX, long))
    conversation_id, history, notes, continued = "", [], [], []
    for i in range(6):
        message = f"{i}: {long}"
        turn = post_turn(page_url, web, message=message, conversation_id=conversation_id, **params)
        assert turn.status_code == 200, turn.text
        conversation_id = re.search(r'id="conversation-id" value="([^"]+)"', turn.text).group(1)
        note = re.search(r"The (\d+) oldest messages? of this conversation", turn.text)
        notes.append(int(note.group(1)) if note else 0)
        events = list(read_sse(web.get(page_url + stream_url(turn.text), stream=True, timeout=120)))
        answer = "".join(d for e, d in events if e == "token").replace("\r\n", "\n")
        done = next(d for e, d in events if e == "done")
        assert "Context used" in done and "of 512 tokens" in done, done
        continued.append("continued" in done)
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": answer}]
    assert notes[0] == notes[1] == 0  # they fit whole
    assert notes[-1] >= 2 and notes[-1] % 2 == 0, notes  # a question with its answer, the oldest first
    assert notes == sorted(notes)
    # a turn that leaves out more than the one before cannot continue its kept session (its text no
    # longer begins with the session's): a fresh session of what the page sent
    fresh = [i for i in range(1, 6) if notes[i] > notes[i - 1]]
    assert fresh and not any(continued[i] for i in fresh), (notes, continued)
    assert continued[1]  # (and one that fits whole does)
    # what the model read then: the system prompt and the newest messages, and it answered as local greedy does
    last = fresh[-1]
    left_out, upto = notes[last], 2 * last + 1
    kept = [{"role": "system", "content": "Be brief."}] + history[left_out:upto]
    ids = tokenizer.apply_chat_template(kept, add_generation_prompt=True)
    assert len(ids) + 8 <= 512 < len(tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}] + history[left_out - 2:upto], add_generation_prompt=True)) + 8
    _, expected = greedy(ids, 8)
    assert history[upto]["content"] == expected.replace("\r", "\n")
    too_long = post_turn(page_url, web, message="word " * 600, conversation_id=conversation_id, **params)
    assert too_long.status_code == 400 and "this message" in too_long.text and "512" in too_long.text


def test_chat_page_stop_button_ends_the_answer(page_url):
    web = browser_session(page_url)
    turn = post_turn(page_url, web, model=TINY_DHT_PREFIX, message="Tell me everything.", temperature="0",
                     max_new_tokens="400")
    response = web.get(page_url + stream_url(turn.text), stream=True, timeout=120)
    tokens, done = 0, None
    for event, data in read_sse(response):
        if event == "token":
            tokens += 1
            if tokens == 3:
                stop = re.search(r'hx-post="([^"]+/stop)"', turn.text).group(1)
                assert web.post(page_url + stop, timeout=10).status_code == 200
        elif event == "done":
            done = data
    assert done is not None and "stopped" in done
    assert tokens < 100


@pytest.mark.parametrize("form,status,word", [
    ({"message": ""}, 400, "message"),
    ({"message": "hi", "temperature": "warm"}, 400, "temperature"),
    ({"message": "hi", "max_new_tokens": "100000"}, 400, "max_new_tokens"),
    ({"message": "hi", "model": "nope"}, 404, "nope"),
    ({"message": "hi", "model": GHOST}, 503, "0:8"),
])
def test_chat_page_refusals_name_the_parameter(page_url, form, status, word):
    response = post_turn(page_url, browser_session(page_url), **{"model": TINY_DHT_PREFIX, **form})
    assert response.status_code == status
    assert word in response.text and response.headers["HX-Retarget"] == "#chat-error"


def test_chat_page_refuses_cross_site_posts(page_url):
    response = requests.post(f"{page_url}/chat/turns", data={"model": TINY_DHT_PREFIX, "message": "hi"},
                             headers={"Origin": "http://evil.example"}, timeout=10)
    assert response.status_code == 403


def test_chat_page_in_a_real_browser_streams_an_answer_with_its_route(page_url, local, browser, artifacts_dir):
    """Headless Chromium: pick the model, send, watch tokens arrive, see the route; stop a long one."""
    from playwright.sync_api import expect

    tokenizer, greedy = local
    _, expected = greedy(tokenizer.apply_chat_template([{"role": "user", "content": "Hello <b>there</b>"}],
                                                       add_generation_prompt=True), 24)
    problems = []
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    page.goto(f"{page_url}/chat")
    expect(page.locator("#chat-model option:checked")).to_have_text("Tiny Llama")
    page.locator("summary", has_text="System prompt").click()
    page.fill('input[name="temperature"]', "0")
    page.fill('input[name="max_new_tokens"]', "24")
    page.fill("#message", "Hello <b>there</b>")
    page.click('button[type="submit"]')

    answer = page.locator(".chat-assistant").last
    expect(answer.locator(".chat-route")).to_be_visible(timeout=60_000)
    assert answer.locator(".chat-text").text_content() == expected  # the streamed text, kept (hidden) for Copy
    # when it is done, the rendered answer (chat/markdown.py) takes the streamed text's place
    expect(answer.locator(".chat-rendered")).to_be_visible()
    expect(answer.locator(".chat-text")).to_be_hidden()
    assert answer.locator(".chat-rendered script, .chat-rendered img, .chat-rendered [onerror]").count() == 0
    expect(answer.locator("button.chat-copy")).to_be_visible()
    expect(answer.locator(".chat-stats")).to_contain_text("tokens/s")
    expect(page.locator(".chat-user .chat-text").last).to_have_text("Hello <b>there</b>")
    expect(page.locator("#message")).to_have_value("")  # cleared for the next turn
    page.screenshot(path=str(artifacts_dir / "chat-answer.png"), full_page=True)

    # the keyboard: Shift+Enter is a new line, Enter sends, Esc stops the answer being written
    page.fill('input[name="max_new_tokens"]', "400")
    page.locator("#message").click()
    page.keyboard.type("Tell me")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("everything.")
    expect(page.locator("#message")).to_have_value("Tell me\neverything.")
    page.keyboard.press("Enter")
    second = page.locator(".chat-assistant").last
    expect(page.locator(".chat-user .chat-text").last).to_have_text("Tell me\neverything.")
    expect(second.locator(".chat-text")).not_to_be_empty(timeout=60_000)
    page.keyboard.press("Escape")
    expect(second.locator(".chat-stats")).to_contain_text("stopped", timeout=60_000)
    assert page.locator(".chat-assistant").count() == 2  # Enter sent it once

    page.fill("#message", "   ")  # passes the browser's checks, not the server's
    page.click('button[type="submit"]')
    expect(page.locator("#chat-error")).to_contain_text("message is empty")
    page.screenshot(path=str(artifacts_dir / "chat-stopped-and-error.png"), full_page=True)
    # the browser logs the deliberate 400 of the empty message as a failed resource load
    assert [p for p in problems if "status of 400" not in p] == []
