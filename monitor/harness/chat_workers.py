"""Several chat workers behind nginx on 127.0.0.1, as the README's production section lays them out
(``swarm-monitor demo --chat-workers N``): a private Redis (``chat_shared``), N gunicorn processes of
``monitor.app.chat_wsgi`` tagged ``w1`` … ``wN``, and nginx in front of them and of the dashboard —
a browser's requests stay on the worker its cookie names, a follow-up that sends its session's
handle reaches the worker that keeps it, a worker gone or draining hands over to the others.

Every process is ours, stopped by its PID (gunicorn drains on SIGTERM); nothing listens beyond
127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from monitor.harness.ports import free_port
from monitor.harness.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent.parent


class ChatWorkersError(RuntimeError):
    pass


def nginx_binary() -> Optional[str]:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    return found


def nginx_config(workdir: Path, port: int, dashboard_port: int, workers: dict[str, int]) -> str:
    """nginx in front: the chat's routes to the worker a request's handle or cookie names (its
    backup: the others), a new visitor to any worker, everything else to the dashboard."""
    def upstream(tag: str) -> str:
        others = " ".join(f"server 127.0.0.1:{p} backup max_fails=0;" for t, p in workers.items() if t != tag)
        return f"  upstream chat_{tag} {{ server 127.0.0.1:{workers[tag]} max_fails=0; {others} }}"

    tags = list(workers)
    by_handle = " ".join(f"~^{t}\\. chat_{t};" for t in tags)
    by_cookie = " ".join(f"{t} chat_{t};" for t in tags)
    chat = """      proxy_pass http://$chat_upstream;
      proxy_next_upstream error timeout http_503 non_idempotent;
      proxy_connect_timeout 2s;
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"""
    return f"""worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 512; }}
http {{
  access_log off;
  client_max_body_size 1m;
  client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy; fastcgi_temp_path {workdir}/fcgi;
  uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
{chr(10).join(upstream(t) for t in tags)}
  upstream monitor_chat {{ {" ".join(f"server 127.0.0.1:{p} max_fails=0;" for p in workers.values())} }}
  upstream monitor_web {{ server 127.0.0.1:{dashboard_port}; }}
  map $http_x_petals_session $chat_by_handle {{ {by_handle} default ""; }}
  map $cookie_swarm_monitor_chat_worker $chat_by_cookie {{ {by_cookie} default monitor_chat; }}
  map $chat_by_handle $chat_upstream {{ "" $chat_by_cookie; default $chat_by_handle; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://monitor_web;
      proxy_set_header Host $host;
      proxy_buffering off;
    }}
    location ~ ^/(chat|v1/|api/v1/generate$) {{
{chat}
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
    location = /api/v2/generate {{
{chat}
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout 3600s;
    }}
  }}
}}
"""


class ChatWorkers:
    """``count`` chat workers and nginx (``start``/``close``); ``env``: the settings every worker
    reads (database, data directory, initial peers, models), as ``SWARM_MONITOR_*`` variables."""

    def __init__(self, workdir: Path, count: int, env: dict[str, str], *, port: int, dashboard_port: int,
                 threads: int = 16):
        if count < 2:
            raise ChatWorkersError("several chat workers means two or more")
        self.nginx = nginx_binary()
        if self.nginx is None:
            raise ChatWorkersError("--chat-workers puts nginx in front of them: install it (scripts/system-deps "
                                   "does, or `apt-get install nginx`)")
        self.workdir, self.count, self.env, self.port, self.dashboard_port = workdir, count, env, port, dashboard_port
        self.threads = threads
        self.redis: Optional[RedisServer] = None
        self.workers: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        self._nginx: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 300) -> "ChatWorkers":
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis = RedisServer(self.workdir)
            for i in range(1, self.count + 1):
                self.workers[f"w{i}"] = free_port()
                self._spawn(f"w{i}")
            (self.workdir / "nginx.conf").write_text(nginx_config(self.workdir, self.port, self.dashboard_port,
                                                                  self.workers))
            self._nginx = subprocess.Popen([self.nginx, "-c", str(self.workdir / "nginx.conf"), "-p", str(self.workdir)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + timeout
            for tag in self.workers:
                self._wait_answering(tag, deadline)
            if self._nginx.poll() is not None:
                raise ChatWorkersError(f"nginx exited: {(self.workdir / 'nginx-error.log').read_text()[-1000:]}")
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, tag: str) -> None:
        """Worker ``tag``'s gunicorn, on its port, logging to ``chat-<tag>.log`` (appended)."""
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        env = {**os.environ, **self.env, "SWARM_MONITOR_CHAT_SHARED": self.redis.url, "SWARM_MONITOR_CHAT_WORKER": tag,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("SWARM_MONITOR_CONFIG", None)
        log = open(self.workdir / f"chat-{tag}.log", "ab")
        self._logs.append(log)
        self.procs[tag] = subprocess.Popen(
            [gunicorn, "--worker-class", "gthread", "--workers", "1", "--threads", str(self.threads),
             "--timeout", "120", "--graceful-timeout", "30", "--bind", f"127.0.0.1:{self.workers[tag]}",
             "monitor.app.chat_wsgi:app"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def _wait_answering(self, tag: str, deadline: float) -> None:
        while not self._answers(f"http://127.0.0.1:{self.workers[tag]}/v1/models"):
            if self.procs[tag].poll() is not None:
                raise ChatWorkersError(f"chat worker {tag} exited: {self.log_tail(tag)}")
            if time.monotonic() > deadline:
                raise ChatWorkersError(f"chat worker {tag} did not answer in time: {self.log_tail(tag)}")
            time.sleep(0.5)

    def restart(self, tag: str, timeout: float = 300) -> None:
        """Start worker ``tag`` again (after it died or was stopped) on its port, and wait until it answers."""
        if self.procs[tag].poll() is None:
            raise ChatWorkersError(f"chat worker {tag} is still running")
        self._spawn(tag)
        self._wait_answering(tag, time.monotonic() + timeout)

    def log_tail(self, tag: str) -> str:
        try:
            return (self.workdir / f"chat-{tag}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status == 200
        except OSError:
            return False

    def close(self) -> None:
        """nginx first, then each worker drains (SIGTERM) and stops, then Redis; a worker that does
        not stop within its graceful timeout is killed with its process group."""
        if self._nginx is not None and self._nginx.poll() is None:
            self._nginx.terminate()
            try:
                self._nginx.wait(20)
            except subprocess.TimeoutExpired:
                self._nginx.kill()
                self._nginx.wait(10)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for log in self._logs:
            log.close()
        if self.redis is not None:
            self.redis.close()
            self.redis = None


def worker_env(settings, models: Sequence) -> dict[str, str]:
    """The settings a chat worker needs, as its environment: the same data directory (operator
    token, SQLite store) and database, initial peers and models as the dashboard's."""
    return {"SWARM_MONITOR_DATA_DIR": str(settings.data_dir),
            "SWARM_MONITOR_DATABASE_URL": settings.resolved_database_url,
            "SWARM_MONITOR_PROXY_HOPS": "1",  # (behind our nginx: each browser its own client)
            "SWARM_MONITOR_INITIAL_PEERS": ",".join(settings.initial_peers),
            "SWARM_MONITOR_MODELS": json.dumps([{"dht_prefix": m.dht_prefix, "num_blocks": m.num_blocks,
                                                 "path": str(m.path), **({"name": m.name} if m.name else {})}
                                                for m in models])}
