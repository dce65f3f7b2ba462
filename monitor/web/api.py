"""JSON API: health.petals.dev's ``/api/v1/state`` and ``/api/v1/is_reachable``, plus history.

Errors are JSON ``{"error": message, "status": code}`` with a 4xx/5xx status; the message names the
bad value and what to send instead.
"""

from __future__ import annotations

import logging
import threading
import time

from flask import Blueprint, abort, current_app, jsonify, request

from monitor.web import deps, queries, security, state_api, timerange
from monitor.web.limits import limiter

log = logging.getLogger(__name__)

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def _current():
    d = deps()
    return d, queries.current(d.store, d.settings)


def _no_poll_yet():
    return jsonify(error="no poll has completed yet; the poller (swarm-monitor poll) writes the first one "
                         "within one scrape period", status=503), 503


def _range() -> timerange.TimeRange:
    return timerange.time_range(request.args, time.time())  # a BadRange answers 400 (create_app)


@bp.get("/state")
def state():
    d, cur = _current()
    if cur.snapshot is None:
        return _no_poll_yet()
    return jsonify(queries.state_dict(cur, d.settings))


REACHABILITY_CACHE_SECONDS = 60.0
_reachability_lock = threading.Lock()


def _live_check(d, peer_id: str):
    """A live probe of a peer of the latest poll, reused for REACHABILITY_CACHE_SECONDS: visitors
    cannot make the monitor dial arbitrary peers, nor dial one peer over and over."""
    cache: dict = current_app.extensions.setdefault("reachability_cache", {})  # peer -> (at, ProbeResult)
    now = time.monotonic()
    with _reachability_lock:
        for stale in [p for p, (at, _) in cache.items() if now - at > REACHABILITY_CACHE_SECONDS]:
            del cache[stale]
        if peer_id in cache:
            return cache[peer_id][1]
    result = d.reachability_check(peer_id)
    with _reachability_lock:
        cache[peer_id] = (now, result)
    return result


@bp.get("/is_reachable/<peer_id>")
@limiter.limit(lambda: deps().settings.reachability_rate_limit)
def is_reachable(peer_id: str):
    """``{success, message, your_ip}`` as health.petals.dev answers: a live probe through the DHT
    when the service provides one (peers of the latest poll only, cached a minute, rate-limited per
    client), else the latest stored probe of that peer."""
    if not security.is_peer_id(peer_id):
        return jsonify(success=False, message=f"{peer_id[:80]!r} is not a peer id (base58, like 12D3KooW...)",
                       your_ip=request.remote_addr), 400
    d, cur = _current()
    announced = cur.snapshot is not None and any(row.peer_id == peer_id for row in cur.snapshot.servers)
    if d.reachability_check is not None and announced:
        try:
            result = _live_check(d, peer_id)
        except Exception:  # noqa: BLE001 - the answer is "could not check", not a crash
            log.exception("live reachability check of %s failed", peer_id)
            return jsonify(success=False, message="the reachability check failed; try again later",
                           your_ip=request.remote_addr)
    else:
        result = d.store.latest_probes().get(peer_id)
    if result is None:
        message = (f"peer {peer_id} has not been probed yet" if announced else
                   f"peer {peer_id} is not announced in the swarm's DHT in the latest poll")
        return jsonify(success=False, message=message, your_ip=request.remote_addr)
    message = None if result.ok else (result.error or "unreachable")
    if not result.ok and result.joining:
        message = f"the peer answers but is still loading its blocks (JOINING): {result.error or ''}".rstrip(": ")
    return jsonify(success=bool(result.ok), message=message, your_ip=request.remote_addr)


@bp.get("/models")
def models():
    d, cur = _current()
    if cur.snapshot is None:
        return _no_poll_yet()
    reports = queries.state_dict(cur, d.settings)["model_reports"]
    keep = ("dht_prefix", "name", "num_blocks", "repository", "official", "state", "monitor_state", "degraded",
            "reasons", "coverage_pct", "servers_online", "min_redundancy", "est_tokens_per_s", "recommendation")
    return jsonify(models=[{key: report[key] for key in keep} for report in reports],
                   last_updated=cur.snapshot.taken_at)


@bp.get("/models/<dht_prefix>")
def model(dht_prefix: str):
    security.require_dht_prefix(dht_prefix)
    d, cur = _current()
    if cur.model(dht_prefix) is None:
        abort(404, description=f"no model with DHT prefix {dht_prefix!r} in the latest poll")
    health = cur.healths.get(dht_prefix)
    return jsonify({**queries.model_report(cur, d.settings, dht_prefix),
                    "diagnosis": health.to_dict() if health is not None else None,
                    "last_updated": cur.snapshot.taken_at})


@bp.get("/models/<dht_prefix>/history")
def model_history(dht_prefix: str):
    security.require_dht_prefix(dht_prefix)
    window = _range()
    d = deps()
    history = queries.model_history(d.store, dht_prefix, window.since, window.until)
    if history is None:
        abort(404, description=f"model {dht_prefix!r} was never seen by this monitor")
    return jsonify(model=dht_prefix, since=window.since, until=window.until, **history)


@bp.get("/peers/<peer_id>")
def peer(peer_id: str):
    security.require_peer_id(peer_id)
    d, cur = _current()
    rows = [row for row in (cur.snapshot.servers if cur.snapshot else ()) if row.peer_id == peer_id]
    probe = cur.probes.get(peer_id)
    if not rows and probe is None and not queries.known_peer(d.store, peer_id):
        abort(404, description=f"peer {peer_id} was never seen by this monitor")
    return jsonify(
        peer_id=peer_id,
        spans=[{"model": row.model, "start": row.start, "end": row.end, "state": state_api.row_state(row, probe),
                "server_info": state_api.server_info(row)} for row in rows],
        probe=_record(probe) if probe is not None else None,
        score=state_api.score_dict(cur.scores.get(peer_id)),
        last_updated=cur.snapshot.taken_at if cur.snapshot else None,
    )


@bp.get("/peers/<peer_id>/history")
def peer_history(peer_id: str):
    security.require_peer_id(peer_id)
    window = _range()
    d = deps()
    history = d.store.peer_history(peer_id, window.since, window.until)
    if not queries.known_peer(d.store, peer_id, history):
        abort(404, description=f"peer {peer_id} was never seen by this monitor")
    return jsonify(
        peer_id=peer_id, since=window.since, until=window.until, first_seen=history.first_seen,
        observations=[_record(o) for o in history.observations],
        probes=[{**_record(p), "at": at} for at, p in history.probes],
        chat_outcomes=[_record(o) for o in history.outcomes],
    )


def _record(item) -> dict:
    """A flat snapshot record (Observation, ProbeResult, ChatOutcome: scalars only) as a dict;
    ``dataclasses.asdict`` deep-copies every field, which cost most of a 30-day history call."""
    return dict(vars(item))
