"""Production serving of the chat: ONE gunicorn worker (gthread) runs ``monitor.app.chat_wsgi:app``
against the session swarm, configured by environment variables only. It starts the DHT client in
the worker (no --preload), streams a completion to the ``openai`` client, closes an idle WebSocket
saying why, answers 429 with Retry-After past ``chat_rate_limit`` per client address, and leaves no
process behind when gunicorn stops."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from openai import OpenAI
from simple_websocket import Client as WsClient, ConnectionClosed

from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import MESSAGES, close_ws, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).parent / "gunicorn"
RATE_LIMIT = 4  # generating requests per minute and client address, here


@pytest.fixture(scope="module")
def chat_server(swarm, tiny_model, tmp_path_factory):
    """(base_url, gunicorn process, its worker's processes) serving the chat of the tiny model."""
    tmp = tmp_path_factory.mktemp("chat-gunicorn")
    port = free_port()
    env = dict(os.environ,
               SWARM_MONITOR_DATA_DIR=str(tmp), SWARM_MONITOR_DATABASE_URL=f"sqlite:///{tmp / 'monitor.db'}",
               SWARM_MONITOR_INITIAL_PEERS=",".join(swarm.initial_peers),
               SWARM_MONITOR_MODELS=json.dumps([{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS,
                                                 "path": str(tiny_model), "name": "Tiny Llama"}]),
               SWARM_MONITOR_CHAT_RATE_LIMIT=f"{RATE_LIMIT} per minute", SWARM_MONITOR_WS_IDLE_TIMEOUT="2",
               SWARM_MONITOR_PORT=str(port),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SWARM_MONITOR_CONFIG", None)
    log = open(tmp / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [str(GUNICORN), "--worker-class", "gthread", "--workers", "1", "--threads", "8", "--timeout", "120",
         "--graceful-timeout", "10", "--bind", f"127.0.0.1:{port}", "monitor.app.chat_wsgi:app"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    family: list[psutil.Process] = []
    def serving() -> bool:
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=20) as response:
                return response.status == 200
        except OSError:
            assert process.poll() is None, f"gunicorn exited: {(tmp / 'gunicorn.log').read_text()[-3000:]}"
            return False

    try:
        assert wait_until(serving, 180), f"gunicorn did not serve the chat: {(tmp / 'gunicorn.log').read_text()[-3000:]}"
        family = psutil.Process(process.pid).children(recursive=True)
        yield base, process, family
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        _, alive = psutil.wait_procs(family, timeout=20)
        for proc in alive:  # reaped here so the session stays clean, and reported below
            proc.kill()
        assert not alive, f"left running after gunicorn stopped: {[p.pid for p in alive]}"


def test_one_worker_holds_the_dht_client_and_streams_to_the_openai_client(chat_server, local):
    base, process, family = chat_server
    workers = psutil.Process(process.pid).children()
    assert len(workers) == 1  # one worker: the DHT client, the engine and the conversations live there
    p2pd = [p for p in family if "p2pd" in p.name()]
    assert p2pd and all(workers[0].pid in {a.pid for a in p.parents()} for p in p2pd)  # started in the worker

    tokenizer, greedy = local
    _, expected = greedy(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True), 16)
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, temperature=0,
                                                 max_tokens=16, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1, "not streamed token by token"
    route = chunks[-1].model_extra["petals"]["route"]
    assert route[0]["start"] == 0 and route[-1]["end"] == TINY_NUM_BLOCKS


def test_an_idle_websocket_is_closed_with_the_reason(chat_server):
    base, _, _ = chat_server
    ws = WsClient.connect(base.replace("http://", "ws://") + "/api/v2/generate")
    try:
        ws.send(json.dumps({"type": "open_inference_session", "model": TINY_DHT_PREFIX, "max_length": 32}))
        assert json.loads(ws.receive(timeout=60)) == {"ok": True}
        started = time.monotonic()
        reply = json.loads(ws.receive(timeout=20))
        waited = time.monotonic() - started
        with pytest.raises(ConnectionClosed):
            while True:
                ws.receive(timeout=10)
    finally:
        close_ws(ws)
    assert reply["ok"] is False and "idle" in reply["traceback"] and "2 s" in reply["traceback"]
    assert 1.5 < waited < 8
    assert "idle" in (ws.close_message or "")


def _post(base: str, path: str, body: dict, source: str = "127.0.0.1") -> tuple[int, dict, dict]:
    """POST JSON from the given loopback address (rate limits are per client address)."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60, source_address=(source, 0))
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def test_past_the_rate_limit_every_chat_api_answers_429_with_retry_after(chat_server):
    base, _, _ = chat_server
    bad = {"model": TINY_DHT_PREFIX, "prompt": "hi", "temperature": 9}  # refused (400), but counted
    statuses = []
    for _ in range(RATE_LIMIT + 1):
        statuses.append(_post(base, "/v1/completions", bad)[0])
        if statuses[-1] == 429:
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) <= {400} and len(statuses) <= RATE_LIMIT + 1
    status, headers, body = _post(base, "/v1/chat/completions", {"model": TINY_DHT_PREFIX, "messages": MESSAGES})
    assert status == 429 and int(headers["Retry-After"]) > 0
    assert body["error"]["type"] == "rate_limit_exceeded" and "too many" in body["error"]["message"]
    status, _, body = _post(base, "/api/v1/generate", {"inputs": "hi", "max_new_tokens": 1})
    assert status == 429 and body["ok"] is False and "too many" in body["traceback"]
    assert _post(base, "/v1/completions", bad, source="127.0.0.2")[0] == 400  # another client: its own budget
