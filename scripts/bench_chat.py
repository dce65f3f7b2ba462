#!/usr/bin/env python
"""Figure: chat tokens/s and time to first token through our API vs the raw petals client, on the
same swarm (ratio), for the tiny model and the demo model.

    .venv/bin/python scripts/bench_chat.py [--models tiny demo] [--runs 5] [--tokens 32]

Per model: a LocalSwarm with two servers (first half, second half: one possible route, so routing
choices cannot differ), ``swarm-monitor serve`` in its own process with the model configured for
chat, and in this process the raw petals client (``chat.remote_model.load_remote_model`` with
petals' own RemoteSequenceManager) on its own DHT client. Both decode greedily from the same
prompt tokens; runs alternate raw / API. Time to first token is measured by the caller (request
sent -> first token in hand, session setup included for both); tokens/s is the decode speed after
the first token: (tokens - 1) / (end - first token).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import bench_common as bc

from monitor import compat  # noqa: F401  (must precede petals)

TARGET_RATIO = 0.9
TARGET_TTFT_OVERHEAD = 0.050
PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Petals runs large language models collaboratively",
    "Once upon a time, in a land far away, there lived a",
    "Write a long story about a volunteer who serves transformer blocks:",
    "0123456789 Hello, world! What is the capital of France? Paris is the capital of",
)


def model_setup(name: str, data_dir: Path):
    """("tiny" or "demo") -> (path, dht_prefix, num_blocks), as the demo prepares it."""
    from monitor.harness.demo_swarm import prepare_model

    return prepare_model(data_dir, tiny=name == "tiny")[:3]


class RawClient:
    """petals' own client (default routing) on its own DHT client, greedy generation with timing."""

    def __init__(self, path: Path, initial_peers):
        from transformers import AutoTokenizer

        from chat.remote_model import load_remote_model
        from monitor.swarm import start_dht

        self.dht = start_dht(initial_peers)
        self.model = load_remote_model(path, self.dht)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))

    def generate(self, prompt: str, max_new_tokens: int) -> dict:
        import torch

        input_ids = torch.tensor([self.tokenizer(prompt).input_ids])
        streamer = bc.TokenTimes()
        times = streamer.times

        import gc

        # petals' _ServerInferenceSession.__del__ closes the session with a blocking call into
        # hivemind's event loop: if the garbage collector runs it on that loop's own thread (any
        # allocation there can trigger a collection) the loop waits for itself and the client hangs
        # for good. So no automatic collection while generating; the sessions are collected here,
        # on this thread, after it.
        gc.disable()
        started = time.perf_counter()
        try:
            output = self.model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False,
                                         streamer=streamer)
            end = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - a failed request is a result
            return {"ok": False, "error": repr(e)[:300], "ttft": None, "tokens": 0, "tokens_per_s": None}
        finally:
            gc.enable()
            gc.collect()  # (not timed: the API's sessions are closed after its last token too)
        tokens = output.shape[1] - input_ids.shape[1]
        first = times[0] if times else end
        return {"ok": True, "error": None, "ttft": first - started, "tokens": tokens, "elapsed": end - started,
                "tokens_per_s": (tokens - 1) / (end - first) if tokens > 1 and end > first else None}

    def close(self):
        import gc

        del self.model  # petals closes leftover server sessions in __del__: let it while the swarm is up
        gc.collect()
        self.dht.shutdown()


def pick_prompt(raw: RawClient, tokens: int) -> str:
    """A prompt the model answers for all `tokens` tokens (greedy, no early end of text)."""
    best, best_tokens = PROMPTS[0], -1
    for prompt in PROMPTS:
        result = raw.generate(prompt, tokens)
        if result["tokens"] >= tokens:
            return prompt
        if result["tokens"] > best_tokens:
            best, best_tokens = prompt, result["tokens"]
    print(f"(no prompt yields {tokens} tokens; using the longest, {best_tokens} tokens)")
    return best


def wait_chat_ready(base: str, prefix: str, prompt: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = bc.stream_completion(base, prefix, prompt, 2)
        if last["ok"]:
            return
        time.sleep(2)
    raise RuntimeError(f"the chat API never answered for {prefix}: {last}")


def measure(name: str, *, runs: int, tokens: int, data_dir: Path) -> dict:
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec

    path, prefix, num_blocks = model_setup(name, data_dir)
    half = num_blocks // 2
    specs = [ServerSpec("first-half", 0, half), ServerSpec("second-half", half, num_blocks)]
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start(specs)
        raw = RawClient(path, swarm.initial_peers)
        try:
            prompt = pick_prompt(raw, tokens)
            with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"]) as svc:
                wait_chat_ready(svc["base"], prefix, prompt)
                raw.generate(prompt, 4)
                results = {"raw": [], "api": []}
                for _ in range(runs):
                    results["raw"].append(raw.generate(prompt, tokens))
                    results["api"].append(bc.stream_completion(svc["base"], prefix, prompt, tokens))
        finally:
            raw.close()
    summary = {"model": name, "prefix": prefix, "prompt": prompt}
    for kind, items in results.items():
        good = [r for r in items if r["ok"]]
        summary[kind] = {
            "tokens_per_s": bc.median([r["tokens_per_s"] for r in good if r["tokens_per_s"]]),
            "ttft": bc.median([r["ttft"] for r in good if r["ttft"] is not None]),
            "tokens": bc.median([r["tokens"] for r in good]), "failed": len(items) - len(good),
            "errors": sorted({r["error"] for r in items if r["error"]})[:3],
        }
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=("tiny", "demo"), default=["tiny", "demo"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(bc.machine())

    rows = []
    for name in args.models:
        r = measure(name, runs=args.runs, tokens=args.tokens, data_dir=args.data_dir)
        print(r, flush=True)
        raw, api = r["raw"], r["api"]
        ratio = api["tokens_per_s"] / raw["tokens_per_s"]
        overhead = api["ttft"] - raw["ttft"]
        rows.append([
            f"{name} ({r['prefix']})", f"{raw['tokens_per_s']:.1f}", f"{api['tokens_per_s']:.1f}",
            f"**{ratio:.2f}×**", bc.verdict(ratio >= TARGET_RATIO),
            bc.ms(raw["ttft"]), bc.ms(api["ttft"]), f"**{overhead * 1000:+.0f} ms**",
            bc.verdict(overhead <= TARGET_TTFT_OVERHEAD),
            f"{raw['failed']} / {api['failed']}",
        ])
    markdown = bc.table(
        ["model", "raw petals tokens/s", "our API tokens/s", "ratio (target ≥ 0.9×)", "",
         "raw TTFT", "API TTFT", "TTFT overhead (target ≤ 50 ms)", "", "failed (raw / API)"], rows)
    markdown += (
        f"\n\nMedians of {args.runs} alternating runs of {args.tokens} greedy tokens per model. Swarm: two petals "
        f"servers (first half, second half of the blocks) on 127.0.0.1. API: `POST /v1/completions` with "
        f"stream=true to `swarm-monitor serve` (its own process, poller running); raw: petals' "
        f"`AutoDistributedModelForCausalLM.generate` with its default sequence manager, in the benchmark process. "
        f"Both times are taken by the caller; TTFT includes opening the inference session."
    )
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("chat", markdown)


if __name__ == "__main__":
    bc.run_and_exit(main)
