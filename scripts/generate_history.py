#!/usr/bin/env python
"""Fill a store with D days of polls of N servers with realistic churn, through the store's own
write path, as the poller would have written them.

    .venv/bin/python scripts/generate_history.py --db sqlite:////tmp/history.db --days 30 --servers 500

Every poll (every ``--poll-period`` s of fabricated time) is a Snapshot recorded with
``Store.record_poll`` together with each model's diagnosis as the poller computes it
(``Poller.assess``, i.e. ``core.assess.assess``); every poll has its
batch of reachability checks (``Store.record_reachability``); chat outcomes are recorded hourly
(``Store.record_chat_outcomes``); ``Store.rollup_and_prune`` runs every simulated hour as the
scheduler runs it, with the default retention (raw 2 days, rollups 90 days); the peer scores are
computed and recorded once at the end by the poller's score job (``Poller.refresh_scores``).

Churn: each of the N server slots alternates sessions up (exponential, mean 20 h) and down (mean
1.5 h); a session starts JOINING for 1-3 polls; 60 % of departures announce OFFLINE for one poll,
the rest vanish; 15 % of departures are for good (a new peer id takes the slot, maybe another
span). 10 % of the slots' peers are unreachable; the others fail 0.5 % of their reachability checks. Spans,
throughputs and announcement fields come from ``simulate_swarm.plan_swarm``.

Two shortcuts keep it fast. ``next_pings`` are only written for the last 2 hours (the store keeps
them for 1 hour, so the database ends up the same). ``coverage.diagnose`` (~60-90 ms per model at
500 servers, petals' route search) runs per model only when the set of blocks without a server
changed, or when the model's rows or reachability outcomes changed and ``--analysis-every`` polls (30)
have passed; otherwise the model's previous diagnosis is recorded again with this poll's block
coverage (``coverage.block_coverage``), which is exact for every poll. So model states may lag
churn by up to 30 polls, but never miss an outage.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from monitor import compat  # noqa: F401,E402  (must precede petals)

HOUR, DAY = 3600.0, 86400.0
MEAN_UP, MEAN_DOWN = 20 * HOUR, 1.5 * HOUR
GRACEFUL, FOR_GOOD, UNREACHABLE = 0.6, 0.15, 0.10
CHATS_PER_HOUR = 20
FAST_COARSE = 10  # fast mode: 1 poll in 10 before the last `fine_days`


@dataclass
class Slot:
    """One place in the swarm a server occupies; successive peers may hold it."""

    server: object  # simulate_swarm.VirtualServer (peer id, model, span, announcement)
    up: bool
    next_event: float
    joining_polls: int = 0
    announce_offline: bool = False
    unreachable: bool = False
    cache: int = 0


class HistoryGenerator:
    """Writes fabricated polls into ``store`` as the poller would; ``run(days)`` returns timings."""

    def __init__(self, store, *, servers: int = 500, models: int = 4, poll_period: float = 60.0,
                 raw_retention_days: float = 2.0, rollup_retention_days: float = 90.0, seed: int = 0,
                 analysis_every: int = 30, num_blocks: Optional[int] = None, fast: bool = False,
                 fine_days: float = 3.0):
        """``num_blocks``: give every model this many blocks instead of its real count (the tests'
        small histories: a diagnosis of 126 blocks per poll costs more than the rest of the poll).
        ``fast``: histories for the peer and score benchmarks, at 2,000 servers too, in a fraction
        of the time: polls before the last 2 hours are recorded without their models' diagnoses
        (the diagnosis and its JSON are most of a poll's cost; the models' status, block coverage
        and state changes start 2 hours before the end), and before the last ``fine_days`` one
        poll in ``FAST_COARSE`` is made (those hours end up as hourly rollups anyway, with one row
        per peer, model and hour as usual, counting fewer polls; keep ``fine_days`` above the raw
        retention for raw rows as dense as the poller's). Everything per peer — observations,
        reachability checks, chat outcomes, rollups — is written as usual."""
        from dataclasses import replace

        from simulate_swarm import plan_swarm, sim_models

        from monitor.app.jobs import Poller
        from monitor.settings import Settings
        from monitor.core.snapshot import ModelInfo

        self.store = store
        self.rng = random.Random(seed)
        self.poll_period = poll_period
        self.raw_retention_days, self.rollup_retention_days = raw_retention_days, rollup_retention_days
        self.sim_models = [replace(m, num_blocks=num_blocks or m.num_blocks) for m in sim_models(models)]
        self.models = tuple(ModelInfo(dht_prefix=m.dht_prefix, num_blocks=m.num_blocks, repository=m.repository,
                                      name=m.repository.rsplit("/", 1)[-1] if m.repository else None)
                            for m in self.sim_models)
        self._plan = lambda n, seed: plan_swarm(n, self.sim_models, unreachable=0.0, seed=seed)
        self.slots = [Slot(server=s, up=False, next_event=0.0) for s in self._plan(servers, seed)]
        self.poller = Poller(Settings(), store, dht=None)  # its analysis and score job; no DHT
        self.analysis_every = analysis_every
        self.fast, self.fine_days = fast, fine_days
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._cache: dict[str, dict] = {}
        self._poll_index = 0

    # ---- churn ---------------------------------------------------------------------------
    def _start(self, at: float) -> None:
        rng = self.rng
        for slot in self.slots:  # the swarm has been running: most slots are mid-session
            slot.up = rng.random() < MEAN_UP / (MEAN_UP + MEAN_DOWN)
            slot.next_event = at + rng.expovariate(1 / (MEAN_UP if slot.up else MEAN_DOWN))
            slot.unreachable = rng.random() < UNREACHABLE
            slot.cache = slot.server.info.get("cache_tokens_left") or 0

    def _advance(self, slot: Slot, at: float) -> None:
        rng = self.rng
        slot.announce_offline = False
        if slot.joining_polls:
            slot.joining_polls -= 1
        if at < slot.next_event:
            return
        if slot.up:  # leaving
            slot.up = False
            slot.announce_offline = rng.random() < GRACEFUL
            slot.next_event = at + rng.expovariate(1 / MEAN_DOWN)
            if rng.random() < FOR_GOOD:  # a new volunteer will take this place
                fresh = self._plan(len(self.models), rng.randrange(1 << 30))
                same_model = [s for s in fresh if s.model == slot.server.model] or fresh
                slot.server = same_model[0]
                slot.unreachable = rng.random() < UNREACHABLE
                self.counts["new_peers"] = self.counts.get("new_peers", 0) + 1
        else:  # (re)joining
            slot.up = True
            slot.joining_polls = rng.randint(1, 3)
            slot.next_event = at + rng.expovariate(1 / MEAN_UP)

    def _rows(self, at: float, with_pings: bool):
        from monitor.core.snapshot import ServerRow

        rows = []
        for slot in self.slots:
            if not slot.up and not slot.announce_offline:
                continue
            s = slot.server
            state = "OFFLINE" if not slot.up else "JOINING" if slot.joining_polls else s.info["state"]
            slot.cache = max(0, slot.cache + self.rng.randint(-3000, 3000))
            info = s.info
            rows.append(ServerRow(
                peer_id=s.peer_id, model=s.model, start=s.start, end=s.end, state=state,
                throughput=info["throughput"], inference_rps=info["inference_rps"], forward_rps=info["forward_rps"],
                network_rps=info["network_rps"], cache_tokens_left=slot.cache, version=info["version"],
                torch_dtype=info["torch_dtype"], quant_type=info["quant_type"], using_relay=info["using_relay"],
                public_name=info["public_name"] or None, adapters=tuple(info["adapters"]),
                next_pings=dict(info.get("next_pings") or {}) if with_pings else {},
            ))
        return rows

    def _reachability(self, at: float, rows):
        from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult

        unreachable = {slot.server.peer_id for slot in self.slots if slot.unreachable}
        results = []
        for peer in sorted({r.peer_id for r in rows if r.state == "ONLINE"}):
            if peer in unreachable or self.rng.random() < 0.005:
                results.append(ReachabilityResult(peer_id=peer, kind="server", ok=False,
                                           error="no answer to rpc_info within 5 s"))
            else:
                results.append(ReachabilityResult(peer_id=peer, kind="server", ok=True,
                                           rtt=round(self.rng.lognormvariate(math.log(0.06), 0.5), 4)))
        return ReachabilityBatch(taken_at=at + 2.0, duration=5.0 if len(results) > len(unreachable) else 0.5,
                          results=tuple(results))

    def _chats(self, hour_start: float, rows):
        from monitor.core.snapshot import ChatOutcome

        online = [r for r in rows if r.state == "ONLINE"]
        outcomes = []
        for _ in range(CHATS_PER_HOUR if online else 0):
            row = self.rng.choice(online)
            ok = self.rng.random() < 0.97
            spt = (row.end - row.start) * self.rng.lognormvariate(math.log(0.03), 0.4)
            outcomes.append(ChatOutcome(at=hour_start + self.rng.uniform(0, HOUR), peer_id=row.peer_id,
                                        model=row.model, start=row.start, end=row.end, ok=ok,
                                        seconds_per_token=round(spt, 4) if ok else None,
                                        error=None if ok else "step timed out"))
        return sorted(outcomes, key=lambda o: o.at)

    # ---- the run ---------------------------------------------------------------------------
    def _timed(self, name: str, fn, *args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started
            self.counts[name] = self.counts.get(name, 0) + 1

    def run(self, days: float, *, end: Optional[float] = None, progress: bool = True) -> dict:
        from tqdm import tqdm

        from monitor.core.snapshot import Snapshot

        end = end if end is not None else time.time()
        start = end - days * DAY
        times = self._poll_times(start, end)
        n_polls = len(times)
        self._start(start)
        next_rollup = math.floor(start / HOUR) * HOUR + HOUR
        pings_from = end - 2 * HOUR
        last_rows, wall = [], time.perf_counter()
        for at in tqdm(times, desc="polls", unit="poll", disable=not progress, mininterval=1.0):
            for slot in self.slots:
                self._advance(slot, at)
            rows = self._rows(at, with_pings=at >= pings_from)
            snapshot = Snapshot(taken_at=at, duration=round(self.rng.uniform(0.2, 0.6), 3), models=self.models,
                                servers=tuple(rows))
            checks = self._reachability(at, rows)
            assessments = [] if self.fast and at < pings_from else self._timed("analyse", self._analyse, snapshot, checks)
            self._timed("record_poll", self.store.record_poll, snapshot, assessments)
            self._timed("record_reachability", self.store.record_reachability, checks)
            if at >= next_rollup:
                self._timed("record_chat_outcomes", self.store.record_chat_outcomes,
                            self._chats(next_rollup - HOUR, rows))
                self._timed("rollup_and_prune", self.store.rollup_and_prune, at,
                            raw_retention_days=self.raw_retention_days,
                            rollup_retention_days=self.rollup_retention_days)
                next_rollup += HOUR
            last_rows = rows
        generated = time.perf_counter() - wall

        self._timed("refresh_scores", self.poller.refresh_scores, end)
        return {
            "polls": n_polls, "servers_last_poll": len(last_rows), "seconds": generated,
            "polls_per_second": n_polls / generated if generated else float("inf"),
            "peers": len(self.store.peer_ids()), "database_bytes": self.store.database_size_bytes(),
            "timings": {name: round(total, 2) for name, total in self.timings.items()},
            "mean_ms": {name: round(1000 * total / self.counts[name], 2) for name, total in self.timings.items()},
            "new_peers": self.counts.get("new_peers", 0), "diagnoses": self.counts.get("diagnoses", 0),
        }

    def _poll_times(self, start: float, end: float) -> list[float]:
        """Every ``poll_period``; in fast mode every ``FAST_COARSE`` periods before the last
        ``fine_days`` (rolled up by then: one hourly row per peer, model and hour all the same)."""
        times, at = [], start
        fine_from = end - self.fine_days * DAY if self.fast else start
        while at < end - 1e-6:
            times.append(at)
            at += self.poll_period * (FAST_COARSE if at < fine_from else 1)
        return times

    def _analyse(self, snapshot, checks):
        """The poller's analysis (``Poller.assess``), per model. Block coverage is computed every
        poll; a model's diagnosis is recomputed when the blocks without a server change, or when
        its rows or reachability outcomes changed and ``analysis_every`` polls have passed, else reused
        with this poll's block coverage."""
        from dataclasses import replace as dc_replace

        from monitor.core import coverage

        reachability = {c.peer_id: c for c in checks.results}
        assessments = []
        for model in snapshot.models:
            rows = snapshot.rows_for(model.dht_prefix)
            blocks = coverage.block_coverage(model, rows, reachability)
            missing = tuple(b.index for b in blocks if b.online == 0)
            key = (tuple((r.peer_id, r.state, r.start, r.end) for r in rows),
                   tuple(reachability[r.peer_id].ok for r in rows if r.peer_id in reachability))
            cached = self._cache.get(model.dht_prefix)
            due = cached is None or cached["missing"] != missing or (
                cached["key"] != key and self._poll_index - cached["at"] >= self.analysis_every)
            if due:
                [health] = self.poller.assess(dc_replace(snapshot, models=(model,)), reachability)
                cached = self._cache[model.dht_prefix] = {"missing": missing, "key": key, "at": self._poll_index,
                                                          "health": health}
                self.counts["diagnoses"] = self.counts.get("diagnoses", 0) + 1
            assessments.append(dc_replace(cached["health"], blocks=blocks))
        self._poll_index += 1
        return assessments


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--db", required=True, help="database URL, e.g. sqlite:////tmp/history.db")
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--poll-period", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fast", action="store_true",
                        help="record the models' diagnoses only for the last 2 hours (see HistoryGenerator)")
    parser.add_argument("--analysis-every", type=int, default=30,
                        help="re-diagnose a changed model at most every this many polls (1: every poll)")
    args = parser.parse_args(argv)

    from monitor.store import Store

    store = Store(args.db)
    try:
        store.migrate()
        stats = HistoryGenerator(store, servers=args.servers, models=args.models, poll_period=args.poll_period,
                                 seed=args.seed, analysis_every=args.analysis_every, fast=args.fast).run(args.days)
    finally:
        store.close()
    import json

    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
