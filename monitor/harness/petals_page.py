"""chat.petals.dev's chat page (its ``chat.js``, CHATBOT regime): what it sends and how it reacts
to an error, written once for whoever replays it — the spec that drives a conversation past 512
tokens (``tests/test_chat_petals_page_flow.py``) and the benchmark that runs 32 of its users
(``scripts/bench_chat_use.py``). Each keeps its own socket loop; the page's words and its rule for
errors are these:

- a session is opened with ``max_length`` 512 (``FIRST_SESSION_LENGTH``);
- a turn sends only the replicas the session has not seen yet, a human's ended by the model's
  separator, an earlier answer by its stop token, with ``max_new_tokens`` 1 (the server streams
  chunks until the stop sequence) and the page's sampling;
- on an error while its user waits, the page resets its session and retries by itself on
  ``Session … expired`` (and a closed connection), grows the session fourfold on
  ``Maximum length exceeded`` up to the model's longest, and otherwise shows the error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

FIRST_SESSION_LENGTH = 512
GROWTH = 4  # the page's session grows fourfold on "Maximum length exceeded"
PAGE_PARAMS = {"do_sample": 1, "temperature": 0.9, "top_p": 0.6}  # the page's sampling
_EXPIRED = re.compile(r"Session .+ expired")


@dataclass(frozen=True)
class PageModel:
    """A model as the page's ``models`` table describes it."""

    max_session_length: int = 8192
    sep_token: str = "\n"
    stop_token: str = "\n"
    extra_stop_sequences: Optional[list] = None


def open_message(model: str, max_length: int) -> dict:
    return {"type": "open_inference_session", "model": model, "max_length": max_length}


def generate_message(replicas: Sequence[Sequence[str]], position: int, page: PageModel) -> tuple[dict, int]:
    """The ``generate`` message for the replicas from ``position`` on (``[kind, text]``, kind
    "human" or "ai"), and the position after them."""
    phrases = []
    for i in range(position, len(replicas)):
        kind, phrase = replicas[i]
        if kind == "human":
            phrase += page.sep_token
        elif i < len(replicas) - 1:
            phrase += page.stop_token
        phrases.append(phrase)
    return ({"type": "generate", "inputs": "".join(phrases), "max_new_tokens": 1, "stop_sequence": page.stop_token,
             "extra_stop_sequences": page.extra_stop_sequences, **PAGE_PARAMS}, len(replicas))


def answer_so_far(text: str, outputs: str, page: PageModel) -> str:
    """The answer shown once ``outputs`` came (the stop token is not shown)."""
    return (text + outputs).replace(page.stop_token, "", 1)


def after_failure(message: str, session_length: int, page: PageModel, *, auto_retry: bool = False) -> tuple[bool, int]:
    """(does the page retry by itself, its session length from now on) after ``message``, for a
    user waiting for an answer."""
    if _EXPIRED.search(message):
        auto_retry = True
    if "Maximum length exceeded" in message and session_length < page.max_session_length:
        return True, min(session_length * GROWTH, page.max_session_length)
    return auto_retry, session_length
