"""Spec: batched requests (README: Chat APIs) on the session swarm, through the ``openai`` client.

``n`` answers of one prompt are one petals inference session of ``n`` rows (its batch dimension);
a list of prompts runs its equal-length ones as one session and the others side by side; greedy
rows equal the single-request answer token for token; choices are numbered prompt by prompt,
streamed chunks carry their choice's index, and usage counts every row.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from flask import Flask
from openai import OpenAI

from chat.capacity import Capacity
from chat.engine import ChatEngine, Finished, GenerationParams, InvalidRequest
from chat.http import create_blueprint
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from support import MESSAGES, serve

PROMPTS = ["The capital of France is", "Once upon a time", "A capital of France is"]  # 1st and 3rd: one length


@pytest.fixture(scope="module")
def engine(swarm, tiny_model):
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        capacity=Capacity(slots=4, queue_size=8), max_batch_rows=16)
    engine.sequence_manager(TINY_DHT_PREFIX)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def client(engine):
    app = Flask(__name__)
    app.register_blueprint(create_blueprint(engine))
    with serve(app) as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def finished_rows(batch) -> dict[int, Finished]:
    with batch:
        return {index: event for index, event in batch if isinstance(event, Finished)}


def test_prompts_of_one_length_share_one_petals_session_and_others_run_beside_it(engine):
    rows = [engine.encode(TINY_DHT_PREFIX, p) for p in PROMPTS]
    assert len(rows[0]) == len(rows[2]) != len(rows[1])
    batch = engine.answer_batch(TINY_DHT_PREFIX, rows, GenerationParams(max_new_tokens=8))
    done = finished_rows(batch)
    assert sorted(done) == [0, 1, 2]
    assert sorted(session.rows for session in batch.sessions) == [1, 2]  # two sessions: rows {0, 2} and {1}
    samples = engine.answer_batch(TINY_DHT_PREFIX, [rows[0]] * 6, GenerationParams(max_new_tokens=8, temperature=1.0))
    finished_rows(samples)
    assert [session.rows for session in samples.sessions] == [6]  # n samples: one session of n rows


def test_greedy_rows_of_a_batch_equal_the_single_request_answer_token_for_token(client, local):
    tokenizer, greedy = local
    singles = [client.completions.create(model=TINY_DHT_PREFIX, prompt=p, max_tokens=24, temperature=0) for p in PROMPTS]
    batch = client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPTS, max_tokens=24, temperature=0, n=2)

    assert [c.index for c in batch.choices] == list(range(6))
    for i, prompt in enumerate(PROMPTS):  # prompt i's j-th answer is choice i × n + j
        expected = greedy(tokenizer(prompt)["input_ids"], 24)[1]
        assert singles[i].choices[0].text == expected
        assert [batch.choices[2 * i + j].text for j in range(2)] == [expected, expected]
    assert batch.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles) * 2  # every row
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles) * 2
    tokens = client.completions.create(model=TINY_DHT_PREFIX, prompt=[tokenizer(p)["input_ids"] for p in PROMPTS],
                                       max_tokens=24, temperature=0)  # token id prompts, a list of them
    assert [c.text for c in tokens.choices] == [s.choices[0].text for s in singles]


def test_chat_with_n_returns_n_choices_in_about_the_time_of_one(client, local):
    tokenizer, greedy = local
    expected = greedy(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True), 32)[1]
    client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=32, temperature=0)  # warm
    started = time.perf_counter()
    one = client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=32, temperature=0)
    alone = time.perf_counter() - started
    started = time.perf_counter()
    four = client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=32, temperature=0, n=4)
    together = time.perf_counter() - started

    assert one.choices[0].message.content == expected
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    assert all(c.message.content == expected for c in four.choices)
    assert four.usage.completion_tokens == 4 * one.usage.completion_tokens
    assert together < 2.5 * alone + 0.5, (together, alone)  # one pass of 4 rows, not 4 passes

    sampled = client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=16,
                                             temperature=1.0, n=4)
    assert len(sampled.choices) == 4 and len({c.message.content for c in sampled.choices}) > 1  # rows sample apart


def test_streamed_choices_carry_their_index_and_add_up_to_the_whole(client):
    whole = client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPTS, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPTS, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    texts = {i: "" for i in range(3)}
    finishes = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    chat = list(client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=8, temperature=0,
                                               n=3, stream=True))
    contents = {i: "" for i in range(3)}
    roles = set()
    for chunk in chat:
        for choice in chunk.choices:
            roles |= {choice.index} if choice.delta.role == "assistant" else set()
            contents[choice.index] += choice.delta.content or ""
    assert roles == {0, 1, 2} and len(set(contents.values())) == 1 and contents[0]


def test_batches_are_bounded(client, engine):
    import openai

    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 16"):
        client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=2, n=17)
    with pytest.raises(openai.BadRequestError, match=r"3 prompts × n = 6 asks for 18 answers"):
        client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPTS, max_tokens=2, n=6)
    with pytest.raises(InvalidRequest):
        engine.answer_batch(TINY_DHT_PREFIX, [[1, 2]] * 17, GenerationParams(max_new_tokens=2))


HOSTILE = [  # (path, the body's hostile part as raw JSON: Python's json reads NaN and 1e999 too)
    ("chat/completions", '"n": 0'), ("chat/completions", '"n": -1'), ("chat/completions", '"n": 1e999'),
    ("chat/completions", '"n": 100000000000000000000000000000'), ("chat/completions", '"n": 2.5'),
    ("chat/completions", '"n": "4"'), ("chat/completions", '"n": true'), ("chat/completions", '"n": NaN'),
    ("chat/completions", '"logprobs": true, "top_logprobs": -1'),
    ("chat/completions", '"logprobs": true, "top_logprobs": 1e999'),
    ("chat/completions", '"logprobs": "yes"'),
    ("completions", '"n": -3'), ("completions", '"logprobs": -1'), ("completions", '"logprobs": NaN'),
    ("completions", '"logprobs": 99999999999999999999'), ("completions", '"echo": "yes", "logprobs": 1'),
    ("completions", '"prompt": [' + ", ".join(['"a"'] * 100_000) + ']'),
    ("completions", '"prompt": [[1, 2], [-1]]'), ("completions", '"prompt": [[1e999]]'),
    ("completions", '"prompt": [[100000000000000000000000]]'), ("completions", '"prompt": [1.5, 2]'),
    ("completions", '"prompt": [[1, 2], "text", {"a": 1}]'), ("completions", '"prompt": []'),
]


@pytest.mark.parametrize("path,part", HOSTILE, ids=[f"{p}:{b[:40]}" for p, b in HOSTILE])
def test_hostile_batch_and_logprob_fields_are_a_400_in_openais_shape(client, engine, path, part):
    base = '"model": "%s", "max_tokens": 2' % TINY_DHT_PREFIX
    if path == "chat/completions":
        base += ', "messages": [{"role": "user", "content": "hi"}]'
    elif '"prompt"' not in part:
        base += ', "prompt": "hi"'
    request = urllib.request.Request(f"{client.base_url}{path}", data=("{" + base + ", " + part + "}").encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    busy = engine.slots.load().busy
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    error = refused.value
    body = error.read().decode()
    assert error.code == 400, body
    detail = json.loads(body)["error"]
    assert detail["type"] == "invalid_request_error" and detail["message"], detail
    assert engine.slots.load().busy == busy  # nothing was generated for it
