"""A request's own routing choices (pure): which peers its route may use, what it sorts by, and the
bounds it sets on what it gets — in OpenAI requests as a ``petals`` object, in chat.petals.dev's
``open_inference_session`` as the same fields.

- ``only`` / ``ignore``: peer ids the route may use only / never (at most ``MAX_PEERS`` each);
- ``sort``: ``speed`` (measured seconds per token only), ``score`` (health score only),
  ``latency`` (petals' own costs: fewest hops and lowest pings); absent: the monitor's weighing of
  both health and speed;
- ``min_tokens_per_s`` / ``max_time_to_first_token``: bounds on what the best route that meets the
  other choices is expected to give (``unmet``, before the request takes a slot);
- ``verified_only``: only servers whose correctness probes passed within the probe window;
- ``allow_fallbacks`` (default true): a server that fails mid-answer may be replaced by another
  allowed one; false: the request fails instead.

The operator's pinned and blocked peers bound every choice: a request can narrow what the chat
may use, never widen it. A choice nobody can meet is refused before any token (``Unmet``: the
field, and what the swarm offers instead); a bad value is a ``ChoiceError`` naming its field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Iterable, Mapping, Optional

from monitor.core.assessment import format_ranges, ranges

SORTS = ("speed", "latency", "score")
MAX_PEERS = 64  # peer ids in ``only`` or ``ignore``
PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{20,128}")  # base58, as libp2p writes peer ids
FIELDS = ("only", "ignore", "sort", "min_tokens_per_s", "max_time_to_first_token", "verified_only",
          "allow_fallbacks")
MAX_TOKENS_PER_S = 1e6
MAX_SECONDS = 3600.0


class ChoiceError(ValueError):
    """A bad value: ``field`` names it (``petals.sort``, ...)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RouteChoice:
    only: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    sort: Optional[str] = None
    min_tokens_per_s: Optional[float] = None
    max_time_to_first_token: Optional[float] = None
    verified_only: bool = False
    allow_fallbacks: bool = True

    @property
    def directed(self) -> bool:
        """It names the servers it runs on (``only``): its load is bounded per server."""
        return bool(self.only)

    @property
    def empty(self) -> bool:
        return self == RouteChoice()

    def to_dict(self) -> dict:
        return {"only": list(self.only), "ignore": list(self.ignore), "sort": self.sort,
                "min_tokens_per_s": self.min_tokens_per_s, "max_time_to_first_token": self.max_time_to_first_token,
                "verified_only": self.verified_only, "allow_fallbacks": self.allow_fallbacks}


def parse_choice(value: Any, *, field: str = "petals", fields: Mapping[str, Any] | None = None) -> RouteChoice:
    """A ``RouteChoice`` from a JSON object (``value``; None: no choice), or ``ChoiceError`` naming
    ``field.<name>``. ``fields``: the same fields given at the top level of a message instead
    (chat.petals.dev's ``open_inference_session``); then ``field`` is their prefix ("")."""
    if fields is not None:
        value = {name: fields[name] for name in FIELDS if fields.get(name) is not None}
    if value is None:
        return RouteChoice()
    name = (lambda key: f"{field}.{key}") if field else (lambda key: key)
    if not isinstance(value, Mapping):
        raise ChoiceError(field, f"{field} must be an object of routing choices ({', '.join(FIELDS)})")
    unknown = sorted(str(key) for key in value if key not in FIELDS)
    if unknown:
        raise ChoiceError(name(unknown[0]), f"{name(unknown[0])[:80]} is not a routing choice; "
                                            f"known: {', '.join(FIELDS)}")
    only, ignore = _peers(value.get("only"), name("only")), _peers(value.get("ignore"), name("ignore"))
    if set(only) & set(ignore):
        raise ChoiceError(name("ignore"), f"{name('ignore')} names peers that {name('only')} allows: "
                                          f"{sorted(set(only) & set(ignore))[0]}")
    sort = value.get("sort")
    if sort is not None and sort not in SORTS:
        raise ChoiceError(name("sort"), f"{name('sort')} must be one of {', '.join(SORTS)}, got {_shown(sort)}")
    return RouteChoice(
        only=only, ignore=ignore, sort=sort,
        min_tokens_per_s=_positive(value.get("min_tokens_per_s"), name("min_tokens_per_s"), MAX_TOKENS_PER_S),
        max_time_to_first_token=_positive(value.get("max_time_to_first_token"), name("max_time_to_first_token"),
                                          MAX_SECONDS),
        verified_only=_flag(value.get("verified_only"), name("verified_only"), False),
        allow_fallbacks=_flag(value.get("allow_fallbacks"), name("allow_fallbacks"), True))


def _shown(value: Any) -> str:
    return repr(value)[:40]


def _peers(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ChoiceError(field, f"{field} must be a list of peer ids")
    if len(value) > MAX_PEERS:
        raise ChoiceError(field, f"{field} names {len(value)} peers; at most {MAX_PEERS}")
    for peer in value:
        if not isinstance(peer, str) or not PEER_ID.fullmatch(peer):
            raise ChoiceError(field, f"{field} must hold peer ids (base58, as the dashboard shows them), "
                                     f"got {_shown(peer)}")
    return tuple(dict.fromkeys(value))


def _positive(value: Any, field: str, most: float) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most:
        raise ChoiceError(field, f"{field} must be a number greater than 0 and at most {most:g}, got {_shown(value)}")
    return float(value)


def _flag(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ChoiceError(field, f"{field} must be true or false, got {_shown(value)}")
    return value


# ---- which peers a route may use -------------------------------------------------------------------


def allowed(choice: RouteChoice, peers: Iterable[str], *, verified: Iterable[str] = (),
            blocked: Iterable[str] = (), pinned: Iterable[str] = ()) -> set[str]:
    """The peers (of ``peers``) a route of this choice may use: the operator's bounds (``pinned``:
    only those, if any; never ``blocked``) narrowed by the request's own."""
    found = set(peers) - set(blocked)
    if pinned := set(pinned):
        found &= pinned
    if choice.only:
        found &= set(choice.only)
    found -= set(choice.ignore)
    if choice.verified_only:
        found &= set(verified)
    return found


def missing(spans: Mapping[str, tuple[int, int]], num_blocks: int, peers: Iterable[str]) -> list[int]:
    """The blocks none of ``peers`` serves (``spans``: peer -> [start, end))."""
    covered: set[int] = set()
    for peer in peers:
        if peer in spans:
            start, end = spans[peer]
            covered.update(range(max(0, start), min(num_blocks, end)))
    return [block for block in range(num_blocks) if block not in covered]


RouteSeconds = Callable[[AbstractSet[str]], Optional[float]]
"""Seconds per token of the best route through some peers over every block, as the one route
estimator prices it (``monitor.core.coverage.route_speed``: petals' own min-latency routing, measured
speeds in place of announced ones); None when they do not cover every block or it cannot say. The
caller supplies it: this module is pure."""


@dataclass(frozen=True)
class Unmet:
    """A choice nobody can meet: the field, and what the swarm offers instead."""

    field: str
    message: str


def unmet(choice: RouteChoice, *, spans: Mapping[str, tuple[int, int]], num_blocks: int,
          route_seconds: RouteSeconds, allowed_peers: Iterable[str], all_peers: Iterable[str],
          time_to_first_token: Optional[float], wait: float = 0.0, field: str = "petals") -> Optional[Unmet]:
    """Why no route can meet ``choice`` now, if none can: the blocks its peers leave unserved, or
    the best allowed route's expected speed or first token against the bounds (``route_seconds``:
    the one route estimator's price of the best route through some peers).
    ``time_to_first_token``: what the model's requests get on their usual route (the forecast's),
    scaled by how much slower the allowed route is; ``wait``: the queue's wait before it."""
    name = (lambda key: f"{field}.{key}") if field else (lambda key: key)
    allowed_peers, all_peers = set(allowed_peers), set(all_peers)
    gaps = missing(spans, num_blocks, allowed_peers)
    if gaps:
        which = name("only") if choice.only else name("verified_only") if choice.verified_only else name("ignore")
        others = sorted(all_peers - allowed_peers)
        offered = f"; the swarm serves them through {', '.join(p[-8:] for p in others[:5])}" if others else ""
        return Unmet(which, f"no route meets {which}: blocks {format_ranges(ranges(gaps))} are served by none of the peers it "
                            f"allows{offered}")
    if choice.min_tokens_per_s is None and choice.max_time_to_first_token is None:
        return None
    route = route_seconds(frozenset(allowed_peers))
    usual = route_seconds(frozenset(all_peers))
    if route is None or usual is None or not (0 < route < float("inf")) or not (0 < usual < float("inf")):
        return None  # not known well enough to tell: let the request try
    if choice.min_tokens_per_s is not None and 1.0 / route < choice.min_tokens_per_s:
        return Unmet(name("min_tokens_per_s"),
                     f"no route meets {name('min_tokens_per_s')} {choice.min_tokens_per_s:g}: the best route it may "
                     f"take is expected at {1.0 / route:.3g} tokens/s")
    if choice.max_time_to_first_token is not None and time_to_first_token is not None:
        expected = wait + time_to_first_token * route / usual
        if expected > choice.max_time_to_first_token:
            return Unmet(name("max_time_to_first_token"),
                         f"no route meets {name('max_time_to_first_token')} {choice.max_time_to_first_token:g} s: "
                         f"the first token is expected after {expected:.3g} s"
                         + (f" ({wait:.3g} s of it waiting for a slot)" if wait >= 0.5 else ""))
    return None

