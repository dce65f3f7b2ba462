"""The peer page's data: the "my server" report and the history charts, built once per store change.

A peer page read ~3,000 raw rows for 7 days and drew four charts with every point on every request
(70 ms alone, p95 1.2–2.9 s under 16 clients). Now:

- what a page derives from the store is kept in the app's cache (``monitor.web.cache``) keyed by
  the store's change marks (``Store.change_marks``: a poll, a reachability round, a score refresh) and
  the minute (the history) or ``LIVE_SECONDS`` (the report, which says "… ago"), so a page is read
  once per change, however many people look at it; concurrent requests for the same page wait for
  one computation instead of all doing it (``cached``); the parts every visitor sees alike (the
  report, the live figures) are made once per ``LIVE_SECONDS`` in a cache of their own
  (``report``, ``rendered``), so they never push the histories out;
- the history is read with runs merged (``merge_runs``: one row per unchanged run per clock hour,
  exact for states) and the reachability chart is downsampled to at most ``MAX_POINTS`` points
  (median RTT per time bucket, failed checks counted per bucket), so a week is a few hundred points.

Web workers import no petals: the report reads what the poller stored (``monitor.core.server_check``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Optional

from flask import request

from monitor.core import maintenance, server_check
from monitor.core.common import MINUTE
from monitor.core.server_check import ServerFacts, ServerReport
from monitor.core.snapshot import ReachabilityResult
from monitor.web import charts

MAX_POINTS = 300  # per chart series: a week in 35-minute buckets


def cached(d, cur, key: tuple, compute: Callable[[], Any]):
    """``compute()`` once per store state (``cur.marks``) and ``key``, in the app's cache
    (``d.cache``: ``WebCache.pages``); callers must not mutate it."""
    return d.cache.page(cur.marks, key, compute)


def rendered(d, cur, key: tuple, now: float, render: Callable[[], Any]):
    """HTML shared by every visitor, once per store state, ``key`` and ``LIVE_SECONDS``: nothing
    of one visitor may be in it (operator controls, CSRF tokens). Its links start with the
    request's script root (a proxy's ``X-Forwarded-Prefix``) and the badges' Markdown with its
    host, so both are part of the key (``request.url_root``): one visitor's forwarded prefix or
    host name never reaches another's page."""
    return d.cache.now(cur.marks, now, ("html", request.url_root, key), render)


# ---- "my server" ------------------------------------------------------------------------------


def server_facts(store, cur, peer_id: str, now: float, *, reachability: Optional[ReachabilityResult] = None,
                 live: bool = False) -> ServerFacts:
    """What the report on ``peer_id`` is made of: the latest poll (``cur``) and a few indexed reads."""
    snapshot = cur.snapshot
    rows = tuple(row for row in (snapshot.servers if snapshot else ()) if row.peer_id == peer_id)
    record = store.peer_record(peer_id)
    last = () if rows else tuple(store.last_announcements(peer_id))
    return ServerFacts(
        peer_id=peer_id, now=now, poll_at=snapshot.taken_at if snapshot else None, models=cur.models, rows=rows,
        versions=cur.derive(("versions",), lambda: dict(Counter(
            row.version for row in (snapshot.servers if snapshot else ()) if row.version))),
        first_seen=record.first_seen if record else None, last_seen=record.last_seen if record else None,
        last=last, reachability=reachability if reachability is not None else cur.reachability.get(peer_id),
        reachability_is_live=live,
        assessments=cur.assessments, score=cur.scores.get(peer_id),
    )


def report(d, cur, peer_id: str, now: float) -> ServerReport:
    """The report with the latest stored reachability check, once per store state and ``LIVE_SECONDS``."""
    return d.cache.now(cur.marks, now, ("report", peer_id),
                       lambda: server_check.check(server_facts(d.store, cur, peer_id, now)))


# ---- history charts --------------------------------------------------------------------------


def history(d, cur, peer_id: str, hours: float, now: float) -> dict:
    """The peer's history over the last ``hours`` for the page: merged observations, downsampled
    reachability checks, the four figures and the newest chat outcomes; once per store state and minute."""
    def build() -> dict:
        since = now - hours * 3600
        found = d.store.peer_history(peer_id, since, now, merge_runs=True)
        # every ok poll since the peer appeared observed it (seen or not), so its series run to the
        # latest poll: merged runs say only when each run began
        latest = min(cur.snapshot.taken_at, now) if cur.snapshot is not None else None
        reachability = downsample_reachability(found.reachability, since, now)
        return dict(
            history=replace(found, reachability=reachability),
            uptime=peer_uptime(d.store, peer_id, found, since, now),
            figures=dict(
                states=charts.peer_state_timeline(found.observations, since=since, until=now, latest=latest),
                throughput=charts.peer_throughput(found.observations, since=since, until=now, latest=latest),
                reachability=charts.peer_reachability(reachability, since=since, until=now),
                chats=charts.peer_chat_outcomes(found.outcomes, since=since, until=now),
            ),
            outcomes=sorted(found.outcomes, key=lambda o: o.at, reverse=True)[:20],
        )

    return cached(d, cur, ("history", peer_id, hours, int(now // MINUTE)), build)


def peer_uptime(store, peer_id: str, found, since: float, until: float) -> maintenance.Uptime:
    """The peer's time ONLINE in the window, the maintenance windows that cover it left out."""
    record = store.peer_record(peer_id)
    names = (peer_id, record.public_name if record else None)
    windows = [w for w in store.maintenance_windows(ending_after=since) if w.covers(peers=names)]
    return maintenance.uptime(found.observations, since, until, maintenance.covered_intervals(windows, since, until))


def downsample_reachability(checks: tuple, since: float, until: float, points: int = MAX_POINTS) -> tuple:
    """At most ``points`` ok and ``points`` failed reachability checks: per time bucket, one ok check
    with the median RTT and one failed check whose error says how many failed (the latest error)."""
    if len(checks) <= points:
        return tuple(checks)
    width = max((until - since) / points, 1.0)
    buckets: dict[int, list] = {}
    for at, result in checks:
        buckets.setdefault(int((at - since) // width), []).append((at, result))
    out = []
    for index in sorted(buckets):
        items = buckets[index]
        ok = [r for _, r in items if r.ok and r.rtt is not None]
        failed = [(at, r) for at, r in items if not r.ok]
        middle = since + (index + 0.5) * width
        if ok:
            out.append((middle, replace(ok[0], rtt=statistics.median(r.rtt for r in ok))))
        if failed:
            at, last = failed[-1]
            error = last.error or "failed"
            out.append((at, replace(last, error=f"{len(failed)} failed: {error}" if len(failed) > 1 else error)))
    return tuple(sorted(out, key=lambda item: item[0]))
