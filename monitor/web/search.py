"""Find a server: the search box on every page and its JSON twin.

- ``GET /search?q=`` — a page of results (or, for the search box's htmx request, just the results
  list). A full peer id of a known peer goes straight to its page's "my server" report; an id
  never seen gets that report here (never seen in this swarm's DHT, and what to check).
- ``GET /api/v1/search?q=`` — the same results as JSON.

The report's JSON and its live "check now" are ``monitor.web.my_server``'s.

Queries are stripped and at most ``MAX_QUERY_CHARS`` long, answers at most ``search_max_results``
peers (``Store.search_peers``: indexed); everything a peer announced is escaped by the templates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from flask import Blueprint, abort, jsonify, redirect, request, url_for

from monitor.api_doc import MonitorError, documented
from monitor.core import server_check
from monitor.web import api_models as m
from monitor.web import deps, peer_view, queries, security, state_api
from monitor.web.render import htmx_target, render

bp = Blueprint("search", __name__)

MAX_QUERY_CHARS = 100


@dataclass(frozen=True)
class Result:
    """One peer found, with what the latest poll says of it."""

    peer_id: str
    public_name: Optional[str]
    matched: str
    state: str  # online / joining / offline / unreachable, or "gone" (not in the latest poll)
    models: tuple[str, ...]
    score: Optional[float]
    first_seen: Optional[float]
    last_seen: Optional[float]

    def to_dict(self) -> dict:
        return {**vars(self), "models": list(self.models), "url": url_for("pages.peer", peer_id=self.peer_id)}


def _query() -> str:
    query = " ".join((request.args.get("q") or "").split())
    if len(query) > MAX_QUERY_CHARS:
        abort(400, description=f"the search is {len(query)} characters long; search with at most "
                               f"{MAX_QUERY_CHARS} (a peer id, the start or end of one, or a public name)")
    return query


def find(query: str) -> tuple[list[Result], bool]:
    """The peers matching ``query`` and whether there were more than ``search_max_results``."""
    if not query:
        return [], False
    d = deps()
    cur = queries.current(d)
    limit = d.settings.search_max_results
    matches = d.store.search_peers(query, limit=limit + 1)
    rows: dict[str, list] = {}
    for row in cur.snapshot.servers if cur.snapshot else ():
        rows.setdefault(row.peer_id, []).append(row)
    results = []
    for match in matches[:limit]:
        mine = rows.get(match.peer_id, [])
        check = cur.reachability.get(match.peer_id)
        states = [state_api.row_state(row, check) for row in mine]
        score = cur.scores.get(match.peer_id)
        results.append(Result(
            peer_id=match.peer_id,
            public_name=next((row.public_name for row in mine if row.public_name), match.public_name),
            matched=match.matched, state=min(states, key=state_api.ROW_STATES.index) if states else "gone",
            models=tuple(row.model for row in mine), score=score.score if score else None,
            first_seen=match.first_seen, last_seen=match.last_seen,
        ))
    return results, len(matches) > limit


@bp.get("/search")
def page():
    query = _query()
    results, more = find(query)
    partial = htmx_target() == "search-results"
    if not partial and security.is_peer_id(query) and any(r.peer_id == query for r in results):
        return redirect(url_for("pages.peer", peer_id=query) + "#my-server", code=303)
    unknown = None
    if security.is_peer_id(query) and not any(r.peer_id == query for r in results):
        d = deps()
        cur = queries.current(d)
        unknown = server_check.check(peer_view.server_facts(d.store, cur, query, time.time()))
    context = dict(query=query, results=results, more=more, unknown=unknown, max_chars=MAX_QUERY_CHARS,
                   now=time.time())
    return render("search.html", {"search-results": "partials/search_results.html"}, **context)


@bp.get("/api/v1/search")
@documented("Peers by id, start or end of id, or public name", "Monitor", {200: m.SearchResults, 400: MonitorError},
            query=m.SearchQuery)
def search_api():
    """``{query, results: [{peer_id, public_name, matched, state, models, score, first_seen,
    last_seen, url}], more}``; 400 for a query over ``MAX_QUERY_CHARS``."""
    query = _query()
    results, more = find(query)
    return jsonify(query=query, results=[r.to_dict() for r in results], more=more)

