"""Reads over a time range: a model's status, state changes, outages and block coverage, and each
peer's observations, reachability checks and chat outcomes (``PeerHistory``, what the scores take).

Where raw rows are kept every poll is one row; before that every rolled-up hour is one
(``hours.rollup_window``), so a range of any length costs at most one row per poll of the last
``raw_retention_days`` plus one per hour before. Every function takes a connection inside a read
transaction.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR
from monitor.core.assessment import BROKEN
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ChatOutcome, Observation, PeerHistory
from monitor.store.latest import reachability_result, status_dict
from monitor.store.hours import floor_hour, mean, raw_start, rollup_window
from monitor.store.schema import (
    BlockCoverageRow,
    ChatOutcomeRow,
    HourlyBlockCoverageRow,
    HourlyModelStatusRow,
    HourlyObservationsRow,
    HourlyPollsRow,
    ModelStateChangeRow,
    ModelStatusRow,
    Peer,
    Poll,
    ReachabilityCheckRow,
    ServerObservationRow,
)


class StateChange(NamedTuple):
    at: float
    from_state: Optional[str]
    to_state: str
    reasons: tuple[str, ...]


# ---- models ----------------------------------------------------------------------------------


def model_status_history(conn: Connection, model: str, since: float, until: float) -> list[dict]:
    """Oldest first: one dict per poll where raw rows are kept, one per hour before that.

    Every dict has ``at, state, reasons, coverage_pct, servers_online, min_redundancy,
    est_tokens_per_s, samples, states`` (an hour's ``state`` is the worst it saw, ``states``
    counts polls per state, the numbers are hourly means except ``min_redundancy``)."""
    raw_from = raw_start(conn)
    h, s = HourlyModelStatusRow.__table__, ModelStatusRow.__table__
    hourly = conn.execute(sa.select(h).where(
        h.c.model == model, *rollup_window(h.c.hour, since, until, raw_from)).order_by(h.c.hour)).mappings().all()
    raw = conn.execute(sa.select(s).where(s.c.model == model, s.c.at >= since, s.c.at <= until)
                       .order_by(s.c.at, s.c.id)).mappings().all()
    out = [{"at": r["hour"], "state": r["worst_state"], "reasons": list(r["reasons"] or ()),
            "coverage_pct": r["mean_coverage_pct"], "servers_online": r["mean_servers_online"],
            "min_redundancy": r["min_redundancy"], "est_tokens_per_s": r["mean_tokens_per_s"],
            "samples": r["samples"], "states": dict(r["states"] or {})} for r in hourly]
    out.extend({**status_dict(r), "samples": 1, "states": {r["state"]: 1}} for r in raw)
    return out


def state_changes(conn: Connection, model: str, since: float, until: float) -> list[StateChange]:
    """Oldest first; the first status ever recorded for a model counts as a change from None."""
    c = ModelStateChangeRow.__table__.c
    rows = conn.execute(sa.select(c.at, c.from_state, c.to_state, c.reasons).where(
        c.model == model, c.at >= since, c.at <= until).order_by(c.at, c.id)).all()
    return [StateChange(r[0], r[1], r[2], tuple(r[3] or ())) for r in rows]


def outage_intervals(conn: Connection, model: str, since: float, until: float) -> list[tuple[float, Optional[float]]]:
    """(start, end) of every stretch BROKEN that overlaps [since, until], oldest first; not
    clipped to the window; ``end`` None while it lasts."""
    c = ModelStateChangeRow.__table__.c
    before = conn.execute(sa.select(c.at).where(c.model == model, c.at < since)
                          .order_by(c.at.desc(), c.id.desc()).limit(1)).scalar()
    query = sa.select(c.at, c.to_state).where(c.model == model).order_by(c.at, c.id)
    if before is not None:
        query = query.where(c.at >= before)
    intervals: list[tuple[float, Optional[float]]] = []
    started: Optional[float] = None
    for at, to_state in conn.execute(query).all():
        if to_state == BROKEN and started is None:
            if at > until:
                break
            started = at
        elif to_state != BROKEN and started is not None:
            if at >= since:
                intervals.append((started, at))
            started = None
    if started is not None:
        intervals.append((started, None))
    return intervals


def block_coverage_series(conn: Connection, model: str, since: float, until: float, value: str,
                          stat: str) -> tuple[list[float], list[list[Optional[float]]]]:
    """(times, matrix[block][time]) for a blocks × time heatmap, oldest first (see ``Store``)."""
    if value not in ("servers", "throughput") or stat not in ("min", "mean"):
        raise ValueError(f"block_coverage_series: value must be 'servers' or 'throughput' (got {value!r}), "
                         f"stat 'min' or 'mean' (got {stat!r})")
    h, b = HourlyBlockCoverageRow.__table__.c, BlockCoverageRow.__table__.c
    hourly = conn.execute(sa.select(h.hour, h[f"{stat}_{value}"]).where(
        h.model == model, *rollup_window(h.hour, since, until, raw_start(conn))).order_by(h.hour)).all()
    raw = conn.execute(sa.select(b.at, b[value]).where(b.model == model, b.at >= since, b.at <= until)
                       .order_by(b.at)).all()
    columns = [(at, list(values or ())) for at, values in [*hourly, *raw]]
    n_blocks = max((len(values) for _, values in columns), default=0)
    matrix = [[values[block] if block < len(values) else None for _, values in columns]
              for block in range(n_blocks)]
    return [at for at, _ in columns], matrix


# ---- peers -----------------------------------------------------------------------------------


def histories(conn: Connection, since: float, until: float, keys: Optional[list[int]], merge_runs: bool = False,
              reachability_since: Optional[float] = None) -> dict[int, PeerHistory]:
    """Per peer key (all peers observed or chatted with if ``keys`` is None): its ``PeerHistory``."""
    observations = _observations(conn, since, until, keys, merge_runs)
    outcomes = _outcomes(conn, since, until, keys)
    wanted = set(observations) | set(outcomes) if keys is None else set(keys)
    q = ReachabilityCheckRow.__table__.c
    checks_q = sa.select(q.peer, q.at, q.kind, q.ok, q.rtt, q.error, q.joining, q.address).where(
        q.at >= max(since, reachability_since or since), q.at <= until).order_by(q.at, q.id)
    peers = Peer.__table__.c
    peers_q = sa.select(peers.id, peers.peer_id, peers.first_seen)
    if keys is not None:
        checks_q, peers_q = checks_q.where(q.peer.in_(keys)), peers_q.where(peers.id.in_(keys))
    checks: dict[int, list] = {}
    for r in conn.execute(checks_q).all():
        if r[0] in wanted:
            checks.setdefault(r[0], []).append(r)
    result = {}
    for key, peer_id, first_seen in conn.execute(peers_q):
        if key in wanted:
            result[key] = PeerHistory(
                peer_id=peer_id,
                observations=tuple(observations.get(key, ())),
                reachability=tuple((r[1], reachability_result(peer_id, *r[2:])) for r in checks.get(key, ())),
                outcomes=tuple(outcomes.get(key, ())),
                first_seen=first_seen,
            )
    return result


def _outcomes(conn: Connection, since: float, until: float, keys: Optional[list[int]]) -> dict[int, list[ChatOutcome]]:
    c, peers = ChatOutcomeRow.__table__.c, Peer.__table__
    query = sa.select(c.peer, peers.c.peer_id, c.at, c.model, c.start, c.end, c.ok, c.seconds_per_token,
                      c.error).join(peers, peers.c.id == c.peer).where(c.at >= since, c.at <= until).order_by(c.at, c.id)
    if keys is not None:
        query = query.where(c.peer.in_(keys))
    outcomes: dict[int, list[ChatOutcome]] = {}
    for r in conn.execute(query).all():
        outcomes.setdefault(r[0], []).append(ChatOutcome(
            at=r[2], peer_id=r[1], model=r[3], start=r[4], end=r[5], ok=bool(r[6]), seconds_per_token=r[7],
            error=r[8]))
    return outcomes


# (at, model, state, seen, start, end, throughput, inference_rps, samples): an observation before
# it becomes one, so runs can be merged first
_Row = tuple


def _observations(conn: Connection, since: float, until: float, keys: Optional[list[int]],
                  merge_runs: bool = False) -> dict[int, list[Observation]]:
    """Per peer key: observations oldest first, unseen polls filled in for the models it served."""
    raw_from = raw_start(conn)
    rows, served, seen_raw, seen_hours = _seen(conn, since, until, keys, raw_from)
    _fill_unseen(conn, since, until, keys, raw_from, rows, served, seen_raw, seen_hours)
    result = {}
    for peer, out in rows.items():
        out.sort(key=lambda r: r[0])
        if merge_runs:
            out = _merge_runs(out)
        result[peer] = [Observation(at=r[0], model=r[1], state=r[2], seen=r[3], start=r[4], end=r[5],
                                    throughput=r[6], inference_rps=r[7], samples=r[8]) for r in out]
    return result


def _seen(conn: Connection, since: float, until: float, keys: Optional[list[int]], raw_from: Optional[float]):
    """The observations that were recorded: hourly rows before raw retention, raw rows after."""
    o, h = ServerObservationRow.__table__.c, HourlyObservationsRow.__table__.c
    raw_q = sa.select(o.peer, o.poll_id, o.at, o.model, o.state, o.start, o.end, o.throughput,
                      o.inference_rps).where(o.at >= since, o.at <= until).order_by(o.at, o.id)
    hourly_q = sa.select(h.peer, h.hour, h.model, h.polls, h.samples, h.online, h.joining, h.mean_throughput,
                         h.mean_inference_rps, h.min_start, h.max_end).where(
        *rollup_window(h.hour, since, until, raw_from))
    if keys is not None:
        raw_q, hourly_q = raw_q.where(o.peer.in_(keys)), hourly_q.where(h.peer.in_(keys))
    rows: dict[int, list[_Row]] = {}
    served: dict[int, set[str]] = {}
    seen_raw: dict[int, set[tuple[int, str]]] = {}
    seen_hours: dict[int, set[tuple[float, str]]] = {}
    for peer, hour, model, polls, samples, online, joining, thr, rps, start, stop in conn.execute(hourly_q).all():
        served.setdefault(peer, set()).add(model)
        seen_hours.setdefault(peer, set()).add((hour, model))
        out = rows.setdefault(peer, [])
        for state, n in ((ONLINE, online), (JOINING, joining), (OFFLINE, samples - online - joining)):
            if n > 0:
                out.append((hour, model, state, True, start, stop, thr, rps, n))
        if polls > samples:
            out.append((hour, model, OFFLINE, False, None, None, None, None, polls - samples))
    for peer, poll_id, at, model, state, start, stop, thr, rps in conn.execute(raw_q).all():
        served.setdefault(peer, set()).add(model)
        seen_raw.setdefault(peer, set()).add((poll_id, model))
        rows.setdefault(peer, []).append((at, model, state, True, start, stop, thr, rps, 1))
    return rows, served, seen_raw, seen_hours


def _fill_unseen(conn: Connection, since: float, until: float, keys: Optional[list[int]], raw_from: Optional[float],
                 rows: dict[int, list[_Row]], served: dict[int, set[str]],
                 seen_raw: dict[int, set[tuple[int, str]]], seen_hours: dict[int, set[tuple[float, str]]]) -> None:
    """Every ok poll (or rolled-up hour) since a peer first appeared that did not see it serving one
    of its models counts as OFFLINE, unseen: a peer that vanishes is down, not absent."""
    p, hp, peers = Poll.__table__.c, HourlyPollsRow.__table__.c, Peer.__table__.c
    ok_polls = conn.execute(sa.select(p.id, p.at).where(p.ok, p.at >= since, p.at <= until).order_by(p.at)).all()
    hours = conn.execute(sa.select(hp.hour, hp.ok_polls).where(
        *rollup_window(hp.hour, since, until, raw_from)).order_by(hp.hour)).all()
    first_q = sa.select(peers.id, peers.first_seen)
    if keys is not None:
        first_q = first_q.where(peers.id.in_(keys))
    first_seen = dict(conn.execute(first_q).all())
    for peer, models in served.items():
        first = first_seen.get(peer)
        if first is None:
            continue
        out = rows[peer]
        models = sorted(models)
        seen = seen_hours.get(peer, set())
        for hour, n in hours:
            if hour + HOUR > first and n:
                out.extend((hour, m, OFFLINE, False, None, None, None, None, n)
                           for m in models if (hour, m) not in seen)
        seen = seen_raw.get(peer, set())
        for poll_id, at in ok_polls:
            if at >= first:
                out.extend((at, m, OFFLINE, False, None, None, None, None, 1)
                           for m in models if (poll_id, m) not in seen)


def _merge_runs(rows: list[_Row]) -> list[_Row]:
    """Consecutive polls of one model with the same (state, seen, span) within one clock hour
    become one row with ``samples`` = their count, ``at`` = the first, and mean speeds. Rows sorted
    by time in, rows sorted by time out; transitions (and so flaps) survive, hours stay separate."""
    merged: list[list] = []
    last: dict[str, int] = {}  # model -> index of its open run in merged
    for r in rows:
        at, model, state, seen, start, end, thr, rps, n = r
        i = last.get(model)
        if i is not None:
            m = merged[i]
            if (m[2], m[3], m[4], m[5]) == (state, seen, start, end) and floor_hour(m[0]) == floor_hour(at):
                m[9].append(thr)
                m[10].append(rps)
                m[8] += n
                continue
        last[model] = len(merged)
        merged.append([at, model, state, seen, start, end, thr, rps, n, [thr], [rps]])
    return [(m[0], m[1], m[2], m[3], m[4], m[5], mean(m[9]), mean(m[10]), m[8]) for m in merged]
