"""Spec: batched requests (README: Chat APIs) on the session swarm, through the ``openai`` client.

``n`` answers of one prompt are one petals inference session of ``n`` rows (its batch dimension);
a list of prompts runs its equal-length ones as one session and the others side by side; greedy
rows equal the single-request answer token for token; choices are numbered prompt by prompt,
streamed chunks carry their choice's index, and usage counts every row.
"""

from __future__ import annotations

import time

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
