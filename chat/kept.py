"""Sessions kept after an answer, so that a follow-up of the same client sends only what is new.

Petals servers keep a session's attention caches only while it is open. An answer's session used
to close when the answer ended, and every follow-up sent its whole conversation through the swarm
again (a 10-turn conversation's first token came 22× later at turn 10 than at turn 1). Now an
answered one-row request's session stays open — **kept** — for ``keep_seconds`` (under the
servers' own idle limit, petals' ``step_timeout`` of 5 minutes), and each answer carries a
**handle** to it: an opaque, unguessable string (``secrets``), bound to the client it was given to.

- **Never across clients.** A kept session is continued only by a request that sends its handle
  back from the client it was given to (``owner``: its address, or its API key); anything else —
  no handle, an unknown or used one, another client's — starts a fresh session, silently (a wrong
  handle is never an error that tells anything). A prefix cache shared between clients would tell
  one, by timing, what another asked.
- **Taken once.** ``take`` removes the entry under the lock: one request at a time continues a
  session, and each answer gets a new handle (the old one is spent).
- **Always right.** A follow-up continues only when what it sends begins with what the session
  holds (``continuation``): its earlier turns are the session's own tokens where their text is what
  the session generated — a chat template re-tokenising an answer's text would rarely give the same
  ids — and what is new is tokenised after them. Otherwise, or when the route it would continue on
  costs more than a fresh one, prefill included (``worth_continuing``), a fresh session starts.
- **Bounded.** Kept sessions are members of the chat's open sessions (``chat.capacity.
  OpenSessions``, kept flag): they count against ``max_open_sessions`` and the client's share, are
  the first to let go when room is needed, and hold cache on their servers but no slot.

Pure but for threads and clocks (the sessions themselves are ``chat.session.ChatSession``)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

logger = logging.getLogger(__name__)

HANDLE_BYTES = 24  # of randomness in a handle (32 URL-safe characters)
MAX_HANDLE_CHARS = 100  # a longer "handle" is not one of ours: ignored unread
DEFAULT_KEEP_SECONDS = 240.0  # petals servers drop a session idle for 5 minutes (their step_timeout)
DEFAULT_HEADROOM = 1024  # tokens a kept-eligible session is opened with beyond what its answer needs
SWEEP_EVERY = 5.0  # seconds between two looks for kept sessions past their time
MAX_AGE = 25 * 60.0  # seconds a petals session is continued at most (servers end one after 30 minutes in all)
PREFILL_SHARE = 0.05  # a prompt token's prefill, in decode steps (on the demo: 4.4 ms against ~100 ms)

# why a request with a handle did not continue (the /metrics reasons)
HIT, NO_HANDLE, UNKNOWN, OTHER_MODEL, OTHER_CHOICE, PREFIX, NO_ROOM, SLOWER, GONE, NOT_KEPT = (
    "continued", "no_handle", "unknown", "other_model", "other_choice", "prefix", "no_room", "slower", "gone",
    "never")  # (never: the request cannot continue at all: several answers, prompt scoring, keeping off)
REASONS = (HIT, UNKNOWN, OTHER_MODEL, OTHER_CHOICE, PREFIX, NO_ROOM, SLOWER, GONE, NOT_KEPT)


@dataclass(frozen=True)
class FollowUp:
    """What a request brings to continue the session of the answer it follows: the ``handle`` that
    answer carried, and its prompt in the shape matching needs — one of:

    - ``text``: a text prompt, whole (it must begin with the earlier prompt and its answer);
    - ``before``, ``answer``, ``after``: a chat's rendering cut around the previous answer — the
      rendering up to it, the answer as the client sent it back, the rendering after it;
    - ``ids``: a prompt of token ids."""

    handle: str
    text: Optional[str] = None
    before: Optional[str] = None
    answer: Optional[str] = None
    after: Optional[str] = None
    ids: Optional[tuple[int, ...]] = None


@dataclass(frozen=True)
class Rendered:
    """How the prompt of a kept session's last answer was written, for its follow-up to be matched
    against: its text (None: it was sent as token ids) — a chat's rendering with the generation
    prompt, a text prompt as sent."""

    text: Optional[str]


@dataclass
class Kept:
    """One kept session: whose it is, what it answered last, until when it is kept."""

    handle: str
    owner: Optional[str]
    model: str
    choice: Any  # the request's RouteChoice: a follow-up with other choices starts fresh
    session: Any  # chat.session.ChatSession
    rendered: Rendered
    answer_ids: tuple[int, ...]  # the tokens of its last answer (the last of them not sent yet)
    answer_text: str  # that answer as its client got it
    until: float


@dataclass(frozen=True)
class Resumed:
    """A kept session taken by a follow-up: what to send through it (``new_ids``: the token that
    replaces its last, not-yet-sent one, then the rest) and how many tokens it did not send again."""

    kept: Kept
    new_ids: tuple[int, ...]
    not_resent: int
    rendered: Optional[str]  # the text the session holds once the new ids are in (``rendered_after``)


def continuation(kept: Kept, follow: FollowUp, *, decode: Callable[[Sequence[int]], str],
                 encode: Callable[[str], list[int]], committed: Sequence[int]) -> Optional[tuple[int, ...]]:
    """The token ids that follow the session's ``committed`` ids (all it sent its servers: every id
    but the last answer's last) in ``follow``'s prompt, or None when that prompt does not begin with
    what the session holds. ``decode``: ids to text, special tokens kept; ``encode``: text to ids,
    no special tokens added. The first id returned takes the place of the answer's last token."""
    if follow.ids is not None:
        ids = tuple(follow.ids)
        if len(ids) <= len(committed) or ids[:len(committed)] != tuple(committed):
            return None
        return ids[len(committed):]
    earlier = kept.rendered.text
    if earlier is None:
        return None
    if follow.text is not None:
        if not follow.text.startswith(earlier):
            return None
        since = follow.text[len(earlier):]
    elif follow.before is not None and follow.answer is not None and follow.after is not None:
        if not follow.before.startswith(earlier) or not _same_answer(follow.answer, kept.answer_text):
            return None
        # the client's copy of the answer is the session's own text (clients may strip it)
        since = follow.before[len(earlier):] + kept.answer_text + follow.after
    else:
        return None
    generated = decode(list(kept.answer_ids[:-1]))  # what the session sent of its answer
    if not since.startswith(generated):
        return None
    rest = since[len(generated):]
    new_ids = tuple(encode(rest)) if rest else ()
    return new_ids or None


def rendered_after(kept: Kept, follow: FollowUp) -> Optional[str]:
    """The text a session holds once it continued with ``follow`` (what its next follow-up must
    begin with): the follow-up's prompt, with the session's own text of its answer; None for ids."""
    if follow.ids is not None:
        return None
    if follow.text is not None:
        return follow.text
    return follow.before + kept.answer_text + follow.after


def _same_answer(sent: str, generated: str) -> bool:
    return sent == generated or sent.strip() == generated.strip()


def worth_continuing(kept_route_seconds: Optional[float], fresh_route_seconds: Optional[float], *, new_tokens: int,
                     all_tokens: int, max_tokens: int) -> bool:
    """Whether continuing on the kept session's route is expected to take no longer than a fresh
    session on the best route now: seconds per token of each route (the sum over its hops of its
    blocks' seconds per block, measured where known, by health), times the tokens each would
    prefill (``PREFILL_SHARE`` of a step each: the follow-up's new ones, or all of them) and
    generate. A kept route whose servers are gone (None) is not worth it; an unknown fresh route
    is (nothing says otherwise)."""
    if kept_route_seconds is None:
        return False
    if fresh_route_seconds is None:
        return True
    kept_cost = kept_route_seconds * (PREFILL_SHARE * new_tokens + max_tokens)
    fresh_cost = fresh_route_seconds * (PREFILL_SHARE * all_tokens + max_tokens)
    return kept_cost <= fresh_cost


def new_handle(worker: Optional[str] = None) -> str:
    """A new handle; ``worker``: this chat worker's tag (``chat_worker``), its prefix, so that a proxy
    can send the follow-up to the worker that keeps the session (README: Several chat workers)."""
    token = secrets.token_urlsafe(HANDLE_BYTES)
    return f"{worker}.{token}" if worker else token


@dataclass(frozen=True)
class KeptLoad:
    """What /metrics shows of kept sessions: how many are kept now, and per model the follow-ups
    that continued one or started fresh, and why."""

    kept: int
    outcomes: dict = field(default_factory=dict)  # (model, reason) -> follow-ups


class KeptSessions:
    """The kept sessions of this process, by handle (see the module's docstring). ``registry``:
    the chat's open sessions (``OpenSessions``), which bound them; ``keep_seconds`` 0 keeps none."""

    def __init__(self, registry: Any, *, keep_seconds: float = DEFAULT_KEEP_SECONDS,
                 clock: Callable[[], float] = time.monotonic, sweep_every: float = SWEEP_EVERY):
        self.registry = registry
        self.keep_seconds = max(0.0, float(keep_seconds))
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, Kept] = {}
        self._outcomes: Counter = Counter()
        self._sweep_every = sweep_every
        self._sweeper: Optional[threading.Thread] = None
        self._closed = threading.Event()

    @property
    def enabled(self) -> bool:
        return self.keep_seconds > 0

    # -- keeping -------------------------------------------------------------------------------
    def keep(self, handle: str, *, owner: Optional[str], model: str, choice: Any, session: Any, rendered: Rendered,
             answer_ids: Sequence[int], answer_text: str) -> bool:
        """Keep ``session`` (answered, one row, open) under ``handle`` for ``owner``; False, and the
        session closed, when keeping is off or no room is left (a kept session never displaces a
        conversation held open, ``OpenSessions.admit``)."""
        if not self.enabled or not answer_ids or self._closed.is_set():
            session.close()
            return False
        if not self.registry.admit(session, owner, kept=True):
            session.close()
            return False
        entry = Kept(handle, owner, model, choice, session, rendered, tuple(answer_ids), answer_text,
                     self._clock() + self.keep_seconds)
        session.on_expire = lambda: self._forget(handle, session)
        leave_load = getattr(session, "leave_load", None)
        if leave_load is not None:  # (idle: cache use on its servers, not load)
            leave_load()
        with self._lock:
            self._kept[handle] = entry
        self._start_sweeping()
        return True

    def take(self, handle: Optional[str], *, owner: Optional[str], model: str, choice: Any) -> tuple[Optional[Kept], str]:
        """(the kept session ``handle`` names, taken out for this request; or None) and why: it is
        taken only by its owner, for its model and routing choice, while it is kept. A session
        taken but not continued is the taker's to close."""
        if not handle:
            return None, NO_HANDLE
        if not isinstance(handle, str) or len(handle) > MAX_HANDLE_CHARS:
            return None, UNKNOWN
        with self._lock:
            entry = self._kept.get(handle)
            if entry is None or entry.owner != owner or entry.until <= self._clock():
                return None, UNKNOWN  # (another client's handle is told apart from nothing)
            del self._kept[handle]
        entry.session.on_expire = None
        self.registry.remove(entry.session)
        if entry.model != model:
            return entry, OTHER_MODEL
        if entry.choice != choice:
            return entry, OTHER_CHOICE
        if entry.session.closed or not entry.session.holds_cache or time.monotonic() - entry.session.opened_at > MAX_AGE:
            return entry, GONE  # (it let go of its servers' caches for another session, or is near their limit)
        return entry, HIT

    def count(self, model: str, reason: str) -> None:
        with self._lock:
            self._outcomes[(model, reason)] += 1

    def _forget(self, handle: str, session: Any) -> None:
        """The registry let go of a kept session (room for another): it is no longer kept."""
        with self._lock:
            entry = self._kept.get(handle)
            if entry is not None and entry.session is session:
                del self._kept[handle]

    # -- letting go ----------------------------------------------------------------------------
    def sweep(self) -> int:
        """Close the kept sessions past their time; how many."""
        now = self._clock()
        with self._lock:
            done = [entry for entry in self._kept.values() if entry.until <= now]
            for entry in done:
                del self._kept[entry.handle]
        for entry in done:
            self._let_go(entry, "kept")
        return len(done)

    def _let_go(self, entry: Kept, reason: str) -> None:
        entry.session.on_expire = None
        self.registry.remove(entry.session, reason)
        entry.session.close()

    def _start_sweeping(self) -> None:
        with self._lock:
            if self._sweeper is not None or self._closed.is_set():
                return
            self._sweeper = threading.Thread(target=self._sweep_loop, name="kept-sessions", daemon=True)
        self._sweeper.start()

    def _sweep_loop(self) -> None:
        while not self._closed.wait(self._sweep_every):
            try:
                self.sweep()
            except Exception as e:  # noqa: BLE001 - the next sweep tries again
                logger.warning("closing kept sessions failed: %r", e)

    def close(self) -> None:
        """Close every kept session (the process ends)."""
        self._closed.set()
        with self._lock:
            entries = list(self._kept.values())
            self._kept.clear()
        for entry in entries:
            self._let_go(entry, "kept")

    def load(self) -> KeptLoad:
        with self._lock:
            return KeptLoad(kept=len(self._kept), outcomes=dict(self._outcomes))
