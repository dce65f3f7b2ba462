#!/usr/bin/env python
"""Figure: memory (RSS) of the service while it watches 500 servers, without a chat model loaded.

    .venv/bin/python scripts/bench_memory.py [--servers 500] [--minutes 5]

A bootstrap peer and scripts/simulate_swarm.py (500 virtual servers over 4 models) on loopback;
``swarm-monitor serve`` watches them (models discovered, none configured for chat, so no chat
model is loaded) with a fresh SQLite store, polling every ``--period`` s so that many polls happen
in a few minutes; the dashboard is requested now and then. RSS is sampled every 5 s: the service's
own process, and its whole tree (the DHT child process and the p2pd daemon are separate processes).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import bench_common as bc

TARGET_RSS = 300 * 2**20


def tree_memory(pid: int) -> dict:
    import psutil

    main = psutil.Process(pid)
    procs = [main] + main.children(recursive=True)
    rss = {"main": main.memory_info().rss, "tree": 0, "tree_pss": 0, "processes": {}}
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss["tree"] += info.rss
        rss["tree_pss"] += getattr(info, "pss", info.rss)
        name = "p2pd" if "p2pd" in proc.name() else "main" if proc.pid == pid else "python child"
        rss["processes"][name] = rss["processes"].get(name, 0) + info.rss
    return rss


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--period", type=float, default=15, help="scrape and probe period of the service (s)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(bc.machine())

    workdir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    samples, polls = [], None
    with bc.bootstrap_peer() as initial_peers:
        with bc.simulator(initial_peers, servers=args.servers, responders=8, hung=0):
            port = _free_port()
            env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(workdir), SWARM_MONITOR_SCRAPE_PERIOD=str(args.period),
                       SWARM_MONITOR_PROBE_PERIOD=str(args.period))
            log = open(workdir / "service.log", "wb")
            proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "swarm-monitor"), "serve", "--port", str(port),
                 "--initial-peers", *initial_peers],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                base = f"http://127.0.0.1:{port}"
                started = time.monotonic()
                while time.monotonic() - started < 120:
                    try:
                        urllib.request.urlopen(base + "/healthz", timeout=5).read()
                        break
                    except OSError:
                        if proc.poll() is not None:
                            raise RuntimeError(f"swarm-monitor serve exited; log:\n"
                                               f"{(workdir / 'service.log').read_text()[-3000:]}")
                        time.sleep(1)
                end = time.monotonic() + args.minutes * 60
                while time.monotonic() < end:
                    for path in ("/", "/api/v1/state", "/metrics"):
                        try:
                            urllib.request.urlopen(base + path, timeout=60).read()
                        except OSError as e:
                            print(f"{path}: {e}")
                    memory = tree_memory(proc.pid)
                    samples.append(memory)
                    print(f"t={time.monotonic() - started:5.0f}s main {memory['main'] / 2**20:.0f} MiB, tree "
                          f"{memory['tree'] / 2**20:.0f} MiB (PSS {memory['tree_pss'] / 2**20:.0f} MiB) "
                          f"{ {k: round(v / 2**20) for k, v in memory['processes'].items()} }", flush=True)
                    time.sleep(5)
                polls = _count_polls(workdir)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
                log.close()

    peak = max(s["main"] for s in samples)
    last = samples[-1]
    markdown = bc.table(
        ["process", "RSS at the end", "peak RSS", "target", ""],
        [["service (`swarm-monitor serve`, main process)", f"{last['main'] / 2**20:.0f} MiB",
          f"**{peak / 2**20:.0f} MiB**", "≤ 300 MB", bc.verdict(peak <= TARGET_RSS)],
         ["its whole tree (+ DHT child process + p2pd)", f"{last['tree'] / 2**20:.0f} MiB "
          f"(PSS {last['tree_pss'] / 2**20:.0f} MiB)", f"{max(s['tree'] for s in samples) / 2**20:.0f} MiB", "", ""]],
    )
    markdown += (
        f"\n\n{args.servers} virtual servers over 4 models (scripts/simulate_swarm.py), watched for "
        f"{args.minutes:g} min with scrape and probe every {args.period:g} s ({polls} polls recorded), no chat "
        f"model; the overview, /api/v1/state and /metrics requested every ~5 s. Per process at the end: "
        + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in last["processes"].items()) + "."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("memory", markdown)
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)


def _count_polls(workdir: Path):
    import sqlite3

    for db in workdir.glob("*.db"):
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM polls WHERE ok").fetchone()[0]
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
