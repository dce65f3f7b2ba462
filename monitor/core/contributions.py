"""The contribution ledger (pure): what every server gave the swarm — measured, not announced.

A server earns for the time between two polls what the first poll's final assessment said of it
(``accrue_poll``; sample and hold, as every history here reads a poll):

- **block-hours announced**: its blocks × the time, while it announced ONLINE (what
  health.petals.dev's "top contributors" counts, kept here only beside what follows);
- **block-hours serving**: the same, only while the stored assessment said *serving*: not
  unreachable, failing, answering wrong, slow, joining or offline. A server that fails, answers
  wrong or cannot be reached earns nothing for that time, whatever it announced;
- **verified block-hours**: serving, with its newest correctness verdict *correct* and at most
  ``VERIFIED_WITHIN`` old (its outputs were compared with the monitor's own blocks, or its peers');
- **uptime**: the share of the time the monitor watched it (from its first poll in the window) that
  it was serving;
- **measured speed**: the time-weighted mean of the probes' seconds per token per block while it
  served (``speed_sum / speed_seconds``);
- **tokens computed for real requests** (``accrue_requests``): each answered request's tokens ×
  the blocks of the hop that went through the server.

Nothing is credited for more than ``MAX_GAP`` after a poll: when the monitor did not look, nobody
measured anything. Increments are per (peer, model, hour) — ``Accrual`` — summed by the store into
an hourly table (the day window), a daily one (``by_day``: week and month) and an all-time one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Iterable, Mapping, Optional, Sequence

from monitor.core.assessment import CAUSE_SERVING, Assessment
from monitor.core.common import DAY, HOUR
from monitor.core.probes import CORRECT
from monitor.core.requests import OK, RequestRecord
from monitor.core.snapshot import ONLINE, ServerRow

MAX_GAP = 300.0  # seconds after a poll that its verdict is credited for, at most
VERIFIED_WITHIN = 1800.0  # a correctness verdict counts for "verified" this long
WINDOWS = (("day", DAY), ("week", 7 * DAY), ("month", 30 * DAY), ("all", None))
WINDOW_NAMES = tuple(name for name, _ in WINDOWS)
SORTS = ("verified", "serving", "announced", "tokens", "uptime")


@dataclass(frozen=True)
class Accrual:
    """What one server earned for one model within one hour (block-seconds and seconds)."""

    peer_id: str
    model: str
    hour: float
    announced: float = 0.0  # block-seconds announced ONLINE
    serving: float = 0.0  # block-seconds the assessment said serving
    verified: float = 0.0  # block-seconds serving with a recent correct verdict
    watched: float = 0.0  # seconds the monitor watched it (announced, in any state)
    serving_seconds: float = 0.0
    speed_seconds: float = 0.0  # seconds serving with a measured speed
    speed_sum: float = 0.0  # measured seconds per token per block × those seconds
    block_tokens: int = 0  # tokens of real requests × the blocks it computed them through
    requests: int = 0  # answered requests whose route went through it


AMOUNTS = tuple(f.name for f in fields(Accrual) if f.name not in ("peer_id", "model", "hour"))


def _hours(start: float, end: float) -> list[tuple[float, float]]:
    """[start, end) cut at hour boundaries: (hour, seconds in it)."""
    out = []
    at = start
    while at < end:
        hour = math.floor(at / HOUR) * HOUR
        upto = min(end, hour + HOUR)
        out.append((hour, upto - at))
        at = upto
    return out


def basis(at: float, servers: Iterable[ServerRow], assessments: Mapping[str, Assessment]) -> dict:
    """What a poll at ``at`` says each server earns until the next one, compactly (a poll keeps it,
    rewritten with each later assessment of the same poll): ``{model: {peer: [blocks, online,
    serving, verified, measured]}}``."""
    out: dict[str, dict[str, list]] = {}
    for row in servers:
        assessment = assessments.get(row.model)
        judged = assessment.servers.get(row.peer_id) if assessment is not None else None
        online = row.state == ONLINE
        serving = online and judged is not None and judged.cause == CAUSE_SERVING
        verdict = judged.verdict if judged is not None else None
        verified = serving and verdict is not None and verdict.verdict == CORRECT and verdict.at >= at - VERIFIED_WITHIN
        measured = (judged.measured if judged is not None and serving and judged.measured is not None
                    and math.isfinite(judged.measured) else None)
        out.setdefault(row.model, {})[row.peer_id] = [max(0, row.end - row.start), int(online), int(serving),
                                                       int(verified), measured]
    return out


def rejudged(kept: Mapping, at: float, assessments: Mapping[str, Assessment]) -> dict:
    """A poll's basis after a later assessment of it: the same servers and spans, judged anew."""
    servers = [ServerRow(peer, model, 0, int(entry[0]), ONLINE if entry[1] else "OFFLINE")
               for model, peers in kept.items() for peer, entry in peers.items()]
    fresh = basis(at, servers, {model: a for model, a in assessments.items() if model in kept})
    return {model: {**peers, **fresh.get(model, {})} for model, peers in kept.items()}


def accrue_basis(start: float, end: float, kept: Mapping) -> list[Accrual]:
    """What the servers of a poll at ``start`` earned until the next poll at ``end`` (at most
    ``MAX_GAP`` later), by that poll's basis (untrusted shape: an entry out of shape earns nothing)."""
    end = min(end, start + MAX_GAP)
    if not end > start or not isinstance(kept, Mapping):
        return []
    cuts = _hours(start, end)
    out = []
    for model, peers in kept.items():
        for peer, entry in (peers.items() if isinstance(peers, Mapping) else ()):
            try:
                blocks, online, serving, verified, measured = entry
                blocks = max(0, int(blocks))
                measured = float(measured) if measured is not None else None
            except (TypeError, ValueError):
                continue
            for hour, seconds in cuts:
                out.append(Accrual(
                    peer_id=str(peer), model=str(model), hour=hour, watched=seconds,
                    announced=blocks * seconds if online else 0.0, serving=blocks * seconds if serving else 0.0,
                    verified=blocks * seconds if verified else 0.0, serving_seconds=seconds if serving else 0.0,
                    speed_seconds=seconds if measured is not None else 0.0,
                    speed_sum=measured * seconds if measured is not None else 0.0))
    return out


def accrue_poll(start: float, end: float, servers: Iterable[ServerRow],
                assessments: Mapping[str, Assessment]) -> list[Accrual]:
    """What the servers a poll at ``start`` saw earned until the next poll at ``end`` (at most
    ``MAX_GAP`` later), by what that poll's assessment of each model said of each of them."""
    return merge(accrue_basis(start, end, basis(start, servers, assessments)))


def accrue_requests(records: Iterable[RequestRecord]) -> list[Accrual]:
    """Real requests' tokens, credited to each server of their routes (tokens × its hop's blocks)."""
    out = []
    for r in records:
        if r.outcome != OK or r.tokens <= 0:
            continue
        hour = math.floor(r.at / HOUR) * HOUR
        for peer, start, end in r.route:
            out.append(Accrual(peer_id=peer, model=r.model, hour=hour, block_tokens=int(r.tokens) * max(0, end - start),
                               requests=1))
    return merge(out)


def merge(accruals: Iterable[Accrual]) -> list[Accrual]:
    """One accrual per (peer, model, hour), the amounts summed."""
    found: dict[tuple, Accrual] = {}
    for a in accruals:
        key = (a.peer_id, a.model, a.hour)
        known = found.get(key)
        found[key] = a if known is None else replace(known, **{k: getattr(known, k) + getattr(a, k) for k in AMOUNTS})
    return list(found.values())


def by_day(accruals: Iterable[Accrual]) -> list[Accrual]:
    """One accrual per (peer, model, UTC day) — its ``hour`` that day's start — the amounts summed."""
    return merge(replace(a, hour=math.floor(a.hour / DAY) * DAY) for a in accruals)


def window_start(window: str, now: float) -> tuple[Optional[float], bool]:
    """Where a window (``WINDOWS``) begins, and whether it is read by days: the last day is the
    last 24 hours and the one going on (hours); a week and a month are the last 7 and 30 whole UTC
    days and the one going on (days); all time has no start."""
    seconds = dict(WINDOWS)[window]
    if seconds is None:
        return None, True
    if seconds <= DAY:
        return math.floor((now - seconds) / HOUR) * HOUR, False
    return math.floor(now / DAY) * DAY - seconds, True


@dataclass(frozen=True)
class Contribution:
    """One server's ledger over a window (of one model, or of all: ``model`` None)."""

    peer_id: str
    model: Optional[str]
    announced_block_hours: float
    serving_block_hours: float
    verified_block_hours: float
    block_tokens: int
    requests: int
    uptime: Optional[float]  # serving / watched; None when never watched
    seconds_per_token_per_block: Optional[float]  # measured, time-weighted; None when never measured
    watched_hours: float
    name: Optional[str] = None  # its announced public name: a claim anyone can make

    def to_dict(self) -> dict:
        short = lambda v: round(v, 4) if isinstance(v, float) else v  # noqa: E731
        return {f.name: short(getattr(self, f.name)) for f in fields(self)}


def contribution(peer_id: str, model: Optional[str], amounts: Mapping[str, float], *,
                 name: Optional[str] = None) -> Contribution:
    """A window's summed amounts (``AMOUNTS``) as a server's contribution."""
    get = lambda key: float(amounts.get(key) or 0.0)  # noqa: E731
    watched = get("watched")
    return Contribution(
        peer_id=peer_id, model=model, announced_block_hours=get("announced") / HOUR,
        serving_block_hours=get("serving") / HOUR, verified_block_hours=get("verified") / HOUR,
        block_tokens=int(get("block_tokens")), requests=int(get("requests")),
        uptime=min(1.0, get("serving_seconds") / watched) if watched > 0 else None,
        seconds_per_token_per_block=get("speed_sum") / get("speed_seconds") if get("speed_seconds") > 0 else None,
        watched_hours=watched / HOUR, name=name)


def ranked(rows: Sequence[Contribution], sort: str = "verified") -> list[Contribution]:
    """The leaderboard: by ``sort`` (``SORTS``), most first; ties by verified, serving, peer id."""
    key = {"verified": lambda c: c.verified_block_hours, "serving": lambda c: c.serving_block_hours,
           "announced": lambda c: c.announced_block_hours, "tokens": lambda c: c.block_tokens,
           "uptime": lambda c: c.uptime or 0.0}[sort]
    return sorted(rows, key=lambda c: (-key(c), -c.verified_block_hours, -c.serving_block_hours, c.peer_id))
