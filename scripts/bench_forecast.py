#!/usr/bin/env python
"""Figures: what you will get, before you ask (#33) — forecast accuracy, load spread over the
swarm, and fallback to the next model.

    .venv/bin/python scripts/bench_forecast.py [--parts accuracy spread fallback] [--model demo|tiny]
                                               [--requests 24] [--no-write]

Swarm: the demo's layout (three servers: all blocks, first half, second half) of ``--model``
(default: the demo's SmolLM2), started by the swarm harness on 127.0.0.1.

(accuracy) ``swarm-monitor serve`` in its own process with a fresh store per condition: *idle*
    (one request at a time), *throttled* (the all-blocks server's compute paused 2/3 of the time),
    *16 users* (16 at once, 16 generation slots) and *queued* (16 at once, 4 slots). People
    arrive 0.2 s apart and each asks one request after another: their first ones are the warm-up
    (the forecast rests on the model's real requests of the last 30 min), the next ones are
    measured, and each goes on asking until everyone's measured requests are in, so the measured
    ones meet the condition's load, not its ramps. Each request is preceded by ``POST /v1/estimate`` with its own body; its
    forecast is compared with what the request then got: time to first token and decode tokens/s
    as the chat measured them (its ``petals`` extension), and the wait for a slot (the client's time
    to the first token less the chat's). Share of requests within ±30 % (first token), ±20 %
    (tokens/s) and ±25 % (wait, queued requests: those forecast to wait or that waited ≥ 1 s);
    beside them, the share within the forecast's ranges (what eight in ten requests alike got), and
    the ceiling in hindsight (``hindsight``: each request judged by the requests that ran beside it).
(spread) 16 concurrent streamed answers through the chat's engine, every server throttled to half
    its speed (so the two cores are not the bottleneck), once with routes spread by the requests in
    flight (the chat as it runs) and once with the load count off (always the best route for the
    request alone): aggregate tokens/s, p95 time to first token, failures, routes taken.
(fallback) a request with ``models: [broken, served]`` (the first model's blocks are not served)
    against the same request to the served model alone: the time added (median of ``--requests``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import bench_common as bc
from bench_chat import PROMPTS, model_setup, wait_chat_ready

from monitor import compat  # noqa: F401  (must precede petals)

TTFT_TOLERANCE, SPEED_TOLERANCE, WAIT_TOLERANCE = 0.30, 0.20, 0.25
TARGET_SHARE = 0.80
TARGET_SPREAD = 1.5
TARGET_FALLBACK = 1.0  # seconds added at most
TOKENS = 32
ARRIVAL_GAP = 0.2  # seconds between two people's first requests
GHOST = "ghost-model"  # a model nobody serves: its blocks are missing


def post(base: str, path: str, body: dict, timeout: float = 60.0) -> dict:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def one(base: str, prefix: str, prompt: str) -> dict:
    """The estimate, then the streamed request; both figures side by side."""
    body = {"model": prefix, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0}
    estimate = post(base, "/v1/estimate", body)["petals"]
    started = time.time()
    got = bc.stream_completion(base, prefix, prompt, TOKENS)
    extension = got.get("petals") or {}
    ttft = extension.get("time_to_first_token")
    waited = max(0.0, got["ttft"] - ttft) if got["ttft"] is not None and ttft is not None else None
    route = lambda hops: "+".join(hop["peer_id"][-6:] for hop in hops or ())  # noqa: E731
    return {"ok": got["ok"], "error": got["error"], "forecast": estimate["forecast"], "ttft": ttft,
            "tokens_per_s": extension.get("tokens_per_second"), "waited": waited, "at": started,
            "end": time.time(), "planned": route(estimate.get("planned_route")),
            "route": route(extension.get("route"))}


def within(forecast, actual, tolerance: float) -> bool:
    return forecast is not None and actual is not None and actual > 0 and abs(forecast - actual) <= tolerance * actual


def in_spread(bounds, actual) -> bool:
    """Whether ``actual`` lies within a forecast's range (what eight in ten requests alike got)."""
    return bool(bounds) and actual is not None and bounds[0] <= actual <= bounds[1]


def hindsight(measured: list, every: list, alike: int = 3) -> tuple:
    """A ceiling no forecast made before a request can pass: each measured request "forecast" after
    the fact by the medians of the requests that ran beside it (overlapping at least half its time;
    those of its route when ``alike`` or more did) — what the load it met while it ran gave others.
    (share of first tokens within ±30 %, share of tokens/s within ±20 %)."""
    ttft = speed = counted = 0
    for r in measured:
        length = r["end"] - r["at"]
        beside = [o for o in every if o is not r and min(o["end"], r["end"]) - max(o["at"], r["at"]) >= length / 2]
        same = [o for o in beside if o["route"] == r["route"]]
        group = same if len(same) >= alike else beside
        if not group:
            continue
        counted += 1
        middle = lambda key: bc.median([o[key] for o in group if o[key] is not None] or [None])  # noqa: E731
        ttft += within(middle("ttft"), r["ttft"], TTFT_TOLERANCE)
        speed += within(middle("tokens_per_s"), r["tokens_per_s"], SPEED_TOLERANCE)
    return (ttft / counted, speed / counted) if counted else (None, None)


def run_condition(swarm, name: str, *, prefix: str, num_blocks: int, path: Path, users: int, slots: int,
                  requests: int) -> dict:
    env = {"SWARM_MONITOR_CHAT_SLOTS": str(slots), "SWARM_MONITOR_MAX_SLOTS_SHARE": "1",
           "SWARM_MONITOR_CHAT_QUEUE_SIZE": "64", "SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute"}
    with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"], env=env) as svc:
        base = svc["base"]
        wait_chat_ready(base, prefix, PROMPTS[0])
        per_user = max(1, requests // users)
        warm = max(2, 8 // users)  # each person's first requests: the forecast's evidence, past the servers' first
        asking = threading.Semaphore(0)  # released once per person whose requests are in
        results: list = []  # the measured requests
        everyone: list = []  # every request, the warm-up's and the last ones too (``hindsight``)

        def ask(prompt: str) -> dict:
            result = one(base, prefix, prompt)
            everyone.append(result)
            return result

        def person(index: int) -> None:
            try:
                for i in range(warm):
                    ask(PROMPTS[(index + i) % len(PROMPTS)])
                for i in range(per_user):
                    results.append(ask(PROMPTS[(index + warm + i) % len(PROMPTS)]))
            finally:
                asking.release()
            asked = 0
            while not everyone_done.is_set():  # the house stays as full until everyone's requests are in
                ask(PROMPTS[(index + asked) % len(PROMPTS)])
                asked += 1

        everyone_done = threading.Event()
        threads = [threading.Thread(target=person, args=(i,)) for i in range(users)]
        for t in threads:  # people arrive a moment apart, not in the same millisecond
            t.start()
            time.sleep(ARRIVAL_GAP)
        for _ in threads:
            asking.acquire()
        everyone_done.set()
        for t in threads:
            t.join()
    good = [r for r in results if r["ok"]]
    # queued: forecast to wait, or waited (a wait nobody forecast counts against the forecast)
    queued = [r for r in good if r["forecast"]["wait"] >= 1.0 or (r["waited"] or 0.0) >= 1.0]
    got_key = {"time_to_first_token": "ttft", "tokens_per_second": "tokens_per_s", "wait": "waited"}
    share = lambda rows, key, tol: (sum(within(r["forecast"][key], r[got_key[key]], tol)  # noqa: E731
                                        for r in rows) / len(rows)) if rows else None
    ceiling = hindsight(good, [r for r in everyone if r["ok"]])
    in_range = lambda key, got: (sum(in_spread(r["forecast"].get(key), r[got]) for r in good)  # noqa: E731
                                 / len(good)) if good else None
    print("requests", name, json.dumps([{k: r[k] for k in ("ok", "ttft", "tokens_per_s", "waited", "at", "end",
                                                           "planned", "route")}
                                        | {"forecast": r["forecast"]} for r in results]), flush=True)
    return {"name": name, "requests": len(results), "failed": len(results) - len(good),
            "ttft_share": share(good, "time_to_first_token", TTFT_TOLERANCE) if good else None,
            "speed_share": share(good, "tokens_per_second", SPEED_TOLERANCE) if good else None,
            "wait_share": share(queued, "wait", WAIT_TOLERANCE), "queued": len(queued), "hindsight": ceiling,
            "in_range": (in_range("time_to_first_token_range", "ttft"), in_range("tokens_per_second_range", "tokens_per_s")),
            "sources": dict(Counter(r["forecast"]["source"] for r in good)),
            "forecast_speed": bc.median([r["forecast"]["tokens_per_second"] for r in good
                                         if r["forecast"]["tokens_per_second"]] or [0]),
            "got_speed": bc.median([r["tokens_per_s"] for r in good if r["tokens_per_s"]] or [0]),
            "forecast_ttft": bc.median([r["forecast"]["time_to_first_token"] for r in good
                                        if r["forecast"]["time_to_first_token"]] or [0]),
            "got_ttft": bc.median([r["ttft"] for r in good if r["ttft"]] or [0])}


def accuracy(model: str, data_dir: Path, requests: int) -> list[dict]:
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm

    path, prefix, num_blocks = model_setup(model, data_dir)
    found = []
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        specs = demo_layout(num_blocks, 3)
        swarm.start(specs)
        kw = dict(prefix=prefix, num_blocks=num_blocks, path=path, requests=requests)
        found.append(run_condition(swarm, "idle", users=1, slots=4, **kw))
        found.append(run_condition(swarm, "16 users", users=16, slots=16, **{**kw, "requests": max(requests, 48)}))
        found.append(run_condition(swarm, "queued (16 users, 4 slots)", users=16, slots=4,
                                   **{**kw, "requests": max(requests, 48)}))
        swarm.throttle(specs[0].name, duty=2 / 3, period=0.2)
        found.append(run_condition(swarm, "one server throttled to 1/3", users=1, slots=4, **kw))
    for r in found:
        print("accuracy", r, flush=True)
    return found


def spread(model: str, data_dir: Path, users: int = 16) -> dict:
    from chat.engine import ChatEngine, GenerationParams
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm
    from monitor.settings import ModelConfig

    path, prefix, num_blocks = model_setup(model, data_dir)
    results = {}
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        specs = demo_layout(num_blocks, 3)
        swarm.start(specs)
        names = {swarm.peer_id(spec.name): spec.name for spec in specs}
        for spec in specs:
            swarm.throttle(spec.name, duty=0.5, period=0.2)
        for mode in ("best route", "spread"):
            engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=prefix, path=path)], max_sessions=users,
                                queue_size=users, queue_timeout=300)
            if mode == "best route":  # the same chat with the load count off
                engine.server_load.factors = lambda *args, **kwargs: {}
            try:
                ids = engine.encode(prefix, PROMPTS[0])
                with engine.answer(prefix, ids, GenerationParams(max_new_tokens=2)) as warm:
                    list(warm)
                rows: list = []

                def ask(index: int) -> None:
                    started = time.perf_counter()
                    try:
                        with engine.answer(prefix, engine.encode(prefix, PROMPTS[index % len(PROMPTS)]),
                                           GenerationParams(max_new_tokens=TOKENS)) as answer:
                            done = list(answer)[-1]
                        rows.append({"ok": True, "ttft": done.time_to_first_token, "tokens": done.completion_tokens,
                                     "end": time.perf_counter() - started,
                                     "route": "+".join(names.get(h.peer_id, "?") for h in done.route)})
                    except Exception as e:  # noqa: BLE001 - counted as failed
                        rows.append({"ok": False, "error": repr(e)[:200]})

                started = time.perf_counter()
                threads = [threading.Thread(target=ask, args=(i,)) for i in range(users)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = time.perf_counter() - started
            finally:
                engine.close()
            good = [r for r in rows if r["ok"]]
            results[mode] = {"tokens_per_s": sum(r["tokens"] for r in good) / elapsed, "elapsed": elapsed,
                             "ttft_p95": bc.percentile([r["ttft"] for r in good], 95) if good else None,
                             "failed": len(rows) - len(good), "routes": dict(Counter(r["route"] for r in good))}
            print("spread", mode, results[mode], flush=True)
    return results


def fallback(model: str, data_dir: Path, requests: int) -> dict:
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm

    path, prefix, num_blocks = model_setup(model, data_dir)
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start(demo_layout(num_blocks, 3))
        with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}", f"{GHOST}:{num_blocks}:{path}"],
                        env={"SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute"}) as svc:
            base = svc["base"]
            wait_chat_ready(base, prefix, PROMPTS[0])
            body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
            direct, fell, answered_by = [], [], Counter()
            for _ in range(requests):
                started = time.perf_counter()
                post(base, "/v1/completions", {**body, "model": prefix})
                direct.append(time.perf_counter() - started)
                started = time.perf_counter()
                answer = post(base, "/v1/completions", {**body, "model": GHOST, "models": [GHOST, prefix]})
                fell.append(time.perf_counter() - started)
                answered_by[answer.get("model")] += 1
    return {"direct": statistics.median(direct), "fallback": statistics.median(fell),
            "added": statistics.median(fell) - statistics.median(direct), "answered_by": dict(answered_by)}


def pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("accuracy", "spread", "fallback"),
                        default=["accuracy", "spread", "fallback"])
    parser.add_argument("--model", choices=("tiny", "demo"), default="demo")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    bc.stop_on_sigterm()
    print(bc.machine())
    sections = []
    if "accuracy" in args.parts:
        found = accuracy(args.model, args.data_dir, args.requests)
        rows = [[r["name"], r["requests"], r["failed"], ", ".join(f"{k} {v}" for k, v in r["sources"].items()),
                 f"{r['forecast_ttft'] * 1000:.0f} / {r['got_ttft'] * 1000:.0f} ms",
                 f"{r['forecast_speed']:.1f} / {r['got_speed']:.1f}",
                 pct(r["ttft_share"]), pct(r["speed_share"]),
                 f"{pct(r['hindsight'][0])} / {pct(r['hindsight'][1])}",
                 f"{pct(r['in_range'][0])} / {pct(r['in_range'][1])}",
                 f"{pct(r['wait_share'])} of {r['queued']}" if r["queued"] else "–",
                 bc.verdict(all(s is not None and s >= TARGET_SHARE for s in (r["ttft_share"], r["speed_share"]))
                            and (r["wait_share"] is None or r["wait_share"] >= TARGET_SHARE))]
                for r in found]
        sections.append("**Forecast accuracy** (`--model " + args.model + "`):\n\n" + bc.table(
            ["condition", "requests", "failed", "forecast from", "first token, forecast / got (medians)",
             "tokens/s, forecast / got (medians)", "first token within ±30 %", "tokens/s within ±20 %",
             "in hindsight: first token / tokens/s", "within the forecast's range: first token / tokens/s",
             "wait within ±25 % (queued)", "≥ 80 % each"], rows))
    if "spread" in args.parts:
        r = spread(args.model, args.data_dir)
        best, spread_ = r["best route"], r["spread"]
        ratio = spread_["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else float("nan")
        rows = [[mode, f"{m['tokens_per_s']:.1f}", bc.ms(m["ttft_p95"]) if m["ttft_p95"] is not None else "–",
                 m["failed"], ", ".join(f"{k} ×{v}" for k, v in sorted(m["routes"].items(), key=lambda kv: -kv[1]))]
                for mode, m in r.items()]
        ok = ratio >= TARGET_SPREAD and spread_["failed"] == 0 and (
            spread_["ttft_p95"] is not None and best["ttft_p95"] is not None and spread_["ttft_p95"] <= best["ttft_p95"])
        sections.append(f"**Load spread** (16 concurrent streamed answers of {TOKENS} tokens, every server "
                        f"throttled to half):\n\n" + bc.table(
                            ["routing", "aggregate tokens/s", "p95 first token", "failed", "routes"], rows)
                        + f"\n\nspread / best route: **{ratio:.2f}×** (target ≥ {TARGET_SPREAD}×, p95 first "
                          f"token no worse, 0 failed): {bc.verdict(ok)}")
    if "fallback" in args.parts:
        r = fallback(args.model, args.data_dir, max(5, args.requests // 4))
        sections.append(f"**Fallback** (`models: [{GHOST}, served]`, the first model's blocks unserved): "
                        f"median {bc.ms(r['fallback'])} against {bc.ms(r['direct'])} asking the served model "
                        f"directly — **{r['added'] * 1000:+.0f} ms** added (target ≤ {TARGET_FALLBACK:.0f} s): "
                        f"{bc.verdict(r['added'] <= TARGET_FALLBACK)}; answered by {r['answered_by']}")
    markdown = "\n\n".join(sections)
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("forecast", markdown)


if __name__ == "__main__":
    bc.run_and_exit(main)
