"""Log-probabilities in OpenAI's two shapes: the chat's ``{"content": [{token, logprob, bytes,
top_logprobs}]}`` and the text completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``.

The engine hands over token ids with their log-probabilities (``chat.decoding.TokenLogprob``);
here they become text. A token's text is what it adds to the text before it (decoded with a few
tokens of context, so a SentencePiece word keeps its leading space); a token that is only part of
a UTF-8 character has no text of its own: the chat shape gives its bytes, the completions shape
OpenAI's ``bytes:\\xNN`` spelling. ``text_offset`` counts those texts from the start of the choice's
text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional, Sequence

from chat.decoding import TokenLogprob

CONTEXT_TOKENS = 6  # tokens decoded before a token to find what it adds (a UTF-8 character spans at most 4)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """Text and bytes of token ids with one tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def texts(self, ids: Sequence[int], before: Sequence[int] = ()) -> list[str]:
        """What each of ``ids`` adds to the text, after the tokens ``before`` them."""
        ids = list(ids)
        context = list(before)[-CONTEXT_TOKENS:]
        out = []
        for i, token in enumerate(ids):
            window = (context + ids[:i])[-CONTEXT_TOKENS:]
            head = self._decode(window) if window else ""
            whole = self._decode(window + [token])
            out.append(whole[len(head):] if whole.startswith(head) and not head.endswith("\ufffd") else
                       self._decode([token]))
        return out

    def token_bytes(self, token_id: int, text: str) -> list[int]:
        """The token's bytes: its text's, unless it is part of a character (then its own byte(s))."""
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        match = _BYTE_TOKEN.fullmatch(piece or "")
        if match:
            return [int(match.group(1), 16)]
        decoder = _byte_decoder()
        if piece and all(ch in decoder for ch in piece):
            return [decoder[ch] for ch in piece]
        return list(text.encode("utf-8"))

    def spelled(self, token_id: int, text: str) -> str:
        """The completions shape's token string (OpenAI's ``bytes:\\xNN`` for part of a character)."""
        if "\ufffd" not in text:
            return text
        return "bytes:" + "".join(f"\\x{b:02x}" for b in self.token_bytes(token_id, text))


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins for bytes (GPT-2's table), back to the bytes."""
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


def chat_content(texts: TokenTexts, logprobs: Sequence[TokenLogprob], before: Sequence[int], top: int) -> list[dict]:
    """The chat shape's ``content`` list for these tokens (``before``: the tokens preceding them)."""
    ids = [lp.token_id for lp in logprobs]
    token_texts = texts.texts(ids, before)
    items = []
    for i, (lp, text) in enumerate(zip(logprobs, token_texts)):
        alternatives = []
        for alt_id, alt_lp in lp.top[:top]:
            alt_text = texts.texts([alt_id], list(before) + ids[:i])[0]
            alternatives.append({"token": alt_text, "logprob": alt_lp, "bytes": texts.token_bytes(alt_id, alt_text)})
        items.append({"token": text, "logprob": lp.logprob, "bytes": texts.token_bytes(lp.token_id, text),
                      "top_logprobs": alternatives})
    return items


def completion_logprobs(texts: TokenTexts, logprobs: Sequence[Optional[TokenLogprob]], ids: Sequence[int],
                        before: Sequence[int], top: int, offset: int = 0) -> dict:
    """The completions shape for tokens ``ids`` (their ``logprobs``; None for a prompt's first
    token), their text starting at ``offset`` characters into the choice's text."""
    token_texts = texts.texts(ids, before)
    result: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for i, (token_id, lp, text) in enumerate(zip(ids, logprobs, token_texts)):
        result["tokens"].append(texts.spelled(token_id, text))
        result["text_offset"].append(offset)
        offset += len(text)
        if lp is None:
            result["token_logprobs"].append(None)
            result["top_logprobs"].append(None)
            continue
        result["token_logprobs"].append(lp.logprob)
        context = list(before) + list(ids[:i])
        alternatives: dict = {}
        for alt_id, alt_lp in lp.top[:top]:
            alt_text = texts.texts([alt_id], context)[0]
            alternatives.setdefault(texts.spelled(alt_id, alt_text), alt_lp)
        result["top_logprobs"].append(alternatives)
    return result


def merged(first: Optional[dict], second: dict) -> dict:
    """Two completions-shape parts (an echoed prompt, then its completion) as one."""
    if not first:
        return second
    return {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
