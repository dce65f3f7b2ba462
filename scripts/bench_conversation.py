#!/usr/bin/env python
"""Figures: a conversation that continues where it stopped (BENCHMARKS.md, section conversation).

    .venv/bin/python scripts/bench_conversation.py [--before REV] [--turns 10] [--tokens 80] [--runs 2]
                                                   [--no-trap] [--no-write]

The demo's model (SmolLM2-135M-Instruct) on two float32 petals servers of every block, started by
the swarm harness on 127.0.0.1, watched by ``swarm-monitor serve`` at the default periods — today's
code (``--before``, in a git worktree) and this checkout's, one after the other, on the same swarm:

(a) a ``--turns``-turn conversation through ``POST /v1/chat/completions`` (streamed, greedy,
    ``--tokens`` per answer, each answer put back in the messages; this checkout's run passes each
    answer's ``petals.session`` back): the first token per turn, and its turns 8–10 against 1–3
    (target ≤ 1.5×; today 8× and more), the answers' time, whether the answers are today's;
(b) the same conversation on the chat page (``POST /chat/turns``, then its event stream): the
    conversation continues by itself;
(c) the trap (``--no-trap`` skips it): mid-way, the server holding the conversation's kept session is
    throttled (``LocalSwarm.throttle``: stopped 90 % of each quarter second); the turns after move
    to the other server and are not slower than fresh sessions of the same conversation.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

import bench_common as bc

from monitor.harness.event_stream import events

BEFORE = "7055118"  # the last commit before sessions were kept after an answer
TARGET_RATIO = 1.5  # first token at turns 8-10 against turns 1-3
QUESTIONS = [
    "What is the capital of France?", "And what river runs through it?", "Name a famous museum there.",
    "What can I see in that museum?", "Which painter made the most famous work there?",
    "Name another painting by that painter.", "Where was that painter born?", "What else is that town known for?",
    "Suggest a dish to eat there.", "Thank you! Summarize our conversation in one sentence.",
]


def chat_turn(base: str, model: str, messages: list, tokens: int, handle: Optional[str]) -> dict:
    """One streamed chat completion; the caller's clock."""
    body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if handle is not None:
        body["petals"] = {"session": handle}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first, text, usage, petals, error = None, "", {}, {}, None
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"].get("message")
                continue
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text += piece
            petals = {**petals, **(event.get("petals") or {})}  # (the route comes with the answer's last chunk)
            usage = event.get("usage") or usage
    return {"ttft": first - started if first else None, "elapsed": time.perf_counter() - started, "text": text,
            "tokens": (usage or {}).get("completion_tokens"),
            "handle": petals.get("session"), "continued": petals.get("continued", False), "route": petals.get("route"),
            "cached": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "prompt_tokens": (usage or {}).get("prompt_tokens"), "error": error}


SYSTEM = "You are a helpful guide. Answer every question at length, in detail."


def api_conversation(base: str, model: str, turns: int, tokens: int, *, pass_handle: bool,
                     on_turn=None) -> list[dict]:
    messages, results, handle = [{"role": "system", "content": SYSTEM}], [], None
    for turn in range(turns):
        if on_turn is not None:
            on_turn(turn, results)
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        result = chat_turn(base, model, messages, tokens, handle if pass_handle else None)
        results.append(result)
        messages.append({"role": "assistant", "content": result["text"]})
        handle = result["handle"]
    return results


def page_conversation(base: str, model: str, turns: int, tokens: int) -> list[dict]:
    """The conversation on the chat page, as its htmx does: a turn's POST, then its event stream."""
    import http.cookiejar

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    html = opener.open(base + "/chat", timeout=60).read().decode()
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', html).group(1)
    conversation, results = "", []
    for turn in range(turns):
        form = {"model": model, "message": QUESTIONS[turn % len(QUESTIONS)], "temperature": "0", "top_p": "1",
                "top_k": "0", "repetition_penalty": "1", "max_new_tokens": str(tokens), "conversation_id": conversation,
                "system": SYSTEM}
        data = urllib.parse.urlencode(form).encode()
        started = time.perf_counter()
        page = opener.open(urllib.request.Request(base + "/chat/turns", data=data, headers={"X-CSRFToken": csrf}),
                           timeout=60).read().decode()
        conversation = re.search(r'id="conversation-id" value="([^"]+)"', page).group(1)
        stream = re.search(r'data-chat-stream="([^"]+)"', page).group(1)
        first, text, done = None, "", ""
        with opener.open(base + stream, timeout=600) as response:
            for event, payload in events(response):
                if event == "token":
                    first = first or time.perf_counter()
                    text += payload
                elif event == "done":
                    done = payload
                    break
        results.append({"ttft": first - started if first else None, "elapsed": time.perf_counter() - started,
                        "text": text, "continued": "continued" in done})
    return results


def ratio(results: list[dict]) -> Optional[float]:
    early = [r["ttft"] for r in results[:3] if r["ttft"]]
    late = [r["ttft"] for r in results[-3:] if r["ttft"]]
    return bc.median(late) / bc.median(early) if early and late else None


def measure(code: Optional[Path], swarm, prefix: str, num_blocks: int, path: Path, *, turns: int, tokens: int,
            runs: int, kept: bool) -> dict:
    with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"], code=code) as svc:
        base = svc["base"]
        wait_ready(base, prefix)
        api = [api_conversation(base, prefix, turns, tokens, pass_handle=kept) for _ in range(runs)]
        page = [page_conversation(base, prefix, turns, tokens) for _ in range(runs)]
    return {"api": api, "page": page}


def wait_ready(base: str, prefix: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if chat_turn(base, prefix, [{"role": "user", "content": "Hi"}], 2, None)["text"]:
                return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError("the chat never answered")


def trap(swarm, prefix: str, num_blocks: int, path: Path, *, turns: int, tokens: int) -> dict:
    """This checkout: a conversation passing its handle back, the server holding its session
    throttled before turn ``turns // 2``; then the same turns as fresh sessions (no handle) with the
    server still throttled."""
    names = {swarm.peer_id(name): name for name in ("a", "b")}
    throttled = {}

    def on_turn(turn, results):
        if turn == turns // 2 and results and results[-1]["route"]:
            name = names[results[-1]["route"][0]["peer_id"]]
            swarm.throttle(name, duty=0.9, period=0.25)
            throttled["name"] = name

    with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"]) as svc:
        wait_ready(svc["base"], prefix)
        try:
            kept = api_conversation(svc["base"], prefix, turns, tokens, pass_handle=True, on_turn=on_turn)
            fresh = api_conversation(svc["base"], prefix, turns, tokens, pass_handle=False)
        finally:
            if throttled:
                swarm.unthrottle(throttled["name"])
    return {"kept": kept, "fresh": fresh, "throttled": throttled.get("name"), "names": names}


def summary_row(label: str, runs: list[list[dict]]) -> list:
    per_turn = [bc.median([run[t]["ttft"] for run in runs if run[t]["ttft"]]) for t in range(len(runs[0]))]
    elapsed = [bc.median([run[t]["elapsed"] for run in runs]) for t in range(len(runs[0]))]
    r = bc.median([ratio(run) for run in runs if ratio(run)])
    continued = sum(1 for run in runs for turn in run[1:] if turn["continued"])
    follow_ups = sum(len(run) - 1 for run in runs)
    return [label, *(bc.ms(v) for v in per_turn), f"**{r:.2f}×**", f"{bc.fmt(elapsed[0])} / {bc.fmt(elapsed[-1])}",
            f"{continued}/{follow_ups}"], r


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the revision whose chat is today's (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=80)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-trap", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    print(bc.machine(), flush=True)
    from monitor.harness.demo_swarm import prepare_model
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec

    path, prefix, num_blocks = prepare_model(args.data_dir, tiny=False)[:3]
    results = {}
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start([ServerSpec("a", 0, num_blocks), ServerSpec("b", 0, num_blocks)])
        with bc.checkout(args.before) as before:
            results["before"] = measure(before, swarm, prefix, num_blocks, path, turns=args.turns, tokens=args.tokens,
                                        runs=args.runs, kept=False)
        print("before done", flush=True)
        results["after"] = measure(None, swarm, prefix, num_blocks, path, turns=args.turns, tokens=args.tokens,
                                   runs=args.runs, kept=True)
        print("after done", flush=True)
        if not args.no_trap:
            results["trap"] = trap(swarm, prefix, num_blocks, path, turns=args.turns, tokens=args.tokens)
    Path("/tmp/bench_conversation.json").write_text(json.dumps(results, default=str))

    header = ["", *(f"turn {t + 1}" for t in range(args.turns)), "turns 8–10 / 1–3 (first token)",
              "answer time turn 1 / last", "continued"]
    rows, ratios = [], {}
    for when in ("before", "after"):
        for where in ("api", "page"):
            row, ratios[(when, where)] = summary_row(f"{when}: {'OpenAI API' if where == 'api' else 'chat page'}",
                                                     results[when][where])
            rows.append(row)
    same_api = [a["text"] == b["text"] for run_a, run_b in zip(results["after"]["api"], results["before"]["api"])
                for a, b in zip(run_a, run_b)]
    same_page = [a["text"] == b["text"] for run_a, run_b in zip(results["after"]["page"], results["before"]["page"])
                 for a, b in zip(run_a, run_b)]
    text = bc.table(header, rows)
    met = all(ratios[("after", where)] <= TARGET_RATIO for where in ("api", "page"))
    text += (f"\n\nFirst token per turn (medians of {args.runs} conversations of {args.turns} turns, {args.tokens} "
             f"greedy tokens per answer; the caller's clock, streamed). Target: turns 8–10 at most {TARGET_RATIO}× "
             f"turns 1–3 — {bc.verdict(met)}. Answers identical to today's: {sum(same_api)}/{len(same_api)} "
             f"(API), {sum(same_page)}/{len(same_page)} (page).")
    if "trap" in results:
        trap_result = results["trap"]
        half = args.turns // 2
        after_kept = [t for t in trap_result["kept"][half + 1:]]
        after_fresh = [t for t in trap_result["fresh"][half + 1:]]
        moved = sum(1 for t in after_kept if t["route"] and trap_result["names"].get(t["route"][0]["peer_id"])
                    != trap_result["throttled"])
        kept_time = sum(t["elapsed"] for t in after_kept)
        fresh_time = sum(t["elapsed"] for t in after_fresh)
        text += (f"\n\nThe trap: server {trap_result['throttled']!r} (holding the conversation's kept session) "
                 f"throttled before turn {half + 1}. Turns {half + 2}–{args.turns}: {moved}/{len(after_kept)} "
                 f"on the other server; their answers took {bc.fmt(kept_time)} continuing against "
                 f"{bc.fmt(fresh_time)} as fresh sessions — {bc.verdict(kept_time <= fresh_time * 1.1)} "
                 f"(not slower, within 10 %).")
    print("\n" + text)
    if not args.no_write:
        bc.write_section("conversation", text)


if __name__ == "__main__":
    bc.run_and_exit(main)
