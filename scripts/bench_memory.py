#!/usr/bin/env python
"""Figure: memory (RSS) of the service while it watches 500 servers, without a chat model loaded.

    .venv/bin/python scripts/bench_memory.py [--servers 500] [--minutes 4] [--layouts serve split]

A bootstrap peer and scripts/simulate_swarm.py (500 virtual servers over 4 models) on loopback,
watched with a fresh SQLite store, polling every ``--period`` s so that many polls happen in a
few minutes, while the overview, /api/v1/state and /metrics are requested every ~5 s. RSS is
sampled every 5 s, per process. Two layouts, one after the other:

- ``serve``: ``swarm-monitor serve``, all in one process (poller, DHT client, web), as the demo
  runs it; its DHT child process and p2pd daemon are separate processes.
- ``split``: the README's production layout: ``swarm-monitor poll`` (poller and DHT client) and
  gunicorn (2 gthread workers) serving ``monitor.web.wsgi:app`` from the same database.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import bench_common as bc

TARGET_RSS = 300 * 10**6  # 300 MB
MiB = 2**20
ROLE_ORDER = ["main", "web worker", "DHT child", "p2pd", "torch_shm_manager", "reaper guard"]


def tree_memory(pid: int) -> list[dict]:
    """One entry per process of the tree under ``pid``: role, RSS and PSS (bytes)."""
    import psutil

    main = psutil.Process(pid)
    result = []
    for proc in [main] + main.children(recursive=True):
        try:
            info = proc.memory_full_info()
            name, cmdline = proc.name(), " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if not name.startswith("python") and name != "gunicorn" and "swarm-monitor" not in name:
            role = "p2pd" if "p2pd" in name else name  # p2pd, torch_shm_manager
        elif proc.pid == pid:
            role = "main"
        elif "gunicorn" in cmdline:
            role = "web worker"
        elif "swarm-monitor" in cmdline:
            role = "DHT child"  # hivemind forks the DHT with the parent's command line
        else:
            role = "reaper guard"  # monitor.swarm.reaper: ends the p2pd daemons if the service dies
        result.append({"role": role, "rss": info.rss, "pss": getattr(info, "pss", info.rss)})
    return result


def watch(base: str, groups: dict[str, int], minutes: float) -> list[dict]:
    """Request the pages and sample every group's process tree (group -> its main pid) until
    ``minutes`` have passed."""
    samples = []
    started_at = time.monotonic()
    while time.monotonic() - started_at < minutes * 60:
        for path in ("/", "/api/v1/state", "/metrics"):
            try:
                urllib.request.urlopen(base + path, timeout=60).read()
            except OSError as e:
                print(f"{path}: {e}")
        sample = {group: tree_memory(pid) for group, pid in groups.items()}
        samples.append(sample)
        print(f"t={time.monotonic() - started_at:4.0f}s " + "; ".join(
            f"{group}: " + ", ".join(f"{p['role']} {p['rss'] / MiB:.0f}" for p in procs)
            for group, procs in sample.items()) + " (MiB)", flush=True)
        time.sleep(5)
    return samples


def run_layout(layout: str, initial_peers: list[str], args) -> dict:
    periods = {"SWARM_MONITOR_SCRAPE_PERIOD": str(args.period), "SWARM_MONITOR_REACHABILITY_PERIOD": str(args.period)}
    if layout == "serve":
        with bc.service(initial_peers, env=periods) as svc:
            samples = watch(svc["base"], {"serve": svc["pid"]}, args.minutes)
            polls = _count_polls(svc["workdir"])
        return {"layout": layout, "samples": samples, "polls": polls}

    workdir = Path(tempfile.mkdtemp(prefix="bench-memory-split-"))
    port = bc.free_port()
    env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(workdir), SWARM_MONITOR_INITIAL_PEERS=",".join(initial_peers),
               PYTHONPATH=str(bc.ROOT), **periods)
    try:
        with bc.process([str(Path(sys.executable).parent / "swarm-monitor"), "poll",
                         *bc.peer_options(initial_peers)], workdir / "poll.log", env=env) as poller, \
                bc.process(bc.gunicorn_args(port), workdir / "web.log", env=env) as web:
            bc.wait_http(f"http://127.0.0.1:{port}", web, workdir / "web.log")
            samples = watch(f"http://127.0.0.1:{port}", {"poller": poller.pid, "web": web.pid}, args.minutes)
            polls = _count_polls(workdir)
        return {"layout": layout, "samples": samples, "polls": polls}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _rows(result: dict) -> list[list]:
    """Per (group, role): peak RSS of one such process, with the target where it applies."""
    rows = []
    samples = result["samples"]
    for group in samples[0]:
        roles = sorted({p["role"] for s in samples for p in s[group]}, key=lambda r: (ROLE_ORDER.index(r) if r in ROLE_ORDER else 99, r))
        for role in roles:
            peak = max((p["rss"] for s in samples for p in s[group] if p["role"] == role), default=0)
            count = max(sum(p["role"] == role for p in s[group]) for s in samples)
            label = {"serve": "`swarm-monitor serve`", "poller": "`swarm-monitor poll`",
                     "web": "gunicorn `monitor.web.wsgi:app`"}[group]
            name = f"{label}: {role}" + (f" (each of {count})" if count > 1 else "")
            judged = role in ("main", "web worker") and not (group == "web" and role == "main")
            rows.append([result["layout"], name, f"**{peak / MiB:.0f} MiB**" if judged else f"{peak / MiB:.0f} MiB",
                         "≤ 300 MB" if judged else "", bc.verdict(peak <= TARGET_RSS) if judged else ""])
        last = samples[-1][group]
        rows.append([result["layout"], f"{label}: whole tree, at the end",
                     f"{sum(p['rss'] for p in last) / MiB:.0f} MiB (PSS {sum(p['pss'] for p in last) / MiB:.0f} MiB)",
                     "", ""])
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=4, help="per layout")
    parser.add_argument("--period", type=float, default=15, help="scrape and reachability period of the poller (s)")
    parser.add_argument("--layouts", nargs="+", choices=("serve", "split"), default=["serve", "split"])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(bc.machine())

    results = []
    with bc.bootstrap_peer() as initial_peers:
        with bc.simulator(initial_peers, servers=args.servers, responders=8, hung=0):
            for layout in args.layouts:
                results.append(run_layout(layout, initial_peers, args))

    markdown = bc.table(["layout", "process", "peak RSS", "target", ""], [row for r in results for row in _rows(r)])
    markdown += (
        f"\n\n{args.servers} virtual servers over 4 models (scripts/simulate_swarm.py), watched for "
        f"{args.minutes:g} min per layout with scrape and reachability checks every {args.period:g} s ("
        + ", ".join(f"{r['layout']}: {r['polls']} polls recorded" for r in results)
        + "), no chat model; the overview, /api/v1/state and /metrics requested every ~5 s. "
        "A process that holds a DHT client imports hivemind, and hivemind imports torch: `import torch` "
        "alone is 252 MiB here, `import hivemind` 310 MiB, with petals 390 MiB, before any work."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("memory", markdown)


def _count_polls(workdir: Path):
    import sqlite3

    for db in workdir.glob("*.db"):
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM polls WHERE ok").fetchone()[0]
    return None


if __name__ == "__main__":
    main()
