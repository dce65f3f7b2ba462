#!/usr/bin/env python
"""Benchmark: how stale one chat worker's view of the others' load is (#47, ``chat/shared_load.py``).

Four ledgers (four chat workers' ``SharedLedger``s, at the defaults: a beat every second, a lease of
8 s) on a private Redis server on 127.0.0.1, each in a process of its own as workers run. Each
worker enters and leaves requests through 50 servers at random, several times a second, for
``--seconds``; meanwhile every worker records, at each read, the age of every other worker's record
(its staleness), and two more ledgers measure the time from one worker counting a request to
another worker's routing counting it (propagation). Then one
worker is killed (SIGKILL: no withdrawal) and the time until no other counts its load is measured
(target: ≤ 10 s: the lease and a beat). Targets: a record's age when read p95 ≤ 1.5 s (a beat and a round
trip); a request counted by one worker in another's routing p95 ≤ 2.5 s (a beat to publish, a beat
to read).

``.venv/bin/python scripts/bench_shared_load.py [--seconds 60] [--no-write]`` (~1.5 min).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import tempfile
import time
from pathlib import Path

from bench_common import machine, median, percentile, run_and_exit, table, verdict, write_section

WORKERS = 4
SERVERS = 50
STALE_TARGET, PROPAGATION_TARGET, LEASE_TARGET = 1.5, 2.5, 10.0


def worker(url: str, name: str, seconds: float, out: "mp.Queue") -> None:
    """One chat worker's ledger under a random load; reports the age of every other worker's record
    at each of its reads."""
    from chat.server_load import ServerLoad
    from chat.shared_load import SharedLedger

    rng = random.Random(name)
    load = ServerLoad()
    ledger = SharedLedger(url, load, worker=name).start()
    ages: list[float] = []
    last = None
    in_flight: list[list[str]] = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        if rng.random() < 0.5 or not in_flight:
            route = [f"server-{rng.randrange(SERVERS)}" for _ in range(rng.randint(1, 3))]
            load.enter(route)
            in_flight.append(route)
        else:
            load.leave(in_flight.pop(rng.randrange(len(in_flight))))
        if ledger.staleness is not last:  # a new read
            last = ledger.staleness
            ages.extend(last)
        time.sleep(rng.uniform(0.05, 0.25))
    ledger.close()
    out.put(ages)


def propagation(url: str, trials: int) -> list[float]:
    """Seconds from one worker counting a request to another worker's routing counting it (two
    ledgers in this process, each on its own thread, as in two workers)."""
    from chat.server_load import ServerLoad
    from chat.shared_load import SharedLedger

    load_a, load_b = ServerLoad(), ServerLoad()
    a, b = SharedLedger(url, load_a, worker="probe-a").start(), SharedLedger(url, load_b, worker="probe-b").start()
    lags = []
    try:
        for k in range(trials):
            peer = f"mark-{k}"
            time.sleep(random.uniform(0, 1.0))  # at any moment of the beats
            counted = time.monotonic()
            load_a.enter([peer])
            while peer not in load_b.in_flight():
                if time.monotonic() - counted > 30:
                    raise RuntimeError("another worker never counted the request")
                time.sleep(0.005)
            lags.append(time.monotonic() - counted)
            load_a.leave([peer])
    finally:
        a.close()
        b.close()
    return lags


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from monitor.harness.redis_server import RedisServer

    print(machine())
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        try:
            figures = run(redis.url, args.seconds, ctx)
        finally:
            redis.close()
    text = report(figures, args.seconds)
    print(text)
    if not args.no_write:
        write_section("shared-load", text)


def run(url: str, seconds: float, ctx) -> dict:
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, f"w{i}", seconds, out), daemon=True) for i in range(WORKERS)]
    for p in procs:
        p.start()
    time.sleep(3)  # (the workers' first beats)
    lags = propagation(url, max(20, int(seconds // 2.5)))
    ages = [a for _ in procs for a in out.get(timeout=seconds + 60)]
    for p in procs:
        p.join(30)
    victim = ctx.Process(target=_victim, args=(url,), daemon=True)
    victim.start()
    return {"ages": ages, "lags": lags, "forgotten": _time_to_forget(url, victim)}


def _victim(url: str) -> None:
    from chat.server_load import ServerLoad
    from chat.shared_load import SharedLedger

    load = ServerLoad()
    SharedLedger(url, load, worker="victim").start()
    load.enter(["victim-server"])
    time.sleep(3600)


def _time_to_forget(url: str, victim) -> float:
    """Kill the victim once another worker counts its load; seconds until that worker no longer does."""
    from chat.server_load import ServerLoad
    from chat.shared_load import SharedLedger

    load = ServerLoad()
    watcher = SharedLedger(url, load, worker="watcher").start()
    try:
        deadline = time.time() + 30
        while load.in_flight().get("victim-server") != 1:
            if time.time() > deadline:
                raise RuntimeError("the watcher never counted the victim's load")
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.time()
        while load.in_flight().get("victim-server"):
            if time.time() > killed + 60:
                raise RuntimeError("the victim's load was still counted a minute after it died")
            time.sleep(0.05)
        return time.time() - killed
    finally:
        watcher.close()
        victim.join(5)


def report(f: dict, seconds: float) -> str:
    ages, lags = f["ages"], f["lags"]
    age95, lag95 = percentile(ages, 95), percentile(lags, 95)
    return (f"Four chat workers (processes) sharing their load through a private Redis on 127.0.0.1 at the "
            f"defaults (a beat every second, a lease of 8 s), each entering and leaving requests through "
            f"{SERVERS} servers several times a second for {seconds:.0f} s; meanwhile two more ledgers measured "
            f"how long a request counted by one takes to be counted by the other's routing:\n\n"
            + table(["figure", "median", "p95", "max", "target", ""], [
                ["another worker's record, its age when read", f"{median(ages):.2f} s", f"{age95:.2f} s",
                 f"{max(ages):.2f} s", f"p95 ≤ {STALE_TARGET} s", verdict(age95 <= STALE_TARGET)],
                ["a request counted by one worker → in another's routing", f"{median(lags):.2f} s",
                 f"{lag95:.2f} s", f"{max(lags):.2f} s", f"p95 ≤ {PROPAGATION_TARGET} s",
                 verdict(lag95 <= PROPAGATION_TARGET)],
                ["a killed worker (SIGKILL) no longer counted after", f"{f['forgotten']:.1f} s", "", "",
                 f"≤ {LEASE_TARGET:.0f} s", verdict(f["forgotten"] <= LEASE_TARGET)]])
            + f"\n\n{len(ages)} record ages read, {len(lags)} requests followed. A worker's view of the "
              "others' load lags by up to a beat of the writer plus a beat of the reader; route choice itself "
              "never waits on Redis (it reads the last view in memory). A dead worker is forgotten when its "
              "record's lease ends (8 s after its last beat) and another worker reads again (a beat).\n\n"
              "Run: `.venv/bin/python scripts/bench_shared_load.py`.\n")


if __name__ == "__main__":
    run_and_exit(main)
