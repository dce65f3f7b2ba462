"""Decoding: what an answer is made of, the loop that generates it, and how a stream of token ids
becomes text that is safe to show.

Tokens arrive one at a time; their text is not final while it ends in an incomplete UTF-8
character or could still grow into a stop sequence, so ``StreamDecoder`` holds such text back
instead of showing (and later taking back) a wrong character. ``decode_steps`` is the loop: the new
input, then one token per step for every row, each chosen from the head's logits, until each row
ended, the budget is spent or the answer is stopped. It steps whatever inference session the model
is used in (``chat.session`` opens it: petals is not imported here); the head and the choice of
each token are the model's shared head steps' (``chat.head_step``, with ``chat.sampling``:
transformers' processors' order and meaning, batched over every answer that is ready). torch is
imported by the functions that need it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from chat.policy import RouteHop
from chat.sampling import RowParams


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability under the model (the head's raw logits, before repetition
    penalty, temperature, top-k or top-p), with the ``top`` most likely tokens at its place."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationParams:
    """temperature 0 means greedy decoding; top_k 0 and top_p 1 switch those filters off.
    ``stop_mode`` "exclude" cuts the text before a stop sequence (OpenAI), "include" keeps it
    (chat.petals.dev). ``logprobs``: each generated token's log-probability, with ``top_logprobs``
    alternatives; ``prompt_logprobs``: the same for every prompt token after the first (scoring:
    OpenAI's ``echo`` with ``logprobs``); ``max_new_tokens`` 0 only scores."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop_sequences: tuple[str, ...] = ()
    stop_mode: str = "exclude"
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass(frozen=True)
class Delta:
    """New text of the answer, and how many tokens it took (held-back tokens included)."""

    text: str
    token_count: int
    logprobs: tuple[TokenLogprob, ...] = ()  # of those tokens, when asked for


@dataclass(frozen=True)
class Finished:
    """The end of an answer: all of it, why it ended, the route it took and how fast it was."""

    text: str  # the whole answer
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop sequence), "length", "cancelled"
    route: tuple[RouteHop, ...]
    time_to_first_token: Optional[float]  # seconds from the start of the answer
    tokens_per_second: Optional[float]  # after the first token
    elapsed: float
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when asked for
    prompt_ids: tuple[int, ...] = ()  # the row's prompt, when its logprobs were asked for
    prompt_logprobs: tuple[Optional[TokenLogprob], ...] = ()  # of prompt_ids (None for the first)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    def stats(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "time_to_first_token": _round(self.time_to_first_token),
            "tokens_per_second": _round(self.tokens_per_second),
            "elapsed": _round(self.elapsed),
            "route": [hop.to_dict() for hop in self.route],
        }


def _round(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


class StreamDecoder:
    """Turns token ids into text deltas, one token at a time.

    Text is emitted only when it is final: not while the tokens so far end in an incomplete UTF-8
    character (the tokenizer decodes those as U+FFFD), nor while its end could still grow into a
    stop sequence. Once a stop sequence appears the answer ends there (cut before it in
    "exclude" mode, after it in "include" mode).
    """

    def __init__(self, tokenizer: Any, *, stop_sequences: Sequence[str] = (), stop_mode: str = "exclude",
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._stops = tuple(s for s in stop_sequences if s)
        self._include = stop_mode == "include"
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self._pending_tokens = 0
        self._pending_logprobs: list[TokenLogprob] = []

    def _decode(self) -> str:
        return self._tokenizer.decode(self.ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

    def _held_back(self, text: str) -> int:
        """Length of the longest end of ``text`` that is a proper start of a stop sequence."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def feed(self, token_id: int, logprob: Optional[TokenLogprob] = None) -> Optional[Delta]:
        if self.stopped:
            return None
        self.ids.append(int(token_id))
        self._pending_tokens += 1
        if logprob is not None:
            self._pending_logprobs.append(logprob)
        text = self._decode()
        found = [(text.find(stop), stop) for stop in self._stops if stop in text]
        if found:
            index, stop = min(found)
            self.stopped = True
            return self._emit(text[: index + len(stop)] if self._include else text[:index])
        if text.endswith("\ufffd"):
            return None
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> Optional[Delta]:
        """Whatever was held back, now that no token follows."""
        if self.stopped:
            return None
        return self._emit(self._decode(), force=True)

    def _emit(self, final: str, force: bool = False) -> Optional[Delta]:
        if len(final) <= len(self.emitted) and not (force and self._pending_tokens):
            return None
        delta = Delta(final[len(self.emitted):], self._pending_tokens, tuple(self._pending_logprobs))
        self.emitted = final if len(final) > len(self.emitted) else self.emitted
        self._pending_tokens = 0
        self._pending_logprobs = []
        return delta


# ---- the loop ---------------------------------------------------------------------------------

SCORE_CHUNK = 64  # prompt positions of one row whose logits are computed at once when scoring a prompt


class Row:
    """One row of an answer: its decoder, its token clock and its log-probabilities."""

    def __init__(self, tokenizer: Any, params: GenerationParams):
        self.decoder = StreamDecoder(tokenizer, stop_sequences=params.stop_sequences, stop_mode=params.stop_mode,
                                     skip_special_tokens=params.skip_special_tokens)
        self.first: Optional[float] = None  # when its first token came
        self.last: Optional[float] = None  # when its latest token came
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[Optional[TokenLogprob]] = []
        self.ended = False  # EOS or a stop sequence

    def timings(self, started: float) -> tuple[Optional[float], Optional[float]]:
        """(seconds to the first token, tokens per second after it; over the whole answer when
        only one token came)."""
        n, first, last = len(self.decoder.ids), self.first, self.last
        ttft = first - started if first else None
        if n >= 2 and last > first:
            return ttft, (n - 1) / (last - first)
        if n and first:
            return ttft, n / (first - started)
        return ttft, None


class AnswerRun:
    """What one answer's decoding loop and its consumer share: the rows, where their text goes
    (``emit``: ``(row, Delta)``) and the two ways to stop (the caller's ``stop_event``;
    ``cancel`` when the consumer leaves). The loop's thread binds ``emit`` and ``cancel``."""

    def __init__(self, tokenizer: Any, params: GenerationParams, n_rows: int, stop_event: Optional[threading.Event]):
        self.rows = [Row(tokenizer, params) for _ in range(n_rows)]
        self.stop_event = stop_event or threading.Event()
        self.cancel = threading.Event()
        self.emit: Callable[[tuple[int, Delta]], None] = lambda item: None
        self.started = time.perf_counter()

    def on_token(self, index: int, token_id: int, logprob: Optional[TokenLogprob], eos: frozenset) -> None:
        row = self.rows[index]
        now = time.perf_counter()
        row.first = row.first or now
        row.last = now
        if logprob is not None:
            row.logprobs.append(logprob)
        delta = row.decoder.feed(token_id, logprob)
        if delta is not None:
            self.emit((index, delta))
        row.ended = row.decoder.stopped or token_id in eos

    def should_stop(self) -> bool:
        return all(row.ended for row in self.rows) or self.stop_event.is_set() or self.cancel.is_set()

    def finish_reason(self, index: int, budget: int) -> str:
        row = self.rows[index]
        if row.ended:
            return "stop"
        if self.stop_event.is_set():
            return "cancelled"
        if len(row.decoder.ids) >= budget:
            return "length"
        return "stop"


def logprob_of(logprobs_row, token_id: int, top: int) -> TokenLogprob:
    """A token's log-probability in one row of log-softmaxed logits, with the ``top`` alternatives."""
    import torch

    alternatives: tuple = ()
    if top:
        values, ids = torch.topk(logprobs_row, top)
        alternatives = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(int(token_id), float(logprobs_row[token_id]), alternatives)


def decode_steps(run: AnswerRun, remote: Any, session: Any, rows: Optional[list[list[int]]], budget: int,
                 params: GenerationParams, *, n_rows: int, eos: frozenset, pad: int, heads: Any) -> None:
    """Step ``session`` (the inference session ``remote`` is used in; its ``output_ids`` are the
    tokens so far): the new input (after the last token, which was generated but not yet sent, as
    petals' ``generate`` does), then one token per step for every row until each row ended, the
    budget is spent or the answer is stopped. The swarm step is this answer's own; the head and
    the choice of the next tokens are ``heads``' (``chat.head_step.HeadSteps``: one batched step
    for every answer of the model that is ready), for the rows that have not ended."""
    import torch

    base = remote.base_model
    device = remote.device
    new = torch.tensor(rows, dtype=torch.long) if rows else torch.zeros((n_rows, 0), dtype=torch.long)
    if session.output_ids is None:
        history = feed = new
    else:
        history = torch.cat([session.output_ids, new], dim=1)
        feed = history[:, session.output_ids.shape[1] - 1:]
    score_prompt = params.prompt_logprobs and session.output_ids is None
    row_params = RowParams(params.temperature, params.top_k, params.top_p, params.repetition_penalty)
    for step in range(max(budget, 1)):
        hidden = base(input_ids=feed.to(device)).last_hidden_state
        if step == 0 and score_prompt:
            _score_prompt(run, heads, hidden, history, params.top_logprobs)
        if not budget:
            session.output_ids = history
            return
        active = [index for index, row in enumerate(run.rows) if not row.ended]
        picked = heads.next_tokens(hidden[active, -1, :], [row_params] * len(active),
                                   [history[index:index + 1] for index in active] if params.repetition_penalty != 1.0
                                   else (), logprobs=params.logprobs, top=params.top_logprobs)
        next_ids = torch.full((n_rows,), pad, dtype=torch.long)
        next_ids[active] = torch.tensor(picked.token_ids, dtype=torch.long)
        history = torch.cat([history, next_ids[:, None]], dim=1)
        session.output_ids = history
        for position, index in enumerate(active):
            logprob = picked.logprobs[position] if picked.logprobs is not None else None
            run.on_token(index, picked.token_ids[position], logprob, eos)
        if run.should_stop():
            return
        feed = next_ids[:, None]


def _score_prompt(run: AnswerRun, heads: Any, hidden, history, top: int) -> None:
    """Each prompt token's log-probability given the ones before it (the first has none), a few
    positions of a row at a time, each its own job among the head steps: a long prompt never holds
    all its logits at once, nor stalls the answers beside it."""
    length = history.shape[1]
    for index, row in enumerate(run.rows):
        row.prompt_logprobs.append(None)
        for start in range(0, length - 1, SCORE_CHUNK):
            end = min(length - 1, start + SCORE_CHUNK)
            row.prompt_logprobs.extend(heads.score(hidden[index, start:end, :], history[index, start + 1:end + 1].tolist(),
                                                   top))
