#!/usr/bin/env python
"""Figures: history at scale — the score job (before: every row into Python; after: SQL aggregates)
at 500 and 2,000 servers, the peer page and the 30-day peer history under 16 concurrent clients
(gunicorn), and finding a server with the search box.

    .venv/bin/python scripts/bench_history.py [--only scores|pages|search] [--no-write]
    .venv/bin/python scripts/bench_history.py --generate-only   # make the histories, measure nothing

Histories (generated once by scripts/generate_history.py in its fast mode, through the store's
write path, and cached in ~/.cache/petals-swarm-monitor-bench/): 30 days × 500 servers (the pages,
search, and the score job at 500) and 7 days × 2,000 servers (the score job at 2,000). Both score
paths run on the same store at the same ``now`` in this process, and their scores are compared.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

import bench_common as bc
from bench_dashboard import CACHE, WebServer, backfill_diagnoses, ensure_history, measure_endpoints

TARGETS = {"score job, 500 servers": 2.0, "score job, 2000 servers": 8.0}
TARGET_PAGE_P95 = 0.200  # 16 clients, gunicorn
# key -> (days, servers, days of polls every minute before it: the rest one in ten, see generate_history)
HISTORIES = {"500": (30, 500, 3.0), "2000": (7, 2000, 1.2)}


def history_db(key: str, regenerate: bool) -> tuple[Path, dict]:
    days, servers, fine_days = HISTORIES[key]
    db = CACHE / f"history-fast-{days:g}d-{servers}s.db"
    meta = ensure_history(db, days=days, servers=servers, regenerate=regenerate, fast=True, fine_days=fine_days)
    from monitor.store import Store

    store = Store(f"sqlite:///{db}")
    try:
        store.migrate()  # a history made before a schema change is brought up to date, data kept
        backfill_diagnoses(store)
    finally:
        store.close()
    return db, meta


# ---- the score job ------------------------------------------------------------------------------


def _histories_scores(store, now: float, *, merge_runs: bool) -> dict:
    """Every peer's score from its whole history of the score window read into Python
    (``store/history.py``) and counted by ``scores.aggregate``, the specification of the SQL."""
    from monitor.core import scores
    from monitor.store import history

    with store.db.read("reading peer histories") as conn:
        histories = history.histories(conn, now - scores.SCORE_WINDOW, now, None, merge_runs,
                                      now - scores.REACHABILITY_WINDOW)
    return scores.score_all((scores.aggregate(h, now) for h in histories.values()), now)


def old_job(store, now: float) -> dict:
    """The score job before this change (a week of histories with merged runs, in Python)."""
    return _histories_scores(store, now, merge_runs=True)


def exact_job(store, now: float) -> dict:
    """The specification: every observation unmerged, in Python (``scores.aggregate``)."""
    return _histories_scores(store, now, merge_runs=False)


def new_job(store, now: float) -> dict:
    from monitor.core import scores

    return scores.score_all(store.peer_aggregates(now), now)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_scores(key: str, db: Path, repeat: int, check: bool) -> dict:
    import sqlalchemy as sa

    from monitor.store import Store

    store = Store(f"sqlite:///{db}")
    try:
        with store.engine.connect() as conn:
            now = conn.execute(sa.text("SELECT max(at) FROM polls WHERE ok")).scalar() + 30
        new_times = []
        for _ in range(repeat):
            gc.collect()
            seconds, new = bc.timed(new_job, store, now)
            new_times.append(seconds)
        rss_new = peak_rss_mib()
        gc.collect()
        old_seconds, old = bc.timed(old_job, store, now)
        rss_old = peak_rss_mib()
        exact = exact_job(store, now) if check else None
    finally:
        store.close()
    differences = [abs(new[p].score - old[p].score) for p in old if p in new]
    exact_differences = [abs(new[p].score - exact[p].score) for p in exact if p in new] if exact else []
    return {"peers": len(new), "new": bc.median(new_times), "new_max": max(new_times), "old": old_seconds,
            "same_peers": new.keys() == old.keys(), "max_diff": max(differences, default=0.0),
            "mean_diff": sum(differences) / len(differences) if differences else 0.0,
            "rss_after_new": rss_new, "rss_after_old": rss_old,
            "exact_max_diff": max(exact_differences) if exact else None,
            "exact_equal": sum(1 for d in exact_differences if d == 0) if exact else None}


# ---- pages and search ---------------------------------------------------------------------------


def pick(db: Path) -> dict:
    """The peer seen longest, a name fragment and an id prefix to search for."""
    import sqlalchemy as sa

    from monitor.store import Store
    from monitor.store.schema import Peer

    store = Store(f"sqlite:///{db}")
    try:
        with store.engine.connect() as conn:
            t = Peer.__table__.c
            peer = conn.execute(sa.select(t.peer_id).where(t.first_seen.is_not(None))
                                .order_by((t.last_seen - t.first_seen).desc())).scalar()
            name = conn.execute(sa.select(t.public_name).where(t.public_name.like("volunteer-%"))
                                .order_by(t.last_seen.desc())).scalar() or "volunteer"
            peers = conn.execute(sa.select(sa.func.count()).select_from(Peer.__table__)).scalar()
        timings = {}
        for label, query in (("id prefix", peer[:14]), ("whole id", peer), ("id end", "…" + peer[-6:]),
                             ("name fragment", name[3:9]), ("no match", "zzzz-nothing")):
            store.search_peers(query)
            runs = [bc.timed(store.search_peers, query)[0] for _ in range(50)]
            timings[label] = (query, bc.median(runs), bc.percentile(runs, 95))
    finally:
        store.close()
    return {"peer": peer, "name": name, "peers": peers, "search": timings}


def bench_pages(db: Path, targets: dict, args) -> dict:
    now = time.time()
    since = now - HISTORIES["500"][0] * 86400
    endpoints = {
        "peer page (7 days)": f"/peers/{targets['peer']}?hours=168",
        "peer page (24 h)": f"/peers/{targets['peer']}",
        "peer history (API, 30 days)": f"/api/v1/peers/{targets['peer']}/history?since={since:.0f}",
        "search box (htmx, name fragment)": f"/search?q={targets['search']['name fragment'][0]}",
        "search API (id prefix)": f"/api/v1/search?q={targets['peer'][:14]}",
    }
    with WebServer(db, "gunicorn") as web:
        return measure_endpoints(web, endpoints, args, width=34, line=_page_line)


def _page_line(name: str, alone: dict, loaded: dict, clients: int) -> str:
    return (f"{name} alone p95 {bc.ms(alone['p95'])} | {clients} clients p50 {bc.ms(loaded['p50'])} "
            f"p95 {bc.ms(loaded['p95'])} {loaded['rps']:.0f} req/s | {alone['bytes']} bytes, "
            f"failed {alone['failed'] + loaded['failed']}")


# ---- the report ---------------------------------------------------------------------------------


def report(scores: dict, pages: dict, targets: dict, metas: dict, args) -> str:
    parts = []
    if scores:
        rows = []
        for key, r in scores.items():
            name = f"score job, {HISTORIES[key][1]} servers"
            target = TARGETS[name]
            rows.append([f"{HISTORIES[key][1]} servers × {HISTORIES[key][0]} d", r["peers"], f"{r['old']:.1f} s",
                         f"**{r['new']:.2f} s** (max {r['new_max']:.2f})", f"{r['old'] / r['new']:.0f}×",
                         f"≤ {target:g} s", bc.verdict(r["new"] <= target),
                         f"{r['max_diff']:.1f} / {r['mean_diff']:.2f}",
                         f"{r['rss_after_new']:.0f} → {r['rss_after_old']:.0f} MiB"])
        parts.append(bc.table(["history", "peers scored", "before (rows into Python)", "after (SQL aggregates)",
                               "ratio", "target", "", "score difference max / mean (points)",
                               "peak RSS after new → after old"], rows))
        parts.append(
            "Score job: `Store.peer_aggregates` + `scores.score_all` (after, median of "
            f"{args.repeat}) against the job as it was, every peer's history with merged runs + "
            "`scores.aggregate` and `scores.score_all` (before, once), on the same SQLite store at the same "
            "`now`, in one process. "
            "The differences are the old job's error, not the new one's: its merged runs are stamped with "
            "their first poll, so its 1-hour uptime window dropped up to an hour of polls. "
            + "".join(f"Against the score of every unmerged observation (`scores.aggregate`, the specification the "
                      f"SQL must meet) on the {HISTORIES[k][1]}-server history: {r['exact_equal']} of {r['peers']} "
                      f"scores equal, largest difference {r['exact_max_diff']:.1f} points. "
                      for k, r in scores.items() if r.get("exact_max_diff") is not None)
            + "Peak RSS is the process's high-water mark (the new job runs first): the aggregates hold a few MiB.")
    if pages:
        rows = []
        for name, (alone, loaded) in pages.items():
            is_page = name.startswith("peer")
            rows.append([name, bc.ms(alone["p50"]), bc.ms(alone["p95"]), bc.ms(loaded["p50"]),
                         f"**{bc.ms(loaded['p95'])}**", f"{loaded['rps']:.0f}", f"{alone['bytes'] / 1024:.0f} kB",
                         alone["failed"] + loaded["failed"], "p95 ≤ 200 ms" if is_page else "",
                         bc.verdict(loaded["p95"] <= TARGET_PAGE_P95) if is_page else ""])
        parts.append(bc.table(["endpoint", "p50 alone", "p95 alone", f"p50 ({args.clients} clients)",
                               f"p95 ({args.clients} clients)", "req/s", "response", "failed", "target", ""], rows))
        meta = metas.get("500", {})
        gen = meta.get("generation", {})
        parts.append(
            f"gunicorn (gthread, 2 workers × 8 threads) on the 30-day history of 500 servers "
            f"({gen.get('polls')} polls, {gen.get('peers')} distinct peers, generated in "
            f"{gen.get('seconds', float('nan')) / 60:.0f} min, ending {(time.time() - meta.get('end', time.time())) / 3600:.1f} h "
            f"before this run); the peer seen longest. 'Alone': {args.requests} sequential requests after 3 "
            f"warm-ups; concurrent: {args.clients} clients × {args.client_requests} requests. The store does not "
            "change during the run (no poller), so after the first request a page is served from the "
            "per-process cache (`monitor/web/peer_view.py`), as between two polls in production.")
    if targets.get("search"):
        rows = [[label, f"`{query[:24]}`", bc.ms(p50), bc.ms(p95)] for label, (query, p50, p95) in targets["search"].items()]
        parts.append(bc.table(["search (Store.search_peers)", "query", "p50", "p95"], rows))
        parts.append(f"{targets['peers']} peers in the table; 50 searches each, in-process (no HTTP).")
    return "\n\n".join(parts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("scores", "pages", "search"), action="append")
    parser.add_argument("--generate-only", action="store_true")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the new score job per history")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client-requests", type=int, default=10)
    parser.add_argument("--no-check", action="store_true",
                        help="skip scoring the 500-server history observation by observation (the spec, ~1 min)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    only = set(args.only or ("scores", "pages", "search"))

    print(bc.machine())
    dbs, metas = {}, {}
    for key in HISTORIES:
        if key == "2000" and "scores" not in only and not args.generate_only:
            continue
        dbs[key], metas[key] = history_db(key, args.regenerate)
    if args.generate_only:
        return
    scores = {}
    if "scores" in only:
        for key, db in dbs.items():
            scores[key] = bench_scores(key, db, args.repeat, check=key == "500" and not args.no_check)
            r = scores[key]
            print(f"score job, {HISTORIES[key][1]} servers: {r['peers']} peers, before {r['old']:.1f} s, after "
                  f"{r['new']:.2f} s ({r['old'] / r['new']:.0f}×), max diff {r['max_diff']:.1f}", flush=True)
    targets = pick(dbs["500"]) if only & {"pages", "search"} else {}
    pages = bench_pages(dbs["500"], targets, args) if "pages" in only else {}
    if "search" not in only:
        targets.pop("search", None)
    markdown = report(scores, pages, targets, metas, args)
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("history", markdown)


if __name__ == "__main__":
    sys.exit(main())
