#!/usr/bin/env python
"""Figure: dashboard latency (p50/p95) on 30 days × 60 s polls × 500 servers, alone and with 16
concurrent clients; database size.

    .venv/bin/python scripts/bench_dashboard.py [--days 30 --servers 500] [--server werkzeug|gunicorn]

The history is generated once (scripts/generate_history.py, through the store's write path) into
``--db`` (default: a SQLite file in ~/.cache/petals-swarm-monitor-bench/) and reused while its
parameters match (``--regenerate`` forces a new one). The web app runs in its own process on
127.0.0.1, as ``swarm-monitor serve`` runs it (werkzeug, threaded) or as the README's production
line (gunicorn gthread, 2 workers × 8 threads); this process is the client.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bench_common as bc

CACHE = Path(os.environ.get("SWARM_MONITOR_BENCH_CACHE", Path.home() / ".cache" / "petals-swarm-monitor-bench"))
TARGETS_P95 = {"overview": 0.050, "model page": 0.100, "peer history (API, 30 days)": 0.100}
TARGET_DB_BYTES = 1 << 30


# ---- the history ------------------------------------------------------------------------------


def ensure_history(db: Path, *, days: float, servers: int, regenerate: bool, fast: bool = False,
                   fine_days: float = 3.0) -> dict:
    """Generate the history unless a matching one exists; returns its description. ``fast``,
    ``fine_days``: the generator's fast mode (``HistoryGenerator``: for the peer and score benchmarks)."""
    from generate_history import HistoryGenerator

    wanted = {"days": days, "servers": servers, "models": 4, "poll_period": 60, **({"fast": True} if fast else {}),
              **({"fine_days": fine_days} if fast and fine_days != 3.0 else {})}

    def generator(store):
        return HistoryGenerator(store, servers=servers, models=4, poll_period=60, fast=fast, fine_days=fine_days)

    return bc.cached_history(db, wanted, generator, regenerate=regenerate)


def backfill_diagnoses(store) -> None:
    """A history made before the poller stored diagnoses gets one for its latest poll, as the
    poller's next probe round would write it (else the web would diagnose it itself)."""
    from monitor.app.jobs import Poller
    from monitor.settings import Settings

    snapshot = store.latest_snapshot()
    if snapshot is not None and not store.latest_assessments():
        Poller(Settings(), store, dht=None).assess_latest()


def pick_targets(db: Path) -> dict:
    """The biggest model, and a peer seen over the whole history (the longest peer history)."""
    import sqlalchemy as sa

    from monitor.store import Store
    from monitor.store.schema import Peer, WatchedModel

    store = Store(f"sqlite:///{db}")
    try:
        store.migrate()  # a history made before a schema change is brought up to date, data kept
        backfill_diagnoses(store)
        with store.engine.connect() as conn:
            models, peers = WatchedModel.__table__.c, Peer.__table__.c
            model = conn.execute(sa.select(models.dht_prefix).order_by(models.num_blocks.desc())).scalar()
            peer = conn.execute(sa.select(peers.peer_id).where(peers.first_seen.is_not(None))
                                .order_by((peers.last_seen - peers.first_seen).desc())).scalar()
        size = store.database_size_bytes()
    finally:
        store.close()
    return {"model": model, "peer": peer, "database_bytes": size}


# ---- the server ---------------------------------------------------------------------------------


def serve(db_url: str, ready_file: str) -> None:
    """(child process) The web app over the store, served by werkzeug (threaded) as `swarm-monitor
    serve` serves it; like a web worker, it imports no petals."""
    from werkzeug.serving import make_server

    from monitor.settings import Settings
    from monitor.store import Store
    from monitor.web import create_app

    settings = Settings(database_url=db_url)
    app = create_app(settings, Store(db_url))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    Path(ready_file).write_text(json.dumps({"port": server.server_port, "pid": os.getpid()}))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


class WebServer:
    """The web app over the history, in its own process (werkzeug or gunicorn) on 127.0.0.1."""

    def __init__(self, db: Path, kind: str):
        self.db, self.kind = db, kind
        self.base = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "WebServer":
        url = f"sqlite:///{self.db}"
        ready = Path(f"/tmp/bench-dashboard-{os.getpid()}.json")
        ready.unlink(missing_ok=True)
        log = Path(f"/tmp/bench-dashboard-{os.getpid()}.log")
        if self.kind == "werkzeug":
            args = [sys.executable, __file__, "_serve", url, str(ready)]
            env = dict(os.environ)
        else:
            port = bc.free_port()
            args = bc.gunicorn_args(port)
            env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(self.db.parent), SWARM_MONITOR_DATABASE_URL=url,
                       PYTHONPATH=str(bc.ROOT))
            ready.write_text(json.dumps({"port": port}))
        proc = self._stack.enter_context(bc.process(args, log, env=env))
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        self.base = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}" if ready.exists() else "http://-"
        ready.unlink(missing_ok=True)
        bc.wait_http(self.base, proc, log, timeout=max(1.0, deadline - time.monotonic()))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        Path(f"/tmp/bench-dashboard-{os.getpid()}.log").unlink(missing_ok=True)


# ---- the client ---------------------------------------------------------------------------------


def fetch(url: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    return time.perf_counter() - started, status, len(body)


def measure(url: str, *, clients: int, requests: int, warmup: int = 3) -> dict:
    for _ in range(warmup):
        fetch(url)
    latencies, failures, sizes = [], [], []
    lock = threading.Lock()

    def client():
        for _ in range(requests):
            seconds, status, size = fetch(url)
            with lock:
                latencies.append(seconds)
                sizes.append(size)
                if status != 200:
                    failures.append(status)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"p50": bc.percentile(latencies, 50), "p95": bc.percentile(latencies, 95), "n": len(latencies),
            "failed": len(failures), "statuses": sorted(set(failures)), "rps": len(latencies) / wall,
            "bytes": int(bc.median(sizes))}


def endpoint_line(name: str, alone: dict, loaded: dict, clients: int) -> str:
    """One endpoint's figures, alone and under load (``name`` padded by the caller)."""
    return (f"{name} alone p50 {bc.ms(alone['p50'])} p95 {bc.ms(alone['p95'])} | {clients} clients "
            f"p50 {bc.ms(loaded['p50'])} p95 {bc.ms(loaded['p95'])} {loaded['rps']:.1f} req/s | "
            f"{alone['bytes']} bytes, failed {alone['failed'] + loaded['failed']}")


def measure_endpoints(web: WebServer, endpoints: dict[str, str], args, *, width: int, line=endpoint_line) -> dict:
    """Each endpoint (name -> path) alone (``args.requests`` sequential requests) and under load
    (``args.clients`` clients × ``args.client_requests``): {name: (alone, loaded)}; after each,
    ``line(name padded to width, alone, loaded, clients)`` is printed."""
    results = {}
    for name, path in endpoints.items():
        alone = measure(web.base + path, clients=1, requests=args.requests)
        loaded = measure(web.base + path, clients=args.clients, requests=args.client_requests)
        results[name] = (alone, loaded)
        print(line(f"{name:{width}s}", alone, loaded, args.clients), flush=True)
    return results


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_serve":
        return serve(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--db", type=Path, default=None, help="SQLite file for the history (reused when it matches)")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--server", choices=("werkzeug", "gunicorn"), default="werkzeug")
    parser.add_argument("--requests", type=int, default=30, help="sequential requests per endpoint, alone")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client-requests", type=int, default=10, help="requests per concurrent client")
    parser.add_argument("--fast", action="store_true",
                        help="the fast history (the one bench_history.py uses: polls every minute for the last 3 "
                             "days, one in ten before; ~1 h to generate instead of ~3): pages read the same "
                             "latest state, rollups and 2 days of raw rows, but the database size is not the "
                             "full history's, so it is left out")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    db = args.db or CACHE / f"history-{'fast-' if args.fast else ''}{args.days:g}d-{args.servers}s.db"
    print(bc.machine())
    meta = ensure_history(db, days=args.days, servers=args.servers, regenerate=args.regenerate, fast=args.fast)
    targets = pick_targets(db)
    file_bytes = sum(Path(f"{db}{s}").stat().st_size for s in ("", "-wal") if Path(f"{db}{s}").exists())
    now = time.time()
    endpoints = {
        "overview": "/",
        "model page": f"/models/{targets['model']}",
        "peer page (7 days)": f"/peers/{targets['peer']}?hours=168",
        "peer history (API, 30 days)": f"/api/v1/peers/{targets['peer']}/history?since={now - args.days * 86400:.0f}",
        "/api/v1/state": "/api/v1/state",
        "/metrics": "/metrics",
    }
    with WebServer(db, args.server) as web:
        results = measure_endpoints(web, endpoints, args, width=30)

    rows = []
    for name, (alone, loaded) in results.items():
        target = TARGETS_P95.get(name)
        rows.append([
            name, bc.ms(alone["p50"]), f"**{bc.ms(alone['p95'])}**", bc.ms(loaded["p50"]), bc.ms(loaded["p95"]),
            f"{loaded['rps']:.1f}", f"{alone['bytes'] / 1024:.0f} kB",
            alone["failed"] + loaded["failed"],
            f"p95 ≤ {target * 1000:.0f} ms" if target else "",
            bc.verdict(alone["p95"] <= target) if target else "",
        ])
    gen = meta.get("generation", {})
    markdown = bc.table(["endpoint", "p50 alone", "p95 alone", f"p50 ({args.clients} clients)",
                         f"p95 ({args.clients} clients)", "req/s (concurrent)", "response", "failed", "target", ""],
                        rows)
    if not args.fast:
        markdown += "\n\n" + bc.table(
            ["database", "size", "target", ""],
            [[f"SQLite, {args.days:g} days × 60 s polls × {args.servers} servers (raw 2 days + hourly rollups)",
              f"**{targets['database_bytes'] / 2**20:.0f} MiB** ({file_bytes / 2**20:.0f} MiB on disk with WAL)",
              "≤ 1 GB", bc.verdict(targets["database_bytes"] <= TARGET_DB_BYTES)]],
        )
    markdown += (
        f"\n\nServer: {args.server} ({'threaded, as `swarm-monitor serve` runs it' if args.server == 'werkzeug' else 'gthread, 2 workers × 8 threads'}) "
        f"in its own process on 127.0.0.1; the client is this process (urllib, a new connection per request). "
        f"'Alone': {args.requests} sequential requests after 3 warm-ups; concurrent: {args.clients} clients × "
        f"{args.client_requests} requests on the same endpoint. Model page: the biggest model "
        f"({targets['model']}); peer: the one seen longest. History generated through the store's write path "
        f"in {gen.get('seconds', float('nan')) / 60:.0f} min ({gen.get('polls_per_second', float('nan')):.1f} "
        f"polls/s; {gen.get('polls')} polls, {gen.get('peers')} distinct peers), ending "
        f"{(now - meta['end']) / 3600:.1f} h before this run."
        + (" Fast history (`--fast`): a poll every minute for the last 3 days, one in ten before (the pages "
           "read the latest state, the rollups and the raw rows of the last days, as on the full history); "
           "the database's size is measured on the full history only (and by tests/test_store.py)."
           if args.fast else "")
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section(f"dashboard-{args.server}", markdown)


if __name__ == "__main__":
    main()
