"""Spec: two chat workers behind nginx, as the README's production section configures them (its
nginx maps are the harness's, line for line) and ``swarm-monitor demo --chat-workers`` starts them
(``monitor.harness.chat_workers``), on one PostgreSQL store and one Redis, against the session
swarm: each a gunicorn process of ``monitor.app.chat_wsgi``.

- a browser's requests stay on the worker its cookie names; a kept session's follow-up that sends
  its handle as ``X-Petals-Session`` reaches the worker holding it and continues there; sent to the
  other worker it is answered as a fresh session, never an error;
- each worker counts the other's load (its lease) and shows itself on the store; requests that
  name a server share its bound over both workers (refused on w2 while w1 runs them);
- ``kill -9`` of one worker while Chromium's chat page streams an answer from it: the page says the
  connection was lost and offers the question again, the other worker answers it (nginx's backup
  server), the store keeps every turn; chat.petals.dev's page, whose WebSocket closed with it,
  opens a session anew and replays its conversation to the other worker; the other worker stops
  counting the dead one within 10 s (its lease, 8 s, and a beat), and the dead one's DHT process
  and p2pd end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from monitor.harness.petals_page import ChatPage, PageModel
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
COOKIE = "swarm_monitor_chat_worker"
ORPHANS_GONE = 10  # s after a worker's death: its watchdog (``monitor.swarm.reaper``) ends them at once


def readme_nginx_maps() -> str:
    """The README's nginx lines for several chat workers (upstreams and maps)."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"```nginx\n(upstream chat_w1.*?)```", text, re.S)
    assert found, "the README shows no nginx configuration for several chat workers"
    return "\n".join(line for line in found.group(1).splitlines() if not line.lstrip().startswith("#"))


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=20) as response:
        text = response.read().decode()
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def call(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def normalized(lines: str, ports: dict[str, int]) -> list[str]:
    """nginx lines with comments and runs of spaces gone and ports named (``w1``'s port → ``PORT_w1``)."""
    out = []
    for line in lines.splitlines():
        line = re.sub(r"\s+", " ", line.split("#", 1)[0]).strip()
        for tag, port in ports.items():
            line = line.replace(f"127.0.0.1:{port}", f"PORT_{tag}")
        if line.startswith(("upstream chat_w", "map ")):
            out.append(line)
    return out


def test_the_readme_s_nginx_lines_are_what_the_demo_and_these_specs_run():
    """The README's upstreams and maps for two workers are, line for line, the harness's (which
    ``swarm-monitor demo --chat-workers`` and the specs below run)."""
    from monitor.harness.chat_workers import nginx_config

    ours = nginx_config(Path("/tmp/x"), 1, 2, {"w1": 5001, "w2": 5002})
    assert normalized(readme_nginx_maps(), {"w1": 5001, "w2": 5002}) == normalized(ours, {"w1": 5001, "w2": 5002})


@pytest.fixture(scope="module")
def workers(swarm, tiny_model, postgres, redis_url, tmp_path_factory):
    """{"w1": base, "w2": base, "proxy": base, "procs": {tag: Popen}}: two gunicorn chat workers and
    nginx as the demo starts them (``monitor.harness.chat_workers``), on one PostgreSQL store, and a
    gunicorn web worker (``monitor.web.wsgi``) behind the same nginx for the rest (the pages'
    assets), as the README's production section lays them out."""
    from monitor.harness.chat_workers import ChatWorkers

    tmp = tmp_path_factory.mktemp("chat-workers")
    if not postgres.running:
        postgres.start()
    postgres_url = postgres.create_database()
    subprocess.run([str(Path(sys.executable).parent / "swarm-monitor"), "migrate", "--database-url", postgres_url],
                   check=True, capture_output=True, timeout=120)
    env = {"SWARM_MONITOR_DATA_DIR": str(tmp / "data"), "SWARM_MONITOR_DATABASE_URL": postgres_url,
           "SWARM_MONITOR_INITIAL_PEERS": ",".join(swarm.initial_peers),
           "SWARM_MONITOR_CHAT_RATE_LIMIT": "600 per minute",  # (the limits over workers: test_shared_load)
           "SWARM_MONITOR_MODELS": json.dumps([{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS,
                                                "path": str(tiny_model)}])}
    proxy_port, web_port = free_port(), free_port()
    web = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "--worker-class", "gthread", "--workers", "1",
                            "--threads", "4", "--bind", f"127.0.0.1:{web_port}", "monitor.web.wsgi:app"],
                           cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        chat = ChatWorkers(tmp, 2, env, port=proxy_port, dashboard_port=web_port, threads=8).start(timeout=240)
        try:
            def web_up() -> bool:
                try:
                    return call(f"http://127.0.0.1:{web_port}/healthz")[0] == 200
                except OSError:
                    return False

            assert wait_until(web_up, 60)
            yield {**{tag: f"http://127.0.0.1:{port}" for tag, port in chat.workers.items()},
                   "proxy": f"http://127.0.0.1:{proxy_port}", "procs": chat.procs, "tmp": tmp}
        finally:
            chat.close()
    finally:
        web.terminate()
        web.wait(30)


def ask(base: str, messages: list, *, handle: str | None = None, headers: dict | None = None) -> tuple[str, dict]:
    body = {"model": TINY_DHT_PREFIX, "messages": messages, "temperature": 0, "max_tokens": 4}
    status, got, raw = call(base + "/v1/chat/completions", body, {**(headers or {}),
                                                                  **({"X-Petals-Session": handle} if handle else {})})
    assert status == 200, raw[:500]
    return got.get("X-Chat-Worker"), json.loads(raw)


def test_a_browser_stays_on_its_worker_and_a_follow_up_reaches_the_worker_that_keeps_its_session(workers):
    proxy = workers["proxy"]
    status, headers, _ = call(proxy + "/v1/models")
    assert status == 200 and headers.get("X-Chat-Worker") in ("w1", "w2")
    for tag in ("w1", "w2"):  # a browser whose cookie names a worker: every request there
        seen = {ask(proxy, [{"role": "user", "content": "Hi"}], headers={"Cookie": f"{COOKIE}={tag}"})[0]
                for _ in range(3)}
        assert seen == {tag}
    messages = [{"role": "user", "content": "Tell me about the number 7."}]
    first_worker, reply = ask(proxy, messages)
    handle = reply["petals"]["session"]
    assert handle.startswith(first_worker + ".")  # the handle names its worker
    messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And the number 8?"}]
    worker, follow = ask(proxy, messages, handle=handle)  # through the proxy, by its header
    assert worker == first_worker and follow["petals"]["continued"] is True
    other = "w2" if first_worker == "w1" else "w1"  # the next follow-up sent straight to the other worker
    messages += [{"role": "assistant", "content": follow["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And 9?"}]
    worker, elsewhere = ask(workers[other], messages, handle=follow["petals"]["session"])
    assert worker == other and elsewhere["petals"]["continued"] is False  # a fresh session, not an error


def test_what_one_worker_runs_through_a_server_counts_on_the_other(workers, swarm):
    """The load ledger between the two processes (through Redis): requests that name their server
    (``petals.only``) share its bound — ``chat_slots`` × ``max_slots_share``, 2 here — over both
    workers. With two running through w1, one more through w2 is refused (429, Retry-After) though
    w2 runs none itself; once they end, w2 answers it."""
    import threading

    full = swarm.peer_id("full")

    def directed(tokens: int, stream: bool = False) -> dict:
        return {"model": TINY_DHT_PREFIX, "messages": [{"role": "user", "content": "Count to a hundred."}],
                "temperature": 0, "max_tokens": tokens, "stream": stream, "petals": {"only": [full]}}

    swarm.throttle("full", duty=0.8, period=0.2)  # its answers last a while
    try:
        held = [threading.Thread(target=call, args=(workers["w1"] + "/v1/chat/completions", directed(120, True)))
                for _ in range(2)]
        for thread in held:
            thread.start()
        tried = []

        def refused() -> bool:
            tried.append(call(workers["w2"] + "/v1/chat/completions", directed(1)))
            return tried[-1][0] == 429 and b"share of requests that name their servers" in tried[-1][2]

        assert wait_until(refused, 20, step=1.0), [(r[0], r[2][:200]) for r in tried]
        assert "Retry-After" in tried[-1][1]
        for thread in held:
            thread.join(120)
        assert wait_until(lambda: call(workers["w2"] + "/v1/chat/completions", directed(1))[0] == 200, 15, step=0.5)
    finally:
        swarm.unthrottle("full")


def test_a_worker_killed_mid_answer_loses_no_stored_turn_and_the_other_answers_the_question_again(workers, browser):
    """A browser on w2 (its cookie) has one turn stored and the next being written when w2 is
    killed: the page says the connection was lost and offers the question again, which w1 answers
    (nginx's backup server); the store has both turns. w1 stops counting w2 within its lease."""
    from playwright.sync_api import expect

    for tag in ("w1", "w2"):
        assert wait_until(lambda tag=tag: metric(workers[tag], "swarm_monitor_chat_shared_workers") == 1, 15)
    proxy = workers["proxy"]
    context = browser.new_context()
    context.add_cookies([{"name": COOKIE, "value": "w2", "url": proxy}])
    page = context.new_page()
    page.goto(proxy + "/chat")
    page.locator("summary", has_text="System prompt").click()
    page.fill('input[name="max_new_tokens"]', "4")
    page.fill("#message", "Where do the blocks live?")
    page.locator("#message").press("Enter")
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(1, timeout=60_000)
    expect(page).to_have_url(re.compile(r"\?c="))  # stored (by w2)
    page.fill('input[name="max_new_tokens"]', "400")  # (the context: 512)
    page.fill("#message", "And who serves them?")
    page.locator("#message").press("Enter")
    expect(page.locator(".chat-assistant .chat-text").nth(1)).to_have_text(re.compile(r"\S"), timeout=60_000)
    # chat.petals.dev's page on a WebSocket to w2 (its cookie), one answer in; "e" ends the tiny model's answers soon
    petals_page = ChatPage(proxy.replace("http://", "ws://") + "/api/v2/generate", "127.0.0.1", TINY_DHT_PREFIX,
                           PageModel(stop_token="e"))
    petals_page.headers["Cookie"] = f"{COOKIE}=w2"
    assert petals_page.ask("Hello there.", timeout=60) is None and petals_page.opens == 1
    victim = workers["procs"]["w2"]
    master = psutil.Process(victim.pid)
    worker = master.children()[0]
    helpers = worker.children(recursive=True)  # its DHT's process and p2pd
    assert any(h.name() == "p2pd" for h in helpers)
    for process in (master, worker):  # mid-answer, by PID (not the group): its helpers are orphaned
        process.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed = time.monotonic()
    assert wait_until(lambda: metric(workers["w1"], "swarm_monitor_chat_shared_workers") == 0, 15, step=0.25)
    assert time.monotonic() - killed <= 10.5  # its lease (8 s) and a beat, within 10 s
    expect(page.locator(".chat-assistant .chat-failed")).to_contain_text("connection to the chat was lost")
    assert page.locator(".chat-assistant .chat-stats").count() == 1  # the turn in flight: no answer shown
    page.fill('input[name="max_new_tokens"]', "4")
    page.locator("button.chat-ask-again").click()  # the question again, to w1
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(2, timeout=60_000)
    expect(page.locator(".chat-user .chat-text")).to_have_text(["Where do the blocks live?", "And who serves them?"])
    expect(page.locator(".chat-failed")).to_have_count(0)  # the failed turn replaced
    page.reload()  # from the store, through w1: both turns, the first stored by w2
    expect(page.locator(".chat-user .chat-text")).to_have_text(["Where do the blocks live?", "And who serves them?"])
    expect(page.locator(".chat-assistant")).to_have_count(2)
    context.close()
    # the page's socket closed with w2: its next turn opens a session anew and replays, on w1
    assert petals_page.ask("And then?", timeout=60) is None and petals_page.opens == 2
    assert petals_page.streamed and not petals_page.shown  # replies came, and no error was shown
    petals_page.close()
    tag, _ = ask(workers["proxy"], [{"role": "user", "content": "Still there?"}], headers={"Cookie": f"{COOKIE}=w2"})
    assert tag == "w1"  # a client of the dead worker: answered by the other
    # its orphaned helpers do not outlive it: its watchdog (``monitor.swarm.reaper``) ends its DHT's
    # process and p2pd once the worker's pipe closes, and then itself
    assert wait_until(lambda: not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers),
                      max(1.0, killed + ORPHANS_GONE - time.monotonic()), step=0.5), \
        [(h.pid, h.name()) for h in helpers if h.is_running()]
