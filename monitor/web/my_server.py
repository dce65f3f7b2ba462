""""Is my server OK?" beyond the peer page: the report as JSON and its live "check now".

- ``GET /api/v1/peers/<peer_id>/report`` — the report (``monitor.core.server_check``, built by
  ``peer_view.report``) as JSON, for any peer id, seen or not;
- ``GET /peers/<peer_id>/reachability`` — the report's "Check reachability now": a live check
  through ``api.reachability`` (the same check, minute cache and per-client budget as
  ``/api/v1/is_reachable``: ``limits.REACHABILITY_VIEWS``), answered as a partial for htmx.

The report itself is rendered inside the peer page (``pages.peer``) and, for an id never seen,
on the search page (``search``).
"""

from __future__ import annotations

import time

from flask import Blueprint, jsonify, make_response, render_template
from flask_limiter import RateLimitExceeded

from monitor.api_doc import MonitorError, documented
from monitor.web import api, deps, peer_view, queries, security
from monitor.web import api_models as m

bp = Blueprint("my_server", __name__)


@bp.get("/api/v1/peers/<peer_id>/report")
@documented('"Is this server OK?"', "Monitor", {200: m.Report, 400: MonitorError})
def report_api(peer_id: str):
    """"Is this server OK?" as JSON: ``{peer_id, status, headline, checks: [{name, status, text,
    advice}], recommendations: [{model, argument, reason}]}`` (for any peer id, seen or not)."""
    security.require_peer_id(peer_id)
    d = deps()
    cur = queries.current(d)
    return jsonify(peer_view.report(d, cur, peer_id, time.time()).to_dict())


@bp.get("/peers/<peer_id>/reachability")
def live_check(peer_id: str):
    """The "check now" of the "my server" report: a live check (peers of the latest poll only)."""
    security.require_peer_id(peer_id)
    return render_template("partials/reachability.html", answer=api.reachability(peer_id), too_often=False,
                           peer_id=peer_id)


@bp.errorhandler(RateLimitExceeded)
def _too_often(error: RateLimitExceeded):
    """Over the budget, the report's htmx request (which swaps only successful answers) still gets
    its answer in words, with ``Retry-After``; ``/api/v1/is_reachable`` answers 429 as usual."""
    response = make_response(render_template("partials/reachability.html", answer=None, too_often=True), 200)
    for name, value in error.get_headers():
        if name.lower() == "retry-after":
            response.headers[name] = value
    response.headers.setdefault("Retry-After", "60")
    return response
