"""``/healthz``: the web worker's own health, for load balancers and uptime checks.

200 while the database answers, with whether the poller keeps it fresh (``poller_stale``); 503
with the reason while it does not (the app's handler for an unavailable store). It reads one row
(the latest poll), so a balancer may ask as often as it likes.
"""

from __future__ import annotations

import time

from flask import Blueprint, jsonify

from monitor.api_doc import MonitorError, documented
from monitor.core.common import is_stale
from monitor.web import api_models as m
from monitor.web import deps

bp = Blueprint("health", __name__)


@bp.get("/healthz")
@documented("The web worker's own health, for load balancers", "Monitor", {200: m.Health, 503: MonitorError})
def healthz():
    d = deps()
    last = d.store.last_poll()  # StoreError -> 503 JSON (app error handler)
    stale = is_stale(last.at if last else None, time.time(), d.settings.scrape_period)
    return jsonify(ok=True, database="reachable", last_poll=last.at if last else None,
                   last_poll_ok=last.ok if last else None, poller_stale=stale)
