"""Generation checks: what the monitor got when it generated a few tokens itself, end to end.

Reachability checks and probes test each server alone; a *generation check* tests what a user
gets: a fixed prompt, a few tokens, through the chat's own engine, routing and session code
(``monitor/app/generation_check.py``). It catches what no per-server view shows: a route that
breaks between servers, a model whose every block is served but whose answer is garbage, servers
that are up and announced but fail every step. A model may name the answer it expects (``expect``:
a regular expression, matched case-insensitively anywhere in the answer, as Uptime Kuma's and
Gatus' keyword checks do): an answer that does not match is a failure too.

Plain data and pure functions: the check as stored (``GenerationCheck``), the judgement of its
answer, the one-line summary the pages show, and how long a check stays news.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Optional

from monitor.core.common import short_peer_id
from monitor.core.timefmt import ago, duration

ANSWER_CHARS = 200  # of the answer kept with a check (and shown in its failure)
EXPECT_CHARS = 200  # the longest expected-answer pattern
FAILURE_CHARS = 300  # the longest failure text stored
NAMED_SERVERS = 3  # servers named in one failure text; the rest are counted
# A check older than this many check periods says nothing about now (the job stopped, or cannot
# load the model): readers treat the model as not checked rather than trust it.
MAX_AGE_PERIODS = 3.0


@dataclass(frozen=True)
class RouteSpan:
    """One server's span of a check's route; ``error``: the error that server failed a step with
    (petals then routed around it, or the check failed), None if it answered."""

    peer_id: str
    start: int
    end: int
    error: Optional[str] = None


@dataclass(frozen=True)
class GenerationCheck:
    """One generation check of one model (``model``: its dht_prefix)."""

    model: str
    at: float  # unix seconds, when it started
    ok: bool  # tokens came and the answer matched ``expect`` (if any)
    error: Optional[str] = None  # why not, for people (the servers' own errors, or the mismatch)
    answer: Optional[str] = None  # the text generated (first ANSWER_CHARS characters)
    expect: Optional[str] = None  # the pattern the answer was matched against
    matched: Optional[bool] = None  # None: no pattern, or no answer
    time_to_first_token: Optional[float] = None  # seconds, prompt and first token
    tokens_per_second: Optional[float] = None  # after the first token
    tokens: int = 0  # tokens generated
    duration: Optional[float] = None  # seconds the whole check took
    route: tuple[RouteSpan, ...] = ()  # the spans it went through, then those that failed a step

    @property
    def route_peers(self) -> tuple[str, ...]:
        """Peers of the spans that answered (the route taken), in route order."""
        return tuple(span.peer_id for span in self.route if span.error is None)

    @property
    def failed_peers(self) -> tuple[str, ...]:
        """Peers that failed a step of this check with an error of their own."""
        return tuple(dict.fromkeys(span.peer_id for span in self.route if span.error is not None))


def compile_expect(pattern: Optional[str]) -> Optional[re.Pattern]:
    """The compiled pattern (case-insensitive), None for none; ``ValueError`` naming the problem."""
    if pattern is None or pattern == "":
        return None
    if len(pattern) > EXPECT_CHARS:
        raise ValueError(f"the expected answer pattern has {len(pattern)} characters, at most {EXPECT_CHARS}")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a regular expression: {e}") from None


def judge_answer(check: GenerationCheck, expect: Optional[str]) -> GenerationCheck:
    """``check`` (which generated ``answer``) judged against ``expect``: without a pattern any
    answer is ok; an answer that does not match is a failure, "answer did not match /Paris/: '…'"."""
    compiled = compile_expect(expect)
    if compiled is None or not check.ok:
        return replace(check, expect=expect or None)
    answer = check.answer or ""
    if compiled.search(answer):
        return replace(check, expect=expect, matched=True)
    return replace(check, expect=expect, matched=False, ok=False,
                   error=f"answer did not match /{expect}/: {answer[:ANSWER_CHARS]!r}")


def servers_failed(spans: Iterable[RouteSpan]) -> Optional[str]:
    """One sentence of the servers' own errors, grouped by message, at most ``NAMED_SERVERS``
    servers named ("…a1b2c3 (0:8), …d4e5f6 (0:8) failed: CUDA error: out of memory"); None if none."""
    by_error: dict[str, list[str]] = {}
    for span in spans:
        if span.error is None:
            continue
        name = f"{short_peer_id(span.peer_id)} ({span.start}:{span.end})"
        names = by_error.setdefault(span.error, [])
        if name not in names:
            names.append(name)
    if not by_error:
        return None
    parts, named = [], 0
    for error, names in by_error.items():
        shown = names[: max(0, NAMED_SERVERS - named)]
        named += len(shown)
        rest = len(names) - len(shown)
        if shown:
            who = ", ".join(shown) + (f" and {rest} more" if rest else "")
        else:
            who = f"{rest} more server{'s' if rest != 1 else ''}"
        parts.append(f"{who} failed: {error}")
    text = "; ".join(parts)
    return text if len(text) <= FAILURE_CHARS else text[: FAILURE_CHARS - 1] + "…"


def _speed(tokens_per_second: float) -> str:
    return f"{tokens_per_second:.0f}" if tokens_per_second >= 10 else f"{tokens_per_second:.1f}"


def summary(check: Optional[GenerationCheck], now: float) -> str:
    """One line for the pages: "generation ok · 17 tok/s · first token 400 ms · 2 min ago",
    "generation failed: ‹error›", or "generation not checked yet" ("failing" is a server's word)."""
    if check is None:
        return "generation not checked yet"
    if not check.ok:
        return f"generation failed: {check.error or 'the check failed'}"
    parts = ["generation ok"]
    if check.tokens_per_second is not None:
        parts.append(f"{_speed(check.tokens_per_second)} tok/s")
    if check.time_to_first_token is not None:
        parts.append(f"first token {duration(check.time_to_first_token)}")
    parts.append(ago(check.at, now))
    return " · ".join(parts)


def is_current(check: Optional[GenerationCheck], now: float, period: float) -> bool:
    """Whether ``check`` still says something about now: newer than ``MAX_AGE_PERIODS`` periods."""
    return check is not None and now - check.at <= MAX_AGE_PERIODS * period
