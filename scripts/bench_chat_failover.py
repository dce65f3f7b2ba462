#!/usr/bin/env python
"""Benchmark: a chat worker killed (#47) — does the other answer at once, and is nothing stored lost?

Swarm: two servers of the tiny model (every block served twice), started by the swarm harness on
127.0.0.1. Chat: two workers behind nginx as the README's production section lays them out
(``monitor.harness.chat_workers``: gunicorn, a private Redis), on a throwaway PostgreSQL store
(``tests/postgres.py``), 8 slots each (either can serve every client alone). Clients, as people
(a second between turns); they all come from 127.0.0.1, which is one client to the workers, so
its share is every slot and its rate limit raised (shares over workers: ``bench_chat_workers``):

- 4 chat-page conversations, 2 whose cookie names w1 and 2 w2, taking turns through nginx as the
  page does (``POST /chat/turns`` and its event stream); a turn that breaks or fails is asked again
  as the page's "Regenerate" asks it (``edit`` one past the last answered question);
- 4 OpenAI clients streaming ``/v1/chat/completions`` through nginx (no cookie: any worker), each
  retrying at once a request that broke or was refused.

Each run kills one worker (``kill -9`` of its gunicorn master and worker by PID, as a crash: its
DHT process and p2pd orphaned; w2, w1, … in turn) after 8 s of traffic, then measures:

- *answered again*: for every client of the dead worker (its last answer before the kill came
  from it, or a request of it broke), from the kill to its next whole answer, from the other
  worker (its second of thought included) — target ≤ 5 s for every one (the worst of the run),
  with the first such answer beside it; a request in flight to the dead worker that nginx could
  hand over (no byte of an answer sent yet) is answered by the other without the client knowing;
- *lost*: answers a conversation saw whole (its "done") that the store does not hold afterwards,
  word for word, read back through nginx (each conversation's JSON export) — target 0;
- *forgotten*: from the kill to the survivor's ``swarm_monitor_chat_shared_workers`` reading 0
  (the dead one's lease) — target ≤ 10 s;
- *orphans*: the dead worker's helper processes (its DHT's process, p2pd, the watchdog that ends
  them: ``monitor.swarm.reaper``) still running 10 s after the kill — target 0;

then the killed worker is started again and the next run begins.

``.venv/bin/python scripts/bench_chat_failover.py [--runs 4] [--no-write]`` (~8 min).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import bench_common as bc

sys.path.insert(0, str(bc.ROOT / "tests"))  # the throwaway PostgreSQL cluster of the specs

COOKIE = "swarm_monitor_chat_worker"
ANSWERED_WITHIN = 5.0  # s, every broken client's next answer after the kill
FORGOTTEN_WITHIN = 10.0  # s, the dead worker's lease
ORPHANS_GONE = 10.0  # s: the dead worker's watchdog (``monitor.swarm.reaper``) ends them at once
WARM = 8.0  # s of traffic before the kill
AFTER = 12.0  # s of traffic after it
TOKENS = 8
THINK = 1.0  # s between a client's turns
QUESTIONS = ["Where do the blocks live?", "Who serves them?", "How fast is it?", "And the next one?"]


class Client:
    """One person: turns one after another, each (start, end, ok, worker, error) recorded; a
    request that breaks or fails is sent again at once (a page's Regenerate, an API client's retry)."""

    def __init__(self, proxy: str, prefix: str, *, page: bool, cookie: str | None = None):
        import requests

        self.proxy, self.prefix, self.page = proxy, prefix, page
        self.web = requests.Session()
        if cookie:
            self.web.cookies.set(COOKIE, cookie)
        self.events: list[tuple[float, float, bool, str, str]] = []
        self.stopping = threading.Event()
        self.conversation_id, self.answered, self.seen = "", 0, []  # (page) its conversation as it saw it
        self._csrf = None

    def new_conversation(self) -> None:
        self.conversation_id, self.answered, self.seen = "", 0, []

    def run(self) -> None:
        again = False
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                ok, worker, error = self.page_turn(again) if self.page else self.api_turn()
            except Exception as e:  # noqa: BLE001 - a broken connection is what this measures
                ok, worker, error = False, "", type(e).__name__
            self.events.append((started, time.monotonic(), ok, worker, error))
            again = not ok
            if ok:
                self.stopping.wait(THINK)
            else:
                time.sleep(0.05)

    def page_turn(self, again: bool) -> tuple[bool, str, str]:
        from monitor.harness.event_stream import events

        if self._csrf is None:
            html = self.web.get(self.proxy + "/chat", timeout=30).text
            self._csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', html).group(1)
        question = QUESTIONS[self.answered % len(QUESTIONS)]
        form = {"model": self.prefix, "message": question, "max_new_tokens": str(TOKENS), "temperature": "0",
                "conversation_id": self.conversation_id}
        if again:
            form["edit"] = str(self.answered)  # the question again, where the conversation stands
        posted = self.web.post(self.proxy + "/chat/turns", data=form, headers={"X-CSRFToken": self._csrf}, timeout=30)
        if posted.status_code != 200:
            return False, posted.headers.get("X-Chat-Worker", ""), f"HTTP {posted.status_code} {_said(posted.text)}"
        self.conversation_id = re.search(r'id="conversation-id" value="([^"]*)"', posted.text).group(1)
        stream = re.search(r'data-chat-stream="([^"]+)"', posted.text).group(1)
        response = self.web.get(self.proxy + stream, stream=True, timeout=60)
        worker = response.headers.get("X-Chat-Worker", "")
        text = ""
        for event, data in events(response.iter_content(chunk_size=None, decode_unicode=True)):
            if event == "token":
                text += data
            elif event == "failed":
                return False, worker, "failed: " + data[:80]
            elif event == "done":
                if "chat-copy" not in data:
                    return False, worker, "no answer"
                self.answered += 1
                self.seen.append(text)
                return True, worker, ""
        return False, worker, "stream ended"

    def api_turn(self) -> tuple[bool, str, str]:
        body = {"model": self.prefix, "messages": [{"role": "user", "content": QUESTIONS[len(self.events) % 4]}],
                "max_tokens": TOKENS, "temperature": 0, "stream": True}
        response = self.web.post(self.proxy + "/v1/chat/completions", json=body, stream=True, timeout=60)
        worker = response.headers.get("X-Chat-Worker", "")
        if response.status_code != 200:
            return False, worker, f"HTTP {response.status_code} {_said(response.text)}"
        finished = False
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    return False, worker, "error: " + str(event["error"].get("message"))[:80]
                finished = finished or any(c.get("finish_reason") for c in event.get("choices") or ())
            elif line == b"data: [DONE]":
                return finished, worker, "" if finished else "no finish"
        return False, worker, "stream ended"

    def stored(self) -> list[str]:
        """The answers the store holds for this conversation (through nginx, as its visitor)."""
        if not self.conversation_id:
            return []
        response = self.web.get(f"{self.proxy}/chat/conversations/{self.conversation_id}/export.json", timeout=30)
        if response.status_code != 200:
            return []
        return [m["content"] for m in response.json()["messages"] if m["role"] == "assistant"]


def _as_streamed(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _said(text: str) -> str:
    """An error answer's first words (tags dropped), to tell its kind."""
    return re.sub(r"<[^>]+>|\s+", " ", text).strip()[:60]


def metric(base: str, name: str) -> float:
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            found = re.search(rf"^{name} ([0-9.e+-]+)$", response.read().decode(), re.M)
        return float(found.group(1)) if found else float("nan")
    except OSError:
        return float("nan")


def one_run(chat, clients: list[Client], victim: str) -> dict:
    import psutil

    survivor = next(t for t in chat.workers if t != victim)
    base = {t: f"http://127.0.0.1:{p}" for t, p in chat.workers.items()}
    if not bc.wait(lambda: metric(base[survivor], "swarm_monitor_chat_shared_workers") == 1, 30):
        raise SystemExit(f"{survivor} never counted {victim}")
    for client in clients:
        if client.page:
            client.new_conversation()
        client.events.clear()
        client.stopping.clear()
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    time.sleep(WARM)
    master = psutil.Process(chat.procs[victim].pid)
    worker = master.children()[0]
    helpers = worker.children(recursive=True)
    for process in (master, worker):
        process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    gone_at: list[float] = []

    def watch_orphans() -> None:  # from the kill on, every 0.1 s
        while time.monotonic() - killed < ORPHANS_GONE + 5:
            if not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers):
                gone_at.append(time.monotonic() - killed)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_orphans, daemon=True)
    watcher.start()
    chat.procs[victim].wait(10)
    forgotten = None
    while time.monotonic() - killed < 20:
        if metric(base[survivor], "swarm_monitor_chat_shared_workers") == 0:
            forgotten = time.monotonic() - killed
            break
        time.sleep(0.1)
    time.sleep(max(0.0, killed + AFTER - time.monotonic()))
    for client in clients:
        client.stopping.set()
    for thread in threads:
        thread.join(90)
    watcher.join(ORPHANS_GONE + 10)
    orphans_gone = gone_at[0] if gone_at else None
    left = [f"{h.name()} {h.pid}" for h in helpers if h.is_running() and h.status() != psutil.STATUS_ZOMBIE]
    for h in helpers:  # (ours: never left behind, whatever the figure)
        if h.is_running():
            h.kill()
    # every client of the dead worker — its last answer before the kill came from it, or a request
    # of it broke after the kill — from the kill to its next whole answer (think time included)
    recovered, errors = [], {}
    for client in clients:
        for e in client.events:
            if not e[2] and e[4]:
                errors[e[4][:70]] = errors.get(e[4][:70], 0) + 1
        before = [e for e in client.events if e[0] < killed and e[2]]
        broke = [e for e in client.events if not e[2] and e[1] >= killed]
        if broke or (before and before[-1][3] == victim):
            after = next((e for e in client.events if e[2] and e[1] > killed and e[3] != victim), None)
            recovered.append((after[1] - killed, after[3]) if after else (float("inf"), ""))
    lost, checked, fewer = 0, 0, 0
    for client in clients:  # each answer a conversation saw, in the store (as many times as it saw it)
        if client.page:
            stored = client.stored()
            checked += len(client.seen)
            # as kept (NUL as unknown: without_nul) and as an event stream carries it (CR and CR LF as LF)
            seen = Counter(_as_streamed(text.replace("\x00", "\ufffd")) for text in client.seen)
            missing = seen - Counter(_as_streamed(text) for text in stored)
            lost += sum(missing.values())
            for text in missing:
                print("not in the store:", repr(text)[:300], "stored:", [repr(t)[:300] for t in stored], flush=True)
            fewer += max(0, len(client.seen) - len(stored))  # (the same by count: text aside)
    answered = sum(1 for c in clients for e in c.events if e[2])
    return {"victim": victim, "recovered": sorted(recovered), "forgotten": forgotten, "orphans_gone": orphans_gone,
            "orphans_left": left, "lost": lost, "fewer": fewer, "checked": checked, "answered": answered, "errors": errors,
            "by_survivor": all(w == survivor for _, w in recovered if w)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from postgres import start_cluster

    from monitor.harness.chat_workers import ChatWorkers
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec
    from monitor.harness.ports import free_port
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model
    from monitor.store import Store

    bc.stop_on_sigterm()  # (kill PID: everything started is stopped)
    print(bc.machine(), flush=True)
    data = Path(os.environ.get("SWARM_MONITOR_TEST_DATA", Path.home() / ".cache" / "petals-swarm-monitor-tests"))
    model = ensure_tiny_model(data)
    cluster = start_cluster()
    runs = []
    try:
        url = cluster.create_database()
        store = Store(url)
        store.migrate()
        store.close()
        with tempfile.TemporaryDirectory(prefix="bench-chat-failover-") as tmp, \
                LocalSwarm(model, TINY_DHT_PREFIX, update_period=10) as swarm:
            swarm.start([ServerSpec("a", 0, TINY_NUM_BLOCKS), ServerSpec("b", 0, TINY_NUM_BLOCKS)])
            env = {"SWARM_MONITOR_DATA_DIR": str(Path(tmp) / "data"), "SWARM_MONITOR_DATABASE_URL": url,
                   "SWARM_MONITOR_INITIAL_PEERS": ",".join(swarm.initial_peers), "SWARM_MONITOR_CHAT_SLOTS": "8",
                   "SWARM_MONITOR_MAX_SLOTS_SHARE": "1", "SWARM_MONITOR_CHAT_RATE_LIMIT": "6000 per minute",
                   "SWARM_MONITOR_MODELS": json.dumps([{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS,
                                                        "path": str(model)}])}
            port = free_port()
            chat = ChatWorkers(Path(tmp) / "chat", 2, env, port=port, dashboard_port=free_port(), threads=16)
            chat.start(timeout=300)
            try:
                proxy = f"http://127.0.0.1:{port}"
                clients = [Client(proxy, TINY_DHT_PREFIX, page=True, cookie=("w1", "w2")[i % 2])
                           for i in range(4)]
                clients += [Client(proxy, TINY_DHT_PREFIX, page=False) for i in range(4)]
                for i in range(args.runs):
                    victim = ("w2", "w1")[i % 2]
                    found = one_run(chat, clients, victim)
                    print(json.dumps(found, default=str), flush=True)
                    runs.append(found)
                    chat.restart(victim)
            finally:
                chat.close()
    finally:
        cluster.close()
    text = report(runs)
    print(text)
    if not args.no_write:
        bc.write_section("chat-failover", text)


def report(runs: list[dict]) -> str:
    rows, ok = [], True
    for i, r in enumerate(runs, 1):
        times = [t for t, _ in r["recovered"]]
        worst = max(times) if times else None
        good = (worst is not None and worst <= ANSWERED_WITHIN and r["lost"] == 0 and r["forgotten"] is not None
                and r["forgotten"] <= FORGOTTEN_WITHIN and r["orphans_gone"] is not None
                and r["orphans_gone"] <= ORPHANS_GONE and r["by_survivor"])
        ok = ok and good
        rows.append([str(i), r["victim"], str(len(times)), bc.fmt(min(times)) if times else "–",
                     bc.fmt(worst) if worst is not None else "–", f"{r['lost']} of {r['checked']}",
                     bc.fmt(r["forgotten"]) if r["forgotten"] is not None else "never",
                     bc.fmt(r["orphans_gone"]) if r["orphans_gone"] is not None else f"left: {r['orphans_left']}",
                     str(r["answered"]), ", ".join(f"{k} ×{v}" for k, v in sorted(r["errors"].items())) or "–",
                     bc.verdict(good)])
    every = [t for r in runs for t, _ in r["recovered"]]
    return (f"**A chat worker killed** (`kill -9` of its gunicorn master and worker by PID, after {WARM:.0f} s of "
            f"traffic; two workers behind nginx on PostgreSQL and Redis, 8 slots each; 4 chat-page conversations "
            f"pinned by cookie, 2 to each worker, and 4 OpenAI clients through any worker, {TOKENS}-token answers, "
            f"{THINK:.0f} s between a client's turns, each asking again at once what broke). *Its clients*: those whose last answer came from the dead worker or whose request broke; *answered again*: "
            f"from the kill to each one's next whole answer, from the other worker (target ≤ {ANSWERED_WITHIN:.0f} s each); *lost*: answered turns the store does not hold "
            f"(target 0); *forgotten*: until the survivor stops counting the dead one (target ≤ "
            f"{FORGOTTEN_WITHIN:.0f} s); *orphans*: when the dead worker's DHT process and p2pd were gone "
            f"(target: within {ORPHANS_GONE:.0f} s).\n\n"
            + bc.table(["run", "killed", "its clients", "first answered again", "last answered again",
                        "stored turns lost", "forgotten", "orphans gone", "answers", "errors clients saw", ""], rows)
            + f"\n\nEvery client answered again: p95 {bc.fmt(bc.percentile(every, 95)) if every else '–'}, worst "
              f"{bc.fmt(max(every)) if every else '–'} (target ≤ {ANSWERED_WITHIN:.0f} s): {bc.verdict(ok)}.\n\n"
              "Run: `.venv/bin/python scripts/bench_chat_failover.py`.\n")


if __name__ == "__main__":
    bc.run_and_exit(main)
