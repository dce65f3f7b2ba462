#!/usr/bin/env python
"""Figures: the chat under real use, on the demo (BENCHMARKS.md, section chat-use).

    .venv/bin/python scripts/bench_chat_use.py [--tiny] [--users 32] [--duration 600] [--read 20 60]
                                               [--parts a b c d] [--swarm demo|harness] [--no-write]

``swarm-monitor demo`` (SmolLM2-135M-Instruct on three petals servers, its poller, probes and
generation checks running at its fast periods; ``--tiny``: the tiny random model) in its own
process — or, with ``--swarm harness``, the same layout started by the swarm harness, its servers
accepting sessions of the model's whole context, and ``swarm-monitor serve`` at the default periods
watching it — behind one trusted proxy hop so that each simulated person has an address of their
own (``X-Forwarded-For``):

(a) ``--users`` people on chat.petals.dev's page (its static/chat.js protocol: a WebSocket session
    of 512 tokens per tab, the conversation sent from its last position, answers streamed with
    max_new_tokens 1 until the stop sequence, a longer session after "Maximum length exceeded", a
    new one after "Session … expired"), each asking, reading for a uniformly random 20–60 s, and
    asking again, for ``--duration`` seconds: turns asked and answered, the wait until the first
    token (p50/p95/max), the answer's duration, errors shown, and people starved (an error shown,
    or a wait beyond the queue timeout);
(b) four such sessions asked once and left idle, then HTTP completions from someone else: their
    time against the same completions with nobody connected;
(c) ``n`` = 8 in one chat completion against 8 sequential ones (greedy, 32 tokens): aggregate
    tokens/s and whether the rows equal the single answer;
(d) the log-probability of a continuation (completions, echo + logprobs, max_tokens 0) against the
    same model computed here by transformers from its checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import bench_common as bc

from monitor.harness import petals_page as chatjs

TARGET_BATCH_SPEEDUP = 3.0
TARGET_LOGPROB_DIFF = 1e-3
TARGET_PERSON_WAIT = 10.0  # seconds: each person's median wait for a first token (#33, a hundred people)
QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "What is two plus two?",
    "Say hello in Spanish.", "What is the largest planet?", "Who wrote Hamlet?",
    "What do bees make?", "How many legs does a spider have?", "What is water made of?",
    "Give me a word that rhymes with cat.",
]
# chat.petals.dev's page describes each model (its ``models`` table); for SmolLM2 in its transcript
# format, an answer ends at the end of its line
PAGE_MODEL = chatjs.PageModel()  # (the page's words and error rule: monitor/harness/petals_page.py)
STOP_AFTER_TOKENS = 200  # a person clicks "stop generation" on an answer that runs on (short questions)


# ---- the demo ---------------------------------------------------------------------------------------


def start_demo(tiny: bool, data_dir: Path, log_path: Path, checkpoint: Optional[Path] = None
               ) -> tuple[subprocess.Popen, str]:
    """``swarm-monitor demo`` in its own session, one proxy hop trusted; (process, base URL).
    ``checkpoint``: serve that folder (``demo --checkpoint``)."""
    env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(data_dir), SWARM_MONITOR_PROXY_HOPS="1",
               SWARM_MONITOR_CHAT_RATE_LIMIT="100000 per minute",
               PYTHONPATH=os.pathsep.join([str(bc.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    # this checkout's code, whatever the environment's installed copy points at
    args = [sys.executable, "-m", "monitor.app.cli", "demo", "--port", "0"] + (
        ["--checkpoint", str(checkpoint)] if checkpoint else ["--tiny"] if tiny else [])
    log = open(log_path, "w")
    proc = subprocess.Popen(args, env=env, cwd=bc.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the demo exited early; its log: " + log_path.read_text()[-3000:])
        log.write(line)
        log.flush()
        match = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/", line)
        if match:
            threading.Thread(target=_copy, args=(proc, log), daemon=True).start()
            return proc, match.group(1)
    raise RuntimeError("the demo did not print its address in time")


@contextlib.contextmanager
def harness_service(model_path: Path, dht_prefix: str, num_blocks: int, context: Optional[int],
                    cache: Optional[int]) -> Iterator[str]:
    """The demo's layout of three servers started by the swarm harness, each accepting sessions as
    long as the model's context (``context``; petals' default 2048 without) with an attention cache
    of ``cache`` tokens (petals' default without), and ``swarm-monitor serve`` at its default
    periods watching it, one proxy hop trusted; yields the base URL."""
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm

    specs = [dataclasses.replace(spec, inference_max_length=context, attn_cache_tokens=cache)
             for spec in demo_layout(num_blocks, 3)]
    env = {"SWARM_MONITOR_PROXY_HOPS": "1", "SWARM_MONITOR_CHAT_RATE_LIMIT": "100000 per minute"}
    with LocalSwarm(model_path, dht_prefix) as swarm:
        swarm.start(specs)
        with bc.service(swarm.initial_peers, models=[f"{dht_prefix}:{num_blocks}:{model_path}"], env=env) as svc:
            yield svc["base"]


def _copy(proc, log) -> None:
    for line in proc.stdout:
        log.write(line)
    log.close()


def stop_demo(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def keep_demo_log(proc: subprocess.Popen, log: Path, kept: Path) -> None:
    stop_demo(proc)
    shutil.copy(log, kept)
    print(f"the demo's log: {kept}")


def post(base: str, path: str, body: dict, address: str = "10.9.0.1", timeout: float = 300) -> dict:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-Forwarded-For": address})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def model_of(base: str) -> str:
    with urllib.request.urlopen(base + "/v1/models", timeout=60) as response:
        return json.loads(response.read())["data"][0]["id"]


def wait_chat(base: str, model: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            post(base, "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1})
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the chat never answered: {e}") from None
            time.sleep(3)


def chat_metrics(base: str) -> dict:
    with urllib.request.urlopen(base + "/metrics", timeout=60) as response:
        text = response.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("swarm_monitor_chat_")}


# ---- (a) people on chat.petals.dev's page -----------------------------------------------------------


class PageUser(chatjs.ChatPage):
    """One person on chat.petals.dev's page (static/chat.js, CHATBOT regime): a thread that asks,
    reads, asks again; every turn timed from Enter to its first token and to its end."""

    def __init__(self, ws_url: str, address: str, model: str, read: tuple[float, float], until: float, seed: int):
        super().__init__(ws_url, address, model, PAGE_MODEL, reply_timeout=300)
        self.read, self.until, self.random = read, until, random.Random(seed)
        self.turns: list[dict] = []  # {asked, first, done, tokens, shown, stopped}

    def run(self) -> None:
        time.sleep(self.random.uniform(0, self.read[0]))  # people arrive over the first reading time
        while time.monotonic() < self.until:
            self.turn(self.random.choice(QUESTIONS))
            time.sleep(self.random.uniform(*self.read))
        self.close()

    def turn(self, question: str) -> None:
        try:
            shown = self.ask(question)
        except chatjs.NoReply as e:
            shown = str(e)
        record = self.turns[-1]
        record["shown"], record["done"] = shown, time.monotonic()
        record["first"] = record["first"] or record["done"]

    def on_ask(self) -> None:
        self.turns.append({"asked": time.monotonic(), "first": None, "done": None, "tokens": 0, "shown": None,
                           "stopped": False})

    def on_reply(self, response: dict) -> bool:
        record = self.turns[-1]
        if response.get("outputs"):
            record["first"] = record["first"] or time.monotonic()
        record["tokens"] += response.get("token_count", 0)
        # "stop generation" on an answer that runs on (the page resets its session)
        record["stopped"] = not response["stop"] and record["tokens"] >= STOP_AFTER_TOKENS
        return record["stopped"]


def part_a(base: str, model: str, users: int, duration: float, read: tuple[float, float], starve: float) -> dict:
    ws_url = base.replace("http://", "ws://") + "/api/v2/generate"
    until = time.monotonic() + duration
    people = [PageUser(ws_url, f"10.1.{i // 250}.{i % 250 + 1}", model, read, until, seed=i) for i in range(users)]
    threads = [threading.Thread(target=p.run, daemon=True) for p in people]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration + 900)
    elapsed = time.monotonic() - started
    turns = [t for p in people for t in p.turns]
    answered = [t for t in turns if t["shown"] is None and t["done"]]
    waits = [t["first"] - t["asked"] for t in answered]
    durations = [t["done"] - t["asked"] for t in answered]
    starved = [p for p in people if not p.turns or any(t["shown"] or not t["done"] for t in p.turns)]
    per_person = [sum(1 for t in p.turns if t["shown"] is None and t["done"]) for p in people]
    person_waits = [bc.median([t["first"] - t["asked"] for t in p.turns if t["shown"] is None and t["done"]])
                    for p in people if p.turns]
    return {"users": users, "elapsed": elapsed, "turns": len(turns), "answered": len(answered),
            "shown": sorted({t["shown"][:120] for t in turns if t["shown"]})[:5],
            "wait_p50": bc.percentile(waits, 50), "wait_p95": bc.percentile(waits, 95), "wait_max": max(waits, default=0),
            "answer_p50": bc.percentile(durations, 50), "answer_p95": bc.percentile(durations, 95),
            "tokens": sum(t["tokens"] for t in answered), "starved": len(starved),
            "over_timeout": sum(1 for w in waits if w > starve),
            "turns_per_person": (min(per_person, default=0), bc.median(per_person), max(per_person, default=0)),
            "person_wait": (min(person_waits, default=0), max(person_waits, default=0)),
            "stopped": sum(1 for t in answered if t["stopped"]),
            "reopened": sum(p.opens - 1 for p in people),
            "server_errors": sorted({re.sub(r"[0-9a-f]{8}", "…", e)[:90]
                                     for p in people for e in p.received_errors})[:6]}


# ---- (b) four idle sessions, then an HTTP completion ----------------------------------------------


def completion_time(base: str, model: str, address: str) -> float:
    started = time.perf_counter()
    post(base, "/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 16,
                                   "temperature": 0}, address=address)
    return time.perf_counter() - started


def part_b(base: str, model: str, runs: int = 5) -> dict:
    """Completions with nobody connected (before and after), and while four sessions sit idle."""
    from simple_websocket import Client

    alone = [completion_time(base, model, "10.2.0.100") for _ in range(runs)]
    ws_url = base.replace("http://", "ws://") + "/api/v2/generate"
    readers = []
    for i in range(4):
        ws = Client.connect(ws_url, headers={"X-Forwarded-For": f"10.2.0.{i + 1}"})
        ws.send(json.dumps({"type": "open_inference_session", "model": model, "max_length": 512}))
        assert json.loads(ws.receive(timeout=120))["ok"]
        ws.send(json.dumps({"type": "generate", "inputs": "Human: Hello!\nAssistant:", "max_new_tokens": 8}))
        assert json.loads(ws.receive(timeout=300))["ok"]
        readers.append(ws)
    metrics = chat_metrics(base)
    idle = [completion_time(base, model, "10.2.0.101") for _ in range(runs)]
    for ws in readers:  # and they go on chatting
        ws.send(json.dumps({"type": "generate", "inputs": "Human: And you?\nAssistant:", "max_new_tokens": 4}))
    again = [json.loads(ws.receive(timeout=300))["ok"] for ws in readers]
    for ws in readers:
        ws.close()
    time.sleep(2)
    alone += [completion_time(base, model, "10.2.0.100") for _ in range(runs)]
    return {"alone": bc.median(alone), "idle": bc.median(idle), "ratio": bc.median(idle) / bc.median(alone),
            "idle_sessions": metrics.get('swarm_monitor_chat_sessions_open{state="idle"}'),
            "busy_slots": metrics.get('swarm_monitor_chat_slots{state="busy"}'), "kept_chatting": all(again)}


# ---- (c) n = 8 against 8 sequential ---------------------------------------------------------------


def part_c(base: str, model: str, n: int = 8, tokens: int = 32, runs: int = 3) -> dict:
    """Alternating runs (8 sequential, then one of n = 8); the median run by speedup."""
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0}
    post(base, "/v1/chat/completions", body)  # warm
    results = []
    for _ in range(runs):
        started = time.perf_counter()
        singles = [post(base, "/v1/chat/completions", body) for _ in range(n)]
        sequential = time.perf_counter() - started
        started = time.perf_counter()
        batch = post(base, "/v1/chat/completions", {**body, "n": n})
        together = time.perf_counter() - started
        seq_tokens = sum(r["usage"]["completion_tokens"] for r in singles)
        batch_tokens = batch["usage"]["completion_tokens"]
        answer = singles[0]["choices"][0]["message"]["content"]
        results.append({"n": n, "tokens": tokens, "runs": runs, "sequential_s": sequential, "batch_s": together,
                        "sequential_tps": seq_tokens / sequential, "batch_tps": batch_tokens / together,
                        "speedup": (batch_tokens / together) / (seq_tokens / sequential),
                        "identical": all(c["message"]["content"] == answer for c in batch["choices"])
                        and len(batch["choices"]) == n})
    results.sort(key=lambda r: r["speedup"])
    middle = dict(results[len(results) // 2])
    middle["speedups"] = [round(r["speedup"], 2) for r in results]
    middle["identical"] = all(r["identical"] for r in results)
    return middle


# ---- (d) logprobs against the checkpoint ----------------------------------------------------------


def part_d(base: str, model: str, path: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    local = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    context = tokenizer("Question: What is the capital of France?\nAnswer:")["input_ids"]
    continuation = tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    ids = context + continuation
    reply = post(base, "/v1/completions", {"model": model, "prompt": [ids], "max_tokens": 0, "echo": True,
                                           "logprobs": 1, "temperature": 0})
    ours = reply["choices"][0]["logprobs"]["token_logprobs"]
    with torch.no_grad():
        reference = torch.log_softmax(local(torch.tensor([ids])).logits.float(), dim=-1)[0]
    theirs = [float(reference[i - 1, ids[i]]) for i in range(1, len(ids))]
    diffs = [abs(a - b) for a, b in zip(ours[1:], theirs)]
    return {"tokens": len(ids), "max_diff": max(diffs), "continuation": sum(ours[len(context):]),
            "reference": sum(theirs[len(context) - 1:])}


# ---- the figure -------------------------------------------------------------------------------------


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of the demo's SmolLM2")
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--read", type=float, nargs=2, default=(20.0, 60.0))
    parser.add_argument("--parts", nargs="+", default=["b", "c", "d", "a"], choices=("a", "b", "c", "d"))
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the demo's data dir (default: a fresh one, its models from the test cache)")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench-chat-use-demo.log",
                        help="where the demo's log is kept")
    parser.add_argument("--stop-after", type=int, default=STOP_AFTER_TOKENS,
                        help="tokens after which a person stops an answer that runs on (the tiny random model's "
                             "never end: a person reads a gibberish paragraph, then stops it)")
    parser.add_argument("--context", type=int, default=None,
                        help="with --tiny: declare this context instead of its 512 tokens (a conversation of "
                             "ten minutes outgrows 512; chat.petals.dev's page then shows an error for good)")
    parser.add_argument("--swarm", choices=("demo", "harness"), default="demo",
                        help="demo: `swarm-monitor demo` (its fast periods); harness: the demo's layout started by "
                             "the swarm harness, its servers accepting the model's whole context, watched by "
                             "`swarm-monitor serve` at the default periods (as people run it)")
    parser.add_argument("--server-cache", type=int, default=None,
                        help="with --swarm harness: each server's attention cache in tokens per block (petals' "
                             "--attn_cache_tokens; default petals' own, 4096 for the tiny model)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    globals()["STOP_AFTER_TOKENS"] = args.stop_after
    print(bc.machine(), flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-chat-use-"))
    data_dir = args.data_dir or workdir / "data"
    if args.data_dir is None:
        data_dir.mkdir()
        cached = Path.home() / ".cache" / "petals-swarm-monitor-tests" / "models"
        if cached.exists():
            (data_dir / "models").symlink_to(cached)
    from monitor.harness.demo_swarm import prepare_model
    from monitor.settings import load_settings

    path, dht_prefix, num_blocks, _ = prepare_model(data_dir, tiny=args.tiny)
    settings = load_settings()  # (the defaults, and what the environment sets for the demo too)
    checkpoint = None
    if args.tiny and args.context:  # the tiny model's weights with a longer context declared (it has
        checkpoint = workdir / path.name  # rotary positions: nothing else changes), served as a checkpoint
        shutil.copytree(path, checkpoint)
        config = json.loads((checkpoint / "config.json").read_text())
        config["max_position_embeddings"] = args.context
        (checkpoint / "config.json").write_text(json.dumps(config))
    results: dict = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        if args.swarm == "harness":
            base = stack.enter_context(harness_service(checkpoint or path, dht_prefix, num_blocks, args.context,
                                                       args.server_cache))
        else:
            proc, base = start_demo(args.tiny, data_dir, workdir / "demo.log", checkpoint)
            stack.callback(keep_demo_log, proc, workdir / "demo.log", args.log)
        model = model_of(base)
        wait_chat(base, model)
        print(f"{args.swarm} at {base}, model {model}", flush=True)
        for part in args.parts:
            began = time.monotonic()
            if part == "a":
                results["a"] = part_a(base, model, args.users, args.duration, tuple(args.read),
                                      starve=settings.chat_queue_timeout)
                results["a_metrics"] = chat_metrics(base)
            elif part == "b":
                results["b"] = part_b(base, model)
            elif part == "c":
                results["c"] = part_c(base, model)
            else:
                results["d"] = part_d(base, model, path)
            print(part, f"({time.monotonic() - began:.0f} s):", results[part], flush=True)
    markdown = report(results, args, settings)
    print("\n" + markdown)
    if not args.no_write:
        bc.write_section("chat-use" if args.users == 32 else f"chat-use-{args.users}", markdown)


def report(results: dict, args, settings) -> str:
    model = "the tiny random model (`--tiny`)" if args.tiny else "the demo's SmolLM2-135M-Instruct"
    rows = []
    if "a" in results:
        a = results["a"]
        low, middle, high = a["turns_per_person"]
        rows.append([f"(a) {a['users']} chat.petals.dev users, {a['elapsed'] / 60:.1f} min",
                     f"{a['answered']} of {a['turns']} turns answered, {len(a['shown'])} errors shown, "
                     f"{a['starved']} starved; turns per person {low}–{high} (median {middle:g}); wait for the "
                     f"first token p50 {bc.fmt(a['wait_p50'])}, p95 {bc.fmt(a['wait_p95'])}, max {bc.fmt(a['wait_max'])} "
                     f"({a['over_timeout']} turns over 60 s; each person's median wait "
                     f"{bc.fmt(a['person_wait'][0])}–{bc.fmt(a['person_wait'][1])}); answers p50 {bc.fmt(a['answer_p50'])}, "
                     f"p95 {bc.fmt(a['answer_p95'])}; {a['tokens'] / a['elapsed']:.1f} tokens/s streamed in all",
                     f"every turn answered, none starved, each person's median wait ≤ {TARGET_PERSON_WAIT:g} s",
                     bc.verdict(a["answered"] == a["turns"] and a["starved"] == 0
                                and a["person_wait"][1] <= TARGET_PERSON_WAIT)])
    if "b" in results:
        b = results["b"]
        rows.append(["(b) 4 idle WebSockets, then an HTTP completion (16 tokens)",
                     f"{bc.fmt(b['idle'])} against {bc.fmt(b['alone'])} alone ({b['ratio']:.2f}×); "
                     f"{b['idle_sessions']:.0f} idle sessions, {b['busy_slots']:.0f} slots busy while they read; "
                     f"they chat on: {'yes' if b['kept_chatting'] else 'NO'}",
                     "its usual time", bc.verdict(b["ratio"] <= 1.5 and b["kept_chatting"])])
    if "c" in results:
        c = results["c"]
        rows.append([f"(c) n = {c['n']} in one chat completion vs {c['n']} sequential ({c['tokens']} greedy tokens)",
                     f"{c['batch_tps']:.1f} vs {c['sequential_tps']:.1f} tokens/s: **{c['speedup']:.1f}×** "
                     f"({bc.fmt(c['batch_s'])} vs {bc.fmt(c['sequential_s'])}; the median of {c['runs']} runs: "
                     f"{', '.join(f'{x:g}×' for x in c['speedups'])}); rows identical: {'yes' if c['identical'] else 'NO'}",
                     f"≥ {TARGET_BATCH_SPEEDUP:g}×, identical",
                     bc.verdict(c["speedup"] >= TARGET_BATCH_SPEEDUP and c["identical"])])
    if "d" in results:
        d = results["d"]
        rows.append([f"(d) logprob of a continuation, {d['tokens']} tokens scored (echo, max_tokens 0)",
                     f"largest difference per token {d['max_diff']:.1e}; continuation {d['continuation']:.4f} vs "
                     f"{d['reference']:.4f} computed by transformers from the checkpoint",
                     f"≤ {TARGET_LOGPROB_DIFF:g}", bc.verdict(d["max_diff"] <= TARGET_LOGPROB_DIFF)])
    markdown = bc.table(["figure", "measured", "target", ""], rows)
    where = ("`swarm-monitor demo` (three servers, its poller, probes and generation checks running at its fast "
             "periods)" if args.swarm == "demo" else
             "the demo's layout of three servers started by the swarm harness, each accepting sessions of "
             f"{args.context or 2048} tokens (petals' `--inference_max_length`)"
             + (f" with attention caches of {args.server_cache} tokens (`--attn_cache_tokens`)" if args.server_cache
                else "") + ", watched by `swarm-monitor serve` at "
             "the default periods (its poller, probes and generation checks running)")
    notes = [f"\n\nOn {model}: {where} with its chat capacity — {settings.chat_slots} generation slots, a queue of "
             f"{settings.chat_queue_size} ({settings.chat_queue_timeout:g} s at most), a client's share "
             f"{settings.max_slots_share:g}, {settings.max_open_sessions} open sessions, "
             f"{settings.max_sessions_per_client} per client — behind one trusted proxy hop, so that every "
             f"simulated person has an address of their own."]
    if "a" in results:
        a, m = results["a"], results.get("a_metrics", {})
        evicted = m.get('swarm_monitor_chat_sessions_expired_total{reason="evicted"}', 0)
        idle = m.get('swarm_monitor_chat_sessions_expired_total{reason="idle"}', 0)
        refused = sum(v for k, v in m.items() if k.startswith("swarm_monitor_chat_refused_total"))
        released = m.get("swarm_monitor_chat_sessions_released_total", 0)
        errors, shown = "; ".join(a["server_errors"]), "; ".join(a["shown"])
        notes.append(f"(a) Each person runs chat.petals.dev's page protocol (static/chat.js) on a WebSocket of "
                     f"their own: asks one of ten short questions, reads for {args.read[0]:g}–{args.read[1]:g} s, asks "
                     f"again; sampling as the page sends it (temperature {chatjs.PAGE_PARAMS['temperature']:g}, top_p "
                     f"{chatjs.PAGE_PARAMS['top_p']:g}), an answer ends at its line's "
                     f"end ({a['stopped']} answers that ran past {STOP_AFTER_TOKENS} tokens were stopped with the page's "
                     f"'stop generation', which ends its session; the page reopened {a['reopened']} sessions). "
                     f"Starved: a person with a turn never answered (an error shown). {a['tokens']} tokens streamed; "
                     f"sessions the chat expired: {evicted:.0f} to make room, {idle:.0f} idle; idle sessions that "
                     f"let go of a full server's cache: {released:.0f}; requests refused: {refused:.0f}." + (f" Errors the page got (and recovered from, unless shown): {errors}."
                                          if errors else "") + (f" Shown: {shown}." if shown else ""))
    return markdown + "\n\n".join(notes)


if __name__ == "__main__":
    bc.run_and_exit(main)
