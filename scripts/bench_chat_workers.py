#!/usr/bin/env python
"""Benchmark: two chat workers sharing one swarm (#47) — do they spread load and share fairly as one?

Swarm: the demo's layout (three servers: all blocks, first half, second half) of the demo's model,
started by the swarm harness on 127.0.0.1, every server throttled to half its speed (so that the two
cores are not the bottleneck). Two chat engines (two workers' routing, slots and ledgers; in one
process on one DHT client, so the 2-core machine computes heads once, as in ``bench_forecast``'s
spread) on a private Redis (``chat_shared``).

(spread) 16 concurrent streamed answers of 32 tokens, 8 through each worker, three ways: the load
    count off (always the best route for the request alone: today's "best route"); each worker
    counting only its own requests (two workers without ``chat_shared``); and the shared ledger.
    Aggregate tokens/s, p95 time to first token, failures, routes taken. Target: shared ≥ 1.5× best
    route (one worker today: 1.88×, BENCHMARKS "forecast").
(fairness) One greedy client sends 16 requests at once, 8 through each worker, while 15 others send
    one each, alternating workers; 4 slots per worker (8 in all), a share of half: the most slots the
    greedy client held at once over both workers (sampled every 50 ms), against its share (4).

(big, ``--big``) The aggregate tokens/s of one and two chat workers on the big client side: a
    checkpoint with 70B's client side (``wide_model("70b")``: hidden 8192, vocabulary 128,256,
    bfloat16) served by two servers; two gunicorn chat workers (``monitor.harness.chat_workers``, a
    throwaway PostgreSQL store, 16 slots each); 16 concurrent streamed answers of 16 tokens all
    through one worker, then 8 through each, in turn, 3 times. Reported, no target: both workers
    compute their heads on the same two cores (section "chat-workers-big").

``.venv/bin/python scripts/bench_chat_workers.py [--no-write]`` (~6 min); ``--big`` (~10 min, and
the 70B-head checkpoint's first build).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import bench_common as bc
from bench_chat import PROMPTS, model_setup
from bench_forecast import TOKENS, concurrent_answers

USERS = 16
SPREAD_TARGET = 1.5


def engines(swarm, prefix: str, path: Path, *, shared: str | None, slots: int, share: float = 0.5, tags=("w1", "w2")):
    from chat.engine import Capacity, ChatEngine
    from monitor.settings import ModelConfig

    capacity = Capacity(slots=slots, queue_size=64, queue_timeout=600, slots_share=share)
    return [ChatEngine(swarm.dht, [ModelConfig(dht_prefix=prefix, path=path)], capacity=capacity, shared=shared,
                       worker=tag) for tag in tags]


def spread_once(swarm, prefix, path, names, mode: str, redis_url: str) -> dict:
    from chat.engine import GenerationParams

    pair = engines(swarm, prefix, path, shared=redis_url if mode == "shared ledger" else None, slots=USERS)
    try:
        if mode == "best route":
            for engine in pair:
                engine.server_load.factors = lambda *args, **kwargs: {}
        for engine in pair:  # warm: the models loaded, the routes known
            with engine.answer(prefix, engine.encode(prefix, PROMPTS[0]), GenerationParams(max_new_tokens=2)) as a:
                list(a)
        time.sleep(2.5)  # (the ledgers' first beats)
        # arrivals a moment apart, as people's: each sees the routes before it
        return concurrent_answers(lambda index: pair[index % 2], prefix, names, USERS,
                                  client_of=lambda index: f"10.0.0.{index}", stagger=0.05)
    finally:
        for engine in pair:
            engine.close()


def fairness(swarm, prefix, path, redis_url: str) -> dict:
    from chat.engine import GenerationParams

    pair = engines(swarm, prefix, path, shared=redis_url, slots=4)
    held_max, stop = [0], threading.Event()
    try:
        for engine in pair:
            with engine.answer(prefix, engine.encode(prefix, PROMPTS[0]), GenerationParams(max_new_tokens=2)) as a:
                list(a)
        time.sleep(2.5)

        def sample() -> None:
            while not stop.is_set():
                held_max[0] = max(held_max[0], sum(engine.slots.held_by("greedy") - _others(engine) for engine in pair))
                time.sleep(0.05)

        done: Counter = Counter()

        def ask(engine, client: str, index: int) -> None:
            try:
                with engine.answer(prefix, engine.encode(prefix, PROMPTS[index % len(PROMPTS)]),
                                   GenerationParams(max_new_tokens=TOKENS), client=client) as answer:
                    list(answer)
                done[client == "greedy"] += 1
            except Exception:  # noqa: BLE001 - a refused request counts as not done
                done["refused"] += 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=ask, args=(pair[i % 2], "greedy", i)) for i in range(16)]
        threads += [threading.Thread(target=ask, args=(pair[i % 2], f"person-{i}", i)) for i in range(15)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        stop.set()
        sampler.join(2)
    finally:
        for engine in pair:
            engine.close()
    return {"greedy_max": held_max[0], "share": 4, "greedy_done": done[True], "others_done": done[False],
            "refused": done["refused"]}


def _others(engine) -> int:
    """What ``Slots.held_by`` adds from the other workers (to count each slot once, where it is held)."""
    from chat.capacity import client_key

    return int(engine.slots.others().held.get(client_key("greedy"), 0))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--big", action="store_true", help="one and two workers on the big client side instead")
    args = parser.parse_args(argv)
    if args.big:
        text = big_client_side(args.data_dir)
        print(text)
        if not args.no_write:
            bc.write_section("chat-workers-big", text)
        return
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm
    from monitor.harness.redis_server import RedisServer

    print(bc.machine(), flush=True)
    path, prefix, num_blocks = model_setup("demo", args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        try:
            with LocalSwarm(path, prefix, update_period=10) as swarm:
                specs = demo_layout(num_blocks, 3)
                swarm.start(specs)
                names = {swarm.peer_id(spec.name): spec.name for spec in specs}
                for spec in specs:
                    swarm.throttle(spec.name, duty=0.5, period=0.2)
                found = {}
                for mode in ("best route", "each its own", "shared ledger"):
                    found[mode] = spread_once(swarm, prefix, path, names, mode, redis.url)
                    print(mode, found[mode], flush=True)
                fair = fairness(swarm, prefix, path, redis.url)
                print("fairness", fair, flush=True)
        finally:
            redis.close()
    text = report(found, fair)
    print(text)
    if not args.no_write:
        bc.write_section("chat-workers", text)


BIG_USERS, BIG_TOKENS, BIG_ROUNDS = 16, 16, 3


def big_client_side(data_dir: Path) -> str:
    """Aggregate tokens/s of 16 concurrent answers through one gunicorn chat worker and through two
    (8 each), on 70B's client side."""
    import json
    import sys

    sys.path.insert(0, str(bc.ROOT / "tests"))
    from postgres import start_cluster

    from monitor.harness.chat_workers import ChatWorkers
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec
    from monitor.harness.ports import free_port
    from monitor.harness.tiny_model import wide_model
    from monitor.store import Store

    bc.stop_on_sigterm()  # (kill PID: everything started is stopped)
    print(bc.machine(), flush=True)
    wide = wide_model(data_dir, "70b")
    cluster = start_cluster()
    found: dict[str, list[dict]] = {"one worker": [], "two workers": []}
    try:
        url = cluster.create_database()
        store = Store(url)
        store.migrate()
        store.close()
        with tempfile.TemporaryDirectory(prefix="bench-chat-big-") as tmp, \
                LocalSwarm(wide.path, wide.dht_prefix) as swarm:
            swarm.start([ServerSpec(f"server-{i + 1}", 0, wide.num_blocks, torch_dtype="bfloat16") for i in range(2)])
            env = {"SWARM_MONITOR_DATA_DIR": str(Path(tmp) / "data"), "SWARM_MONITOR_DATABASE_URL": url,
                   "SWARM_MONITOR_INITIAL_PEERS": ",".join(swarm.initial_peers), "SWARM_MONITOR_CHAT_SLOTS": "16",
                   "SWARM_MONITOR_MAX_SLOTS_SHARE": "1", "SWARM_MONITOR_CHAT_QUEUE_SIZE": "64",
                   "SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute",
                   "SWARM_MONITOR_MODELS": json.dumps([{"dht_prefix": wide.dht_prefix, "num_blocks": wide.num_blocks,
                                                        "path": str(wide.path)}])}
            chat = ChatWorkers(Path(tmp) / "chat", 2, env, port=free_port(), dashboard_port=free_port(),
                               threads=24).start(timeout=900)
            try:
                bases = [f"http://127.0.0.1:{port}" for port in chat.workers.values()]
                for base in bases:  # warm: each worker's first answer (its routes, its head's first step)
                    bc.stream_completion(base, wide.dht_prefix, PROMPTS[0], 4)
                for _ in range(BIG_ROUNDS):
                    for mode, targets in (("one worker", bases[:1]), ("two workers", bases)):
                        found[mode].append(_answers_at_once(targets, wide.dht_prefix))
                        print(mode, found[mode][-1], flush=True)
            finally:
                chat.close()
    finally:
        cluster.close()
    from chat.client_side import fast_bfloat16

    return big_report(found, "bfloat16" if fast_bfloat16() else "float32")


def _answers_at_once(bases: list[str], prefix: str) -> dict:
    rows: list[dict] = []

    def ask(index: int) -> None:
        rows.append(bc.stream_completion(bases[index % len(bases)], prefix, PROMPTS[index % len(PROMPTS)], BIG_TOKENS))

    started = time.perf_counter()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(BIG_USERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    good = [r for r in rows if r["ok"]]
    return {"tokens_per_s": sum(r["tokens"] for r in good) / elapsed, "failed": len(rows) - len(good),
            "ttft_p95": bc.percentile([r["ttft"] for r in good], 95) if good else None,
            "per_answer": bc.median([r["tokens_per_s"] for r in good if r["tokens_per_s"]]) if good else None}


def big_report(found: dict[str, list[dict]], dtype: str) -> str:
    rows = []
    for mode, runs in found.items():
        rows.append([mode, f"{bc.median([r['tokens_per_s'] for r in runs]):.2f}",
                     " / ".join(f"{r['tokens_per_s']:.2f}" for r in runs),
                     f"{bc.median([r['per_answer'] for r in runs if r['per_answer']]):.2f}",
                     bc.ms(bc.median([r['ttft_p95'] for r in runs if r['ttft_p95'] is not None])),
                     str(sum(r["failed"] for r in runs))])
    one = bc.median([r["tokens_per_s"] for r in found["one worker"]])
    two = bc.median([r["tokens_per_s"] for r in found["two workers"]])
    return (f"**One and two chat workers on the big client side** (70B's client side: hidden 8192, vocabulary "
            f"128,256, bfloat16 on disk, computed in **{dtype}** by the chat on this host (`chat_dtype` auto: "
            f"bfloat16 only where the CPU has AVX-512 BF16 or AMX); two servers; two gunicorn chat workers on PostgreSQL and Redis, 16 slots each; "
            f"{BIG_USERS} concurrent streamed answers of {BIG_TOKENS} tokens all through one worker, or "
            f"{BIG_USERS // 2} through each; {BIG_ROUNDS} rounds in turn):\n\n"
            + bc.table(["chat workers", "aggregate tokens/s (median)", "each round", "tokens/s per answer",
                        "p95 first token", "failed"], rows)
            + f"\n\ntwo / one: **{two / one:.2f}×**. Both chat workers, both servers and this script share the "
              f"same two cores: each worker batches its own answers into one head step per token, so two workers "
              f"make two smaller batches on the same cores, and the two bfloat16 servers of the 8192-wide block "
              f"compute on them too. The figure says that a second worker costs the aggregate nothing here; it "
              f"cannot show what a second host's cores add.\n\n"
              "Run: `.venv/bin/python scripts/bench_chat_workers.py --big`.\n")


def report(found: dict, fair: dict) -> str:
    ratio = found["shared ledger"]["tokens_per_s"] / found["best route"]["tokens_per_s"]
    rows = [[mode, f"{r['tokens_per_s']:.1f}", bc.ms(r["ttft_p95"]) if r["ttft_p95"] is not None else "–",
             str(r["failed"]), ", ".join(f"{k} ×{v}" for k, v in sorted(r["routes"].items(), key=lambda kv: -kv[1]))]
            for mode, r in found.items()]
    return (f"**Load spread through two chat workers** ({USERS} concurrent streamed answers of {TOKENS} tokens, "
            f"8 through each, every server throttled to half; two engines in one process on one DHT client, each "
            f"with its own routing, slots and ledger, on a private Redis):\n\n"
            + bc.table(["routing", "aggregate tokens/s", "p95 first token", "failed", "routes"], rows)
            + f"\n\nshared ledger / best route: **{ratio:.2f}×** (target ≥ {SPREAD_TARGET}×): "
              f"{bc.verdict(ratio >= SPREAD_TARGET and found['shared ledger']['failed'] == 0)}\n\n"
              f"**Fairness over two workers** (4 slots each, a share of half: 4 of 8): one greedy client sending 16 "
              f"at once, 8 through each worker, beside 15 people with one request each: the greedy client held at "
              f"most **{fair['greedy_max']}** slots at once over both (its share: {fair['share']}): "
              f"{bc.verdict(fair['greedy_max'] <= fair['share'])}; answered: greedy {fair['greedy_done']}, "
              f"the others {fair['others_done']}, refused {fair['refused']}.\n\n"
              "What a 2-core machine cannot show: more aggregate tokens/s from a second worker — both share the same "
              "two cores (the heads) and the same three throttled servers; the figures above are about routing and "
              "shares over workers, which do not depend on the cores.\n\n"
              "Run: `.venv/bin/python scripts/bench_chat_workers.py`.\n")


if __name__ == "__main__":
    bc.run_and_exit(main)
