"""Dashboard pages: overview, model, peer. Thin: read the store, call the pure modules, render.

An htmx request (a part of a page refreshing itself) gets only the partial its target names
(``monitor.web.render``).
"""

from __future__ import annotations

import time

from typing import Optional

from flask import Blueprint, abort, redirect, render_template, request, url_for
from markupsafe import Markup

from monitor.core import scores as scores_module
from monitor.core.common import DAY, MINUTE, WEEK
from monitor.core.assessment import CAUSES
from monitor.families.checkpoint import describe as describe_checkpoint
from monitor.store import PEER_POLICIES
from monitor.web import (auth, charts, contributors, deps, peer_view, probe_views, queries, request_stats, security,
                         state_api, timerange)
from monitor.web.render import htmx_target, render

bp = Blueprint("pages", __name__)


@bp.get("/")
def overview():
    d = deps()
    cur = queries.current(d)
    now = time.time()
    context = dict(now=now, cur=cur, poll=queries.poll_info(cur, d.settings, now), pollers=queries.pollers(d, cur, now),
                   chat_workers=queries.chat_workers(d, cur, now),
                   demo_servers=d.demo_controls.servers() if d.demo_controls is not None else None)
    if cur.snapshot is not None:
        state = queries.state_dict(cur, d.settings)
        context.update(state=state, sparklines={} if cur.unavailable else {
            report["dht_prefix"]: _sparkline(cur, d.store, report["dht_prefix"], report["monitor_state"], now)
            for report in state["model_reports"]
        })
    return render("overview.html", {"overview-live": "partials/overview_live.html"}, **context)


def _sparkline(cur: queries.Current, store, dht_prefix: str, state: str, now: float) -> dict:
    """The model's 24 h coverage line, drawn once per state and minute."""
    def draw():
        times, values = queries.coverage_history(store, dht_prefix, now - DAY, now)
        return charts.sparkline(times, values, state=state, since=now - DAY, until=now)

    return cur.derive(("sparkline", dht_prefix, state, int(now // MINUTE)), draw)


def _model_or_404(cur: queries.Current, dht_prefix: str):
    security.require_dht_prefix(dht_prefix)
    model = cur.model(dht_prefix)
    if model is None:
        known = ", ".join(m.dht_prefix for m in cur.models) or "none yet"
        abort(404, description=f"no model with DHT prefix {dht_prefix!r} in the latest poll (known: {known})")
    return model


SERVING = "serving"
SERVER_SORTS = {"span": lambda r: (r["span"]["start"], r["span"]["end"], r["peer_id"]),
                "score": lambda r: (-(r["score"] if r["score"] is not None else -1), r["peer_id"]),
                "cause": lambda r: (CAUSES.index(r["cause"]) if r["cause"] in CAUSES else len(CAUSES), r["peer_id"]),
                "name": lambda r: ((r["span"]["server_info"].get("public_name") or "").lower(), r["peer_id"])}


def _server_table(report: dict, assessment, cause: Optional[str], sort: str) -> dict:
    """The servers table: every announced server with why it does not serve (its cause), filtered
    by cause and sorted as the visitor asked (``?cause=``, ``?sort=``)."""
    causes = assessment.excluded_causes if assessment is not None else {}
    rows = [{**row, "cause": causes.get(row["peer_id"], SERVING), "why": (assessment.excluded_peers.get(row["peer_id"])
                                                                            if assessment is not None else None)}
            for row in report["server_rows"]]
    counts = {c: sum(r["cause"] == c for r in rows) for c in (SERVING, *CAUSES)}
    shown = [r for r in rows if cause is None or r["cause"] == cause]
    return {"server_rows": sorted(shown, key=SERVER_SORTS[sort]), "cause_counts": counts, "cause": cause,
            "sort": sort, "sorts": tuple(SERVER_SORTS)}


def _table_args() -> tuple[Optional[str], str]:
    cause = request.args.get("cause") or None
    if cause is not None and cause not in (SERVING, *CAUSES):
        abort(400, description=f"cause must be one of {', '.join((SERVING, *CAUSES))}, got {cause[:40]!r}")
    sort = request.args.get("sort") or "span"
    if sort not in SERVER_SORTS:
        abort(400, description=f"sort must be one of {', '.join(SERVER_SORTS)}, got {sort[:40]!r}")
    return cause, sort


@bp.get("/models/<dht_prefix>")
def model(dht_prefix: str):
    d = deps()
    cur = queries.current(d)
    model = _model_or_404(cur, dht_prefix)
    cause, sort = _table_args()
    now = time.time()
    assessment = cur.assessments.get(dht_prefix)
    report = queries.model_report(cur, d.settings, dht_prefix)
    configured = next((m for m in d.settings.models if m.dht_prefix == dht_prefix and m.path), None)
    # DHT records carry no family: it is named where a checkpoint is configured
    family = describe_checkpoint(configured.path) if configured else None  # (its config.json: a small read)
    context = dict(now=now, cur=cur, model=model, report=report, assessment=assessment, family=family,
                   poll=queries.poll_info(cur, d.settings, now), **_server_table(report, assessment, cause, sort))
    target = htmx_target()
    if target in (None, "model-live"):
        context.update(cur.derive(("model-live", dht_prefix, int(now // MINUTE)), lambda: dict(
            redundancy_figure=charts.redundancy_chart(queries.block_rows(assessment)) if assessment else None,
            changes=queries.state_changes(d.store, dht_prefix, now - WEEK, now),
            outages=queries.outages(d.store, dht_prefix, now - WEEK, now),
            measured=probe_views.model_servers(assessment),
            generation_figure=_generation_chart(d.store, dht_prefix, now - DAY, now),
            requests=request_stats.cached(d, cur, ("request-stats-model", dht_prefix), now,
                                          lambda: request_stats.model_stats(d.store, dht_prefix, now, servers=False)),
            request_figure=_request_chart(d.store, dht_prefix, now - WEEK, now),
        )))
    if target in (None, "model-heatmaps"):
        context.update(heatmaps=cur.derive(("heatmaps", dht_prefix, int(now // MINUTE)), lambda: [
            (label, _heatmap(d.store, dht_prefix, now - span, now))
            for label, span in (("last 24 h", DAY), ("last 7 days", WEEK))
        ]))
    return render("model.html", {"model-live": "partials/model_live.html",
                                  "model-heatmaps": "partials/model_heatmaps.html"}, **context)


def _generation_chart(store, dht_prefix: str, since: float, until: float):
    checks = store.generation_check_history(dht_prefix, since, until)
    return charts.generation_checks(checks, since=since, until=until) if checks else None


def _request_chart(store, dht_prefix: str, since: float, until: float):
    rows = store.request_hours(dht_prefix, since, until)
    return charts.request_hours(rows, since=since, until=until) if rows else None


def _heatmap(store, dht_prefix: str, since: float, until: float):
    times, matrix = queries.coverage_series(store, dht_prefix, since, until)
    return charts.coverage_heatmap(times, matrix, since=since, until=until) if times else None


@bp.get("/peers/<peer_id>")
def peer(peer_id: str):
    """What a peer announces, "is my server OK?" (peer_view.report), its score and its history;
    what comes from the store is built once per store change (peer_view.cached) and the parts
    every visitor sees alike rendered once per few seconds (peer_view.rendered), whoever asks."""
    d = deps()
    security.require_peer_id(peer_id)
    hours = timerange.window(request.args.get("hours"))  # a BadRange answers 400 (create_app)
    cur = queries.current(d)
    now = time.time()
    rows = [row for row in (cur.snapshot.servers if cur.snapshot else ()) if row.peer_id == peer_id]
    # every peer the store knows has a row in ``peers``: an unknown id is refused before anything is
    # read or cached for it (random well-formed ids would otherwise push real pages out of the cache)
    if not rows and peer_id not in cur.reachability and d.store.peer_record(peer_id) is None:
        abort(404, description=f"peer {peer_id} was never seen by this monitor")
    target = htmx_target()
    view = peer_view.history(d, cur, peer_id, hours, now) if target != "my-server" else {}
    models = {m.dht_prefix: m for m in cur.models}
    reachability = cur.reachability.get(peer_id)
    context = dict(
        now=now, cur=cur, peer_id=peer_id, hours=hours, reachability=reachability, **view,
        rows=[(row, models.get(row.model), state_api.row_state(row, reachability)) for row in rows],
        public_name=next((row.public_name for row in rows if row.public_name), None),
        score=state_api.score_dict(cur.scores.get(peer_id)),
        formula=scores_module.FORMULA,
        windows=timerange.WINDOWS,
        policy=d.store.peer_policies().get(peer_id) if target is None else None,
    )
    my_server = peer_view.rendered(d, cur, ("my-server", peer_id), now, lambda: Markup(render_template(
        "partials/my_server.html", report=peer_view.report(d, cur, peer_id, now), **context)))
    if target == "my-server":
        return my_server
    live = peer_view.rendered(d, cur, ("peer-live", peer_id, hours), now, lambda: Markup(
        render_template("partials/peer_live.html", **context,
                        measured=probe_views.peer_probes(d.store, peer_id, cur.assessments),
                        given=contributors.of_peer(d, cur, peer_id, now),
                        requests=request_stats.cached(d, cur, ("request-stats-peer", peer_id), now,
                                                      lambda: request_stats.peer_stats(d.store, peer_id, now)))))
    return live if target == "peer-live" else render_template("peer.html", peer_live=live, my_server=my_server,
                                                              **context)


@bp.post("/peers/<peer_id>/policy")
@auth.operator_required
def peer_policy(peer_id: str):
    """Pin or block a peer for the chat's routing (or clear it): operators only."""
    d = deps()
    security.require_peer_id(peer_id)
    policy = request.form.get("policy") or None
    if policy is not None and policy not in PEER_POLICIES:
        abort(400, description=f"policy must be 'pinned', 'blocked' or empty, got {policy[:40]!r}")
    d.store.set_peer_policy(peer_id, policy)
    if request.headers.get("HX-Request") != "true":
        return redirect(url_for("pages.peer", peer_id=peer_id), code=303)
    return render_template("partials/peer_policy.html", peer_id=peer_id, policy=policy)
