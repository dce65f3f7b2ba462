#!/usr/bin/env python
"""Figure: a plain petals script with and without ``route_with`` (swarm_monitor_client) — tokens/s,
failed requests, petals' retries and time to first token, side by side in one run; and the routing
view's size and latency at 500 simulated servers under 16 clients.

    .venv/bin/python scripts/bench_client.py [--requests 8] [--tokens 24]

Swarm (tiny Llama, 127.0.0.1): A serves the first half of the blocks, B the second, C all of them;
all announce the same throughput, so petals' own routing prefers C's one-hop route. Scenarios, on
one swarm, one after another: *healthy* (nothing wrong: what the client adds to the first token),
*trap* (C throttled: stopped 80 % of every 0.2 s) and *fail* (C fails every step). The monitor is
``swarm-monitor serve`` in its own process (speed probes every 10 s so that it has measured every
server within a minute; the detection bounds at the defaults are bench_churn.py's); each scenario
starts once its routing view says what is wrong. The script is ``scripts/plain_petals.py``:
petals' own model and greedy ``generate``, nothing of the service in its process but
``swarm_monitor_client`` (and our environment's ``monitor.compat``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "plain_petals.py"
MONITOR_ENV = {"SWARM_MONITOR_SPEED_PROBE_PERIOD": "10", "SWARM_MONITOR_SPEED_PROBE_MAX_SHARE": "0.4"}
VIEW_CLIENTS, VIEW_REQUESTS = 16, 25  # routing-view readers at 500 servers, requests each
TTFT_TARGET, RATIO_TARGET, VIEW_BYTES_TARGET = 0.020, 3.0, 256 * 1024


def view(base: str, prefix: str) -> dict:
    with urllib.request.urlopen(f"{base}/api/v1/routing/{prefix}", timeout=10) as response:
        return json.loads(response.read())


def run_script(swarm, path: Path, *, monitor: str | None, requests: int, tokens: int) -> list[dict]:
    args = [sys.executable, str(SCRIPT), "--path", str(path), "--requests", str(requests), "--tokens", str(tokens)]
    for peer in swarm.initial_peers:
        args += ["--peer", peer]
    if monitor:
        args += ["--monitor", monitor]
    with tempfile.TemporaryDirectory(prefix="bench-client-script-") as tmp:
        log = Path(tmp) / "script.log"
        with bc.process(args, log) as proc:  # its own group: its DHT process and p2pd end with it
            code = proc.wait(900)
        output = log.read_text(errors="replace")
    if code != 0:
        raise SystemExit(f"plain_petals.py failed: {output[-2000:]}")
    return [json.loads(line) for line in output.splitlines() if line.startswith("{") and '"tokens"' in line]


def summary(answers: list[dict], swarm) -> dict:
    tails = {swarm.peer_id(name)[-6:]: name for name in "ABC"}
    routes = [" → ".join(tails.get(part.split("…")[-1].strip(), "?") for part in route.split("=>"))
              for answer in answers for route in answer["routes"]]
    speeds = [a["tokens_per_s"] for a in answers if a["ok"] and a["tokens_per_s"]]
    return {"tokens_per_s": statistics.median(speeds) if speeds else 0.0,
            "ttft": statistics.median(a["ttft"] for a in answers if a["ok"]) if any(a["ok"] for a in answers) else None,
            "failed": sum(not a["ok"] for a in answers), "retries": sum(a["retries"] for a in answers),
            "routes": dict(sorted({r: routes.count(r) for r in routes}.items()))}


def scenarios(args) -> dict:
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model

    half = TINY_NUM_BLOCKS // 2
    found = {}
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        path = ensure_tiny_model(Path(tmp) / "models")
        with LocalSwarm(path, TINY_DHT_PREFIX, update_period=60) as swarm:
            swarm.start([ServerSpec("A", 0, half, throughput=100.0), ServerSpec("B", half, TINY_NUM_BLOCKS, throughput=100.0),
                         ServerSpec("C", 0, TINY_NUM_BLOCKS, throughput=100.0)])
            c = swarm.peer_id("C")
            with bc.service(swarm.initial_peers, models=[f"{TINY_DHT_PREFIX}:{TINY_NUM_BLOCKS}:{path}"],
                            env=MONITOR_ENV) as svc:
                base = svc["base"]

                def entry_of_c():
                    try:
                        return next((e for e in view(base, TINY_DHT_PREFIX)["peers"] if e["peer_id"] == c), None)
                    except Exception:  # noqa: BLE001 - not up yet
                        return None

                def all_measured():
                    try:
                        peers = view(base, TINY_DHT_PREFIX)["peers"]
                    except Exception:  # noqa: BLE001
                        return False
                    return len(peers) == 3 and all(e["seconds_per_token_per_block"] for e in peers)

                for name, fault, heal, judged in (
                        ("healthy", None, None, lambda e: all_measured()),
                        ("trap", lambda: swarm.throttle("C", duty=0.8, period=0.2), lambda: swarm.unthrottle("C"),
                         lambda e: e and e["slow"]),
                        ("fail", lambda: swarm.fail("C"), lambda: swarm.unfail("C"), lambda e: e and e["failing"])):
                    if fault:
                        fault()
                    try:
                        started = time.time()
                        if not bc.wait(lambda: judged(entry_of_c()), 300, step=1):
                            raise SystemExit(f"{name}: the monitor never judged C ({entry_of_c()})")
                        print(f"{name}: the routing view says so after {time.time() - started:.0f} s", flush=True)
                        default = run_script(swarm, path, monitor=None, requests=args.requests, tokens=args.tokens)
                        routed = run_script(swarm, path, monitor=base, requests=args.requests, tokens=args.tokens)
                        found[name] = {"default": summary(default, swarm), "route_with": summary(routed, swarm)}
                        print(name, json.dumps(found[name]), flush=True)
                    finally:
                        if heal:
                            heal()
                            bc.wait(lambda: not (entry_of_c() or {}).get("slow") and not (entry_of_c() or {}).get("failing"),
                                    300, step=1)
    return found


def view_at_scale() -> dict:
    with bc.bootstrap_peer() as peers, bc.simulator(peers, servers=500, models=1):
        with bc.service(peers, env={"SWARM_MONITOR_SCRAPE_PERIOD": "30"}) as svc:
            base = svc["base"]

            def state():
                with urllib.request.urlopen(f"{base}/api/v1/state", timeout=30) as response:
                    return json.loads(response.read())

            bc.wait(lambda: _models(state), 300, step=2)
            reports = state()["model_reports"]
            prefix = max(reports, key=lambda r: len(r["server_rows"]))["dht_prefix"]
            latencies, sizes, lock = [], [], threading.Lock()

            def reader():
                for _ in range(VIEW_REQUESTS):
                    started = time.perf_counter()
                    with urllib.request.urlopen(f"{base}/api/v1/routing/{prefix}", timeout=30) as response:
                        body = response.read()
                    with lock:
                        latencies.append(time.perf_counter() - started)
                        sizes.append(len(body))

            threads = [threading.Thread(target=reader) for _ in range(VIEW_CLIENTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            body = view(base, prefix)
            return {"prefix": prefix, "servers": len(body["peers"]), "bytes": max(sizes),
                    "p50": bc.percentile(latencies, 50), "p95": bc.percentile(latencies, 95), "requests": len(latencies)}


def _models(state) -> bool:
    try:
        return any(len(r["server_rows"]) >= 100 for r in state()["model_reports"])
    except Exception:  # noqa: BLE001 - not polled yet
        return False


def report(found: dict, scale: dict, args) -> str:
    rows = []
    for name, modes in found.items():
        for mode in ("default", "route_with"):
            m = modes[mode]
            rows.append([name, "petals' own" if mode == "default" else "`route_with`", f"{m['tokens_per_s']:.1f}",
                         bc.ms(m["ttft"]) if m["ttft"] is not None else "—", m["failed"], m["retries"],
                         ", ".join(f"{r} ×{n}" for r, n in m["routes"].items())])
    table = bc.table(["scenario", "routing", "tokens/s (median)", "TTFT (median)", "failed requests",
                      "petals' retries", "routes taken"], rows)
    checks = []
    trap, fail, healthy = found.get("trap"), found.get("fail"), found.get("healthy")
    if trap:
        ratio = trap["route_with"]["tokens_per_s"] / max(1e-9, trap["default"]["tokens_per_s"])
        checks.append(["trap: `route_with` / petals' own tokens/s", f"**{ratio:.2f}×**", f"≥ {RATIO_TARGET:g}×",
                       bc.verdict(ratio >= RATIO_TARGET and trap["route_with"]["failed"] == 0)])
    if fail:
        checks.append(["fail: retries on the failing server, petals' own / `route_with`",
                       f"{fail['default']['retries']} / **{fail['route_with']['retries']}**", "— / 0",
                       bc.verdict(fail["route_with"]["retries"] == 0 and fail["route_with"]["failed"] == 0)])
    if healthy:
        added = healthy["route_with"]["ttft"] - healthy["default"]["ttft"]
        checks.append(["healthy: time to first token added by `route_with`", f"**{added * 1000:+.1f} ms**",
                       f"≤ {TTFT_TARGET * 1000:.0f} ms", bc.verdict(added <= TTFT_TARGET)])
    checks.append([f"routing view, {scale['servers']} servers: size", f"**{scale['bytes'] / 1024:.0f} KiB**",
                   f"≤ {VIEW_BYTES_TARGET // 1024} KiB", bc.verdict(scale["bytes"] <= VIEW_BYTES_TARGET)])
    checks.append([f"routing view, {VIEW_CLIENTS} clients: latency p50 / p95", f"{bc.ms(scale['p50'])} / "
                   f"**{bc.ms(scale['p95'])}**", "—", ""])
    return (f"{table}\n\n{bc.table(['figure', 'measured', 'target', ''], checks)}\n\n"
            f"{args.requests} sequential greedy requests of {args.tokens} tokens per scenario and routing, each "
            "routing in a fresh process of `scripts/plain_petals.py` (petals' own model and `generate`; the "
            "monitor's part: `swarm_monitor_client` only). A = first half of the blocks, B = second half, C = all, "
            "all announcing throughput 100; the monitor a `swarm-monitor serve` with speed probes every 10 s. "
            f"Routing view: `scripts/simulate_swarm.py` 500 servers of one model, its view read "
            f"{VIEW_REQUESTS}× by each of {VIEW_CLIENTS} threads ({scale['requests']} requests; werkzeug, the "
            "all-in-one `serve`).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(bc.machine(), flush=True)
    found = scenarios(args)
    scale = view_at_scale()
    print("view at scale", scale, flush=True)
    text = report(found, scale, args)
    print(text)
    if not args.no_write:
        bc.write_section("client", text)


if __name__ == "__main__":
    bc.run_and_exit(main)
