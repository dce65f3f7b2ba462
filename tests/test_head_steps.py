"""Spec: the chat's own compute (README: The chat's own compute) — one head step for every answer of
a model that is ready, its numerics checked against the reference implementations: petals' own
``LMHead`` computing one answer at a time (what the chat did before), and transformers' logits
processors (what ``generate`` does) for the choice of the next token.

Pure: no swarm. The real-swarm specs of the same (answers joining, leaving and failing over
mid-way through a wide head) are in tests/test_wide_head.py.
"""

from __future__ import annotations

import threading

import pytest
import torch
from petals.client.lm_head import LMHead
from transformers import (LlamaConfig, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from chat.head_step import HeadSteps
from chat.sampling import RowParams, distribution, next_tokens, penalize, sample

VOCAB = 128256
HIDDEN = 256

CASES = [  # temperature, top_k, top_p
    (1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 50, 1.0), (1.3, 40, 0.8), (0.5, 0, 0.5), (2.0, 0, 0.999), (0.9, 3, 0.95),
    (1.0, 0, 0.0),
]


def reference_distribution(scores, temperature, top_k, top_p):
    """transformers' warpers, in generate's order, then the softmax ``generate`` draws from."""
    warped = scores.clone()
    for warper in ([TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else []) +
                   ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])):
        warped = warper(None, warped)
    return torch.softmax(warped, dim=-1)


def test_every_sampled_row_follows_the_law_transformers_warpers_give_it():
    torch.manual_seed(0)
    scores = torch.randn(len(CASES), VOCAB) * 3
    scores[1, :5] += 12  # a peaked row: top-p keeps a handful
    ours = distribution(scores.clone(), [RowParams(t, k, p) for t, k, p in CASES])
    for row, (t, k, p) in enumerate(CASES):
        expected = reference_distribution(scores[row:row + 1], t, k, p)[0]
        # the same tokens kept, but at a top-p cut through the flat tail of 128,256 probabilities,
        # where float32 sums in another order may cross it a few tokens of 2e-7 apart
        differ = (ours[row] > 0) != (expected > 0)
        if differ.any():
            boundary = expected[expected > 0].min() if p < 1.0 else 0.0
            assert p < 1.0 and float((ours[row] + expected)[differ].sum()) < 1e-5, f"row {row} keeps other tokens"
            assert float((ours[row] + expected)[differ].max()) <= 1.01 * float(boundary) + 1e-9, f"row {row}: not at the cut"
        assert torch.allclose(ours[row], expected, atol=1e-6), f"row {row} ({t}, {k}, {p})"


def test_draws_come_from_that_law():
    torch.manual_seed(1)
    scores = torch.randn(2, 12) * 2
    params = [RowParams(1.0, 0, 1.0), RowParams(0.8, 5, 0.9)]
    law = distribution(scores.clone(), params)
    draws = torch.stack([sample(scores.clone(), params) for _ in range(4000)])
    for row in range(2):
        seen = torch.bincount(draws[:, row], minlength=12).float() / len(draws)
        assert torch.all(seen[law[row] == 0] == 0), "a draw fell outside the kept tokens"
        assert torch.allclose(seen, law[row], atol=0.03), (seen, law[row])


def test_the_repetition_penalty_is_transformers_and_greedy_rows_take_the_argmax():
    torch.manual_seed(2)
    scores = torch.randn(3, 1000)
    history = torch.randint(0, 1000, (3, 40))
    expected = RepetitionPenaltyLogitsProcessor(1.3)(history, scores.clone())
    ours = scores.clone()
    for row in range(3):
        penalize(ours[row:row + 1], history[row:row + 1], 1.3)
    assert torch.equal(ours, expected)
    chosen = next_tokens(scores.clone(), [RowParams(repetition_penalty=1.3)] * 3, [history[i:i + 1] for i in range(3)])
    assert chosen.tolist() == torch.argmax(expected, dim=-1).tolist()


def petals_head(weight) -> LMHead:
    """petals' own head over ``weight`` (what one answer at a time computed before)."""
    config = LlamaConfig(vocab_size=weight.shape[0], hidden_size=weight.shape[1], tie_word_embeddings=False)
    config.use_chunked_forward, config.chunked_forward_step = "auto", 16384
    head = LMHead(config)
    head.weight = torch.nn.Parameter(weight, requires_grad=False)
    return head


@pytest.mark.parametrize("dtype, tolerance, chunked", [(torch.float32, 1e-5, False), (torch.bfloat16, 1e-2, False),
                                                       (torch.bfloat16, 1e-5, True)])
def test_rows_of_a_shared_step_equal_petals_head_one_answer_at_a_time(dtype, tolerance, chunked):
    """Answers of 1 to 3 rows each, handed in from their own threads at once, in float32 and
    bfloat16 (on this CPU's bfloat16 kernels, and as petals computes bfloat16 without them)."""
    torch.manual_seed(3)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.05).to(dtype)
    reference = petals_head(weight)
    reference.use_chunked_forward = chunked
    heads = HeadSteps("m", weight, chunked=chunked)
    answers = [torch.randn(1 + i % 3, HIDDEN).to(dtype) for i in range(12)]  # (the final norm's output, in its precision)
    got: dict[int, torch.Tensor] = {}
    start = threading.Barrier(len(answers))

    def answer(index):
        start.wait()
        got[index] = heads.logits_of(answers[index])

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(len(answers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    heads.close()
    assert heads.stats.steps < len(answers), "no step was shared"
    with torch.no_grad():
        for index, hidden in enumerate(answers):
            for row in range(hidden.shape[0]):
                alone = reference(hidden[row:row + 1]).float()[0]
                assert torch.allclose(got[index][row], alone, atol=tolerance, rtol=0), \
                    f"answer {index} row {row}: {float((got[index][row] - alone).abs().max())}"


class HeldSteps(HeadSteps):
    """Head steps whose first step waits until the spec lets it go: what is handed in meanwhile
    must form the next step, all of it, and nothing waits for a window."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.first_running, self.release = threading.Event(), threading.Event()
        self.sizes: list[int] = []

    def logits(self, hidden):
        self.sizes.append(hidden.shape[0])
        if len(self.sizes) == 1:
            self.first_running.set()
            self.release.wait(10)
        return super().logits(hidden)


def test_what_queues_while_a_step_runs_forms_the_next_step():
    weight = torch.randn(1000, 32)
    heads = HeldSteps("m", weight)
    first = threading.Thread(target=heads.logits_of, args=(torch.randn(1, 32),))
    first.start()
    assert heads.first_running.wait(10)
    later = [threading.Thread(target=heads.logits_of, args=(torch.randn(2, 32),)) for _ in range(5)]
    for thread in later:
        thread.start()
    while len(heads._queue) < 5:
        threading.Event().wait(0.005)
    heads.release.set()
    for thread in [first, *later]:
        thread.join(10)
    heads.close()
    assert heads.sizes == [1, 10]
    assert (heads.stats.steps, heads.stats.rows) == (2, 11)


def test_a_failing_answer_costs_only_itself():
    heads = HeadSteps("m", torch.randn(100, 8))
    ok = heads.next_tokens(torch.randn(1, 8), [RowParams()])
    with pytest.raises(IndexError):
        heads.score(torch.randn(1, 8), [1000])  # a target outside the vocabulary
    again = heads.next_tokens(torch.randn(2, 8), [RowParams(), RowParams(1.0, 5, 0.9)])
    heads.close()
    assert len(ok.token_ids) == 1 and len(again.token_ids) == 2
    assert all(0 <= t < 100 for t in again.token_ids)
