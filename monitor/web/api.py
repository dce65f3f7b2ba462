"""JSON API: health.petals.dev's ``/api/v1/state`` and ``/api/v1/is_reachable``, plus history
(within retention and at most ``history_max_points`` points a series: ``monitor.web.history``)
and the routing view other petals clients route by (``/api/v1/routing/<prefix>``:
``monitor.core.routing_view``, read by ``swarm_monitor_client``).

Errors are JSON ``{"error": message, "status": code}`` with a 4xx/5xx status; the message names the
bad value and what to send instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Optional

from flask import Blueprint, Response, abort, current_app, jsonify, request

from monitor.api_doc import MonitorError, documented
from monitor.core.routing_view import CHAT_OUTCOME_WINDOW, peer_routing, routing_view
from monitor.core.snapshot import ReachabilityResult
from monitor.web import api_models as m
from monitor.web import contributors, deps, history, peer_view, queries, request_stats, security, state_api, timerange

log = logging.getLogger(__name__)

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def _current():
    d = deps()
    return d, queries.current(d)


def _no_poll_yet(cur: Optional[queries.Current] = None):
    last = cur.last_poll if cur is not None else None
    if last is not None and not last.ok:  # e.g. "cannot reach any bootstrap peer (…), retrying"
        why = f"no poll has completed yet; the last one failed: {'; '.join(last.errors) or 'unknown error'}"
    else:
        why = "no poll has completed yet; the poller (swarm-monitor poll) writes the first one within one scrape period"
    return jsonify(error=why, status=503), 503


def _range() -> timerange.TimeRange:
    return timerange.time_range(request.args, time.time())  # a BadRange answers 400 (create_app)


@bp.get("/state")
@documented("The swarm now, in health.petals.dev's shape", "Monitor", {200: m.State, 503: MonitorError})
def state():
    d, cur = _current()
    if cur.snapshot is None:
        return _no_poll_yet(cur)
    now = time.time()
    return jsonify({**queries.state_dict(cur, d.settings), "poller": queries.pollers(d, cur, now),
                    "measured_contributors": contributors.measured_top(d, cur, now)})


@bp.get("/models/<prefix>/stats")
@documented("Statistics of the requests the chat served for a model", "Monitor", {200: m.RequestStats, 404: MonitorError})
def model_request_stats(prefix: str):
    """Statistics from the requests the chat served for one model (``web.request_stats``): success
    over 5 min / 30 min / 1 day; time to first token, tokens/s and slot wait at p50 / p90 / p99 over
    30 min and 1 day; the same per server its requests went through."""
    d, cur = _current()
    if cur.snapshot is not None and cur.model(prefix) is None and prefix not in {m.dht_prefix for m in d.settings.models}:
        return jsonify(error=f"no model with DHT prefix {prefix[:100]!r}", status=404), 404
    now = time.time()
    return jsonify(request_stats.cached(d, cur, ("request-stats", prefix), now,
                                        lambda: request_stats.model_stats(d.store, prefix, now)))


@bp.get("/peers/<peer_id>/stats")
@documented("Statistics of the chat's requests through a server", "Monitor", {200: m.RequestStats, 400: MonitorError})
def peer_request_stats(peer_id: str):
    """Statistics from the chat's requests whose route went through this server (every model)."""
    security.require_peer_id(peer_id)
    d, cur = _current()
    now = time.time()
    return jsonify(request_stats.cached(d, cur, ("request-stats-peer", peer_id), now,
                                        lambda: request_stats.peer_stats(d.store, peer_id, now)))


ROUTING_MAX_AGE = 5  # seconds a client or cache may keep a routing view (clients refresh every 10 s)


@bp.get("/routing/<prefix>")
@documented("A model's routing view, for petals clients (ETag)", "Monitor",
            {200: m.RoutingView, 304: None, 404: MonitorError, 503: MonitorError})
def routing(prefix: str):
    """The routing view of one model (``routing_view``), from the stored assessment, scores, chat
    outcomes and the operator's policies; compact JSON with an ETag (304 when unchanged)."""
    d, cur = _current()
    if cur.snapshot is None:
        return _no_poll_yet(cur)
    model = cur.model(prefix)
    if model is None:
        known = ", ".join(sorted(m.dht_prefix for m in cur.models)[:20]) or "none yet"
        return jsonify(error=f"no model with DHT prefix {prefix[:100]!r} in the latest poll (known: {known})",
                       status=404), 404
    now = time.time()

    def compute() -> bytes:
        known = peer_routing(scores={peer: s.score for peer, s in cur.scores.items()},
                             outcomes=d.store.recent_chat_outcomes(now - CHAT_OUTCOME_WINDOW),
                             assessments=cur.assessments, policies=d.store.peer_policies(), now=now)
        view = routing_view(prefix, model.num_blocks, cur.snapshot.servers, known, cur.assessments.get(prefix))
        return json.dumps(view, separators=(",", ":"), allow_nan=False).encode()

    body = d.cache.now(cur.marks, now, ("routing", prefix), compute)
    response = Response(body, mimetype="application/json")
    response.set_etag(hashlib.sha256(body).hexdigest()[:32])
    response.headers["Cache-Control"] = f"public, max-age={ROUTING_MAX_AGE}"
    return response.make_conditional(request)


def _live_check(d, peer_id: str):
    """A live check of a peer of the latest poll, kept a while in the app's cache
    (``WebCache.reachability``): visitors cannot make the monitor dial arbitrary peers, nor dial
    one peer over and over."""
    return d.cache.reachability.get(peer_id, lambda: d.reachability_check(peer_id))


@dataclass(frozen=True)
class Reachability:
    """A reachability answer: ``success`` and ``message`` as health.petals.dev words them, the
    reachability check behind them (None: none) and whether it was a live one."""

    success: bool
    message: Optional[str]
    check: Optional[ReachabilityResult] = None
    live: bool = False


def reachability(peer_id: str) -> Reachability:
    """A live check through the DHT when the service provides one (peers of the latest poll only,
    kept a minute), else the latest stored check of that peer. Its views are rate-limited per
    client (``limits.REACHABILITY_VIEWS``); ``peer_id`` must be a peer id."""
    d, cur = _current()
    announced = cur.snapshot is not None and any(row.peer_id == peer_id for row in cur.snapshot.servers)
    live = d.reachability_check is not None and announced
    if live:
        try:
            result = _live_check(d, peer_id)
        except Exception:  # noqa: BLE001 - the answer is "could not check", not a crash
            log.exception("live reachability check of %s failed", peer_id)
            return Reachability(False, "the reachability check failed; try again later")
    else:
        result = d.store.latest_reachability().get(peer_id)
    if result is None:
        return Reachability(False, f"peer {peer_id} has not been checked for reachability yet" if announced else
                            f"peer {peer_id} is not announced in the swarm's DHT in the latest poll")
    message = None if result.ok else (result.error or "unreachable")
    if not result.ok and result.joining:
        message = f"the peer answers but is still loading its blocks (JOINING): {result.error or ''}".rstrip(": ")
    return Reachability(bool(result.ok), message, result, live)


@bp.get("/is_reachable/<peer_id>")
@documented("Whether a peer is reachable (health.petals.dev's answer)", "Monitor",
            {200: m.Reachable, 400: m.Reachable, 429: MonitorError})
def is_reachable(peer_id: str):
    """``{success, message, your_ip}`` as health.petals.dev answers (see ``reachability``); within
    ``reachability_rate_limit`` per client (``limits.REACHABILITY_VIEWS``)."""
    if not security.is_peer_id(peer_id):
        return jsonify(success=False, message=f"{peer_id[:80]!r} is not a peer id (base58, like 12D3KooW...)",
                       your_ip=request.remote_addr), 400
    answer = reachability(peer_id)
    return jsonify(success=answer.success, message=answer.message, your_ip=request.remote_addr)


@bp.get("/models")
@documented("The models now", "Monitor", {200: m.Models, 503: MonitorError})
def models():
    d, cur = _current()
    if cur.snapshot is None:
        return _no_poll_yet()
    reports = queries.state_dict(cur, d.settings)["model_reports"]
    keep = ("dht_prefix", "name", "num_blocks", "repository", "official", "state", "monitor_state", "degraded",
            "reasons", "coverage_pct", "servers_online", "min_redundancy", "est_tokens_per_s", "speed_source",
            "recommendation")
    return jsonify(models=[{key: report[key] for key in keep} for report in reports],
                   last_updated=cur.snapshot.taken_at)


@bp.get("/models/<dht_prefix>")
@documented("A model now, with its assessment", "Monitor", {200: m.ModelDetail, **m.ERRORS})
def model(dht_prefix: str):
    security.require_dht_prefix(dht_prefix)
    d, cur = _current()
    if cur.model(dht_prefix) is None:
        abort(404, description=f"no model with DHT prefix {dht_prefix!r} in the latest poll")
    assessment = cur.assessments.get(dht_prefix)
    return jsonify({**queries.model_report(cur, d.settings, dht_prefix),
                    "diagnosis": assessment.to_dict() if assessment is not None else None,
                    "last_updated": cur.snapshot.taken_at})


def _history_limits() -> history.HistoryLimits:
    """The request's range within retention, and the answer's bounds (monitor.web.history)."""
    window, settings = _range(), deps().settings
    return history.history_limits(window.since, window.until, now=time.time(),
                                  retention_days=settings.rollup_retention_days,
                                  max_points=settings.history_max_points)


@bp.get("/models/<dht_prefix>/history")
@documented("A model's history in a range (bounded)", "Monitor", {200: m.ModelHistory, **m.ERRORS},
            query=m.RangeQuery)
def model_history(dht_prefix: str):
    """A model's status, state changes, outages and block coverage in a range, bounded (see
    monitor.web.history: clamped to retention, at most ``history_max_points`` points a series)."""
    security.require_dht_prefix(dht_prefix)
    limits = _history_limits()
    raw = queries.model_history(deps().store, dht_prefix, limits.since, limits.until)
    if raw is None:
        abort(404, description=f"model {dht_prefix!r} was never seen by this monitor")
    bounded = history.model_history(raw, limits)
    return jsonify(model=dht_prefix, since=limits.since, until=limits.until, **bounded, limits=limits.to_dict())


@bp.get("/peers/<peer_id>")
@documented("A peer now", "Monitor", {200: m.PeerNow, **m.ERRORS})
def peer(peer_id: str):
    security.require_peer_id(peer_id)
    d, cur = _current()
    rows = [row for row in (cur.snapshot.servers if cur.snapshot else ()) if row.peer_id == peer_id]
    check = cur.reachability.get(peer_id)
    if not rows and check is None and not queries.known_peer(d.store, peer_id):
        abort(404, description=f"peer {peer_id} was never seen by this monitor")
    return jsonify(
        peer_id=peer_id,
        spans=[{"model": row.model, "start": row.start, "end": row.end, "state": state_api.row_state(row, check),
                "server_info": state_api.server_info(row)} for row in rows],
        probe=_record(check) if check is not None else None,  # (its latest reachability check: the API's name)
        score=state_api.score_dict(cur.scores.get(peer_id)),
        last_updated=cur.snapshot.taken_at if cur.snapshot else None,
    )


@bp.get("/peers/<peer_id>/history")
@documented("A peer's observations, reachability checks and chat outcomes in a range", "Monitor",
            {200: m.PeerHistory, **m.ERRORS}, query=m.RangeQuery)
def peer_history(peer_id: str):
    """A peer's observations, reachability checks (the API's key "probes") and chat outcomes in a
    range, bounded like a model's history.
    The answer is kept until the store changes (``peer_view.cached``; at most a minute when the
    range ends now): many clients asking for a month of one peer cost one read."""
    security.require_peer_id(peer_id)
    d, cur = _current()
    asked = (request.args.get("since"), request.args.get("until"))
    minute = int(time.time() // 60) if None in asked else None
    body = peer_view.cached(d, cur, ("history-api", peer_id, *asked, minute), lambda: _peer_history_json(d, peer_id))
    return current_app.response_class(body, mimetype="application/json")


def _peer_history_json(d, peer_id: str) -> str:
    limits = _history_limits()
    found = d.store.peer_history(peer_id, limits.since, limits.until)
    if not queries.known_peer(d.store, peer_id, found):
        abort(404, description=f"peer {peer_id} was never seen by this monitor")
    bounded = history.peer_history([_record(o) for o in found.observations],
                                   [{**_record(r), "at": at} for at, r in found.reachability],
                                   [_record(o) for o in found.outcomes], limits)
    return current_app.json.dumps(dict(peer_id=peer_id, since=limits.since, until=limits.until,
                                       first_seen=found.first_seen, **bounded, limits=limits.to_dict())) + "\n"


def _record(item) -> dict:
    """A flat snapshot record (Observation, ReachabilityResult, ChatOutcome: scalars only) as a dict;
    ``dataclasses.asdict`` deep-copies every field, which cost most of a 30-day history call."""
    return dict(vars(item))
