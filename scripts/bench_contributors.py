"""Benchmark: the contribution ledger (#50) at 500 servers — what it adds to storing a poll, and the
contributors page and API over 30 days of it.

1. **A poll's write**: ``scripts/simulate_swarm``'s plan (500 servers of 4 models, 10 % unreachable,
   every server probed, one probe checked for correctness), assessed and stored as the poller does,
   ``--repeats`` polls 60 s apart: ``record_poll`` with the ledger (the poll's basis kept, the
   interval since the poll before credited by its basis) against the same with both left out,
   alternating in one run (ratio; target: ≤ 10 % added).
2. **The page over 30 days**: the ledger of 500 servers × 30 days (360,000 hourly rows), a month
   of it read from the hours as before revision 0028; then folded into days and pruned as the
   hourly rollup leaves it (15,000 daily rows, two days of hours), and ``/contributors`` for each
   window and ``/api/v1/contributors`` for a month, each request computed anew (no cached answer:
   every query differs), p50 / p95 (target: page p95 ≤ 100 ms).

SQLite. ~2 min. Run: ``.venv/bin/python scripts/bench_contributors.py [--no-write]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from pathlib import Path

from bench_assessment import fresh_store, swarm_inputs
from bench_common import machine, median, ms, percentile, run_and_exit, table, verdict, write_section

from monitor import compat  # noqa: F401  (before petals)
from monitor.app import assessing
from monitor.core.common import DAY, HOUR
from monitor.core.contributions import Accrual
from monitor.core.snapshot import Snapshot
from monitor.settings import Settings
from monitor.store import Store, contributions, writes
from simulate_swarm import sim_models

POLL_TARGET = 0.10  # the accrual adds at most this share to a poll's write
PAGE_TARGET = 0.100  # seconds, p95


def poll_writes(servers: int, repeats: int) -> dict:
    now = time.time()
    models, rows, _, checks, probes = swarm_inputs(servers, now)
    timings = {"with": [], "without": []}
    real, real_basis = contributions.after_poll, writes.ledger.basis
    with tempfile.TemporaryDirectory() as tmp:
        settings, store = fresh_store(Path(tmp), checks, probes, now)
        gc.collect()
        gc.freeze()
        try:
            for i in range(4 * repeats):  # in pairs, alternating: the second of a pair is timed, after one alike
                at = now + 60 * i
                snapshot = Snapshot(taken_at=at, duration=3.0, models=tuple(models), servers=tuple(rows))
                assessed = assessing.assess_poll(store, settings, snapshot, store.latest_reachability(), now=at)
                mode = "with" if (i // 2) % 2 else "without"
                contributions.after_poll = real if mode == "with" else (lambda conn, until: None)
                writes.ledger.basis = real_basis if mode == "with" else (lambda at, servers, assessments: None)
                started = time.perf_counter()
                store.record_poll(snapshot, assessed)
                if i % 2:
                    timings[mode].append(time.perf_counter() - started)
        finally:
            contributions.after_poll, writes.ledger.basis = real, real_basis
        credited = len(store.contributions(None))
        store.close()
    return {"rows": len(rows), "credited": credited, **timings}


def ledger_of(store: Store, servers: int, days: int, rng: random.Random) -> int:
    """``days`` of hourly accruals for ``servers`` servers (one model each, of 4), as polls would leave them."""
    models = [m.dht_prefix for m in sim_models(4)]
    end = time.time() // HOUR * HOUR
    written = 0
    peers = [f"Qm{rng.getrandbits(200):050x}"[:46] for _ in range(servers)]
    for day in range(days):
        batch = []
        for hour in range(24):
            at = end - (day * 24 + hour) * HOUR
            for i, peer in enumerate(peers):
                blocks = 8 + i % 24
                serving = 3600 * (0.0 if rng.random() < 0.05 else 1.0)
                batch.append(Accrual(peer_id=peer, model=models[i % 4], hour=at, announced=blocks * 3600.0,
                                     serving=blocks * serving, verified=blocks * serving * (rng.random() < 0.8),
                                     watched=3600.0, serving_seconds=serving, speed_seconds=serving,
                                     speed_sum=0.02 * serving, block_tokens=rng.randrange(0, 10_000) * blocks,
                                     requests=rng.randrange(0, 50)))
        with store.db.write("writing a benchmark's ledger") as conn:
            contributions.record(conn, batch)
        written += len(batch)
    return written


def pages(servers: int, days: int, requests: int) -> dict:
    from monitor.web import create_app

    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'monitor.db'}")
        store.migrate()
        started = time.perf_counter()
        rows = ledger_of(store, servers, days, rng)
        generated = time.perf_counter() - started
        now = time.time()
        before = []
        for _ in range(max(3, requests // 4)):  # as before revision 0028: a month summed from its hours
            t = time.perf_counter()
            store.contributions((now - 30 * DAY) // HOUR * HOUR)
            before.append(time.perf_counter() - t)
        with store.db.write("the ledger as the hourly rollup leaves it") as conn:  # hours folded, 2 days kept
            contributions.fold(conn, now)
            contributions.prune(conn, now - 400 * DAY, now)
        app = create_app(Settings(data_dir=Path(tmp), initial_peers=[], discover_models=False), store)
        client = app.test_client()
        found = {}
        for name, path, first in (("page, a day", "/contributors?window=day&limit={n}", 100),
                                  ("page, a week", "/contributors?window=week&limit={n}", 100),
                                  ("page, a month", "/contributors?window=month&limit={n}", 100),
                                  ("page, all time", "/contributors?window=all&limit={n}", 100),
                                  ("API, a month", "/api/v1/contributors?window=month&limit={n}", 300)):
            times = []
            for i in range(requests):
                url = path.format(n=first + i)  # a new query each time: computed, never a cached answer
                t = time.perf_counter()
                answer = client.get(url)
                times.append(time.perf_counter() - t)
                assert answer.status_code == 200, (url, answer.status_code)
            found[name] = times
        found["a month from the hours (before: the store's read alone)"] = before
        # the rollup's part, each hour: the hour that ended folded into its day (one row per server)
        t = time.perf_counter()
        with store.db.write("folding a benchmark's newest hour") as conn:
            hour_rows = contributions.fold(conn, now + HOUR + contributions.FOLD_AFTER)
        hourly = time.perf_counter() - t
        # and once a day: the oldest day past the retention summed into the all-time rows
        oldest = (now // HOUR * HOUR - (days * 24 - 1) * HOUR) // DAY * DAY
        t = time.perf_counter()
        with store.db.write("folding a benchmark's oldest day") as conn:
            folded = contributions.prune(conn, oldest + DAY + HOUR, now)
        fold = time.perf_counter() - t
        store.close()
    return {"rows": rows, "generated": generated, "times": found, "fold": fold, "folded": folded, "hourly": hourly,
            "hour_rows": hour_rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(machine())
    writes = poll_writes(args.servers, args.repeats)
    added = median(writes["with"]) / median(writes["without"]) - 1
    shown = pages(args.servers, args.days, args.requests)
    page_p95 = max(percentile(t, 95) for name, t in shown["times"].items() if name.startswith("page"))
    text = (f"**A poll's write** ({writes['rows']} server records of 4 models, SQLite, {args.repeats} polls each way, "
            f"alternating):\n\n" + table(["record_poll", "median", "p95"], [
                ["without the ledger", ms(median(writes["without"])), ms(percentile(writes["without"], 95))],
                ["with it", ms(median(writes["with"])), ms(percentile(writes["with"], 95))]])
            + f"\n\nadded: **{added * 100:+.1f} %** of a poll's write (target ≤ {POLL_TARGET * 100:.0f} %): "
              f"{verdict(added <= POLL_TARGET)}; {writes['credited']} servers credited.\n\n"
            f"**Contributors over {args.days} days** ({shown['rows']:,} hourly rows of {args.servers} servers and their "
            f"days, "
            f"written in {shown['generated']:.0f} s; each request computed anew):\n\n"
            + table(["request", "p50", "p95"], [[name, ms(median(t)), ms(percentile(t, 95))]
                                                for name, t in shown["times"].items()])
            + f"\n\npage p95 **{ms(page_p95)}** (target ≤ {ms(PAGE_TARGET)}): {verdict(page_p95 <= PAGE_TARGET)}.\n\n"
              f"The rollup's part: the hours are summed as polls are written (the poll's write above); the hourly "
              f"rollup folds the hour that ended into its day ({ms(shown['hourly'])} for {shown['hour_rows']:,} "
              f"rows) and drops hours older than two days (only the last day reads them); once a day the oldest "
              f"day past the retention goes into the all-time rows ({ms(shown['fold'])} for {shown['folded']:,} "
              f"rows).\n\n"
              "Run: `.venv/bin/python scripts/bench_contributors.py`.\n")
    print(text)
    if not args.no_write:
        write_section("contributors", text)


if __name__ == "__main__":
    run_and_exit(main)
