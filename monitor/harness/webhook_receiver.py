"""A webhook receiver on 127.0.0.1: what the alert tests and the detection benchmark point the
monitor's webhooks at, so notices are received for real (HTTP, JSON) without leaving loopback.

It records every request (arrival time, path, headers, parsed JSON body; a GET, as a heartbeat's
ping, with none) and answers with the next status of ``plan`` (then 200): a plan of
``[503, 503]`` makes the first two attempts fail.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

MAX_BODY = 1_000_000


@dataclass
class Received:
    at: float  # time.time() on arrival
    path: str
    headers: dict[str, str]
    body: Any  # the JSON payload (None if it was not JSON)
    status: int  # what the receiver answered


@dataclass
class WebhookReceiver:
    """``with WebhookReceiver() as hook: ... hook.url ... hook.received``"""

    plan: list[int] = field(default_factory=list)  # statuses to answer, in order; then 200
    delay: float = 0.0  # seconds to wait before answering (a slow receiver)
    redirect_to: Optional[str] = None  # answer 302 to this Location instead
    received: list[Received] = field(default_factory=list)
    _server: Optional[ThreadingHTTPServer] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._arrived = threading.Condition(self._lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/hook"

    def start(self) -> "WebhookReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                if receiver.delay:
                    time.sleep(receiver.delay)
                status = receiver._next_status()
                with receiver._lock:
                    receiver.received.append(Received(time.time(), self.path, dict(self.headers), body, status))
                    receiver._arrived.notify_all()
                try:
                    self.send_response(status)
                    if status in (301, 302, 307, 308) and receiver.redirect_to:
                        self.send_header("Location", receiver.redirect_to)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"ok" if status < 300 else b"receiver says no")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender gave up waiting (a slow receiver's test)

            def do_GET(self):  # noqa: N802 - a heartbeat's ping (healthchecks-style): no body
                status = receiver._next_status()
                with receiver._lock:
                    receiver.received.append(Received(time.time(), self.path, dict(self.headers), None, status))
                    receiver._arrived.notify_all()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True).start()
        return self

    def _next_status(self) -> int:
        with self._lock:
            if self.redirect_to:
                return 302
            return self.plan.pop(0) if self.plan else 200

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- reading ---------------------------------------------------------------------------
    def accepted(self) -> list[Any]:
        """Bodies of the requests answered 2xx, in arrival order."""
        with self._lock:
            return [r.body for r in self.received if 200 <= r.status < 300]

    def wait_for(self, count: int, timeout: float) -> list[Any]:
        """Wait until ``count`` requests were accepted (or the timeout); returns the accepted bodies."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(1 for r in self.received if 200 <= r.status < 300) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(left)
        return self.accepted()
