#!/usr/bin/env python
"""Figure: the slow-server trap — tokens/s and failed requests with health-aware routing vs petals'
default routing (ratio).

    .venv/bin/python scripts/bench_trap.py [--models tiny demo] [--requests 8] [--tokens 24]

Swarm: servers A (first half of the blocks), B (second half) and C (all blocks), all announcing the
same throughput, so petals' default routing prefers C's one-hop route; C is then throttled
(``LocalSwarm.throttle``: its compute process is stopped for ``--duty`` of every 0.2 s, while its
connection handlers and p2pd still answer), so it announces well but answers slowly. For each mode
(``SWARM_MONITOR_ROUTING`` = default, then health) a fresh ``swarm-monitor serve`` (own process,
own empty store: the health-aware router starts knowing nothing) answers ``--requests``
sequential streamed completions; the table gives the median decode tokens/s, failures and which
peers each request used.

Both modes start once the swarm is in its steady state: A announces its ping to B (``next_pings``).
Until then petals prices the A→B hop at its 150 ms "unknown delay", and a service that starts in
those first seconds keeps that view for a whole client refresh period (60 s).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import bench_common as bc
from bench_chat import PROMPTS, model_setup, wait_chat_ready

from monitor import compat  # noqa: F401  (must precede petals)

TARGET_RATIO = 2.0


def run_mode(swarm, mode: str, *, prefix: str, num_blocks: int, path: Path, requests: int, tokens: int,
             names: dict) -> dict:
    with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"],
                    env={"SWARM_MONITOR_ROUTING": mode}) as svc:
        wait_chat_ready(svc["base"], prefix, PROMPTS[0])
        results = [bc.stream_completion(svc["base"], prefix, PROMPTS[0], tokens) for _ in range(requests)]
    routes = Counter()
    for r in results:
        hops = [names.get(hop.get("peer_id"), "?") for hop in ((r.get("petals") or {}).get("route") or ())]
        routes["+".join(hops) or "?"] += 1
    good = [r for r in results if r["ok"]]
    return {
        "mode": mode,
        "tokens_per_s": bc.median([r["tokens_per_s"] for r in good if r["tokens_per_s"]]),
        "ttft": bc.median([r["ttft"] for r in good if r["ttft"] is not None]),
        "failed": len(results) - len(good), "errors": sorted({str(r["error"])[:120] for r in results if r["error"]}),
        "routes": dict(routes), "per_request": [round(r["tokens_per_s"] or 0, 1) for r in results],
    }


def wait_next_pings(swarm, prefix: str, num_blocks: int, first: str, second: str, timeout: float = 120.0) -> float:
    """Wait until ``first`` announces a ping to ``second``; returns the seconds waited."""
    from monitor.core.snapshot import ModelInfo
    from monitor.swarm import scrape

    started = time.monotonic()
    want_from, want_to = swarm.peer_id(first), swarm.peer_id(second)
    while time.monotonic() - started < timeout:
        snapshot = scrape(swarm.dht, [ModelInfo(prefix, num_blocks)], discover=False)
        if any(row.peer_id == want_from and want_to in (row.next_pings or {}) for row in snapshot.servers):
            return time.monotonic() - started
        time.sleep(2)
    raise RuntimeError(f"{first} did not announce a ping to {second} within {timeout:.0f} s")


def measure(model: str, *, requests: int, tokens: int, duty: float, data_dir: Path) -> dict:
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec

    path, prefix, num_blocks = model_setup(model, data_dir)
    half = num_blocks // 2
    specs = [ServerSpec("A", 0, half, throughput=100.0), ServerSpec("B", half, num_blocks, throughput=100.0),
             ServerSpec("C", 0, num_blocks, throughput=100.0)]
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start(specs)
        names = {swarm.peer_id(spec.name): spec.name for spec in specs}
        print(f"{model}: A announced its ping to B after {wait_next_pings(swarm, prefix, num_blocks, 'A', 'B'):.0f} s")
        swarm.throttle("C", duty=duty, period=0.2)
        results = {mode: run_mode(swarm, mode, prefix=prefix, num_blocks=num_blocks, path=path,
                                  requests=requests, tokens=tokens, names=names)
                   for mode in ("default", "health")}
    for r in results.values():
        print(model, r, flush=True)
    return {"model": model, "prefix": prefix, "num_blocks": num_blocks, "half": half, **results}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=("tiny", "demo"), default=["tiny", "demo"])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--duty", type=float, default=0.8, help="fraction of time C's compute process is stopped")
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(bc.machine())

    rows, summary = [], []
    for model in args.models:
        r = measure(model, requests=args.requests, tokens=args.tokens, duty=args.duty, data_dir=args.data_dir)
        for mode in ("default", "health"):
            m = r[mode]
            rows.append([f"{model} ({r['num_blocks']} blocks)", mode, f"{m['tokens_per_s']:.1f}", bc.ms(m["ttft"]),
                         m["failed"],
                         ", ".join(f"{route} ×{n}" for route, n in sorted(m["routes"].items(), key=lambda kv: -kv[1])),
                         " ".join(str(x) for x in m["per_request"])])
        ratio = r["health"]["tokens_per_s"] / r["default"]["tokens_per_s"]
        summary.append([f"{model} ({r['num_blocks']} blocks)", f"**{ratio:.2f}×**", "≥ 2×",
                        bc.verdict(ratio >= TARGET_RATIO), r["health"]["failed"], "0",
                        bc.verdict(r["health"]["failed"] == 0)])
    markdown = bc.table(["model", "routing", "tokens/s (median)", "TTFT (median)", "failed requests",
                         "routes taken", "tokens/s per request, in order"], rows)
    markdown += "\n\n" + bc.table(
        ["model", "health-aware / default tokens/s", "target", "", "failed requests (health-aware)", "target", ""],
        summary)
    markdown += (
        f"\n\nA = first half of the blocks, B = second half, C = all blocks, all announcing throughput 100; C "
        f"throttled (stopped {args.duty:.0%} of every 0.2 s). {args.requests} sequential streamed completions of "
        f"{args.tokens} greedy tokens per mode, started once A announces its ping to B, each mode with a fresh `swarm-monitor serve` and an empty store "
        f"(the health-aware router starts knowing nothing and learns from its own requests)."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("trap", markdown)


if __name__ == "__main__":
    main()
