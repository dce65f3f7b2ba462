#!/usr/bin/env python
"""Figure: scrape and reachability-check time vs swarm size (virtual servers over 4 models, 10 % unreachable).

    .venv/bin/python scripts/bench_scrape.py [--sizes 100 500 2000] [--runs 5]

For each size: a bootstrap peer and scripts/simulate_swarm.py (its own process) announcing the
virtual servers into a real DHT on loopback, refreshed as real servers do; then the monitor's own
DHT client runs ``monitor.swarm.scrape`` (cold once, then ``--runs`` times) and
``monitor.swarm.check_servers`` over the ONLINE peers, sorted as the poller sorts them.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import bench_common as bc

from monitor import compat  # noqa: F401  (must precede petals)

TARGET_SCRAPE_SECONDS = 1.0  # at 500 servers with 10 % unreachable


def measure(size: int, *, runs: int, check_runs: int, responders: int, hung_cap: int, timeout: float,
            concurrency: int) -> dict:
    from monitor.swarm import check_servers, scrape, start_dht

    with bc.bootstrap_peer() as initial_peers:
        hung = min(hung_cap, round(0.1 * size))
        with bc.simulator(initial_peers, servers=size, responders=responders, hung=hung) as sim:
            kind_of = {peer: kind for kind, peers in sim["peers"].items() for peer in peers}
            dht = start_dht(initial_peers)
            try:
                cold, snapshot = bc.timed(scrape, dht, [], discover=True)
                warm = []
                for _ in range(runs):
                    snapshot = scrape(dht, [], discover=True)
                    warm.append(snapshot.duration)
                online = sorted({r.peer_id for r in snapshot.servers if r.state == "ONLINE"})
                check_times, outcome = [], Counter()
                for _ in range(check_runs):
                    batch = check_servers(dht, online, timeout=timeout, concurrency=concurrency)
                    check_times.append(batch.duration)
                    outcome = Counter("ok" if r.ok else "timeout" if "within" in (r.error or "") else "failed"
                                      for r in batch.results)
            finally:
                dht.shutdown()
    kinds = Counter(kind_of.get(peer, "?") for peer in online)
    return {
        "size": size, "records": sim["records"], "rows": len(snapshot.servers),
        "missing": len(set(kind_of) - {r.peer_id for r in snapshot.servers}), "invalid": snapshot.invalid_records,
        "errors": snapshot.errors, "cold": cold, "scrape": bc.median(warm), "scrape_max": max(warm),
        "checked": len(online), "check": bc.median(check_times), "outcome": dict(outcome), "kinds": dict(kinds),
        "hung": hung, "expected_check": math.ceil(kinds.get("hung", 0) / concurrency) * timeout,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--runs", type=int, default=5, help="warm scrapes per size (median reported)")
    parser.add_argument("--check-runs", type=int, default=3, help="reachability check rounds per size (median)")
    parser.add_argument("--responders", type=int, default=8, help="virtual servers whose peer answers rpc_info")
    parser.add_argument("--hung-cap", type=int, default=16,
                        help="at most this many unreachable peers hang (each is a frozen p2pd, ~60 MB)")
    parser.add_argument("--reachability-timeout", type=float, default=5.0)
    parser.add_argument("--reachability-concurrency", type=int, default=32)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)

    print(bc.machine())
    results = []
    for size in args.sizes:
        print(f"\n== {size} virtual servers over 4 models ==", flush=True)
        result = measure(size, runs=args.runs, check_runs=args.check_runs, responders=args.responders,
                         hung_cap=args.hung_cap, timeout=args.reachability_timeout, concurrency=args.reachability_concurrency)
        print(result, flush=True)
        results.append(result)

    rows = []
    for r in results:
        target = verdict = ""
        if r["size"] == 500:
            target = f"≤ {TARGET_SCRAPE_SECONDS:.1f} s"
            verdict = bc.verdict(r["scrape"] <= TARGET_SCRAPE_SECONDS)
        rows.append([
            r["size"], r["records"], f"{r['rows']} ({r['missing']} missing, {r['invalid']} invalid)",
            f"{r['cold']:.2f} s", f"**{r['scrape']:.2f} s** (max {r['scrape_max']:.2f})", target, verdict,
            r["checked"], f"{r['check']:.1f} s",
            f"{r['outcome'].get('ok', 0)} ok / {r['outcome'].get('failed', 0)} failed fast / "
            f"{r['outcome'].get('timeout', 0)} timed out", f"{r['expected_check']:.0f} s",
        ])
    markdown = bc.table(
        ["servers", "(block, peer) records", "rows scraped", "first scrape", "scrape (median)", "target", "",
         "peers checked", "reachability checks (median)", "check outcomes", "ideal check time"],
        rows,
    )
    markdown += (
        f"\n\nScrape: median of {args.runs} warm scrapes (`monitor.swarm.scrape`, discover on, batches of 256 "
        f"blocks) after one cold scrape. Reachability checks: median of {args.check_runs} runs of `check_servers` over the "
        f"ONLINE peers in the poller's order (sorted), timeout {args.reachability_timeout:g} s, concurrency "
        f"{args.reachability_concurrency}; {args.responders} peers answer, up to {args.hung_cap} unreachable peers hang "
        f"(frozen p2pd), the rest have no process and fail at the routing lookup. 'Ideal check time' is "
        f"ceil(hung / concurrency) × timeout, what `check_servers`' docstring promises."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("scrape", markdown)


if __name__ == "__main__":
    main()
