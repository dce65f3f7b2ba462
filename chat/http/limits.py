"""What one visitor may make the chat do, beyond the per-client rate limits (``monitor.web.limits``).

A public chat is shared and scarce: every answer holds a place in the swarm, every prompt costs
tokenizer time before the model's context can be checked, every open WebSocket holds an inference
session, and the chat page keeps conversations in memory. So, for every API alike:

- a prompt's characters are counted before it is tokenized (``ChatLimits.check_prompt_chars``),
  and a list of token ids is bounded by the model's context before it is read (``check_token_ids``);
- a WebSocket session ends after ``ws_idle_timeout`` seconds without a request, and after
  ``ws_max_lifetime`` seconds in all, and the client is told why (``WsClock``) in chat.petals.dev's
  own words for it, "Session <id> expired: <why>", on which its page opens a new session by itself;
- the chat page keeps each visitor's conversations apart, at most ``conversations_per_visitor``
  per visitor and ``max_visitors`` visitors (``chat.http.page``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from chat.errors import InvalidRequest, check_fits_context


@dataclass(frozen=True)
class ChatLimits:
    max_prompt_chars: int = 100_000
    ws_idle_timeout: float = 300.0
    ws_max_lifetime: float = 3600.0
    conversations_per_visitor: int = 4
    max_visitors: int = 500

    @classmethod
    def from_settings(cls, settings: Any) -> "ChatLimits":
        return cls(max_prompt_chars=settings.max_prompt_chars, ws_idle_timeout=settings.ws_idle_timeout,
                   ws_max_lifetime=settings.ws_max_lifetime,
                   conversations_per_visitor=settings.chat_conversations_per_visitor,
                   max_visitors=settings.chat_max_visitors)

    def check_prompt_chars(self, param: str, n_chars: int, *, what: str = "") -> None:
        """Refuse a prompt longer than ``max_prompt_chars`` characters; call it before tokenizing."""
        if n_chars > self.max_prompt_chars:
            raise InvalidRequest(param, f"{what or param} is {n_chars} characters long; at most "
                                        f"{self.max_prompt_chars} characters are accepted here: shorten it")


def check_token_ids(param: str, ids: Sequence[Any], context: int) -> None:
    """Refuse a list of token ids that cannot fit the model's context, before reading its items."""
    check_fits_context(param, len(ids), context, unit="token ids")


class WsClosing(Exception):
    """The server ends a WebSocket session; ``str(e)`` tells the client why, ``reason`` is the
    limit it reached ("idle", "lifetime", "evicted") as /metrics counts it."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class WsClock:
    """A WebSocket session's time limits: idle (no request for ``ws_idle_timeout`` s) and lifetime
    (``ws_max_lifetime`` s since it opened). ``label`` names the session in what the client is told."""

    def __init__(self, limits: ChatLimits, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.idle, self.lifetime = limits.ws_idle_timeout, limits.ws_max_lifetime
        self.deadline = clock() + limits.ws_max_lifetime

    def receive_timeout(self) -> float:
        """How long the next receive may wait."""
        return max(0.0, min(self.idle, self.deadline - self._clock()))

    def expired(self) -> bool:
        return self._clock() >= self.deadline

    def remaining(self) -> float:
        """Seconds the session may still last."""
        return max(0.0, self.deadline - self._clock())

    def closing(self, label: str) -> WsClosing:
        """Why a receive that timed out ends the session."""
        if self.expired():
            return self.over(label)
        return WsClosing(f"Session {label} expired: no request for {self.idle:g} s (idle timeout); "
                         f"open a new session to go on", "idle")

    def over(self, label: str) -> WsClosing:
        return WsClosing(f"Session {label} expired: it reached its maximum lifetime of {self.lifetime:g} s; "
                         f"open a new session to go on", "lifetime")
