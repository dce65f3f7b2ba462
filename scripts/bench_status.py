#!/usr/bin/env python
"""Figure: the status page's latency (p50/p95) over 90 days × 500 servers, alone and with 16
concurrent clients; the Atom feed and a badge beside it.

    .venv/bin/python scripts/bench_status.py [--days 90 --servers 500] [--regenerate]

The history is made once by scripts/generate_history.py's ``HistoryGenerator`` through the
store's write path, every poll with its models' diagnoses (the status page reads the models'
states: hourly rollups over 90 days, raw rows over the last 2), but with a poll every 10 minutes
before the last 3 days (``COARSE``): those hours are rolled up into one row per model and hour
either way, so the page reads the same rows as over a history polled every minute, and the
history takes ~30 min instead of ~4 h. It is kept in ``--db`` and reused while its parameters
match. The web app runs in its own process on 127.0.0.1 (werkzeug, threaded, as ``swarm-monitor
serve``); this process is the client (``bench_dashboard.measure_endpoints``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import bench_common as bc

CACHE = Path(os.environ.get("SWARM_MONITOR_BENCH_CACHE", Path.home() / ".cache" / "petals-swarm-monitor-bench"))
TARGETS_P95 = {"/status": 0.100}
COARSE = 10  # one poll in COARSE before the last FINE_DAYS
FINE_DAYS = 3.0


def status_history(store, *, servers: int):
    """A ``HistoryGenerator`` that diagnoses every poll it makes (unlike its ``fast`` mode, which
    leaves the models' states out before the last 2 hours) and polls every ``COARSE`` periods
    before the last ``FINE_DAYS``."""
    from generate_history import DAY, HistoryGenerator

    class StatusHistory(HistoryGenerator):
        def _poll_times(self, start: float, end: float) -> list[float]:
            times, at, fine_from = [], start, end - FINE_DAYS * DAY
            while at < end - 1e-6:
                times.append(at)
                at += self.poll_period * (COARSE if at < fine_from else 1)
            return times

    return StatusHistory(store, servers=servers, models=4, poll_period=60)


def ensure_history(db: Path, *, days: float, servers: int, regenerate: bool) -> dict:
    """Generate the history unless a matching one exists; returns its description."""
    wanted = {"days": days, "servers": servers, "models": 4, "poll_period": 60, "coarse": COARSE,
              "fine_days": FINE_DAYS}
    return bc.cached_history(db, wanted, lambda store: status_history(store, servers=servers), regenerate=regenerate)


def cold_builds(db: Path, n: int = 5) -> list[float]:
    """Seconds to read and fold the whole status page's history with an empty cache (what the first
    request after each poll pays, once per web worker), ``n`` times in this process."""
    from monitor.settings import Settings
    from monitor.store import Store
    from monitor.web import create_app, deps, queries, status

    url = f"sqlite:///{db}"
    store = Store(url)
    seconds = []
    try:
        for _ in range(n):
            app = create_app(Settings(database_url=url, data_dir=db.parent), store)  # a new app: an empty cache
            with app.test_request_context("/status"):
                d = deps()
                cur = queries.current(d)
                started = time.perf_counter()
                status.model_statuses(d, cur, time.time())
                seconds.append(time.perf_counter() - started)
    finally:
        store.close()
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=90)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--db", type=Path, default=None, help="SQLite file for the history (reused when it matches)")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--generate-only", action="store_true", help="make the history and stop")
    parser.add_argument("--requests", type=int, default=30, help="sequential requests per endpoint, alone")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client-requests", type=int, default=10, help="requests per concurrent client")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from bench_dashboard import WebServer, measure_endpoints, pick_targets

    db = args.db or CACHE / f"history-status-{args.days:g}d-{args.servers}s.db"
    print(bc.machine())
    meta = ensure_history(db, days=args.days, servers=args.servers, regenerate=args.regenerate)
    if args.generate_only:
        return
    targets = pick_targets(db)  # migrates the history to this version's schema; the biggest model, the oldest peer
    cold = cold_builds(db)
    print(f"cold build of the status page's history: median {bc.ms(bc.median(cold))}, max {bc.ms(max(cold))}")
    endpoints = {
        "/status": "/status",
        "/status/feed.atom": "/status/feed.atom",
        "model uptime badge (30 d)": f"/badges/models/{targets['model']}/uptime/30d.svg",
        "peer uptime badge (30 d)": f"/badges/peers/{targets['peer']}/uptime/30d.svg",
    }
    with WebServer(db, "werkzeug") as web:
        results = measure_endpoints(web, endpoints, args, width=28)
    rows = []
    for name, (alone, loaded) in results.items():
        target = TARGETS_P95.get(name)
        rows.append([name, bc.ms(alone["p50"]), f"**{bc.ms(alone['p95'])}**", bc.ms(loaded["p50"]),
                     bc.ms(loaded["p95"]), f"{loaded['rps']:.1f}", f"{alone['bytes'] / 1024:.0f} kB",
                     alone["failed"] + loaded["failed"], f"p95 ≤ {target * 1000:.0f} ms" if target else "",
                     bc.verdict(alone["p95"] <= target) if target else ""])
    gen = meta.get("generation", {})
    markdown = bc.table(["endpoint", "p50 alone", "p95 alone", f"p50 ({args.clients} clients)",
                         f"p95 ({args.clients} clients)", "req/s (concurrent)", "response", "failed", "target", ""],
                        rows)
    markdown += (
        f"\n\nThe status page over {args.days:g} days × {args.servers} servers × 4 models (its bars read every "
        f"model's hourly rollups of {args.days:g} days and the raw polls of the last 2): werkzeug (threaded, as "
        f"`swarm-monitor serve`) in its own process on 127.0.0.1, the client this process; 'alone': "
        f"{args.requests} sequential requests after 3 warm-ups, concurrent: {args.clients} clients × "
        f"{args.client_requests}. A page is read and folded once per store change (a poll) and minute and kept "
        f"in the app's cache: that first request costs **{bc.ms(bc.median(cold))}** (median of {len(cold)} "
        f"builds with an empty cache, max {bc.ms(max(cold))}), once per poll and web worker. History made "
        f"through the store's write path with every poll's diagnosis, a poll a minute for the last "
        f"{FINE_DAYS:g} days and one in {COARSE} before (the same rollup rows per model and hour), "
        f"{gen.get('polls')} polls in {gen.get('seconds', float('nan')) / 60:.0f} min, ending "
        f"{(time.time() - meta['end']) / 3600:.1f} h before this run."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("status-page", markdown)


if __name__ == "__main__":
    main()
