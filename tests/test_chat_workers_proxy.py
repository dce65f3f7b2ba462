"""Spec: two chat workers behind nginx, as the README's production section configures them (its
nginx maps, read from the README itself), on one PostgreSQL store and one Redis, against the
session swarm: each a gunicorn process of ``monitor.app.chat_wsgi``.

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
GUNICORN = Path(sys.executable).parent / "gunicorn"
NGINX = Path("/usr/sbin/nginx")
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


@pytest.fixture(scope="module")
def workers(swarm, tiny_model, postgres, redis_url, tmp_path_factory):
    """{"w1": base, "w2": base, "proxy": base, "procs": {tag: Popen}} — two gunicorn chat workers and nginx."""
    tmp = tmp_path_factory.mktemp("chat-workers")
    if not postgres.running:
        postgres.start()
    postgres_url = postgres.create_database()
    subprocess.run([str(Path(sys.executable).parent / "swarm-monitor"), "migrate", "--database-url", postgres_url],
                   check=True, capture_output=True, timeout=120)
    ports = {"w1": free_port(), "w2": free_port()}
    procs, logs = {}, {}
    for tag, port in ports.items():
        env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(tmp / tag), SWARM_MONITOR_DATABASE_URL=postgres_url,
                   SWARM_MONITOR_INITIAL_PEERS=",".join(swarm.initial_peers),
                   SWARM_MONITOR_MODELS=json.dumps([{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS,
                                                     "path": str(tiny_model)}]),
                   SWARM_MONITOR_CHAT_SHARED=redis_url, SWARM_MONITOR_CHAT_WORKER=tag,
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("SWARM_MONITOR_CONFIG", None)
        logs[tag] = open(tmp / f"{tag}.log", "wb")
        procs[tag] = subprocess.Popen(
            [str(GUNICORN), "--worker-class", "gthread", "--workers", "1", "--threads", "8", "--timeout", "120",
             "--graceful-timeout", "10", "--bind", f"127.0.0.1:{port}", "monitor.app.chat_wsgi:app"],
            cwd=ROOT, env=env, stdout=logs[tag], stderr=subprocess.STDOUT, start_new_session=True)
    proxy_port = free_port()
    maps = readme_nginx_maps().replace("127.0.0.1:5001", f"127.0.0.1:{ports['w1']}").replace(
        "127.0.0.1:5002", f"127.0.0.1:{ports['w2']}")
    (tmp / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 128; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
{maps}
  server {{
    listen 127.0.0.1:{proxy_port};
    location / {{
      proxy_pass http://$chat_upstream;
      proxy_set_header Host $host;  # (as the README's server block sets it)
      proxy_next_upstream error timeout http_503 non_idempotent;
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")
    nginx = subprocess.Popen([str(NGINX), "-c", str(tmp / "nginx.conf"), "-p", str(tmp)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    bases = {tag: f"http://127.0.0.1:{port}" for tag, port in ports.items()}
    try:
        for tag, base in bases.items():
            def serving(base=base, tag=tag) -> bool:
                assert procs[tag].poll() is None, (tmp / f"{tag}.log").read_text()[-3000:]
                try:
                    with urllib.request.urlopen(base + "/v1/models", timeout=20) as response:
                        return response.status == 200
                except OSError:
                    return False
            assert wait_until(serving, 240, step=1), (tmp / f"{tag}.log").read_text()[-3000:]
        yield {**bases, "proxy": f"http://127.0.0.1:{proxy_port}", "procs": procs, "tmp": tmp}
    finally:
        nginx.terminate()
        nginx.wait(20)
        for tag, proc in procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            logs[tag].close()


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
