"""The compute-check job: every ONLINE server, every ``compute_check_period``, computes one token
through the first block of its span (``core.compute_checks``), on a thread of its own.

Each (server, model) is due a period after its last check, or ``CONFIRM_DELAY`` after a first
failure (its confirmation). A round checks the servers that are due, at most
``compute_check_concurrency`` at once, on its own P2P replica (``swarm.speed.ProbeLoop``), stores
the checks, and — when a verdict changed (a failure confirmed, a server answering again) — assesses
the newest poll again at once (``after_change``), so every reader sees it. A server that answers
again is handed to ``on_recovered`` (the prober looks at it again soon: its probes may still call
it failing).

Out of turn, ``check_now`` checks the servers a request named (``Store.request_job("compute-check",
peer)``: a chat or a generation check that met the server failing, from any process), carried out
by the leader's requests job. At 500 servers and the default 20 s period that is 25 checks a
second, each a request of one hidden state (16 KB at 8,192 dims in float16) and its answer, and a
row each in the store (an hour kept: 90,000 rows).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Optional

from monitor.app.rounds import start_rounds
from monitor.core.compute_checks import SCRAPE_REQUEST_INTERVAL, ComputeCheck, due_after, verdicts, window
from monitor.core.snapshot import ONLINE, Snapshot
from monitor.swarm.speed import ForwardTarget, ProbeLoop

log = logging.getLogger(__name__)

TICK_MAX = 5.0  # seconds between two looks for servers that are due (new servers are checked this soon)


class ComputeChecker:
    def __init__(self, settings, store, dht, *, snapshot: Callable[[], Optional[Snapshot]],
                 after_change: Optional[Callable[[], object]] = None,
                 on_recovered: Optional[Callable[[set], object]] = None):
        self.settings, self.store, self.dht = settings, store, dht
        self.snapshot, self.after_change, self.on_recovered = snapshot, after_change, on_recovered
        self.period = settings.compute_check_period
        self.max_age = window(self.period)
        self.next_due: dict[tuple[str, str], float] = {}
        self.newest: dict[tuple[str, str], ComputeCheck] = {}
        self.kept: list[ComputeCheck] = []  # the window's checks, for the verdicts before and after a round
        self.rounds = self.checks = self.failures = 0
        self.awaiting_poll: Optional[float] = None  # the first failure no poll has followed yet
        self.poll_interval = SCRAPE_REQUEST_INTERVAL
        self._lock = threading.Lock()  # one round (or requested check) at a time
        self._loop: Optional[ProbeLoop] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- one round ---------------------------------------------------------------------------
    def run_once(self, now: Optional[float] = None) -> list[ComputeCheck]:
        """Check every server that is due; returns (and stores) the checks."""
        snapshot = self.snapshot()
        if snapshot is None:
            return []
        now = time.time() if now is None else now
        with self._lock:
            self._ask_for_poll(snapshot)
            return self._run(self._due(snapshot, now), now)

    def check_now(self, peers: Iterable[str], *, by: Optional[str] = None) -> list[ComputeCheck]:
        """Check these servers now (each model they serve in the newest poll), out of turn."""
        snapshot = self.snapshot()
        wanted = set(peers)
        if snapshot is None or not wanted:
            return []
        targets = [t for t in _targets(snapshot, by=by) if t.peer_id in wanted]
        with self._lock:
            return self._run(targets, time.time())

    def _ask_for_poll(self, snapshot: Optional[Snapshot]) -> None:
        """After a first failure, a poll at once (did the server leave? a clean stop announces
        OFFLINE; ``compute_checks.verdicts`` waits for a poll after the failure): asked for through
        the store, again each round (an equal request within ``poll_interval`` is not written) until
        a poll newer than the failure is there."""
        if self.awaiting_poll is None:
            return
        if snapshot is not None and snapshot.taken_at >= self.awaiting_poll:
            self.awaiting_poll = None
            return
        self.store.request_job("scrape", by="compute-check", min_interval=self.poll_interval,
                               why="a server failed its compute check: did it leave?")

    def _due(self, snapshot: Snapshot, now: float) -> list[ForwardTarget]:
        due, known = [], {}
        for target in _targets(snapshot):
            key = (target.peer_id, target.model)
            known[key] = self.next_due.get(key, 0.0)
            if now >= known[key]:
                due.append(target)
        self.next_due = known  # (servers gone from the poll are forgotten)
        return due

    def _run(self, targets: list[ForwardTarget], now: float) -> list[ComputeCheck]:
        if not targets:
            return []
        if self._loop is None:
            self._loop = ProbeLoop(self.dht, concurrency=self.settings.compute_check_concurrency)
        try:
            checks = self._loop.forward_checks(targets, timeout=self.settings.compute_check_timeout)
        except Exception:
            self._loop.reset()  # the daemon may have gone: connect again next round
            raise
        before = verdicts(self.kept, now=now, max_age=self.max_age)
        recovered = set()
        for check in checks:
            key = (check.peer_id, check.model)
            previous = self.newest.get(key)
            self.next_due[key] = due_after(check, previous, self.period)
            if check.ok and previous is not None and not previous.ok:
                recovered.add(check.peer_id)
            self.newest[key] = check
        self.kept = [c for c in self.kept if c.at >= now - self.max_age] + checks
        self.store.record_compute_checks(checks, now=now)
        first = [c.at for c in checks if not c.ok and self.next_due[(c.peer_id, c.model)] - c.at < self.period]
        if first:
            self.awaiting_poll = min([*first, *([self.awaiting_poll] if self.awaiting_poll else [])])
            self._ask_for_poll(None)
        self.rounds += 1
        self.checks += len(checks)
        self.failures += sum(1 for c in checks if not c.ok)
        after = verdicts(self.kept, now=time.time(), max_age=self.max_age)
        if after.changed(before) and self.after_change is not None:
            self.after_change()
        if recovered and self.on_recovered is not None:
            self.on_recovered(recovered)
        return checks

    # ---- the job's thread ----------------------------------------------------------------------
    def seconds_to_next_round(self) -> float:
        tick = min(TICK_MAX, max(0.5, self.period / 4))
        if not self.next_due:
            return tick
        return min(tick, max(0.2, min(self.next_due.values()) - time.time()))

    def start(self, *, stats=None, run_now: bool = True) -> "ComputeChecker":
        self._thread = start_rounds("compute-check", self.run_once, self.seconds_to_next_round, self._stop,
                                    stats=stats, first_pause=None if run_now else self.period)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.compute_check_timeout * 4 + 15)
            self._thread = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def _targets(snapshot: Snapshot, *, by: Optional[str] = None) -> list[ForwardTarget]:
    """One check per ONLINE (server, model): the first block of its span."""
    found: dict[tuple[str, str], ForwardTarget] = {}
    for row in snapshot.servers:
        if row.state == ONLINE and row.end > row.start and (row.peer_id, row.model) not in found:
            found[(row.peer_id, row.model)] = ForwardTarget(row.peer_id, row.model, row.start, requested_by=by)
    return list(found.values())


# ---- the jobs (``app/job_table.py``) ----------------------------------------------------------


def start_compute_checks(ctx, run_now: bool = True) -> ComputeChecker:
    """The ``compute-checks`` rounds: a thread of its own, stopped by ``ComputeChecker.close``; a
    server that answers again is probed next (``JobContext.probe_soon``)."""
    checker = _own_checker(ctx)
    checker.on_recovered = ctx.probe_soon
    return checker.start(stats=ctx.stats, run_now=run_now)


def _own_checker(ctx) -> ComputeChecker:
    return ComputeChecker(ctx.settings, ctx.store, ctx.dht, snapshot=ctx.latest_snapshot,
                          after_change=ctx.assess_latest)


def compute_checks(ctx) -> list[ComputeCheck]:
    """``swarm-monitor job compute-checks --once``: one round, by a checker of its own."""
    checker = _own_checker(ctx)
    try:
        return checker.run_once()
    finally:
        checker.close()


def compute_check(ctx) -> list[ComputeCheck]:
    """Out of turn, every ONLINE server of the newest poll (a request names its servers instead)."""
    snapshot = ctx.latest_snapshot()
    online = sorted({row.peer_id for row in (snapshot.servers if snapshot else ()) if row.state == ONLINE})
    return check_now(ctx, online, "operator")


def check_now(ctx, peers: list[str], by: Optional[str] = None) -> list[ComputeCheck]:
    """A compute check of ``peers`` now (a request through the store), by the running checker (whose
    confirmations follow) or by one of its own; only while the poller leads and its DHT is up."""
    if not ctx.leads() or ctx.swarm_problem() is not None or not peers:
        return []
    running = ctx.workers.get("compute-checks")
    if running is not None:
        return running.check_now(peers, by=by)
    checker = _own_checker(ctx)
    try:
        return checker.check_now(peers, by=by)
    finally:
        checker.close()
