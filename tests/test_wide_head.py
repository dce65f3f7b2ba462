"""Spec: the chat at a real vocabulary's width (README: The chat's own compute), on a real swarm of a
Llama 3.1-style checkpoint with a 128,256-token head (hidden 512: small enough for make test; the
70B and 405B shapes are the benchmark's, scripts/bench_head_step.py).

- Answers that run at once — of different lengths and parameters, joining and leaving mid-way, one
  failing over to another server mid-way — get what each gets alone: every token's log-probability
  within 1e-5 (float32), greedy tokens identical wherever the top-2 margin exceeds that, and alone
  the reference transformers' own greedy continuation.
- Their head steps are shared (rows per step > 1), and /metrics and ``GET /v1/models`` show the
  chat's own cost per model.
- A client side too big for the memory free is refused in one line while another model answers;
  precision and device settings this machine cannot honour are refused in one line.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest

from chat.capacity import Capacity
from chat.client_side import ClientSideError, ClientSideSettings
from chat.engine import ChatEngine, Finished, GenerationParams
from chat.http import create_blueprint
from chat.metrics import ChatCollector
from monitor.harness import reference
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, wide_model
from monitor.settings import ModelConfig, Settings
from support import serve

pytestmark = pytest.mark.swarm

PROMPTS = ["Petals runs large language models", "The capital of France is", "Hello, world!", "Once upon a time"]
TOLERANCE = 1e-5
REQUEST_TIMEOUT = 8


@pytest.fixture(scope="module")
def wide(data_dir):
    return wide_model(data_dir)


@pytest.fixture(scope="module")
def wide_swarm(wide):
    with LocalSwarm(wide.path, wide.dht_prefix, update_period=5) as s:
        s.start([ServerSpec("a", 0, wide.num_blocks), ServerSpec("b", 0, wide.num_blocks)])
        yield s


@pytest.fixture(scope="module")
def engine(wide, wide_swarm):
    engine = ChatEngine(wide_swarm.dht, [ModelConfig(dht_prefix=wide.dht_prefix, path=wide.path)],
                        capacity=Capacity(slots=16, queue_size=16, slots_share=1.0),
                        request_timeout=REQUEST_TIMEOUT,
                        client_side=ClientSideSettings(dtype="float32", device="cpu"))
    engine.sequence_manager(wide.dht_prefix)
    yield engine
    engine.close()


def answer(engine, name, ids, params) -> Finished:
    with engine.answer(name, ids, params) as events:
        return next(event for event in events if isinstance(event, Finished))


def same_answer(alone: Finished, shared: Finished, what: str) -> None:
    """Token for token while the alone answer's top-2 margin exceeds the tolerance; each token's
    log-probability within it."""
    for position, (mine, theirs) in enumerate(zip(alone.logprobs, shared.logprobs)):
        if mine.token_id != theirs.token_id:
            (_, first), (_, second) = mine.top[:2]
            assert first - second <= TOLERANCE, f"{what}: token {position} differs with a margin of {first - second}"
            return
        assert abs(mine.logprob - theirs.logprob) <= TOLERANCE, \
            f"{what}: token {position}'s log-probability {theirs.logprob} alone was {mine.logprob}"
    assert len(alone.token_ids) == len(shared.token_ids), what


def test_answers_sharing_head_steps_get_what_each_gets_alone(engine, wide, wide_swarm):
    name = wide.dht_prefix
    rows = [engine.encode(name, prompt) for prompt in PROMPTS]
    greedy = [GenerationParams(max_new_tokens=n, logprobs=True, top_logprobs=2) for n in (6, 24, 12, 30)]
    alone = [answer(engine, name, ids, params) for ids, params in zip(rows, greedy)]
    assert engine.models.client_side_info(name)["rows_per_head_step"] == 1.0  # (one at a time)
    expected = reference.run("reference", {"path": str(wide.path), "generate": rows[:2], "max_new_tokens": 24})
    assert list(alone[1].token_ids) == expected["generated"][1]  # the reference's own greedy continuation
    assert list(alone[0].token_ids) == expected["generated"][0][:6]

    names = {wide_swarm.peer_id(n): n for n in ("a", "b")}
    shared: dict[int, Finished] = {}
    killed: list[str] = []

    def run(index: int, params: GenerationParams, delay: float, kill_after: int = 0) -> None:
        time.sleep(delay)  # joining mid-way
        with engine.answer(name, rows[index % len(rows)], params) as events:
            tokens = 0
            for event in events:
                if isinstance(event, Finished):
                    shared[index] = event
                elif kill_after and not killed:
                    tokens += event.token_count
                    if tokens >= kill_after:  # fail over mid-way: the server of its route dies
                        killed.append(names[events.session.route()[0].peer_id])
                        wide_swarm.kill(killed[0])

    threads = [threading.Thread(target=run, args=(i, greedy[i], 0.15 * i, 8 if i == 3 else 0)) for i in range(4)]
    threads += [threading.Thread(target=run, args=(4 + i, GenerationParams(max_new_tokens=10 + 6 * i, temperature=0.8,
                                                                           top_p=0.9, repetition_penalty=1.2),
                                                   0.1 * i)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    try:
        assert sorted(shared) == list(range(7)), "an answer did not finish"
        assert killed, "no server was killed mid-answer"
        for index in range(4):
            same_answer(alone[index], shared[index], f"answer {index}")
        for index in range(4, 7):
            assert shared[index].completion_tokens == 10 + 6 * (index - 4)
        info = engine.models.client_side_info(name)
        assert info["rows_per_head_step"] > 1.0, "the answers never shared a head step"
        assert info["dtype"] == "float32" and info["device"] == "cpu" and info["head_ms_per_token"] > 0
    finally:
        for server in killed:
            wide_swarm.restart(server)


def test_the_chat_shows_its_own_cost_per_model(engine, wide):
    registry = CollectorRegistry()
    registry.register(ChatCollector(engine))
    before = _rows(generate_latest(registry).decode(), wide.dht_prefix)
    answer(engine, wide.dht_prefix, engine.encode(wide.dht_prefix, PROMPTS[0]), GenerationParams(max_new_tokens=5))
    text = generate_latest(registry).decode()
    assert _rows(text, wide.dht_prefix) >= before + 5
    assert f'swarm_monitor_chat_head_step_seconds_count{{model="{wide.dht_prefix}"}}' in text
    app = Flask(__name__)
    app.register_blueprint(create_blueprint(engine))
    with serve(app) as url:
        card = next(m for m in requests.get(f"{url}/v1/models", timeout=60).json()["data"]
                    if m["id"] == wide.dht_prefix)
        shown = requests.get(f"{url}/chat/client-side", params={"model": wide.dht_prefix}, timeout=60).text
        for hostile in ("x" * 4000, "../../etc/passwd", "\x00<script>"):  # no such model: nothing to show
            assert requests.get(f"{url}/chat/client-side", params={"model": hostile}, timeout=60).status_code == 204
        assert requests.get(f"{url}/chat/client-side", timeout=60).status_code == 204
    side = card["petals"]["client_side"]
    assert side["dtype"] == "float32" and side["device"] == "cpu"
    assert side["memory_bytes"] == 2 * 128256 * 512 * 4 + 512 * 4  # embeddings, head, final norm
    assert side["head_ms_per_token"] > 0
    assert "<strong>float32</strong> on cpu, 0.5 GiB" in shown and "ms per token</strong>" in shown  # the pages'


def _rows(text: str, model: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'swarm_monitor_chat_head_step_rows_sum{{model="{model}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_client_side_too_big_for_the_memory_is_refused_while_another_model_answers(swarm, tiny_model, wide):
    """800 MB free: the tiny model's client side fits, the wide one's (1.2 GiB while loading) does not."""
    small_host = ClientSideSettings(dtype="float32", device="cpu", available=lambda: 800 << 20)
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model),
                                    ModelConfig(dht_prefix=wide.dht_prefix, path=wide.path)], client_side=small_host)
    app = Flask(__name__)
    app.register_blueprint(create_blueprint(engine))
    try:
        with serve(app) as url:
            refused = requests.post(f"{url}/v1/completions", json={"model": wide.dht_prefix, "prompt": "Hello",
                                                                   "max_tokens": 3}, timeout=60)
            served = requests.post(f"{url}/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "Hello",
                                                                  "max_tokens": 3}, timeout=60)
            cards = {m["id"]: m["petals"] for m in requests.get(f"{url}/v1/models", timeout=60).json()["data"]}
    finally:
        engine.close()
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "\n" not in message and "needs 1.2 GiB" in message and "0.8 GiB free" in message, message
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3
    assert cards[wide.dht_prefix]["served"] is False and "GiB" in cards[wide.dht_prefix]["reason"]
    assert cards[TINY_DHT_PREFIX]["served"] is True


def test_precision_and_device_settings_this_machine_cannot_honour_are_refused_in_one_line(tiny_model):
    models = [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)]
    with pytest.raises(ClientSideError) as cuda:
        ChatEngine(None, models, client_side=ClientSideSettings(device="cuda"))
    assert str(cuda.value).startswith("chat_device 'cuda': torch sees no CUDA device") and "\n" not in str(cuda.value)
    with pytest.raises(ClientSideError, match="chat_device 'cuda:3'"):
        ChatEngine(None, models, client_side=ClientSideSettings(device="cuda:3"))
    with pytest.raises(ValueError, match="chat_device"):
        Settings(chat_device="gpu")
    with pytest.raises(ValueError, match="chat_dtype"):
        Settings(chat_dtype="float16")
