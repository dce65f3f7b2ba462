#!/usr/bin/env python
"""Figure: what request rows cost — per request in the chat, and on the pages that read them.

    .venv/bin/python scripts/bench_requests.py [--requests 2000] [--rows 50000]

Per request: ``chat.request.RequestLog`` observing a 32-token answer's events (Delta × 32, then
Finished) and handing its row to ``chat.feedback.StoreRequests`` (the real queue and writer thread
over a real SQLite store), timed per request against the same events passed through untouched.
Pages: the model page, the model's stats API and /metrics with a day of ``--rows`` request rows in
the store (one model, 8 servers), against the same store without them; the web app in this process
(Flask's test client), 5 warm-ups then 200 timed requests each, p95.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bench_common as bc  # noqa: E402

OVERHEAD_TARGET = 0.001  # seconds per request
PAGE_TIMES = 200


def events(tokens: int = 32):
    from chat.decoding import Delta, Finished
    from chat.policy import RouteHop

    for _ in range(tokens):
        yield Delta("x", 1)
    yield Finished(text="x" * tokens, token_ids=tuple(range(tokens)), prompt_tokens=8, finish_reason="length",
                   route=(RouteHop("QmA" + "a" * 43, 0, 4), RouteHop("QmB" + "b" * 43, 4, 8)),
                   time_to_first_token=0.1, tokens_per_second=30.0, elapsed=1.0)


def per_request(store, requests: int) -> dict:
    from chat.feedback import StoreRequests
    from chat.request import RequestLog

    sink = StoreRequests(store).start()
    plain, logged = [], []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            for _ in events():
                pass
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            log = RequestLog(sink, "m", "openai")
            for _ in log.observe(events(), lambda: [], rows=1):
                pass
            logged.append(time.perf_counter() - started)
    finally:
        sink.close()
    added = sorted(max(0.0, a - b) for a, b in zip(logged, plain))
    return {"requests": requests, "written": sink.written, "p50": bc.percentile(added, 50), "p95": bc.percentile(added, 95),
            "p99": bc.percentile(added, 99)}


def page_times(store, settings, prefix: str) -> dict:
    from monitor.web import create_app

    client = create_app(settings, store).test_client()
    found = {}
    for name, path in (("model page", f"/models/{prefix}"), ("stats API", f"/api/v1/models/{prefix}/stats"),
                       ("/metrics", "/metrics")):
        started = time.perf_counter()
        client.get(path)  # the first: nothing cached yet, the figures computed from the rows
        cold = time.perf_counter() - started
        for _ in range(5):
            client.get(path)
        times = []
        for _ in range(PAGE_TIMES):
            started = time.perf_counter()
            response = client.get(path)
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, (path, response.status_code)
        found[name] = (cold, bc.percentile(times, 95))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(bc.machine(), flush=True)

    from monitor.app import assessing
    from monitor.core.assessment import RouteHop
    from monitor.core.requests import OK, RequestRecord
    from monitor.core.snapshot import Snapshot
    from support import PEERS, TINY, poll_rows, sqlite_store, web_settings

    with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp:
        store = sqlite_store(Path(tmp) / "a")
        overhead = per_request(store, args.requests)
        print("per request", overhead, flush=True)
        settings = web_settings()
        pages = {}
        for label, rows in (("without rows", 0), (f"{args.rows} rows", args.rows)):
            path = Path(tmp) / label.replace(" ", "-")
            path.mkdir()
            store = sqlite_store(path)
            now = time.time()
            snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
            store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=now))
            peers = [PEERS[n] for n in ("first", "second", "full")]
            batch = []
            for i in range(rows):
                batch.append(RequestRecord(at=now - random.uniform(0, 86_000), model=TINY.dht_prefix, api="openai",
                                           outcome=OK, route=(RouteHop(random.choice(peers), 0, 8),),
                                           time_to_first_token=random.uniform(0.05, 2), tokens=32,
                                           tokens_per_second=random.uniform(2, 40), waited=random.uniform(0, 1)))
                if len(batch) == 5000:
                    store.record_requests(batch)
                    batch = []
            store.record_requests(batch)
            pages[label] = page_times(store, settings, TINY.dht_prefix)
            print(label, pages[label], flush=True)
            store.close()
    labels = list(pages)
    rows = [[name, f"{bc.ms(pages[labels[0]][name][0])} / {bc.ms(pages[labels[0]][name][1])}",
             f"{bc.ms(pages[labels[1]][name][0])} / **{bc.ms(pages[labels[1]][name][1])}**"] for name in pages[labels[0]]]
    text = (bc.table(["figure", "p50", "p95", "p99", "target", ""], [[
        f"added per request (RequestLog + StoreRequests), {overhead['requests']} requests",
        f"{overhead['p50'] * 1e6:.0f} µs", f"**{overhead['p95'] * 1e6:.0f} µs**", f"{overhead['p99'] * 1e6:.0f} µs",
        f"≤ {OVERHEAD_TARGET * 1000:.0f} ms", bc.verdict(overhead["p95"] <= OVERHEAD_TARGET)]])
        + "\n\n" + bc.table(["page: first request / p95", labels[0], labels[1]], rows)
        + f"\n\nPer request: a 32-token answer's events through `RequestLog` into `StoreRequests` (its queue; "
        f"{overhead['written']} rows written by its thread into SQLite meanwhile), minus the same events alone. Pages: "
        f"Flask's test client in this process, {PAGE_TIMES} requests each after 5 warm-ups; the rows spread over the "
        "last day, 3 servers. The stats are computed once per store change and minute (`request_stats.cached`), so most "
        "requests after the first read the cached figures; the model page's target is p95 ≤ 100 ms.")
    print(text)
    if not args.no_write:
        bc.write_section("requests", text)


if __name__ == "__main__":
    bc.run_and_exit(main)
