"""What can go wrong with a chat request, as exceptions the HTTP side maps to one status each.

Raised by the engine and by the request checks alike, so that every API refuses the same problem
with the same status and the same message. ``str(e)`` is written for people: what failed, with
what value, and what to do; never internals.
"""

from __future__ import annotations

from typing import Optional, Sequence


class ChatError(Exception):
    """Base of every refusal and failure the chat reports to its user."""

    status = 500


class InvalidRequest(ChatError):
    """A parameter is missing or wrong; ``param`` names it (None: the request as a whole)."""

    status = 400

    def __init__(self, param: Optional[str], message: str):
        super().__init__(message)
        self.param = param


def check_fits_context(param: str, tokens: int, context: int, *, what: Optional[str] = None, unit: str = "tokens",
                       hint: str = "") -> None:
    """The chat's one context-length check: an input of ``tokens`` tokens must leave the model's
    ``context`` room for at least one token more; else ``InvalidRequest`` naming ``param``, the
    figures and (``hint``) what to do."""
    if tokens >= context:
        raise InvalidRequest(param, f"{what or param} is {tokens} {unit}; the model's context is {context} tokens, "
                                    f"so at most {context - 1} fit{hint and '; ' + hint}")


class MaxLengthExceeded(InvalidRequest):
    """A session's ``max_length`` is used up. The message starts with petals' own words, "Maximum
    length exceeded", on which chat.petals.dev's page opens a longer session by itself."""

    def __init__(self, detail: str):
        super().__init__("max_length", f"Maximum length exceeded: {detail}")


class SessionTooLong(InvalidRequest):
    """A session longer than any route's servers accept (their ``inference_max_length``, learned
    from their refusals): ``param`` names what asked for the length. Not petals' "Maximum length
    exceeded", on which chat.petals.dev's page would ask for a longer one again."""

    def __init__(self, model: str, param: str, length: int, longest: int, prompt_tokens: int = 0):
        fits = (f"ask for at most {longest - prompt_tokens} new tokens" if 0 < prompt_tokens < longest else
                f"keep the prompt and the answer within {longest} tokens")
        super().__init__(param, f"the request needs a session of {length} tokens (prompt and answer), but the "
                                f"servers of {model!r} accept sessions of at most {longest} tokens (their "
                                f"inference_max_length): {fits}")
        self.longest = longest


class RouteUnmet(ChatError):
    """A request's routing choices (``monitor.core.route_choice``) no route can meet now: ``param``
    names the choice, the message what the swarm offers instead."""

    status = 422

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class UnknownModel(ChatError):
    status = 404

    def __init__(self, name: str, known: Sequence[str]):
        listed = ", ".join(repr(k) for k in known) or "none"
        super().__init__(f"unknown model {name!r}; models here: {listed}")


class ModelNotServed(ChatError):
    """Some block of the model has no usable server (``missing_blocks``, when known)."""

    status = 503

    def __init__(self, name: str, reason: str, missing_blocks: Sequence[int] = ()):
        super().__init__(f"model {name!r} is not fully served: {reason}")
        self.reason, self.missing_blocks = reason, list(missing_blocks)


class Busy(ChatError):
    """Every chat session is in use and the queue is full (or waited too long)."""

    status = 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class ServersFull(Busy):
    """The servers of every route hold other sessions in their attention caches, and none made room
    for this one in time: the swarm is busy, not broken (``monitor.core.common.cache_full``)."""

    def __init__(self, model: str, waited: float, retry_after: int = 60):
        super().__init__(f"the servers of {model!r} have no room in their attention caches for this session now "
                         f"(they hold other sessions, and none made room within {waited:.0f} s); retry in "
                         f"{retry_after} s", retry_after)


class SessionExpired(ChatError):
    """A kept-open session was ended by the chat (idle, evicted to make room, or too old). The
    message has chat.petals.dev's shape, "Session <id> expired: <why>", on which its page opens a
    new session by itself and carries on."""

    status = 410

    def __init__(self, label: str, detail: str):
        super().__init__(f"Session {label} expired: {detail}")
        self.label, self.detail = label, detail


class GenerationFailed(ChatError):
    """The swarm failed while answering (after petals' own retries)."""

    status = 503
