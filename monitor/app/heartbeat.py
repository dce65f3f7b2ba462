"""The dead man's switch: the leading poller requests ``heartbeat_url`` after each successful poll.

A monitor cannot announce its own death: the ``monitor_stale`` rule is evaluated by the poller
that stopped. A healthchecks-style service (healthchecks.io, Uptime Kuma's push monitors, Cronitor,
or any URL that pages when requests stop arriving) closes that gap: it expects a ping every scrape
period and pages when they stop — when every poller is gone, when none can poll, when none can
reach the database. Only the leader pings, so one ping per poll reaches it whatever the number of
standbys. A GET, the method every such service takes; a ping that fails is logged and counted
(job ``heartbeat``), never retried (the next poll pings again).
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from typing import Callable, Optional

from monitor.core.common import short_error

log = logging.getLogger(__name__)

TIMEOUT = 10.0
USER_AGENT = "petals-swarm-monitor heartbeat"


def ping(url: str, timeout: float = TIMEOUT) -> Optional[str]:
    """Request ``url`` once; None if it answered 2xx or 3xx, else what went wrong (no URL: it may
    carry a secret token)."""
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the operator's URL
            response.read(1024)
            return None if response.status < 400 else f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except Exception as e:  # noqa: BLE001 - DNS, refused, timeout, TLS: said, never raised
        return short_error(getattr(e, "reason", None) or e)


class Heartbeat:
    """Pings in the background, one at a time (a ping still under way makes the next one wait for
    the next poll rather than pile up)."""

    def __init__(self, url: str, *, may_ping: Callable[[], bool], counted: Optional[Callable] = None,
                 timeout: float = TIMEOUT):
        """``may_ping()``: asked right before each request (only the leader pings);
        ``counted(error_or_None)``: each ping's outcome."""
        self.url = url
        self.may_ping = may_ping
        self.counted = counted
        self.timeout = timeout
        self.sent = 0
        self.failed = 0
        self._busy = threading.Lock()

    def beat(self) -> None:
        if not self._busy.acquire(blocking=False):
            return
        threading.Thread(target=self._send, name="heartbeat", daemon=True).start()

    def _send(self) -> None:
        try:
            if not self.may_ping():
                return
            error = ping(self.url, self.timeout)
            self.sent += 1
            if error is not None:
                self.failed += 1
                log.warning("the heartbeat URL did not take the ping: %s", error)
            if self.counted is not None:
                self.counted(error)
        finally:
            self._busy.release()
