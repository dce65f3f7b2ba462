"""Spec: the chat's capacity rules (README: Chat capacity; ``chat.capacity``) on a real swarm
through the real web app: open WebSocket sessions that sit idle hold no slot (four of them, and an
HTTP completion is answered as soon as ever); one client's many requests never take every slot;
the queue and its waits, the slots and the open sessions are on /metrics; a waiting streamed
request hears its place in the queue, then its answer. The rules themselves, without a swarm:
``test_chat_capacity.py``.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from simple_websocket import Client as WsClient

from chat.capacity import Capacity
from chat.engine import ChatEngine
from chat.http import create_blueprint
from chat.http.limits import ChatLimits
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig, Settings
from monitor.store import Store
from monitor.web import create_app
from support import close_ws, serve, wait_until


@pytest.fixture(scope="module")
def engine(swarm, tiny_model):
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        capacity=Capacity(slots=4, queue_size=8, queue_timeout=60, slots_share=0.5, open_sessions=8))
    engine.sequence_manager(TINY_DHT_PREFIX)  # loaded now: timings below exclude it
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def app(engine, tmp_path_factory):
    """The dashboard app with the chat, behind one trusted proxy: each spec client has its own address."""
    data_dir = tmp_path_factory.mktemp("chat-slots")
    store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
    store.migrate()
    settings = Settings(data_dir=data_dir, chat_rate_limit="1000 per minute", proxy_hops=1)
    yield create_app(settings, store, chat_blueprints=[create_blueprint(engine, ChatLimits.from_settings(settings))])
    store.close()


@pytest.fixture(scope="module")
def base_url(app):
    with serve(app) as url:
        yield url


def as_client(address):
    return {"X-Forwarded-For": address}


def ws_session(base_url, address, max_length=256):
    ws = WsClient.connect(base_url.replace("http://", "ws://") + "/api/v2/generate", headers=as_client(address))
    ws.send(json.dumps({"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": max_length}))
    assert json.loads(ws.receive(timeout=60)) == {"ok": True}
    return ws


def ws_turn(ws, inputs, tokens=4):
    ws.send(json.dumps({"type": "generate", "inputs": inputs, "max_new_tokens": tokens}))
    reply = json.loads(ws.receive(timeout=60))
    assert reply["ok"], reply
    return reply


def complete(base_url, address, tokens=8):
    started = time.monotonic()
    response = requests.post(f"{base_url}/v1/completions", headers=as_client(address), timeout=120,
                             json={"model": TINY_DHT_PREFIX, "prompt": "The capital of France is", "max_tokens": tokens,
                                   "temperature": 0})
    return response, time.monotonic() - started


def test_four_idle_websocket_sessions_hold_no_slot_and_a_fifth_client_is_answered_at_once(base_url, engine):
    """The issue's "four people reading": four chat.petals.dev sessions, asked once and left idle,
    then an HTTP completion from someone else: answered in its usual time, without waiting; the
    four go on chatting afterwards."""
    _, usual = complete(base_url, "10.0.0.99")
    readers = [ws_session(base_url, f"10.0.0.{i}") for i in range(1, 5)]
    try:
        for ws in readers:
            ws_turn(ws, "Once upon a time")
        # (just after their last token; the first completion's session is kept too, idle: chat.kept)
        assert wait_until(lambda: engine.load().sessions.states["idle"] - engine.load().sessions.kept >= 4, 10)
        assert engine.load().slots.busy == 0  # reading: no slot held
        response, took = complete(base_url, "10.0.0.50")
        assert response.status_code == 200, response.text
        assert took < max(3 * usual, usual + 2.0), (took, usual)
        for ws in readers:  # and they keep chatting, in the same sessions
            assert ws_turn(ws, " and then")["outputs"]
    finally:
        for ws in readers:
            close_ws(ws)


def test_one_client_cannot_take_every_slot(base_url, engine):
    """Alice sends six completions at once; she never holds more than her share (2 of 4 slots), so
    Bob, who asks while hers run, is answered without queueing behind them."""
    held_by_alice: list[int] = []
    alice_done: list = []

    def alice():
        alice_done.append(complete(base_url, "10.1.0.1", tokens=96)[0].status_code)

    threads = [threading.Thread(target=alice, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    watching = True

    def watch():
        while watching:
            held_by_alice.append(engine.slots.held_by("10.1.0.1"))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert wait_until(lambda: engine.slots.held_by("10.1.0.1") == 2, 30, step=0.01)
        assert wait_until(lambda: engine.load().slots.waiting >= 1, 30, step=0.01)  # her others wait, though two
        assert engine.load().slots.busy == 2  # slots are free
        bob, took = complete(base_url, "10.1.0.2", tokens=4)
        assert bob.status_code == 200 and engine.load().slots.waiting >= 1, "Bob went before Alice's queue emptied"
    finally:
        for thread in threads:
            thread.join(120)
        watching = False
        watcher.join(5)
    assert alice_done == [200] * 6
    assert max(held_by_alice) == 2


def test_metrics_show_slots_queue_waits_and_open_sessions(base_url, engine):
    ws = ws_session(base_url, "10.2.0.1")
    try:
        ws_turn(ws, "Hello")
        text = requests.get(f"{base_url}/metrics", timeout=30).text
    finally:
        close_ws(ws)
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("swarm_monitor_chat_")}
    assert samples['swarm_monitor_chat_slots{state="busy"}'] + samples['swarm_monitor_chat_slots{state="free"}'] == 4
    assert samples['swarm_monitor_chat_sessions_open{state="idle"}'] >= 1
    assert {'swarm_monitor_chat_sessions_open{state="waiting"}', 'swarm_monitor_chat_sessions_open{state="generating"}',
            "swarm_monitor_chat_queue_requests", "swarm_monitor_chat_queue_clients",
            "swarm_monitor_chat_retry_after_seconds", 'swarm_monitor_chat_refused_total{reason="queue_full"}',
            'swarm_monitor_chat_sessions_expired_total{reason="evicted"}'} <= set(samples)
    assert samples["swarm_monitor_chat_queue_wait_seconds_count"] >= 1
    assert samples['swarm_monitor_chat_queue_wait_seconds_bucket{le="+Inf"}'] == \
        samples["swarm_monitor_chat_queue_wait_seconds_count"]


def test_a_waiting_streamed_request_hears_its_queue_position_then_its_answer(base_url, engine):
    """Every slot held: a streamed OpenAI request gets its response at once, SSE comments with its
    place and expected wait (which OpenAI's clients skip), then its answer when a slot frees."""
    held = [engine.slots.acquire(f"203.0.113.{i}") for i in range(engine.capacity.slots)]
    try:
        response = requests.post(f"{base_url}/v1/chat/completions", headers=as_client("198.51.100.7"), stream=True,
                                 timeout=120, json={"model": TINY_DHT_PREFIX, "stream": True, "max_tokens": 4,
                                                    "messages": [{"role": "user", "content": "Hi"}]})
        assert response.status_code == 200
        lines = response.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line)
        assert first.startswith(": queue position 1, expected wait "), first
    finally:
        for slot in held:
            slot.release()
    rest = [line for line in lines if line]
    data = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert rest[-1] == "data: [DONE]" and data and all("error" not in d for d in data), rest
    assert data[-1]["choices"][0]["finish_reason"] in ("length", "stop")
