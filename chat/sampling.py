"""The next token of many rows at once, from their logits: transformers' order and meaning, batched.

``generate`` applies, per row, the repetition penalty to the head's raw logits, then either takes the
argmax (greedy) or divides by the temperature, keeps the top-k and then the top-p of what is left,
and draws from the softmax. Done one row at a time over a 128,256-token vocabulary that costs a sort
of the whole vocabulary per row (8 ms) and a draw from it (2 ms): more than the head step itself for
16 answers. Here every sampled row of a head step is handled together: one softmax, one
``topk`` that grows until it holds every token a row's top-k/top-p keeps (the same tokens as
transformers' sort would keep), and a draw over the kept few; rows with no filter draw by the
inverse of their cumulative distribution. ``distribution`` is the law every draw follows (what the
specs compare with transformers' own warpers); greedy rows are one batched argmax.

Parameters differ per row (each answer has its own), so they come as one ``RowParams`` per row.
torch is imported by the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

FIRST_K = 64  # the first top-k taken for a filtered row; it grows until it holds the kept tokens


@dataclass(frozen=True)
class RowParams:
    """How one row's next token is chosen (``chat.decoding.GenerationParams``' sampling fields)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


def penalize(scores, history, penalty: float) -> None:
    """transformers' ``RepetitionPenaltyLogitsProcessor``, in place on ``scores`` ([rows, vocab])
    for the tokens of ``history`` ([rows, tokens]): a seen token's logit is divided by the penalty
    when positive, multiplied when negative."""
    import torch

    if penalty == 1.0 or history is None or history.shape[1] == 0:
        return
    history = history.to(scores.device)
    seen = torch.gather(scores, 1, history)
    scores.scatter_(1, history, torch.where(seen < 0, seen * penalty, seen / penalty))


def _vectors(params: Sequence[RowParams], device: Any):
    import torch

    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    top_k = torch.tensor([p.top_k for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    return temperature, top_k, top_p


def _kept(probs, top_k, top_p):
    """(probabilities, token ids, kept mask) of the smallest prefix of each row's most likely
    tokens that holds every token its top-k and then top-p keep (transformers' TopK then TopP: a
    token is kept while the mass before it, among the top-k, is below top_p; the first always)."""
    import torch

    vocab = probs.shape[-1]
    k = min(vocab, max(FIRST_K, int(top_k.max()) if top_k.numel() else 0))
    ranks = None
    while True:
        values, ids = torch.sort(probs, dim=-1, descending=True) if k >= vocab else torch.topk(probs, k, dim=-1)
        if ranks is None or ranks.shape[-1] != k:
            ranks = torch.arange(k, device=probs.device)[None, :]
        in_k = (top_k[:, None] <= 0) | (ranks < top_k[:, None])
        inside = values * in_k
        mass = torch.where(top_k > 0, inside.sum(-1), torch.ones_like(top_p))  # top-p among the top-k's mass
        before = (torch.cumsum(inside, -1) - inside) / mass[:, None]
        keep = in_k & ((top_p[:, None] >= 1.0) | (before < top_p[:, None]))
        keep[:, 0] = True
        # enough when no row keeps its last candidate while more tokens could follow it
        unsure = keep[:, -1] & ((top_k <= 0) | (top_k > k))
        if k >= vocab or not bool(unsure.any()):
            return values, ids, keep
        # a row whose candidates hold less than half of its top-p is flat: it needs much of the
        # vocabulary, so sort it all at once; else take more, at twice the mass per token of its last
        covered = (inside.sum(-1) / mass)[unsure]
        if float((covered / top_p[unsure]).min()) < 0.5:
            k = vocab
        else:
            wanted = float((top_p[unsure] - covered).clamp(min=0).max()) / max(float(values[unsure, -1].min()), 1e-12)
            k = min(vocab, max(4 * k, int(k + 2 * wanted)))
            k = vocab if k > vocab // 8 else k


def _law(scores, params: Sequence[RowParams]):
    """What ``distribution`` and ``sample`` share: the tempered probabilities ([rows, vocab]), which
    rows are filtered (top-k or top-p), and those rows' ``_kept`` candidates (None: no such row)."""
    import torch

    temperature, top_k, top_p = _vectors(params, scores.device)
    probs = torch.softmax(scores / temperature[:, None], dim=-1)
    filtered = (top_k > 0) | (top_p < 1.0)
    rows = filtered.nonzero().squeeze(1)
    kept = _kept(probs[rows], top_k[rows], top_p[rows]) if rows.numel() else None
    return probs, filtered, kept


def _draw(weights, generator: Optional[Any] = None):
    """One index per row of ``weights`` ([rows, n], not normalised), by the inverse of their
    cumulative distribution (a draw from 128,256 tokens by ``torch.multinomial`` costs 2 ms a row)."""
    import torch

    cumulative = torch.cumsum(weights, dim=-1)
    draw = torch.rand((weights.shape[0], 1), generator=generator, device=weights.device) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, draw).squeeze(1).clamp(max=weights.shape[-1] - 1)


def distribution(scores, params: Sequence[RowParams]):
    """The probability of every token for every sampled row ([rows, vocab]), after temperature,
    top-k and top-p: what ``sample`` draws from (the specs compare it with transformers')."""
    import torch

    probs, filtered, kept = _law(scores, params)
    if kept is not None:
        values, ids, keep = kept
        weights = values * keep
        rows = filtered.nonzero().squeeze(1)
        probs[rows] = torch.zeros_like(probs[rows]).scatter_(1, ids, weights / weights.sum(-1, keepdim=True))
    return probs


def sample(scores, params: Sequence[RowParams], generator: Optional[Any] = None):
    """One token id per row ([rows] long), drawn from ``distribution``: over the whole vocabulary for
    unfiltered rows, over the kept tokens only for the others (the kept are a prefix of the
    candidates, so their order is the draw's)."""
    import torch

    probs, filtered, kept = _law(scores, params)
    chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
    plain = (~filtered).nonzero().squeeze(1)
    if plain.numel():
        chosen[plain] = _draw(probs[plain], generator)
    if kept is not None:
        values, ids, keep = kept
        picked = _draw(values * keep, generator)
        chosen[filtered.nonzero().squeeze(1)] = ids.gather(1, picked[:, None]).squeeze(1)
    return chosen


def next_tokens(logits, params: Sequence[RowParams], histories: Sequence[Any] = (), generator: Optional[Any] = None):
    """The next token of every row of ``logits`` ([rows, vocab] float32, changed in place by the
    repetition penalty): each row's penalty over its ``histories[i]`` ([1, tokens], or None), then one
    batched argmax for the greedy rows and one batched draw for the others."""
    import torch

    for index, row in enumerate(params):
        if row.repetition_penalty != 1.0 and index < len(histories) and histories[index] is not None:
            penalize(logits[index:index + 1], histories[index], row.repetition_penalty)
    chosen = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    greedy = [i for i, row in enumerate(params) if row.greedy]
    sampled = [i for i, row in enumerate(params) if not row.greedy]
    if greedy:
        index = torch.tensor(greedy, device=logits.device)
        chosen[index] = torch.argmax(logits[index], dim=-1)
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        chosen[index] = sample(logits[index], [params[i] for i in sampled], generator)
    return chosen
