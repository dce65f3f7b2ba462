"""What the peer scores need, counted by SQL: ``PeerAggregates`` per peer, no row materialized.

The score job used to read a week of observations, reachability checks and chat outcomes into Python for every
peer (``history.histories``: ~24 s and ~150,000 objects at 500 servers). Here the database counts,
and whatever is older than the last hour or two comes from the hourly rollups:

- every window ends now and is split by ``_plan``: the whole hours inside it that are rolled up
  come from the ``hourly_*`` tables, the rest (its first, partial hour and the hours not rolled up
  yet) from raw rows;
- **uptime** per window (1 h, 24 h, 7 d): ONLINE polls per peer and model, and the ok polls since
  the peer was first seen, once per model it served in the week (a poll that did not see it counts
  as down) — ``hourly_observations`` (``polls``, ``online``) and ``hourly_polls`` (``ok_polls``);
- **flaps** in the last day: pairs of consecutive ok polls whose first saw the peer ONLINE for a
  model (chances) and whose second did not (flaps). The rollup counts the pairs inside each hour
  (``departures``: ``hourly_observations.flap_chances`` / ``flaps``); the pairs across hour
  boundaries, in the partial hours and in hours rolled up before those columns existed are
  counted here from raw rows, the same way;
- **reachability checks** of the last day: ok / failed / JOINING counts, the RTT histogram
  (``reachability_bins``, buckets as ``monitor.core.quantiles`` computes them;
  ``hourly_reachability.rtt_bins``) and the latest failure's error (``hourly_reachability.last_error``);
- **chat outcomes** of the week: counts, the histogram of seconds per token per block, the latest
  error; and the latest announced ``inference_rps``.

``scores.aggregate`` is the specification: the same counts from a ``PeerHistory`` (tests check
both give equal scores, on SQLite and PostgreSQL). Memory is bounded by peers × (models +
histogram buckets); the raw rows read are a few hours' worth whatever the history's length. Every
function takes a connection inside a read transaction; the SQL runs on SQLite (≥ 3.35: ``ln``,
``floor``, window functions) and PostgreSQL alike.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core import quantiles
from monitor.core.common import HOUR
from monitor.core.scores import CHAT_WINDOW, FLAP_WINDOW, REACHABILITY_WINDOW, UPTIME_WINDOWS, PeerAggregates, Uptime
from monitor.core.snapshot import ONLINE
from monitor.store.engine import count_if
from monitor.store.hours import floor_hour, raw_pruned_until, rolled_up_until
from monitor.store.schema import (
    ChatOutcomeRow,
    HourlyObservationsRow,
    HourlyPollsRow,
    HourlyReachabilityRow,
    Peer,
    Poll,
    ReachabilityCheckRow,
    ServerObservationRow,
)

Interval = tuple[float, float]  # [start, end), closed at `now` for the interval that ends there
_CHUNK = 400  # ids per IN list, or SELECTs per UNION ALL in departures(): below SQLite's 500 compound terms


@dataclass
class _Window:
    """One window [start, now]: rolled-up hours [hours_from, hours_until), raw intervals for the rest."""

    start: float
    hours_from: float
    hours_until: float  # == hours_from: no hourly part
    raw: list[Interval]


@dataclass
class _Peer:
    """What the queries found about one peer key, before it becomes ``PeerAggregates``."""

    models: set = field(default_factory=set)
    online: list = field(default_factory=lambda: [0] * len(UPTIME_WINDOWS))
    extra_polls: list = field(default_factory=lambda: [0] * len(UPTIME_WINDOWS))  # hourly polls − ok polls
    counts: dict = field(default_factory=dict)  # PeerAggregates' integer fields
    rtt_bins: dict = field(default_factory=dict)  # bucket -> [count, sum], merged as rows come
    speed_bins: dict = field(default_factory=dict)
    reachability_error: tuple = (-math.inf, None)  # (when, error) of the latest failed reachability check
    chat_error: Optional[str] = None
    advertised: Optional[float] = None
    announced: tuple = (-math.inf, None)  # (hour, model) of the latest rolled-up hour with an inference_rps

    def add(self, name: str, n) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(n or 0)


def _histogram(bins: dict) -> quantiles.Histogram:
    return quantiles.from_bins((index, n, total) for index, (n, total) in bins.items())


def peer_aggregates(conn: Connection, now: float) -> list[PeerAggregates]:
    """The aggregates of every peer observed or chatted with in the last week, by peer id."""
    watermark = rolled_up_until(conn)
    windows = [_plan(now - span, now, watermark) for span, _, _ in UPTIME_WINDOWS]
    week = windows[-1]
    polls = _ok_polls(conn, week.start, now)  # (id, at) of the raw ok polls, by time
    peers: dict[int, _Peer] = {}
    _raw_online(conn, windows, polls, now, peers)
    hourly_polls = _hourly_online(conn, windows, peers)
    _chats(conn, now, peers)  # (a peer only chatted with is scored too)
    if not peers:
        return []
    _flaps(conn, _plan(now - FLAP_WINDOW, now, watermark), polls, peers)
    _reachability(conn, _plan(now - REACHABILITY_WINDOW, now, watermark), now, peers)
    _advertised(conn, week, polls, now, peers)
    names = _peer_names(conn, list(peers))
    counter = _Polls.of(polls, hourly_polls)
    result = []
    for key, found in peers.items():
        if key not in names:
            continue
        peer_id, first_seen = names[key]
        uptime = tuple(Uptime(online=found.online[i], polls=found.extra_polls[i] + len(found.models) * counter.since(
            window, first_seen, now)) for i, window in enumerate(windows))
        result.append(PeerAggregates(
            peer_id=peer_id, uptime=uptime, **found.counts,
            reachability_rtt=_histogram(found.rtt_bins), last_reachability_error=found.reachability_error[1],
            chat_speed=_histogram(found.speed_bins), last_chat_error=found.chat_error,
            advertised_inference_rps=found.advertised,
        ))
    return sorted(result, key=lambda agg: agg.peer_id)


# ---- the plan: which part of each window comes from rollups, which from raw rows -------------


def _plan(start: float, now: float, watermark: Optional[float]) -> _Window:
    """Whole hours inside [start, now] that are rolled up come from the rollups, the rest from raw rows."""
    first_hour = floor_hour(start) + (HOUR if floor_hour(start) < start else 0.0)
    until = min(floor_hour(now), watermark) if watermark is not None else first_hour
    if until <= first_hour:
        return _Window(start, first_hour, first_hour, [(start, now)])
    return _Window(start, first_hour, until, ([(start, first_hour)] if start < first_hour else []) + [(until, now)])


def _in(column, intervals: Sequence[Interval], now: float):
    """SQL: ``column`` in any of the intervals."""
    return sa.or_(*(sa.and_(column >= start, column <= end if end >= now else column < end)
                    for start, end in intervals))


def _inside(at: float, intervals: Sequence[Interval], now: float) -> bool:
    return any(start <= at and (at <= end if end >= now else at < end) for start, end in intervals)


def _chunks(items: Sequence, size: int = _CHUNK) -> Iterable[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _ok_polls(conn: Connection, since: float, now: float) -> list[tuple[int, float]]:
    """(id, at) of the ok polls kept raw in [since, now], oldest first (a few thousand at most)."""
    p = Poll.__table__.c
    return [(i, at) for i, at in conn.execute(
        sa.select(p.id, p.at).where(p.ok, p.at >= since, p.at <= now).order_by(p.at, p.id))]


# ---- uptime ----------------------------------------------------------------------------------


def _raw_online(conn: Connection, windows: list[_Window], polls: list[tuple[int, float]], now: float,
                peers: dict[int, _Peer]) -> None:
    """Per (peer, model): ONLINE raw observations in each window's raw intervals (by poll id: the
    observations are indexed by poll)."""
    o = ServerObservationRow.__table__.c
    member = {i: [_inside(at, w.raw, now) for w in windows] for i, at in polls}
    wanted = [i for i, inside in member.items() if any(inside)]
    for chunk in _chunks(wanted):
        per_window = [[i for i in chunk if member[i][k]] for k in range(len(windows))]
        query = sa.select(o.peer, o.model, *(
            count_if(sa.and_(o.state == ONLINE, o.poll_id.in_(ids))) if ids else sa.literal(0)
            for ids in per_window
        )).where(o.poll_id.in_(chunk)).group_by(o.peer, o.model)
        for peer, model, *online in conn.execute(query):
            found = peers.setdefault(peer, _Peer())
            found.models.add(model)
            for k, n in enumerate(online):
                found.online[k] += int(n or 0)


def _hourly_online(conn: Connection, windows: list[_Window], peers: dict[int, _Peer]) -> list[tuple[float, int]]:
    """Per (peer, model): ONLINE polls and (polls − the hour's ok polls) in each window's rolled-up
    hours; returns the (hour, ok polls) of those hours, oldest first."""
    hourly = [w for w in windows if w.hours_until > w.hours_from]
    if not hourly:
        return []
    frm, until = min(w.hours_from for w in hourly), max(w.hours_until for w in hourly)
    h, hp = HourlyObservationsRow.__table__.c, HourlyPollsRow.__table__.c
    ok_polls = sa.func.coalesce(hp.ok_polls, 0)
    columns = []
    for window in windows:
        inside = sa.and_(h.hour >= window.hours_from, h.hour < window.hours_until)
        columns += [sa.func.sum(sa.case((inside, h.online), else_=0)),
                    sa.func.sum(sa.case((inside, h.polls - ok_polls), else_=0))]
    announced = sa.and_(h.mean_inference_rps.is_not(None), h.mean_inference_rps != 0)
    query = (sa.select(h.peer, h.model, sa.func.max(sa.case((announced, h.hour))), *columns)
             .select_from(HourlyObservationsRow.__table__.outerjoin(HourlyPollsRow.__table__, hp.hour == h.hour))
             .where(h.hour >= frm, h.hour < until).group_by(h.peer, h.model))
    for peer, model, announced_hour, *sums in conn.execute(query):
        found = peers.setdefault(peer, _Peer())
        found.models.add(model)
        if announced_hour is not None and announced_hour > found.announced[0]:
            found.announced = (announced_hour, model)
        for k in range(len(windows)):
            found.online[k] += int(sums[2 * k] or 0)
            found.extra_polls[k] += int(sums[2 * k + 1] or 0)
    return [(hour, n) for hour, n in conn.execute(
        sa.select(hp.hour, hp.ok_polls).where(hp.hour >= frm, hp.hour < until).order_by(hp.hour))]


@dataclass(frozen=True)
class _Polls:
    """The ok polls a peer could have been seen by: raw ones by time, rolled-up hours with running
    totals, so a peer's count per window is a few bisections."""

    times: list[float]  # raw ok polls, sorted
    hours: list[float]  # rolled-up hours, sorted
    totals: list[int]  # totals[i]: ok polls in hours[:i]

    @classmethod
    def of(cls, polls: list[tuple[int, float]], hourly: list[tuple[float, int]]) -> "_Polls":
        totals = [0]
        for _, n in hourly:
            totals.append(totals[-1] + (n or 0))
        return cls([at for _, at in polls], [hour for hour, _ in hourly], totals)

    def since(self, window: _Window, first_seen: Optional[float], now: float) -> int:
        """Ok polls in the window at or after ``first_seen`` (a rolled-up hour counts whole if the
        peer was first seen before its end, as the rollup and ``history.histories`` count it)."""
        if first_seen is None:
            return 0
        count = 0
        for start, end in window.raw:
            lo = bisect.bisect_left(self.times, max(start, first_seen))
            hi = bisect.bisect_right(self.times, end) if end >= now else bisect.bisect_left(self.times, end)
            count += max(0, hi - lo)
        lo = bisect.bisect_left(self.hours, max(window.hours_from, first_seen - HOUR + 1e-6))
        hi = bisect.bisect_left(self.hours, window.hours_until)
        return count + max(0, self.totals[hi] - self.totals[lo]) if hi > lo else count


# ---- flaps -----------------------------------------------------------------------------------


def departures(conn: Connection, pairs: Sequence[tuple[int, float]]) -> dict[tuple[int, str], tuple[int, int]]:
    """Per (peer, model): of the ONLINE observations at the first poll of each pair (poll id, time
    of the next ok poll), how many there were (chances) and how many were not ONLINE at the next
    poll (flaps). Also what the hourly rollup stores for the pairs inside each hour."""
    observations = ServerObservationRow.__table__
    following = observations.alias("next_observation")
    o, nxt = observations.c, following.c
    found: dict[tuple[int, str], list[int]] = {}
    for chunk in _chunks(list(pairs)):
        given = sa.union_all(*(sa.select(sa.literal(poll, sa.Integer).label("poll"),
                                         sa.literal(at, sa.Float).label("next_at")) for poll, at in chunk)).subquery()
        query = (sa.select(o.peer, o.model, sa.func.count(), count_if(nxt.peer.is_(None)))
                 .select_from(given.join(observations, o.poll_id == given.c.poll).outerjoin(following, sa.and_(
                     nxt.peer == o.peer, nxt.at == given.c.next_at, nxt.model == o.model, nxt.state == ONLINE)))
                 .where(o.state == ONLINE).group_by(o.peer, o.model))
        for peer, model, chances, flaps in conn.execute(query):
            slot = found.setdefault((peer, model), [0, 0])
            slot[0] += int(chances)
            slot[1] += int(flaps or 0)
    return {key: (chances, flaps) for key, (chances, flaps) in found.items()}


def _flaps(conn: Connection, window: _Window, polls: list[tuple[int, float]], peers: dict[int, _Peer]) -> None:
    """Pairs whose second poll is in the window: inside rolled-up hours from the rollup, the rest
    (across hour boundaries, partial hours, hours rolled up without the counts) from raw rows."""
    h = HourlyObservationsRow.__table__.c
    counted: set[float] = set()
    if window.hours_until > window.hours_from:
        hours = sa.and_(h.hour >= window.hours_from, h.hour < window.hours_until)
        counted = set(conn.execute(sa.select(h.hour).where(hours, h.flap_chances.is_not(None)).distinct()).scalars())
        for peer, chances, flaps in conn.execute(sa.select(h.peer, sa.func.sum(h.flap_chances), sa.func.sum(h.flaps))
                                                 .where(hours, h.flap_chances.is_not(None)).group_by(h.peer)):
            if peer in peers:
                peers[peer].add("flap_chances", chances)
                peers[peer].add("flaps", flaps)
    pairs = [(before, after_at) for (before, before_at), (_, after_at) in zip(polls, polls[1:])
             if after_at >= window.start
             and not (floor_hour(before_at) == floor_hour(after_at)
                      and floor_hour(after_at) in counted)]
    for (peer, _), (chances, flaps) in departures(conn, pairs).items():
        if peer in peers:
            peers[peer].add("flap_chances", chances)
            peers[peer].add("flaps", flaps)


# ---- reachability checks, chats, advertised speed --------------------------------------------


def _bucket(value):
    """SQL: the histogram bucket of a value, as ``quantiles.bucket`` computes it (clamped when merged)."""
    return sa.case((value > quantiles.LOW,
                    sa.cast(sa.func.floor(sa.func.ln(value / quantiles.LOW) * quantiles.SCALE), sa.Integer)),
                   else_=0)


def reachability_bins(conn: Connection, intervals: Sequence[Interval], now: float, *, by_peer: bool = True) -> dict:
    """peer -> {"n", "ok", "joining", "bins": [(bucket, count, sum of RTTs)], "error": (at, error)
    of the latest failure that was not JOINING} over the reachability checks in ``intervals``: what the hourly
    rollup keeps per hour and what the scores count for the partial hours."""
    q = ReachabilityCheckRow.__table__.c
    timed = sa.and_(q.ok, q.rtt.is_not(None))
    where = _in(q.at, intervals, now)
    found: dict[int, dict] = {}
    for peer, index, n, ok, joining, n_timed, total in conn.execute(sa.select(
            q.peer, sa.case((timed, _bucket(q.rtt))), sa.func.count(), count_if(q.ok), count_if(q.joining),
            count_if(timed), sa.func.sum(sa.case((timed, q.rtt), else_=0.0)),
    ).where(where).group_by(q.peer, sa.text("2"))):
        slot = found.setdefault(peer, {"n": 0, "ok": 0, "joining": 0, "bins": [], "error": None})
        slot["n"] += int(n)
        slot["ok"] += int(ok or 0)
        slot["joining"] += int(joining or 0)
        if index is not None and n_timed:
            slot["bins"].append((int(index), int(n_timed), float(total or 0.0)))
    failed = sa.and_(where, ~q.ok, ~q.joining)
    for peer, at, error in _latest(conn, ReachabilityCheckRow.__table__, (q.at, q.error), failed):
        if peer in found:
            found[peer]["error"] = (at, error)
    return found


def _reachability(conn: Connection, window: _Window, now: float, peers: dict[int, _Peer]) -> None:
    raw = list(window.raw)
    if window.hours_until > window.hours_from:
        hp = HourlyReachabilityRow.__table__.c
        pruned = raw_pruned_until(conn)
        for peer, hour, n, ok, joining, bins, error, mean_rtt in conn.execute(sa.select(
                hp.peer, hp.hour, hp.n, hp.ok, hp.joining, hp.rtt_bins, hp.last_error, hp.mean_rtt).where(
                hp.hour >= window.hours_from, hp.hour < window.hours_until)):
            if bins is None and (pruned is None or hour >= pruned):  # rolled up before revision 0008
                raw.append((hour, hour + HOUR))  # (its raw rows are still there: count those)
            elif peer in peers:
                if bins is None:  # (raw rows and histogram pruned: the hour's mean stands for its checks)
                    bins = [quantiles.bucket(mean_rtt), ok, mean_rtt * ok] if mean_rtt and ok else []
                _add_reachability(peers[peer], n, ok, joining, zip(*[iter(bins)] * 3),  # (stored flat: b, n, sum, ...)
                            (hour + HOUR - 1, error) if n - ok - joining > 0 else None)
    for peer, slot in reachability_bins(conn, _merge(raw), now).items():
        if peer in peers:
            _add_reachability(peers[peer], slot["n"], slot["ok"], slot["joining"], slot["bins"], slot["error"])


def prune(conn: Connection, cutoff: float) -> int:
    """Drop the RTT histograms of hours before ``cutoff`` (the raw retention's): the scores read a
    day of them, and they are most of a rolled-up hour's bytes. Returns the rows changed."""
    hp = HourlyReachabilityRow.__table__
    return conn.execute(sa.update(hp).where(hp.c.hour < cutoff, hp.c.rtt_bins.is_not(None))
                        .values(rtt_bins=None)).rowcount


def _add_reachability(found: _Peer, n: int, ok: int, joining: int, bins: Iterable, error: Optional[tuple]) -> None:
    found.add("reachability_ok", ok)
    found.add("reachability_joining", joining)
    found.add("reachability_failed", max(0, n - ok - joining))  # (a JOINING answer is never ok)
    quantiles.merge_bins(found.rtt_bins, bins)
    if error is not None and error[0] > found.reachability_error[0]:
        found.reachability_error = error


def _merge(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _chats(conn: Connection, now: float, peers: dict[int, _Peer]) -> None:
    c = ChatOutcomeRow.__table__.c
    speed = c.seconds_per_token / (c.end - c.start)
    timed = sa.and_(c.ok, c.seconds_per_token.is_not(None), c.end > c.start)
    where = sa.and_(c.at >= now - CHAT_WINDOW, c.at <= now)
    for peer, index, ok, failed, n_timed, total in conn.execute(sa.select(
            c.peer, sa.case((timed, _bucket(speed))), count_if(c.ok), count_if(~c.ok),
            count_if(timed), sa.func.sum(sa.case((timed, speed), else_=0.0)),
    ).where(where).group_by(c.peer, sa.text("2"))):
        found = peers.setdefault(peer, _Peer())
        found.add("chats_ok", ok)
        found.add("chats_failed", failed)
        if index is not None and n_timed:
            quantiles.merge_bins(found.speed_bins, [(int(index), int(n_timed), float(total or 0.0))])
    for peer, _, error in _latest(conn, ChatOutcomeRow.__table__, (c.at, c.error), sa.and_(where, ~c.ok)):
        if peer in peers:
            peers[peer].chat_error = error


def _latest(conn: Connection, table, columns: Sequence, condition) -> list[tuple]:
    """(peer, *columns) of each peer's latest row (by ``at``, then ``id``) matching ``condition``."""
    c = table.c
    ranked = sa.select(c.peer, *columns, sa.func.row_number().over(
        partition_by=c.peer, order_by=(c.at.desc(), c.id.desc())).label("n")).where(condition).subquery()
    return [tuple(row) for row in conn.execute(sa.select(*[col for col in ranked.c if col.name != "n"])
                                               .where(ranked.c.n == 1))]


def _advertised(conn: Connection, week: _Window, polls: list[tuple[int, float]], now: float,
                peers: dict[int, _Peer]) -> None:
    """Each peer's latest announced ``inference_rps``: from the raw rows not rolled up yet, else
    the mean of the latest rolled-up hour that has one (found by ``_hourly_online``; read here by
    primary key)."""
    o = ServerObservationRow.__table__.c
    tail = [i for i, at in polls if _inside(at, week.raw[-1:], now)]
    found: dict[int, float] = {}
    for chunk in _chunks(tail):
        for peer, _, value in _latest(conn, ServerObservationRow.__table__, (o.at, o.inference_rps),
                                      sa.and_(o.poll_id.in_(chunk), o.inference_rps.is_not(None), o.inference_rps != 0)):
            found[peer] = value  # (chunks are in time order: the later one wins)
    keys = [(peer, model, hour) for peer, p in peers.items() if peer not in found
            for hour, model in (p.announced,) if model is not None]
    for chunk in _chunks(keys, 200):  # an OR of primary keys (SQLite scans the table for a row-value IN),
        # as text: SQLAlchemy would compile an expression of 600 parameters anew for every chunk
        where = " OR ".join(f"(peer = :p{i} AND model = :m{i} AND hour = :h{i})" for i in range(len(chunk)))
        values = {f"{name}{i}": value for i, key in enumerate(chunk) for name, value in zip("pmh", key)}
        for peer, value in conn.execute(sa.text(
                f"SELECT peer, mean_inference_rps FROM {HourlyObservationsRow.__tablename__} WHERE {where}"), values):
            found.setdefault(peer, value)
    for peer, value in found.items():
        if peer in peers and value is not None and math.isfinite(value):
            peers[peer].advertised = float(value)


def _peer_names(conn: Connection, keys: list[int]) -> dict[int, tuple[str, Optional[float]]]:
    t = Peer.__table__.c
    return {key: (peer_id, first_seen) for chunk in _chunks(keys)
            for key, peer_id, first_seen in conn.execute(
                sa.select(t.id, t.peer_id, t.first_seen).where(t.id.in_(chunk)))}
