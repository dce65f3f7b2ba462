"""Benchmark: the one stored assessment at 500 servers — its size per poll, and what assessing,
storing and reading it costs (``scripts/simulate_swarm``'s plan, 4 models, every server probed
twice, one probe checked for correctness, 10 % of servers unreachable).

Writes the ``assessment`` section of BENCHMARKS.md. ~1 min. Run: ``.venv/bin/python scripts/bench_assessment.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

from bench_common import machine, median, ms, percentile, run_and_exit, stamp, table, write_section

from monitor import compat  # noqa: F401  (before petals)
from monitor.app import assessing
from monitor.core.probes import CORRECT, ServerProbe
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.settings import Settings
from monitor.store import Store
from monitor.store.writes import ASSESSMENT_RETENTION
from simulate_swarm import plan_swarm, planned_rows, sim_models


def build(servers: int):
    planned = plan_swarm(servers, sim_models(4), unreachable=0.1)
    models, rows = planned_rows(planned, sim_models(4))
    return models, rows, planned


def swarm_inputs(servers: int, now: float):
    """``servers`` server records of 4 models (10 % unreachable), their reachability checks and two
    speed probes each (the newer checked correct): (models, rows, unreachable, checks, probes)."""
    models, rows, planned = build(servers)
    unreachable = {s.peer_id for s in planned[: len(planned) // 10]}
    checks = tuple(ReachabilityResult(row.peer_id, "server", row.peer_id not in unreachable, rtt=0.02,
                                      error="Failed to connect in 5 sec" if row.peer_id in unreachable else None)
                   for row in {r.peer_id: r for r in rows}.values())
    probes = [ServerProbe(row.peer_id, row.model, row.start, row.end, at=now - 30 - i * 60, ok=True,
                          seconds_per_token=0.02 * (row.end - row.start), rtt=0.01, prefill_seconds=0.05, duration=0.3,
                          verdict=CORRECT if i == 0 else None, error_ratio=1e-5 if i == 0 else None,
                          tolerance=1e-3 if i == 0 else None, checked_against="peers" if i == 0 else None)
              for row in rows if row.peer_id not in unreachable for i in range(2)]
    return models, rows, unreachable, checks, probes


def fresh_store(directory: Path, checks, probes, now: float) -> tuple[Settings, Store]:
    """Settings and a migrated SQLite store in ``directory`` holding the checks and probes."""
    settings = Settings(data_dir=directory, initial_peers=[], discover_models=False)
    store = Store(f"sqlite:///{directory / 'monitor.db'}")
    store.migrate()
    store.record_reachability(ReachabilityBatch(taken_at=now - 5, duration=1.0, results=checks))
    store.record_server_probes(probes)
    return settings, store


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    now = time.time()
    models, rows, unreachable, checks, probes = swarm_inputs(args.servers, now)
    with tempfile.TemporaryDirectory() as tmp:
        settings, store = fresh_store(Path(tmp), checks, probes, now)
        gc.collect()
        gc.freeze()
        assess_s, record_s, read_s, state_s = [], [], [], []
        for i in range(args.repeats):
            snapshot = Snapshot(taken_at=now + i, duration=3.0, models=tuple(models), servers=tuple(rows))
            started = time.perf_counter()
            assessed = assessing.assess_poll(store, settings, snapshot, store.latest_reachability(), now=now + i)
            assess_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.record_poll(snapshot, assessed)
            record_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.latest_assessments()
            read_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.latest_state()
            state_s.append(time.perf_counter() - started)
        size = sum(len(json.dumps(a.to_dict())) for a in assessed)
        store.close()
    figures = table(["what", "median", "p95"], [
        ["assess (4 models, every input read at one now)", ms(median(assess_s)), ms(percentile(assess_s, 95))],
        ["record_poll with its assessments (one transaction)", ms(median(record_s)), ms(percentile(record_s, 95))],
        ["latest_assessments (every reader's one call)", ms(median(read_s)), ms(percentile(read_s, 95))],
        ["latest_state (the web's one transaction)", ms(median(state_s)), ms(percentile(state_s, 95))],
    ])
    text = (f"_Last run {stamp()}, {machine()}._\n\n"
            f"## The one stored assessment at {args.servers} servers\n\n"
            f"{len(rows)} server records of 4 models, {len(probes)} probes in the window, {len(unreachable)} "
            f"servers unreachable; {args.repeats} polls, SQLite. One poll's assessments are "
            f"**{size / 1024:.0f} KiB** of JSON ({size / max(len(rows), 1):.0f} bytes per server record); kept "
            f"{ASSESSMENT_RETENTION / 3600:g} h (`ASSESSMENT_RETENTION`, pruned with every poll), that is "
            f"{size * ASSESSMENT_RETENTION / 60 / 2**20:.0f} MiB at the default 60 s scrape period.\n\n"
            f"{figures}\n\nRun: `.venv/bin/python scripts/bench_assessment.py`.\n")
    print(text)
    if not args.no_write:
        write_section("assessment", text)


if __name__ == "__main__":
    run_and_exit(main)
