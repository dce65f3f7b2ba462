#!/usr/bin/env python
"""Benchmark: the chat's own compute at the size of the models people serve (README: The chat's own
compute) — today's code and the new side by side, in one run.

A checkpoint with Llama-3.1-70B's client side (hidden 8192, vocabulary 128,256, untied head,
``rope_type: llama3``; one block as it is, with a small MLP) is served by two petals servers of the
swarm harness (bfloat16; they share the machine's cores with the chat), and ``swarm-monitor serve``
at its default periods (16 slots, a client's share 1, the rate limit lifted) answers through the
OpenAI API:

- one answer alone (greedy), three times;
- 16 separate concurrent streamed answers (not ``n=16``), greedy, then sampled (temperature 0.8,
  top-p 0.9 over all 128,256 logits);

each measured as aggregate and per-answer tokens/s, first token p50/p95, and the CPU seconds per
generated token of the chat's process (with its DHT and p2p daemons) and of the server. "Before" is
the product at ``--before`` (a git worktree of it, run on this environment), "after" this checkout.
Then, unless ``--skip-405b``: a client side of Llama-3.1-405B's shape (hidden 16384) loads in
bfloat16 and answers; its memory and milliseconds per token.

    .venv/bin/python scripts/bench_head_step.py [--before REV] [--tokens 32] [--answers 16] [--no-write]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Optional

import bench_common as bc

BEFORE = "cd6f2a3"  # the last commit before one head step for every answer
SERVERS = 2
SAMPLED = {"temperature": 0.8, "top_p": 0.9}
PROMPT = "Petals runs large language models collaboratively. Tell me about"


def proc_tree_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of the process, of it and its children) now."""
    import psutil

    main = psutil.Process(pid)
    own = sum(main.cpu_times()[:2])
    total = own
    for child in main.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return own, total


def _cpu(pids: list[int]) -> tuple[float, float]:
    own = [proc_tree_cpu(pid) for pid in pids]
    return sum(o for o, _ in own), sum(t for _, t in own)


def memory(pid: int) -> tuple[float, float]:
    """(resident GiB now, peak resident GiB) of the process."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kib = {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}
    return kib["VmRSS"] / 2**20, kib["VmHWM"] / 2**20


def models(base: str) -> list[dict]:
    with urllib.request.urlopen(base + "/v1/models", timeout=600) as response:
        return json.loads(response.read())["data"]


def wait_ready(base: str, model: str, timeout: float = 900) -> None:
    """Until the model answers a completion (its client side loaded, its route found)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = bc.stream_completion(base, model, "Hello", 2, timeout=600)
        if done["ok"]:
            return
        time.sleep(2)
    raise RuntimeError(f"{model} did not answer within {timeout:.0f} s: {done['error']}")


def at_once(base: str, model: str, answers: int, tokens: int, sampling: Optional[dict], pids: dict) -> dict:
    """``answers`` separate streamed completions at once; what they got and what they cost."""
    cpu_before = {name: _cpu(group) for name, group in pids.items()}
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(answers) as pool:
        done = list(pool.map(lambda i: bc.stream_completion(base, model, f"{PROMPT} {i}", tokens, timeout=1800,
                                                            sampling=sampling), range(answers)))
    wall = time.perf_counter() - started
    cpu_after = {name: _cpu(group) for name, group in pids.items()}
    ok = [d for d in done if d["ok"]]
    generated = sum(d["tokens"] for d in ok)
    first = [d["ttft"] for d in ok if d["ttft"] is not None]
    speeds = [d["tokens_per_s"] for d in ok if d["tokens_per_s"]]
    chat_own = cpu_after["chat"][0] - cpu_before["chat"][0]
    chat_all = cpu_after["chat"][1] - cpu_before["chat"][1]
    server = cpu_after["server"][1] - cpu_before["server"][1]
    return {"answers": len(done), "ok": len(ok), "errors": sorted({str(d["error"])[:120] for d in done if not d["ok"]}),
            "tokens": generated, "wall": wall, "aggregate": generated / wall if wall else 0.0,
            "per_answer": bc.median(speeds) if speeds else None,
            "ttft_p50": bc.percentile(first, 50) if first else None,
            "ttft_p95": bc.percentile(first, 95) if first else None,
            "chat_cpu_per_token": chat_own / generated if generated else None,
            "chat_tree_cpu_per_token": chat_all / generated if generated else None,
            "server_cpu_per_token": server / generated if generated else None}


def alone(base: str, model: str, tokens: int, runs: int = 3) -> dict:
    done = [bc.stream_completion(base, model, PROMPT, tokens, timeout=1800) for _ in range(runs)]
    ok = [d for d in done if d["ok"]]
    return {"ok": len(ok), "runs": runs, "tokens_per_s": bc.median([d["tokens_per_s"] for d in ok if d["tokens_per_s"]]),
            "ttft": bc.median([d["ttft"] for d in ok if d["ttft"] is not None])}


@contextlib.contextmanager
def served(path: Path, prefix: str, blocks: int, code: Optional[Path], env: dict, servers: int = SERVERS):
    """``servers`` petals servers of the harness, each serving every block in bfloat16, and ``serve``
    (at ``code``) watching them; yields the service and the servers' PIDs."""
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec

    names = [chr(ord("a") + i) for i in range(servers)]
    with LocalSwarm(path, prefix) as swarm:
        swarm.start([ServerSpec(name, 0, blocks, torch_dtype="bfloat16") for name in names])
        with bc.service(swarm.initial_peers, models=[f"{prefix}:{blocks}:{path}"], env=env, code=code,
                        timeout=600) as svc:
            yield svc, [swarm.servers[name].pid for name in names]


def side(label: str, path: Path, prefix: str, blocks: int, code: Optional[Path], args,
         extra: Optional[dict] = None) -> dict:
    env = {"SWARM_MONITOR_CHAT_SLOTS": str(args.answers), "SWARM_MONITOR_MAX_SLOTS_SHARE": "1",
           "SWARM_MONITOR_CHAT_QUEUE_SIZE": "64", "SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute",
           "SWARM_MONITOR_PROXY_HOPS": "1", **(extra or {})}
    print(f"[{label}] starting the server and the chat ...", flush=True)
    with served(path, prefix, blocks, code, env) as (svc, server_pids):
        base = svc["base"]
        wait_ready(base, prefix)
        pids = {"chat": [svc["pid"]], "server": server_pids}
        result = {"memory_loaded": memory(svc["pid"])}
        print(f"[{label}] one answer alone ...", flush=True)
        result["alone"] = alone(base, prefix, args.tokens * 2)
        print(f"[{label}] {args.answers} answers at once, greedy ...", flush=True)
        result["greedy"] = at_once(base, prefix, args.answers, args.tokens, None, pids)
        print(f"[{label}] {args.answers} answers at once, sampled ...", flush=True)
        result["sampled"] = at_once(base, prefix, args.answers, args.tokens, SAMPLED, pids)
        result["memory"] = memory(svc["pid"])
        card = next((m for m in models(base) if m["id"] == prefix), {})
        result["client_side"] = (card.get("petals") or {}).get("client_side")
        print(f"[{label}] {json.dumps(result, default=str)}", flush=True)
        return result


def big(path: Path, prefix: str, blocks: int, args) -> dict:
    """The 405B-shaped client side: loads in bfloat16 and answers."""
    env = {"SWARM_MONITOR_CHAT_DTYPE": "bfloat16", "SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute"}
    with served(path, prefix, blocks, None, env, servers=1) as (svc, _):
        wait_ready(base := svc["base"], prefix, timeout=1800)
        loaded = memory(svc["pid"])
        one = alone(base, prefix, args.tokens, runs=2)
        card = next((m for m in models(base) if m["id"] == prefix), {})
        result = {"memory_loaded": loaded, "alone": one, "client_side": (card.get("petals") or {}).get("client_side")}
        print(f"[405b] {json.dumps(result, default=str)}", flush=True)
        return result


def _f(value, digits=2, unit="") -> str:
    return "–" if value is None else f"{value:.{digits}f}{unit}"


def report(before: dict, after: dict, huge: Optional[dict], args) -> str:
    rows = []
    for part, title in (("greedy", f"{args.answers} answers, greedy"), ("sampled", f"{args.answers} answers, sampled")):
        b, a = before[part], after[part]
        rows.append([title, "aggregate tokens/s", _f(b["aggregate"]), _f(a["aggregate"]),
                     _f(a["aggregate"] / b["aggregate"] if b["aggregate"] else None, 1, "×")])
        rows.append(["", "per answer tokens/s (median)", _f(b["per_answer"]), _f(a["per_answer"]), ""])
        rows.append(["", "first token p50 / p95 (s)", f"{_f(b['ttft_p50'])} / {_f(b['ttft_p95'])}",
                     f"{_f(a['ttft_p50'])} / {_f(a['ttft_p95'])}", ""])
        ratio = a["chat_cpu_per_token"] / b["chat_cpu_per_token"] \
            if a["chat_cpu_per_token"] and b["chat_cpu_per_token"] else None
        rows.append(["", "chat CPU s per token (its process)", _f(b["chat_cpu_per_token"], 3),
                     _f(a["chat_cpu_per_token"], 3), _f(ratio, 3, "×")])
        rows.append(["", "chat CPU s per token (with its DHT, p2pd)", _f(b["chat_tree_cpu_per_token"], 3),
                     _f(a["chat_tree_cpu_per_token"], 3), ""])
        rows.append(["", "servers' CPU s per token", _f(b["server_cpu_per_token"], 3), _f(a["server_cpu_per_token"], 3),
                     ""])
        rows.append(["", "answered", f"{b['ok']}/{b['answers']}", f"{a['ok']}/{a['answers']}", ""])
    b, a = before["alone"], after["alone"]
    rows.append(["one answer alone", "tokens/s (median of 3)", _f(b["tokens_per_s"]), _f(a["tokens_per_s"]),
                 _f(a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else None, 2, "×")])
    rows.append(["", "first token (s)", _f(b["ttft"]), _f(a["ttft"]), ""])
    rows.append(["chat process", "resident GiB loaded / after the runs (peak while loading)",
                 f"{_f(before['memory_loaded'][0])} / {_f(before['memory'][0])} ({_f(before['memory'][1])})",
                 f"{_f(after['memory_loaded'][0])} / {_f(after['memory'][0])} ({_f(after['memory'][1])})", ""])
    side = after.get("client_side") or {}
    g, s = after["greedy"], after["sampled"]
    gb, sb = before["greedy"], before["sampled"]
    targets = [
        ("chat CPU per token at 16 answers ≤ 1/10 of today's (greedy, sampled)",
         all(x["chat_cpu_per_token"] and y["chat_cpu_per_token"] and x["chat_cpu_per_token"] <= y["chat_cpu_per_token"] / 10
             for x, y in ((g, gb), (s, sb)))),
        ("aggregate tokens/s at 16 answers ≥ 3× today's (greedy, sampled)",
         all(x["aggregate"] >= 3 * y["aggregate"] for x, y in ((g, gb), (s, sb)))),
        ("one answer alone not slower (≥ 0.95×)", bool(a["tokens_per_s"] and b["tokens_per_s"]
                                                      and a["tokens_per_s"] >= 0.95 * b["tokens_per_s"])),
        ("the chat process ≤ 5 GiB with that client side (resident after the runs)", after["memory"][0] <= 5.0),
    ]
    text = [f"Llama-3.1-70B's client side (hidden 8192, vocabulary 128,256; one block, on {SERVERS} harness "
            f"servers in bfloat16 sharing the 2 cores), `swarm-monitor serve` at its default periods with {args.answers} slots, a client's share 1. "
            f"Before: the product at `{args.before}` (float32 client side, the head once per answer per token); "
            f"after: this checkout (`chat_dtype` auto: {side.get('dtype')} on {side.get('device')}, "
            f"{_f(side.get('head_ms_per_token'))} ms per token in its head steps, "
            f"{_f(side.get('rows_per_head_step'))} rows per step on average). {args.tokens} tokens per answer "
            f"({2 * args.tokens} alone). One run, both sides in it.", "",
            bc.table(["", "figure", "before", "after", "after / before"], rows), ""]
    text += [f"- {bc.verdict(ok)} {what}" for what, ok in targets]
    if huge is not None:
        hs = huge.get("client_side") or {}
        text += ["", f"Llama-3.1-405B's client side (hidden 16384, vocabulary 128,256, one block), bfloat16: loaded "
                     f"and answering, the chat process resident {_f(huge['memory_loaded'][0])} GiB (peak while "
                     f"loading {_f(huge['memory_loaded'][1])} GiB; its tensors {_f((hs.get('memory_bytes') or 0) / 2**30)} "
                     f"GiB), {_f(hs.get('head_ms_per_token'))} ms per token in its head steps, one answer alone "
                     f"{_f(huge['alone']['tokens_per_s'])} tokens/s ({huge['alone']['ok']}/{huge['alone']['runs']} "
                     f"answered)."]
    for name, result in (("before", before), ("after", after)):
        errors = sorted(set(result["greedy"]["errors"] + result["sampled"]["errors"]))
        if errors:
            text.append(f"\nErrors ({name}): " + "; ".join(errors))
    return "\n".join(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the revision whose chat is today's (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer of the 16 (twice as many alone)")
    parser.add_argument("--answers", type=int, default=16)
    parser.add_argument("--skip-405b", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--after-only", action="store_true", help="only this checkout (a try; writes nothing)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for this checkout's serve (a try)")
    args = parser.parse_args(argv)
    from monitor.harness.tiny_model import wide_model

    data_dir = Path.home() / ".cache" / "petals-swarm-monitor"
    print("building the checkpoints (first run only) ...", flush=True)
    seventy = wide_model(data_dir, "70b")
    if args.after_only:
        side("after", seventy.path, seventy.dht_prefix, seventy.num_blocks, None, args,
             dict(pair.split("=", 1) for pair in args.env))
        return
    with bc.checkout(args.before) as code:
        before = side("before", seventy.path, seventy.dht_prefix, seventy.num_blocks, code, args)
    after = side("after", seventy.path, seventy.dht_prefix, seventy.num_blocks, None, args)
    huge = None
    if not args.skip_405b:
        print("[405b] loading and answering ...", flush=True)
        four = wide_model(data_dir, "405b")
        huge = big(four.path, four.dht_prefix, four.num_blocks, args)
    text = report(before, after, huge, args)
    print(text)
    if not args.no_write:
        bc.write_section("head-step", text)


if __name__ == "__main__":
    bc.run_and_exit(main)
