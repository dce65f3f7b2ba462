"""Spec: two chat workers behind nginx, as the README's production section configures them (its
nginx maps are the harness's, line for line) and ``swarm-monitor demo --chat-workers`` starts them
(``monitor.harness.chat_workers``), on one PostgreSQL store and one Redis, against the session
swarm: each a gunicorn process of ``monitor.app.chat_wsgi``.

- a browser's requests stay on the worker its cookie names; a kept session's follow-up that sends
  its handle as ``X-Petals-Session`` reaches the worker holding it and continues there; sent to the
  other worker it is answered as a fresh session, never an error;
- each worker counts the other's load (its lease) and shows itself on the store;
- ``kill -9`` of one worker: the other stops counting it within 10 s (its lease, 8 s, and a beat), and a browser
  whose cookie names the dead one is answered by the other (nginx's backup server).
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

import pytest

from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
COOKIE = "swarm_monitor_chat_worker"


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
    nginx as the demo starts them (``monitor.harness.chat_workers``), on one PostgreSQL store."""
    from monitor.harness.chat_workers import ChatWorkers

    tmp = tmp_path_factory.mktemp("chat-workers")
    if not postgres.running:
        postgres.start()
    postgres_url = postgres.create_database()
    subprocess.run([str(Path(sys.executable).parent / "swarm-monitor"), "migrate", "--database-url", postgres_url],
                   check=True, capture_output=True, timeout=120)
    env = {"SWARM_MONITOR_DATA_DIR": str(tmp / "data"), "SWARM_MONITOR_DATABASE_URL": postgres_url,
           "SWARM_MONITOR_INITIAL_PEERS": ",".join(swarm.initial_peers),
           "SWARM_MONITOR_MODELS": json.dumps([{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS,
                                                "path": str(tiny_model)}])}
    proxy_port = free_port()
    chat = ChatWorkers(tmp, 2, env, port=proxy_port, dashboard_port=free_port(), threads=8).start(timeout=240)
    try:
        yield {**{tag: f"http://127.0.0.1:{port}" for tag, port in chat.workers.items()},
               "proxy": f"http://127.0.0.1:{proxy_port}", "procs": chat.procs, "tmp": tmp}
    finally:
        chat.close()


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


def test_each_worker_counts_the_other_and_a_killed_one_is_forgotten_within_its_lease(workers):
    for tag in ("w1", "w2"):
        assert wait_until(lambda tag=tag: metric(workers[tag], "swarm_monitor_chat_shared_workers") == 1, 15)
    victim = workers["procs"]["w2"]
    os.killpg(victim.pid, signal.SIGKILL)  # gunicorn's master and its worker, at once
    victim.wait(10)
    killed = time.monotonic()
    assert wait_until(lambda: metric(workers["w1"], "swarm_monitor_chat_shared_workers") == 0, 15, step=0.25)
    assert time.monotonic() - killed <= 10.5  # its lease (8 s) and a beat, within 10 s
    worker, _ = ask(workers["proxy"], [{"role": "user", "content": "Still there?"}], headers={"Cookie": f"{COOKIE}=w2"})
    assert worker == "w1"  # a browser of the dead worker: answered by the other
