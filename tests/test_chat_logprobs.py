"""Spec: log-probabilities on both OpenAI endpoints (README: Chat APIs), on the session swarm,
checked against the tiny model computed locally from its checkpoint by transformers.

The model's head runs in the chat's process, so each generated token's log-probability (and the
``top_logprobs`` most likely tokens at its place) comes from the same logits that chose it; ``echo``
with ``logprobs`` scores the prompt too (``max_tokens`` 0: only scores it), the way evaluation
harnesses such as lm-evaluation-harness call an OpenAI completions API. All bounded.
"""

from __future__ import annotations

import openai
import pytest
import torch
from flask import Flask
from openai import OpenAI
from transformers import AutoModelForCausalLM

from chat.engine import ChatEngine
from chat.http import create_blueprint
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from support import MESSAGES, serve

PROMPT = "The capital of France is"
TOLERANCE = 1e-4  # float32 through the swarm's blocks against the same blocks here


@pytest.fixture(scope="module")
def client(swarm, tiny_model):
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], max_logprobs=20)
    app = Flask(__name__)
    app.register_blueprint(create_blueprint(engine))
    with serve(app) as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Log-softmax of the tiny model's logits at every position of a token sequence, computed here."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits.float(), dim=-1)[0]

    return logprobs


def token_bytes(token: str) -> bytes:
    """A completions-shape token's bytes (OpenAI spells part of a character ``bytes:\\xNN``)."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:])
    return token.encode()


def test_a_text_completions_logprobs_equal_the_models_own(client, local, reference):
    tokenizer, greedy = local
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    generated, _ = greedy(prompt_ids, 12)
    local_lp = reference(prompt_ids + generated)
    reply = client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=5)
    choice = reply.choices[0]
    token_logprobs = choice.logprobs.token_logprobs
    assert len(token_logprobs) == len(choice.logprobs.tokens) == len(generated) == 12
    for i, (token, logprob) in enumerate(zip(generated, token_logprobs)):
        position = len(prompt_ids) - 1 + i  # the logits that chose token i
        assert abs(logprob - float(local_lp[position, token])) < TOLERANCE
        top = choice.logprobs.top_logprobs[i]
        expected_top = local_lp[position].topk(5).values.tolist()
        assert len(top) == 5 and sorted(top.values(), reverse=True) == pytest.approx(expected_top, abs=TOLERANCE)
        assert abs(max(top.values()) - logprob) < TOLERANCE  # greedy: the most likely one
    assert b"".join(token_bytes(t) for t in choice.logprobs.tokens).decode("utf-8", "replace") == choice.text
    offsets = choice.logprobs.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets)


def test_echo_with_logprobs_scores_the_prompt_like_an_evaluation_harness(client, local, reference):
    """lm-evaluation-harness's loglikelihood: context + continuation as token ids, echo, max_tokens 0."""
    tokenizer, _ = local
    context = tokenizer("Paris is the capital of")["input_ids"]
    continuation = tokenizer(" France", add_special_tokens=False)["input_ids"]
    ids = context + continuation
    scored = client.completions.create(model=TINY_DHT_PREFIX, prompt=[ids], max_tokens=0, echo=True, logprobs=1,
                                       temperature=0)
    logprobs = scored.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing before the first
    assert len(logprobs.token_logprobs) == len(ids) and scored.usage.completion_tokens == 0
    local_lp = reference(ids)
    for i in range(1, len(ids)):
        assert abs(logprobs.token_logprobs[i] - float(local_lp[i - 1, ids[i]])) < TOLERANCE
    continuation_logprob = sum(logprobs.token_logprobs[len(context):])
    expected = sum(float(local_lp[i - 1, ids[i]]) for i in range(len(context), len(ids)))
    assert abs(continuation_logprob - expected) < TOLERANCE * len(continuation)

    both = client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPT, max_tokens=4, echo=True, logprobs=0,
                                     temperature=0)  # the prompt, then its completion
    choice = both.choices[0]
    n_prompt = len(tokenizer(PROMPT)["input_ids"])
    assert choice.text.startswith(PROMPT) and len(choice.logprobs.token_logprobs) == n_prompt + 4
    assert choice.logprobs.token_logprobs[0] is None and all(t == {} for t in choice.logprobs.top_logprobs[1:])


def test_chat_logprobs_and_top_logprobs_equal_the_models_own_also_streamed(client, local, reference):
    tokenizer, greedy = local
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    generated, _ = greedy(prompt_ids, 10)
    local_lp = reference(prompt_ids + generated)
    reply = client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=10, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == len(generated) == 10
    assert b"".join(bytes(i.bytes) for i in content).decode("utf-8", "replace") == reply.choices[0].message.content
    for i, (token, item) in enumerate(zip(generated, content)):
        position = len(prompt_ids) - 1 + i
        assert abs(item.logprob - float(local_lp[position, token])) < TOLERANCE
        expected_top = local_lp[position].topk(3).values.tolist()
        assert [t.logprob for t in item.top_logprobs] == pytest.approx(expected_top, abs=TOLERANCE)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token or "\ufffd" in item.token

    streamed = list(client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=10,
                                                   temperature=0, logprobs=True, top_logprobs=3, stream=True))
    streamed_items = [item for chunk in streamed for choice in chunk.choices if choice.logprobs
                      for item in choice.logprobs.content]
    assert [(i.token, round(i.logprob, 5)) for i in streamed_items] == [(i.token, round(i.logprob, 5)) for i in content]


def test_logprobs_are_bounded(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=2, logprobs=True,
                                       top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPT, max_tokens=2, logprobs=21)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=TINY_DHT_PREFIX, messages=MESSAGES, max_tokens=2, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=TINY_DHT_PREFIX, prompt=PROMPT, max_tokens=0)  # 0 only to score (echo)
