"""What an answer is made of, and how a stream of token ids becomes text that is safe to show.

Tokens arrive one at a time; their text is not final while it ends in an incomplete UTF-8
character or could still grow into a stop sequence, so ``StreamDecoder`` holds such text back
instead of showing (and later taking back) a wrong character. Plain data and tokenizer calls only:
no petals, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from chat.policy import RouteHop


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
