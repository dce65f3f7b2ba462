"""A private Redis server for the specs and benchmarks (Debian's ``redis-server``, installed by
scripts/system-deps): on 127.0.0.1 and a free port, nothing saved to disk, stopped by its PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from monitor.harness.ports import free_port


class RedisUnavailable(RuntimeError):
    pass


class RedisServer:
    def __init__(self, workdir: Path):
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RedisUnavailable("redis-server is not installed (scripts/system-deps installs it)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._log = open(workdir / "redis.log", "w")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--protected-mode", "yes"], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self._pong():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RedisUnavailable(f"redis-server did not answer: {(workdir / 'redis.log').read_text()[-500:]}")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
