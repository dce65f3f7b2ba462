#!/usr/bin/env python
"""Figure: fail-over of the pollers — take-over time after the leader is killed (SIGKILL) and after
it is frozen (SIGSTOP of its whole process group), median and worst of a few runs; the longest gap
between stored polls across each take-over; and what a standby costs (memory, database load).

    .venv/bin/python scripts/bench_failover.py [--runs 3] [--scrape-period 10] [--database-url URL]

Swarm: a bootstrap peer and one full server of the tiny model (the swarm harness, 127.0.0.1).
Database: a throwaway PostgreSQL cluster (``tests/postgres.py``), or ``--database-url``. Pollers:
real ``swarm-monitor poll`` processes (``monitor/harness/pollers.py``), the lease at its default
(half a scrape period), so the bound is ``core.leadership.takeover_within``: 1.5 leases.

- *take-over*: from the signal to the start of the standby's term (its claim's time in the
  database), per run;
- *gap*: the longest interval between two successive stored polls from the last poll before the
  signal to the first one after the take-over (the bound: a scrape period plus the take-over
  bound, plus the poll's own duration);
- *standby cost*: the proportional set size (PSS) of a standby's process tree (the poller, its
  DHT child, p2pd) against the leader's, and the statements and transactions per minute each
  sends to PostgreSQL (counted from the server's statement log, by application name).

A frozen leader is woken after the take-over and becomes the next run's standby (it steps down
without writing); a killed one is replaced by a new standby. Short runs; the machine has 2 shared
cores, so the section records the load.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import bench_common as bc

from monitor import compat  # noqa: F401  (must precede petals)

sys.path.insert(0, str(bc.ROOT / "tests"))  # the throwaway PostgreSQL cluster of the specs


def tree_pss(pid: int) -> float:
    """MiB of proportional set size of a process and its descendants (shared pages split)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except psutil.NoSuchProcess:
        return float("nan")
    return total / 2**20


def statement_counts(log_file: Path, since_offset: int) -> dict[str, dict[str, int]]:
    """application name -> statements and BEGINs logged since ``since_offset`` bytes."""
    counts: dict[str, dict[str, int]] = {}
    with open(log_file, "rb") as log:
        log.seek(since_offset)
        for raw in log:
            line = raw.decode(errors="replace")
            found = re.match(r"app=(\S*) .*?LOG:\s+(?:statement|execute [^:]*): (.*)", line)
            if not found:
                continue
            app = counts.setdefault(found.group(1), {"statements": 0, "transactions": 0})
            app["statements"] += 1
            app["transactions"] += found.group(2).strip().upper().startswith("BEGIN")
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per kind of failure")
    parser.add_argument("--scrape-period", type=float, default=10.0)
    parser.add_argument("--database-url", default=None, help="a PostgreSQL database (default: a throwaway cluster)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)

    from monitor.core import leadership as core
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec
    from monitor.harness.pollers import PollerProcess, leader_pid, poll_times, write_config
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model
    from monitor.store import Store

    print(f"machine: {bc.machine()}", flush=True)
    period = args.scrape_period
    lease = core.default_lease_seconds(period)
    bound = core.takeover_within(lease)
    cluster = None
    if args.database_url is None:
        from postgres import start_cluster

        cluster = start_cluster()
        url_base = cluster.url
    else:
        url_base = args.database_url
    data = Path(os.environ.get("SWARM_MONITOR_TEST_DATA", Path.home() / ".cache" / "petals-swarm-monitor-tests"))
    model = ensure_tiny_model(data)
    results = {"kill": [], "freeze": []}
    cost = {}
    pollers: list[PollerProcess] = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp_name, \
            LocalSwarm(model, TINY_DHT_PREFIX, update_period=5) as swarm:
        tmp = Path(tmp_name)
        try:
            swarm.start([ServerSpec("full", 0, TINY_NUM_BLOCKS, throughput=100.0)])
            store = Store(url_base)
            store.migrate()
            if cluster is not None:  # every statement in the server's log, with the client's application name
                with store.engine.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                    conn.exec_driver_sql("ALTER SYSTEM SET log_statement = 'all'")
                    conn.exec_driver_sql("ALTER SYSTEM SET log_line_prefix = 'app=%%a '")
                    conn.exec_driver_sql("SELECT pg_reload_conf()")
            config = write_config(tmp / "poller.toml", initial_peers=swarm.initial_peers,
                                  models=[(TINY_DHT_PREFIX, TINY_NUM_BLOCKS)], scrape_period=period)
            serial = iter(range(1, 1000))

            def start() -> PollerProcess:
                name = f"poller-{next(serial)}"
                url = url_base + ("&" if "?" in url_base else "?") + f"application_name={name}"
                poller = PollerProcess(name, config, url, tmp / name).start()
                pollers.append(poller)
                return poller

            def standing_by(poller: PollerProcess) -> bool:
                found = next((m for m in store.poller_status().members if m.pid == poller.pid), None)
                return found is not None and found.role == core.STANDBY and time.time() - found.seen_at < 2 * lease

            leader = start()
            if not bc.wait(lambda: leader_pid(store) == leader.pid and len(poll_times(store)) >= 2, 300):
                raise SystemExit("the first poller never led:\n" + leader.log()[-3000:])
            standby = start()
            if not bc.wait(lambda: standing_by(standby), 300):
                raise SystemExit("the standby never reported:\n" + standby.log()[-3000:])

            # ---- the standby's cost: a minute of leader and standby side by side ----
            time.sleep(period)
            offset = cluster.log_file.stat().st_size if cluster is not None else 0
            began = time.time()
            time.sleep(60)
            minutes = (time.time() - began) / 60
            cost = {"leader_mib": tree_pss(leader.pid), "standby_mib": tree_pss(standby.pid)}
            if cluster is not None:
                counts = statement_counts(cluster.log_file, offset)
                for role, poller in (("leader", leader), ("standby", standby)):
                    mine = counts.get(poller.name, {"statements": 0, "transactions": 0})
                    cost[f"{role}_statements"] = mine["statements"] / minutes
                    cost[f"{role}_transactions"] = mine["transactions"] / minutes
                with store.engine.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                    conn.exec_driver_sql("ALTER SYSTEM RESET log_statement")
                    conn.exec_driver_sql("SELECT pg_reload_conf()")
            print(f"  standby cost: {cost}", flush=True)

            # ---- take-overs ----
            for kind in ("kill", "freeze"):
                for run in range(args.runs):
                    before = poll_times(store)
                    lost_at = leader.kill() if kind == "kill" else leader.freeze()
                    if not bc.wait(lambda: leader_pid(store) == standby.pid, bound + 60, step=0.1):
                        raise SystemExit(f"{kind} run {run + 1}: no take-over:\n" + standby.log()[-3000:])
                    term = store.poller_status().terms[0]
                    took = term.since - lost_at
                    # the first poll of the new term (a poll the old leader stored meanwhile would show as a short gap)
                    after = bc.wait(lambda: [t for t in poll_times(store, before[-1] + 1e-6) if t >= term.since - 1], 3 * period)
                    if not after:
                        raise SystemExit(f"{kind} run {run + 1}: no poll after the take-over")
                    gap = min(poll_times(store, before[-1] + 1e-6)) - before[-1]
                    results[kind].append({"takeover": took, "gap": gap})
                    print(f"  {kind} run {run + 1}: take-over {took:.1f} s, gap {gap:.1f} s", flush=True)
                    if kind == "freeze":
                        time.sleep(lease)
                        leader.wake()  # it steps down without writing: the next run's standby
                        if not bc.wait(lambda: standing_by(leader), 60):
                            raise SystemExit("the woken poller did not stand by:\n" + leader.log()[-3000:])
                        leader, standby = standby, leader
                    else:
                        leader, standby = standby, start()
                        if not bc.wait(lambda: standing_by(standby), 300):
                            raise SystemExit("the new standby never reported:\n" + standby.log()[-3000:])
                    time.sleep(period)  # a poll or two of the new leader before the next failure
            store.close()
        finally:
            for poller in pollers:
                poller.close()
            if cluster is not None:
                cluster.close()

    claims_per_minute = 60 / core.renew_every(lease)
    per_claim = cost.get("standby_statements", float("nan")) / claims_per_minute
    rows = []
    for kind, label in (("kill", "kill -9 the leader"), ("freeze", "SIGSTOP the leader (its process group)")):
        took = [r["takeover"] for r in results[kind]]
        gap = [r["gap"] for r in results[kind]]
        rows.append([label, len(took), bc.fmt(bc.median(took)), bc.fmt(max(took)), bc.fmt(bc.median(gap)),
                     bc.fmt(max(gap)), bc.verdict(max(took) <= bound and max(gap) <= period + bound + 5)])
    text = "\n".join([
        f"### Poller fail-over: {args.runs} runs per failure, scrape period {period:g} s, lease {lease:g} s",
        "",
        f"Two `swarm-monitor poll` processes on one PostgreSQL database and a swarm of one server (tiny model); "
        f"the bound on a take-over is 1.5 leases ({bound:g} s), on the gap between two stored polls across it a "
        f"scrape period plus that plus the poll itself (taken as 5 s: {period + bound + 5:g} s). The take-over is "
        "timed from the signal to the start of the standby's term in the database; the gap from the last poll "
        "the old leader stored to the first the new one stored.",
        "",
        bc.table(["failure", "runs", "take-over, median", "take-over, worst", "gap between polls, median",
                  "gap, worst", f"take-over ≤ {bound:g} s, gap ≤ {period + bound + 5:g} s"], rows),
        "",
        bc.table(["poller", "memory (PSS of its process tree)", "statements / min", "transactions / min"], [
            ["leader", f"{cost.get('leader_mib', float('nan')):.0f} MiB",
             f"{cost.get('leader_statements', float('nan')):.0f}", f"{cost.get('leader_transactions', float('nan')):.0f}"],
            ["standby", f"{cost.get('standby_mib', float('nan')):.0f} MiB",
             f"{cost.get('standby_statements', float('nan')):.0f}", f"{cost.get('standby_transactions', float('nan')):.0f}"],
        ]),
        "",
        "A standby's memory is a DHT client's (hivemind and torch imported, p2pd): a second poller costs a "
        "second machine's worth of it, not more. Its database load is one claim per renewal period (a quarter "
        f"lease, here every {core.renew_every(lease):g} s): one short write transaction that reads the lease and "
        f"reports the poller, {per_claim:.1f} statements each; at the default 60 s scrape period (a 30 s lease, a "
        f"claim every {core.renew_every(30.0):g} s) that is {per_claim * 60 / core.renew_every(30.0):.0f} statements "
        f"and {60 / core.renew_every(30.0):.0f} transactions a minute. "
        "Run: `.venv/bin/python scripts/bench_failover.py`.",
    ])
    print("\n" + text)
    if not args.no_write:
        bc.write_section("failover", text)


if __name__ == "__main__":
    main()
