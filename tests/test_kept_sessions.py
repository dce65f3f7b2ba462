"""Specs of sessions kept after an answer (``chat.kept``), through the OpenAI API on the session
swarm (tiny Llama, float32 servers): a follow-up that sends its answer's ``petals.session`` back
continues that session — only what is new goes through the swarm — and gets what a fresh session
of the same tokens gets; never another client's; a wrong handle is ignored; a session is taken by
one request at a time; kept sessions are bounded and let go first. The rules without a swarm:
``test_kept_rules.py``."""

from __future__ import annotations

import json
import threading
import time

import pytest

from chat.decoding import Finished, GenerationParams
from chat.engine import ChatEngine, FollowUp, Rendered
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.core.requests import stats
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.settings import ModelConfig

from support import chat_app

ME, STRANGER = "127.0.0.2", "127.0.0.3"
ANSWER_TOKENS = 12


@pytest.fixture(scope="module")
def chat(swarm, tiny_model, tmp_path_factory):
    """(engine, store, rows, web client factory) on the session swarm."""
    models = [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)]
    with chat_app(swarm, models, tmp_path_factory.mktemp("kept"), slots=4, keep_seconds=60) as (
            engine, store, rows, app):
        def client(address: str = ME):
            web = app.test_client()
            web.environ_base["REMOTE_ADDR"] = address
            return web

        yield engine, store, rows, client


def ask(client, messages, handle=None, **extra) -> dict:
    body = {"model": TINY_DHT_PREFIX, "messages": messages, "temperature": 0, "max_tokens": ANSWER_TOKENS, **extra}
    if handle is not None:
        body["petals"] = {**body.get("petals", {}), "session": handle}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def conversation(client, turns: int, *, send_handle: bool = True) -> list[dict]:
    """A conversation of ``turns`` questions, each answer put back in the messages; the replies."""
    messages, replies, handle = [], [], None
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Tell me about the number {turn + 1}."})
        reply = ask(client, messages, handle if send_handle else None)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        handle = reply["petals"].get("session")
    return replies


def test_a_follow_up_continues_its_session_and_sends_only_what_is_new(chat):
    engine, store, rows, client = chat
    continued = conversation(client(), 4)
    fresh = conversation(client(), 2, send_handle=False)
    # every answer carries a handle; the follow-ups that sent theirs back continued, and did not send
    # their earlier turns again
    assert all(len(reply["petals"]["session"]) >= 32 for reply in continued + fresh)
    assert [reply["petals"]["continued"] for reply in continued] == [False, True, True, True]
    assert [reply["petals"]["continued"] for reply in fresh] == [False, False]
    cached = [reply["usage"]["prompt_tokens_details"]["cached_tokens"] for reply in continued]
    assert cached[0] == 0 and cached == sorted(cached)
    assert all(0 < c < reply["usage"]["prompt_tokens"] for c, reply in zip(cached[1:], continued[1:]))
    # kept idle, they hold cache on their servers but are no load on them (they compute nothing)
    assert engine.load().kept.kept >= 2 and not any(engine.server_load.in_flight().values())
    # the request rows say so, as the store keeps them
    rows.flush()
    stored = [r for r in store.requests_since(time.time() - 600, model=TINY_DHT_PREFIX)][-6:]
    assert [(r.follow_up, r.continued) for r in stored] == [(False, False), (True, True), (True, True), (True, True),
                                                             (False, False), (False, False)]
    assert [r.tokens_not_resent for r in stored[:4]] == cached
    # and the model's request statistics count them: the hit rate
    figures = stats(stored, now=time.time())["latency"]["30m"]
    assert (figures["follow_ups"], figures["continued"], figures["tokens_not_resent"]) == (3, 3, sum(cached))


def test_greedy_answers_of_a_continued_session_equal_a_fresh_session_of_the_same_tokens(chat):
    """Turn after turn, the continued session's prompt is the session's own tokens and then the new
    turn's: a fresh session sent exactly those ids (a text completion of token ids) answers the same."""
    engine, _, _, client = chat
    me = client()
    messages, handle, held = [], None, []
    for turn in range(4):
        messages.append({"role": "user", "content": f"Count with me: {turn}, {turn + 1}"})
        reply = ask(me, messages, handle)
        handle = reply["petals"]["session"]
        kept = engine.kept._kept[handle]
        history = kept.session.committed_ids()
        prompt = history[:len(history) - len(kept.answer_ids) + 1]
        assert prompt[:len(held)] == held  # the kept session's own tokens come first
        assert reply["petals"]["continued"] is (turn > 0)
        alone = me.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": prompt, "temperature": 0,
                                                 "max_tokens": ANSWER_TOKENS}).get_json()
        assert alone["choices"][0]["text"] == reply["choices"][0]["message"]["content"], turn
        held = history
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


def test_never_across_clients_and_a_wrong_handle_is_ignored(chat):
    engine, _, _, client = chat
    messages = [{"role": "user", "content": "A secret question"}]
    mine = ask(client(ME), messages)
    follow = messages + [{"role": "assistant", "content": mine["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "go on"}]
    # another client with my handle, or anyone with a made-up one: a fresh session, no error
    for address, handle in ((STRANGER, mine["petals"]["session"]), (ME, "x" * 43), (ME, "\u00e9" * 500)):
        reply = ask(client(address), follow, handle)
        assert reply["petals"]["continued"] is False
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # my session is still mine (the stranger's try did not spend it)
    assert ask(client(ME), follow, mine["petals"]["session"])["petals"]["continued"] is True
    bad = client(ME).post("/v1/chat/completions", json={"model": TINY_DHT_PREFIX, "messages": follow,
                                                        "petals": {"session": 42}})
    assert bad.status_code == 400 and "petals.session" in bad.get_json()["error"]["message"]


def test_a_kept_session_is_taken_by_one_request_at_a_time(chat):
    engine, _, _, client = chat
    messages = [{"role": "user", "content": "Two at once"}]
    first = ask(client(), messages)
    follow = messages + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "again"}]
    results, start = [], threading.Barrier(3)

    def follow_up():
        c = client()
        start.wait()
        results.append(ask(c, follow, first["petals"]["session"]))

    threads = [threading.Thread(target=follow_up) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(r["petals"]["continued"] for r in results) == [False, False, True]
    fresh = {r["choices"][0]["message"]["content"] for r in results if not r["petals"]["continued"]}
    assert len(fresh) == 1  # (the two that started fresh say the same)


def test_streamed_chunks_carry_the_handle_and_a_follow_up_of_a_stream_continues(chat):
    _, _, _, client = chat
    me = client()
    messages = [{"role": "user", "content": "Stream to me"}]
    body = {"model": TINY_DHT_PREFIX, "messages": messages, "temperature": 0, "max_tokens": ANSWER_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}
    chunks = [json.loads(line[6:]) for line in me.post("/v1/chat/completions", json=body).get_data(as_text=True)
              .splitlines() if line.startswith("data: {")]
    handles = {chunk["petals"]["session"] for chunk in chunks}
    assert len(handles) == 1 and all(chunk["petals"]["continued"] is False for chunk in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    follow = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    assert ask(me, follow, handles.pop())["petals"]["continued"] is True


def test_chat_petals_dev_s_http_api_and_text_completions_continue_too(chat):
    engine, _, _, client = chat
    me = client()
    first = me.post("/api/v1/generate", data={"model": TINY_DHT_PREFIX, "inputs": "Once upon a time",
                                              "max_new_tokens": 6}).get_json()
    assert first["ok"] and first["session"] and first["continued"] is False
    follow = "Once upon a time" + first["outputs"] + " and then"
    second = me.post("/api/v1/generate", data={"model": TINY_DHT_PREFIX, "inputs": follow, "max_new_tokens": 6,
                                               "session": first["session"]}).get_json()
    assert second["ok"] and second["continued"] is True
    text = {"model": TINY_DHT_PREFIX, "prompt": "A tale:", "max_tokens": 6, "temperature": 0}
    one = me.post("/v1/completions", json=text).get_json()
    two = me.post("/v1/completions", json={**text, "prompt": "A tale:" + one["choices"][0]["text"] + " more",
                                           "petals": {"session": one["petals"]["session"]}}).get_json()
    assert two["petals"]["continued"] is True and two["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # several answers in one request never continue nor leave a session
    many = me.post("/v1/completions", json={**text, "n": 2, "petals": {"session": two["petals"]["session"]}}).get_json()
    assert "session" not in many["petals"]
    assert ("tiny-llama", "never") in engine.kept.load().outcomes


# ---- a server that ends idle sessions fast ---------------------------------------------------------


@pytest.fixture(scope="module")
def forgetful(tiny_model):
    """A swarm of one server that ends a session idle for 2 s (petals' step_timeout; 300 s by default)."""
    swarm = LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=5)
    try:
        yield swarm.start([ServerSpec("forgetful", 0, TINY_NUM_BLOCKS, step_timeout=2)])
    finally:
        swarm.close()


def test_a_session_its_server_dropped_while_idle_goes_on_unblamed(forgetful, tiny_model):
    """A conversation held open (chat.petals.dev's WebSocket) or kept after an answer whose server
    ended it while it was idle: its next answer is what a fresh session of its whole text gives,
    no outcome of that server is recorded as failed, it is not banned, and the kept one's request
    row does not claim to have continued."""
    outcomes, records = [], []
    engine = ChatEngine(forgetful.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        outcome_sink=outcomes.append, request_sink=records.append, keep_seconds=60)
    params = GenerationParams(max_new_tokens=6)
    try:
        prompt = engine.encode(TINY_DHT_PREFIX, "Once upon a time")
        held = engine.open_session(TINY_DHT_PREFIX, 64)
        first = finished(held.generate(prompt, params))
        time.sleep(3)  # the server ends it
        more = engine.encode(TINY_DHT_PREFIX, " and then", add_special_tokens=False)
        second = finished(held.generate(more, params))
        whole = prompt + list(first.token_ids) + more
        with engine.answer(TINY_DHT_PREFIX, whole, params) as alone:
            assert finished(alone).token_ids == second.token_ids
        held.close()

        text = "A story: "
        batch = engine.answer_batch(TINY_DHT_PREFIX, [engine.encode(TINY_DHT_PREFIX, text)], params,
                                    rendered=Rendered(text))
        with batch:
            answer = [e for _, e in batch if isinstance(e, Finished)][-1]
        time.sleep(3)
        follow = text + answer.text + " more"
        again = engine.answer_batch(TINY_DHT_PREFIX, [engine.encode(TINY_DHT_PREFIX, follow)], params,
                                    rendered=Rendered(follow), follow=FollowUp(batch.handle, text=follow))
        with again:
            assert [e for _, e in again if isinstance(e, Finished)][-1].token_ids
        assert records[-1].follow_up and not records[-1].continued and records[-1].tokens_not_resent == 0
    finally:
        engine.close()
    assert outcomes and all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    state = engine.models.sequence_manager(TINY_DHT_PREFIX).state
    assert all(span.peer_id not in state.banned_peers for span in state.sequence_info.spans_by_priority)


def finished(events) -> Finished:
    return [e for e in events if isinstance(e, Finished)][-1]
