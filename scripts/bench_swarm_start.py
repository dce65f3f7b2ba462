#!/usr/bin/env python
"""Figure: what starting a private swarm costs, with the harness's fork server and without it.

    .venv/bin/python scripts/bench_swarm_start.py [--runs 3] [--servers 3]

Each run starts the demo's layout on the tiny Llama (a bootstrap peer and ``--servers`` servers,
``monitor.harness.local_swarm``) and measures the wall time until every server is ONLINE in the
DHT and the CPU time its processes used by then (each process tree: the server or bootstrap peer,
its DHT process; p2pd included), then closes it. The modes alternate run by run, so that a change
of the machine's load touches both alike:

- *fork server*: every process forked from one that imported torch, transformers, hivemind and
  petals once (``monitor/harness/fork_server.py``); that import is counted once, apart;
- *subprocess*: every process a fresh ``python -m monitor.harness.server_process`` that imports
  them itself (``SWARM_FORK_SERVER=0``).

The test suite starts about a hundred such processes (``make test``), the demo four.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import bench_common as bc
import psutil

from monitor.harness import fork_server
from monitor.harness.demo_swarm import demo_layout
from monitor.harness.local_swarm import LocalSwarm
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model

MODES = ("fork server", "subprocess")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and every live descendant."""
    try:
        root = psutil.Process(pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total
    except psutil.Error:
        return 0.0


def start_once(model: Path, servers: int, mode: str) -> tuple[float, float]:
    os.environ[fork_server.DISABLE] = "0" if mode == "subprocess" else "1"
    began = time.monotonic()
    with LocalSwarm(model, TINY_DHT_PREFIX, workdir=Path(tempfile.mkdtemp(prefix="bench-start-"))) as swarm:
        swarm.start(demo_layout(TINY_NUM_BLOCKS, servers))
        wall = time.monotonic() - began
        procs = [swarm.bootstrap, *swarm.servers.values()]
        cpu = sum(tree_cpu(p.pid) for p in procs)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--servers", type=int, default=3)
    args = parser.parse_args()
    model = ensure_tiny_model(Path(os.environ.get("SWARM_MONITOR_TEST_DATA",
                                                  Path.home() / ".cache" / "petals-swarm-monitor-tests")))
    machine = bc.machine()
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    fork_server_cpu = None
    for run in range(args.runs):
        for mode in (MODES if run % 2 == 0 else MODES[::-1]):
            fork_server.FORK_SERVER.shutdown()  # each run pays its own fork server's start
            wall, cpu = start_once(model, args.servers, mode)
            if mode == "fork server":
                server = fork_server.FORK_SERVER._popen  # noqa: SLF001 - its own import, counted apart
                if server is not None:
                    fork_server_cpu = tree_cpu(server.pid) if fork_server_cpu is None else fork_server_cpu
            results[mode].append((wall, cpu))
            print(f"run {run + 1}, {mode}: ONLINE after {wall:.1f} s, {cpu:.1f} CPU-s in the swarm's processes",
                  flush=True)
    fork_server.FORK_SERVER.shutdown()

    processes = args.servers + 1
    rows = []
    for mode in MODES:
        walls, cpus = [w for w, _ in results[mode]], [c for _, c in results[mode]]
        rows.append([mode, f"{bc.median(walls):.1f} s", f"{max(walls):.1f} s", f"{bc.median(cpus):.1f} s",
                     f"{bc.median(cpus) / processes:.2f} s"])
    fork, plain = (bc.median([c for _, c in results[m]]) for m in MODES)
    fork_wall, plain_wall = (bc.median([w for w, _ in results[m]]) for m in MODES)
    text = "\n\n".join([
        f"### Starting a swarm: {processes} processes (a bootstrap peer, {args.servers} servers), {args.runs} runs per mode",
        bc.table(["mode", "until every server is ONLINE, median", "worst", "CPU of its processes, median",
                  "per process"], rows),
        f"The fork server's processes use **{fork / plain:.2f}×** the CPU time of fresh ones "
        f"({plain - fork:.1f} CPU-s saved per swarm, {(plain - fork) / processes:.1f} per process), and the swarm "
        f"is ONLINE in {fork_wall / plain_wall:.2f}× the time. The fork server's own import, paid once per harness "
        f"process (a test session, a demo): {fork_server_cpu or 0:.1f} CPU-s. Tiny Llama, "
        f"{TINY_NUM_BLOCKS} blocks, the demo's layout; {machine}. "
        "Run: `.venv/bin/python scripts/bench_swarm_start.py`.",
    ])
    print("\n" + text)
    bc.write_section("swarm-start", text)


if __name__ == "__main__":
    main()
