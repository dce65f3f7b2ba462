"""Contributors: what every server gave the swarm, from the contribution ledger (``core/contributions.py``,
``store/contributions.py``) — measured, not announced. Read from the stored ledger, once per store
change (the app's cache)::

    /contributors                               the leaderboard page (per model or all; a window; sortable)
    GET /api/v1/contributors?window=&model=&sort=&limit=
    GET /api/v1/contributors/<peer_id>          one server: every window, over all models and per model

A server's announced public name is shown as what it is: a claim anyone can make.
"""

from __future__ import annotations

import time
from typing import Optional

from flask import Blueprint, abort, jsonify, render_template, request
from pydantic import BaseModel, Field

from monitor.api_doc import MonitorError, Open, documented
from monitor.core.common import HOUR
from monitor.core.contributions import SORTS, WINDOW_NAMES, WINDOWS, ranked, window_start
from monitor.store import owners
from monitor.web import deps, queries, security

bp = Blueprint("contributors", __name__)

MAX_LIMIT = 500


class ContributorsQuery(BaseModel):
    window: str = Field("week", description="day | week | month | all", json_schema_extra={"enum": list(WINDOW_NAMES)})
    model: Optional[str] = Field(None, description="a model's DHT prefix (all models when absent)")
    sort: str = Field("verified", json_schema_extra={"enum": list(SORTS)})
    limit: int = Field(100, ge=1, le=MAX_LIMIT)


class Contributor(Open):
    peer_id: str
    model: Optional[str]
    name: Optional[str] = Field(description="its announced public name: a claim anyone can make")
    announced_block_hours: float
    serving_block_hours: float
    verified_block_hours: float
    block_tokens: int
    requests: int
    uptime: Optional[float]
    seconds_per_token_per_block: Optional[float]
    watched_hours: float


class Contributors(Open):
    window: str
    model: Optional[str]
    sort: str
    since: Optional[float]
    contributors: list[Contributor]


class PeerContribution(Open):
    peer_id: str
    owner_proven_at: Optional[float] = Field(None, description="when someone last proved they run it (its key)")
    windows: dict[str, dict]




def _query() -> ContributorsQuery:
    """The leaderboard's query, or a 400 naming the parameter (JSON on the API, a page for people)."""
    args = request.args
    window, sort = args.get("window", "week"), args.get("sort", "verified")
    if window not in WINDOW_NAMES:
        abort(400, description=f"window must be one of {', '.join(WINDOW_NAMES)}, got {window[:40]!r}")
    if sort not in SORTS:
        abort(400, description=f"sort must be one of {', '.join(SORTS)}, got {sort[:40]!r}")
    model = args.get("model") or None
    if model is not None and not security.is_dht_prefix(model):
        abort(400, description=f"model: {security.not_dht_prefix(model)}")
    limit = args.get("limit", "100")
    if not (limit.isdigit() and 1 <= int(limit) <= MAX_LIMIT):
        abort(400, description=f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit[:40]!r}")
    return ContributorsQuery(window=window, model=model, sort=sort, limit=int(limit))


def board(d, cur, q: ContributorsQuery, now: float) -> dict:
    """The leaderboard as the API and the page show it."""
    first, days = window_start(q.window, now)

    def compute():
        rows = d.store.contributions(first, model=q.model, days=days)
        return [c.to_dict() for c in ranked(rows, q.sort)[:q.limit]]

    found = d.cache.page(cur.marks, ("contributors", q.window, q.model, q.sort, q.limit, int(now // HOUR)), compute)
    return {"window": q.window, "model": q.model, "sort": q.sort, "since": first, "contributors": found}


STATE_TOP = 20  # servers in the state API's ``measured_contributors``


def measured_top(d, cur, now: float) -> list[dict]:
    """The state API's field beside health.petals.dev's ``top_contributors`` (names anyone can
    claim, blocks announced now): the week's most verified servers, by peer id, measured."""
    q = ContributorsQuery(window="week", sort="verified", limit=STATE_TOP)
    return [{"peer_id": c["peer_id"], "name": c["name"], "verified_block_hours": c["verified_block_hours"],
             "serving_block_hours": c["serving_block_hours"]} for c in board(d, cur, q, now)["contributors"]]


def of_peer(d, cur, peer_id: str, now: float) -> dict:
    """One server's ledger: each window, over all models and per model."""
    def compute():
        out = {}
        for name, _ in WINDOWS:
            first, days = window_start(name, now)
            total = d.store.contributions(first, peer_id=peer_id, days=days)
            out[name] = {"total": total[0].to_dict() if total else None,
                         "models": [c.to_dict() for c in d.store.contributions(first, peer_id=peer_id, by_model=True,
                                                                               days=days)]}
        return out

    with d.store.db.read("reading who proved they run a server") as conn:  # (one indexed row: read fresh)
        proven = owners.proven(conn, peer_id)
    return {"peer_id": peer_id, "owner_proven_at": proven,
            "windows": d.cache.page(cur.marks, ("contributor", peer_id, int(now // HOUR)), compute)}


@bp.get("/api/v1/contributors")
@documented("What every server gave the swarm: the contribution ledger (measured, not announced)", "Monitor",
            {200: Contributors, 400: MonitorError}, query=ContributorsQuery)
def api_contributors():
    q = _query()
    d = deps()
    return jsonify(board(d, queries.current(d), q, time.time()))


@bp.get("/api/v1/contributors/<peer_id>")
@documented("What one server gave the swarm, every window, over all models and per model", "Monitor",
            {200: PeerContribution, 400: MonitorError})
def api_contributor(peer_id: str):
    if not security.is_peer_id(peer_id):
        return jsonify(error=security.not_peer_id(peer_id), status=400), 400
    d = deps()
    return jsonify(of_peer(d, queries.current(d), peer_id, time.time()))


@bp.get("/contributors")
def page():
    q = _query()
    d = deps()
    cur = queries.current(d)
    models = sorted(m.dht_prefix for m in (cur.snapshot.models if cur.snapshot else ()))
    return render_template("contributors.html", board=board(d, cur, q, time.time()), models=models,
                           windows=WINDOW_NAMES, sorts=SORTS)
