"""/metrics (and /api/prometheus): Prometheus metrics read from the store at scrape time.

A custom collector builds every family from the latest stored poll, so any number of web workers
answer the same numbers. It reads the typed state (``queries.Current``: the snapshot's rows,
reachability checks, ``PeerScore``s, ``Assessment``s) with the same rules as the state document
(``state_api.row_state``, ``monitor_state``, ``bootstrap_addresses``, ``unreachable_peers``), not
that document itself. Names follow health.petals.dev's where they mean the same thing
(``update_duration``, ``servers_num_total``, ``n_blocks{model}``, ``blocks{model,state}``, ...);
ours carry the ``swarm_monitor_`` prefix.

Label values drawn from what peers announce (versions, model prefixes, peer ids) are bounded, so a
hostile peer cannot blow up the scrape: at most ``MAX_LABEL_CHARS`` characters (a longer value is
cut and ends with a hash of the whole, so distinct values stay distinct), the ``MAX_VERSION_LABELS``
most common versions (the rest under ``other``), and scores of the ``MAX_PEER_SERIES`` peers of the
latest poll that serve the most blocks.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import time
from collections import Counter
from typing import Iterable, Sequence

from flask import Blueprint, Response, current_app
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from monitor.core.calibration import FIGURES
from monitor.core.common import finite
from monitor.core.snapshot import ModelInfo, ServerRow
from monitor.web import probe_views, queries, request_stats, state_api

bp = Blueprint("metrics", __name__)

PING_PERCENTILES = (25, 50, 75, 90, 95)
RPS_KINDS = ("network", "inference", "forward")
MODEL_STATES = ("healthy", "degraded", "broken", "unknown")  # unknown: not diagnosed
MAX_LABEL_CHARS = 64
MAX_VERSION_LABELS = 50
MAX_PEER_SERIES = 500
OTHER = "other"
REGISTRY = "swarm_monitor_registry"  # the app's registry in app.extensions (create_app)


def label(value: str) -> str:
    """A label value from peer-announced text, at most ``MAX_LABEL_CHARS`` characters."""
    if len(value) <= MAX_LABEL_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:8]
    return f"{value[:MAX_LABEL_CHARS - 9]}~{digest}"


def top_labels(counts: Counter, limit: int) -> list[tuple[str, int]]:
    """The ``limit`` most common values (ties by value) as labels, the rest summed under ``other``."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept: Counter = Counter()
    for value, count in ranked[:limit]:
        kept[label(value)] += count
    rest = sum(count for _, count in ranked[limit:])
    if rest:
        kept[OTHER] += rest
    return sorted(kept.items())


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = (len(sorted_values) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _server_rows(cur: queries.Current) -> Iterable[tuple[ModelInfo, list[ServerRow]]]:
    """Each model of the latest poll with its servers' rows, in the state document's order (models
    as polled, rows by peer id and start)."""
    for model in cur.models:
        yield model, sorted(cur.snapshot.rows_for(model.dht_prefix), key=lambda r: (r.peer_id, r.start))


def server_families(cur: queries.Current) -> Iterable:
    """Swarm-wide server metrics, health.petals.dev's names; a peer serving several models counts
    once, as its first row (by model, then span) announces it."""
    peers: dict[str, ServerRow] = {}
    for _, rows in _server_rows(cur):
        for row in rows:
            peers.setdefault(row.peer_id, row)
    pings = sorted(rtt for row in peers.values() for rtt in map(finite, (row.next_pings or {}).values())
                   if rtt is not None)
    versions = Counter(row.version for row in peers.values() if row.version)

    yield GaugeMetricFamily("servers_num_total", "Servers (distinct peers) announcing any block", value=len(peers))
    yield GaugeMetricFamily("servers_num_relay", "Servers that reach the swarm through a libp2p relay",
                            value=sum(1 for row in peers.values() if row.using_relay))
    ping = GaugeMetricFamily("ping_pct", "Percentiles of RTTs (seconds) between servers, from their next_pings",
                             labels=["pct"])
    if pings:
        for pct in PING_PERCENTILES:
            ping.add_metric([str(pct)], _percentile(pings, pct))
    yield ping
    version = GaugeMetricFamily("server_version", f"Servers per petals version (the {MAX_VERSION_LABELS} most "
                                f"common; the rest as {OTHER})", labels=["version_number"])
    for number, count in top_labels(versions, MAX_VERSION_LABELS):
        version.add_metric([number], count)
    yield version


def _blocks(num_blocks: int, rows: Sequence[ServerRow], reachability) -> tuple[Counter, list[int], dict[str, list[float]]]:
    """A model's blocks as its rows announce them (spans cut to the model): blocks per row state
    (``state_api.row_state``), online servers per block, and per RPS kind the summed RPS per block."""
    per_state: Counter = Counter()
    online_per_block = [0] * num_blocks
    rps = {kind: [0.0] * num_blocks for kind in RPS_KINDS}
    for row in rows:
        state = state_api.row_state(row, reachability.get(row.peer_id))
        start, end = max(row.start, 0), min(row.end, num_blocks)
        per_state[state] += max(end - start, 0)
        announced = {kind: finite(getattr(row, f"{kind}_rps")) or 0.0 for kind in RPS_KINDS}
        for block in range(start, end):
            if state == "online":
                online_per_block[block] += 1
            for kind in RPS_KINDS:
                rps[kind][block] += announced[kind]
    return per_state, online_per_block, rps


def model_families(cur: queries.Current) -> Iterable:
    """Per-model block and throughput metrics (health.petals.dev's names) and our diagnosis."""
    n_blocks = GaugeMetricFamily("n_blocks", "Blocks in the model", labels=["model"])
    servers_num = GaugeMetricFamily("servers_num", "Servers announcing blocks of the model", labels=["model"])
    blocks_total = GaugeMetricFamily("blocks_total", "Blocks announced over all servers (a block served twice counts twice)",
                                     labels=["model"])
    blocks = GaugeMetricFamily("blocks", "Blocks announced, by server state", labels=["model", "state"])
    online_min = GaugeMetricFamily("blocks_online_min", "Online servers on the model's least served block",
                                   labels=["model"])
    rps_avg = GaugeMetricFamily("rps_avg", "Mean over blocks of the summed RPS of the block's servers",
                                labels=["model", "rps"])
    rps_min = GaugeMetricFamily("rps_min", "Minimum over blocks of the summed RPS of the block's servers",
                                labels=["model", "rps"])
    model_state = GaugeMetricFamily("swarm_monitor_model_state",
                                    "1 for the model's current state (healthy, degraded, broken), else 0",
                                    labels=["model", "state"])
    confirmed = GaugeMetricFamily("swarm_monitor_model_confirmed",
                                  "1 when the model's degraded or broken state rests only on confirmed checks of the "
                                  "servers it lost within the hour and those measured slow (two failed compute checks, "
                                  "failing probes, wrong outputs, two slow probes): the alerts tell it at once",
                                  labels=["model"])
    coverage = GaugeMetricFamily("swarm_monitor_model_coverage_percent", "Blocks served by an online, reachable server",
                                 labels=["model"])
    redundancy = GaugeMetricFamily("swarm_monitor_model_min_redundancy",
                                   "Serving servers on the least served block (0: the model is broken)", labels=["model"])
    online = GaugeMetricFamily("swarm_monitor_model_servers_online", "Servers online and reachable", labels=["model"])
    speed = GaugeMetricFamily("swarm_monitor_model_est_tokens_per_second",
                              "Estimated tokens/s of the best route for one client", labels=["model"])

    for info, rows in _server_rows(cur):
        model, num = label(info.dht_prefix), info.num_blocks
        per_state, online_per_block, rps = _blocks(num, rows, cur.reachability)
        n_blocks.add_metric([model], num)
        servers_num.add_metric([model], len(rows))
        blocks_total.add_metric([model], sum(per_state.values()))
        for name in state_api.ROW_STATES:
            blocks.add_metric([model, name], per_state[name])
        online_min.add_metric([model], min(online_per_block) if num else 0)
        for kind in RPS_KINDS:
            rps_avg.add_metric([model, kind], statistics.fmean(rps[kind]) if num else 0.0)
            rps_min.add_metric([model, kind], min(rps[kind]) if num else 0.0)
        assessment = cur.assessments.get(info.dht_prefix)
        for name in MODEL_STATES:
            model_state.add_metric([model, name], 1.0 if state_api.monitor_state(assessment) == name else 0.0)
        if assessment is None:
            continue
        confirmed.add_metric([model], 1.0 if assessment.trouble_confirmed else 0.0)
        if finite(assessment.coverage_pct) is not None:
            coverage.add_metric([model], finite(assessment.coverage_pct))
        if assessment.min_redundancy is not None:
            redundancy.add_metric([model], assessment.min_redundancy)
        if assessment.servers_online is not None:
            online.add_metric([model], assessment.servers_online)
        if finite(assessment.est_tokens_per_s) is not None:
            speed.add_metric([model], finite(assessment.est_tokens_per_s))
    yield from (n_blocks, servers_num, blocks_total, blocks, online_min, rps_avg, rps_min,
                model_state, confirmed, coverage, redundancy, online, speed)
    yield from generation_families(cur)


def generation_families(cur: queries.Current) -> Iterable:
    """Each model's newest generation check (``monitor.core.generation``): what a user got."""
    ok = GaugeMetricFamily("swarm_monitor_generation_check_ok", "1 if the model's newest generation check "
                           "generated an answer (matching its expected pattern, if any), else 0", labels=["model"])
    at = GaugeMetricFamily("swarm_monitor_generation_check_timestamp_seconds", "When the newest generation check "
                           "started (unix seconds)", labels=["model"])
    ttft = GaugeMetricFamily("swarm_monitor_generation_check_first_token_seconds", "Time to the first token of the "
                             "newest generation check", labels=["model"])
    speed = GaugeMetricFamily("swarm_monitor_generation_check_tokens_per_second", "Tokens per second after the "
                              "first token, newest generation check", labels=["model"])
    for model in cur.models:
        check = cur.generation.get(model.dht_prefix)
        if check is None:
            continue
        name = label(model.dht_prefix)
        ok.add_metric([name], 1.0 if check.ok else 0.0)
        at.add_metric([name], check.at)
        if finite(check.time_to_first_token) is not None:
            ttft.add_metric([name], finite(check.time_to_first_token))
        if finite(check.tokens_per_second) is not None:
            speed.add_metric([name], finite(check.tokens_per_second))
    yield from (ok, at, ttft, speed)


def scored_peers(cur: queries.Current) -> tuple[list[str], int]:
    """Peers of the latest poll that have a score, the ``MAX_PEER_SERIES`` serving the most blocks
    online first (ties by peer id); and how many were left out."""
    blocks: Counter = Counter()
    for _, rows in _server_rows(cur):
        for row in rows:
            if row.peer_id in cur.scores:
                online = state_api.row_state(row, cur.reachability.get(row.peer_id)) == "online"
                blocks[row.peer_id] += row.length if online else 0
    ranked = sorted(blocks, key=lambda peer: (-blocks[peer], peer))
    return ranked[:MAX_PEER_SERIES], max(len(ranked) - MAX_PEER_SERIES, 0)


def peer_families(cur: queries.Current, initial_peers: Sequence[str]) -> Iterable:
    score = GaugeMetricFamily("swarm_monitor_peer_health_score", f"Peer health score, 0-100 (peers of the latest "
                              f"poll, at most {MAX_PEER_SERIES}: those serving the most blocks)", labels=["peer_id"])
    peers, left_out = scored_peers(cur)
    for peer in peers:
        score.add_metric([label(peer)], cur.scores[peer].score)
    yield score
    yield GaugeMetricFamily("swarm_monitor_peer_health_score_left_out",
                            f"Scored peers of the latest poll beyond the {MAX_PEER_SERIES} reported", value=left_out)
    bootstrap = state_api.bootstrap_addresses(initial_peers, cur.reachability)
    yield GaugeMetricFamily("swarm_monitor_unreachable_peers", "Peers whose latest reachability check failed",
                            value=len(state_api.unreachable_peers(cur.snapshot, cur.reachability, bootstrap)))


def bootstrap_family(cur: queries.Current, initial_peers: Sequence[str]) -> GaugeMetricFamily:
    """Each bootstrap peer's latest check, also before the first successful poll (a monitor whose
    DHT client cannot start finds them all down)."""
    boot = GaugeMetricFamily("swarm_monitor_bootstrap_peer_up",
                             "1 if the bootstrap peer answered its latest reachability check", labels=["peer_id"])
    for peer in state_api.bootstrap_addresses(initial_peers, cur.reachability):
        check = cur.reachability.get(peer)
        if check is not None:
            boot.add_metric([label(peer)], 1.0 if check.ok else 0.0)
    return boot


def poll_families(cur: queries.Current, stats: queries.PollStats) -> Iterable:
    snapshot, last = cur.snapshot, stats.last_poll
    if snapshot is not None:
        yield GaugeMetricFamily("update_duration", "Seconds the latest successful poll of the swarm took",
                                value=snapshot.duration)
        yield GaugeMetricFamily("swarm_monitor_last_successful_poll_timestamp_seconds",
                                "Unix time of the latest poll that was scraped and stored", value=snapshot.taken_at)
        yield GaugeMetricFamily("swarm_monitor_last_poll_invalid_records",
                                "DHT records the latest successful poll rejected as malformed",
                                value=snapshot.invalid_records)
    if last is not None:
        yield GaugeMetricFamily("swarm_monitor_last_poll_timestamp_seconds",
                                "Unix time of the latest poll, successful or failed", value=last.at)
        yield GaugeMetricFamily("swarm_monitor_last_poll_ok",
                                "1 if the latest poll was scraped and stored, 0 if it failed (the dashboard says why)",
                                value=1.0 if last.ok else 0.0)
        yield GaugeMetricFamily("swarm_monitor_last_poll_errors", "Errors the latest poll reported",
                                value=len(last.errors))
        yield GaugeMetricFamily("swarm_monitor_last_poll_clamped_values",
                                "Announced values the latest poll bounded to what can be stored (out of range, "
                                "not finite)", value=last.clamped_values)
        yield GaugeMetricFamily("swarm_monitor_last_poll_dropped_rows",
                                "Rows of the latest poll the database refused (named in the poll's errors)",
                                value=last.dropped_rows)
    polls = GaugeMetricFamily("swarm_monitor_polls_24h", "Polls in the last 24 h, by result (failed: "
                              "the scrape failed, or the poll could not be stored)", labels=["result"])
    for result in ("ok", "failed"):
        polls.add_metric([result], stats.last_day[result])
    yield polls
    yield GaugeMetricFamily("swarm_monitor_invalid_records_24h",
                            "Malformed DHT records the polls of the last 24 h dropped",
                            value=stats.last_day["invalid_records"])
    yield GaugeMetricFamily("swarm_monitor_clamped_values_24h",
                            "Announced values the polls of the last 24 h bounded to what can be stored",
                            value=stats.last_day["clamped_values"])
    yield GaugeMetricFamily("swarm_monitor_dropped_rows_24h",
                            "Rows of the polls of the last 24 h the database refused",
                            value=stats.last_day["dropped_rows"])
    if stats.database_size_bytes is not None:
        yield GaugeMetricFamily("swarm_monitor_database_size_bytes", "Size of the monitor's database",
                                value=stats.database_size_bytes)


def alert_families(store) -> Iterable:
    """Alerts: each pending or firing alert, and deliveries to webhooks per status (24 h)."""
    alert = GaugeMetricFamily("swarm_monitor_alert", "1 per alert pending or firing (the rules in README: Alerts)",
                              labels=["rule", "kind", "subject", "severity", "status"])
    for item in store.alerts().values():
        alert.add_metric([item.rule, item.kind, item.subject, item.severity, item.status], 1.0)
    yield alert
    deliveries = GaugeMetricFamily("swarm_monitor_alert_deliveries",
                                   "Alert notices to webhooks in the last 24 h by status (pending: every one "
                                   "waiting, failed: given up after every retry)", labels=["webhook", "status"])
    for webhook, counts in sorted(store.alert_delivery_counts(time.time() - 86400).items()):
        for status, n in counts.items():
            deliveries.add_metric([webhook, status], n)
    yield deliveries
    evaluated = store.alerts_evaluated_at()
    if evaluated is not None:
        yield GaugeMetricFamily("swarm_monitor_alerts_evaluated_timestamp_seconds",
                                "Unix time the poller last evaluated the alert rules (at least every minute)",
                                value=evaluated)


def poller_families(pollers: dict) -> Iterable:
    """Who polls the store (``state_api.poller_section``): the leader (host, start, since when, its
    lease, its latest poll), the standbys seen recently, take-overs, and what each poller cannot
    reach. The leader's latest poll is the Prometheus rules' dead man's switch: it stops moving
    when every poller is gone."""
    leader, lapsed = pollers.get("leader"), pollers.get("lapsed")
    info = GaugeMetricFamily("swarm_monitor_poller_leader", "1 for the poller that leads now (its lease holds)",
                             labels=["host", "pid", "epoch"])
    started = GaugeMetricFamily("swarm_monitor_poller_leader_started_timestamp_seconds",
                                "When the leading poller's process started (unix seconds)")
    since = GaugeMetricFamily("swarm_monitor_poller_leader_since_timestamp_seconds",
                              "When the leading poller took the lease (unix seconds)")
    last_poll = GaugeMetricFamily("swarm_monitor_poller_leader_last_poll_timestamp_seconds",
                                  "The latest successful poll of the leading poller (of the last one, while none "
                                  "leads): it stops moving when no poller polls")
    expires = GaugeMetricFamily("swarm_monitor_poller_lease_expiry_timestamp_seconds",
                                "When the leader's lease runs out unless renewed (of the last leader's, while none leads)")
    if leader is not None:
        info.add_metric([label(leader["host"]), str(leader["pid"]), str(leader["epoch"])], 1.0)
        started.add_metric([], leader["started_at"])
        since.add_metric([], leader["since"])
        expires.add_metric([], leader["lease_expires_at"])
    elif lapsed is not None:
        expires.add_metric([], lapsed["lease_expired_at"])
    polled = (leader or lapsed or {}).get("last_poll_at")
    if polled is not None:
        last_poll.add_metric([], polled)
    yield from (info, started, since, last_poll, expires)
    yield GaugeMetricFamily("swarm_monitor_poller_leading", "1 if a poller leads now (its lease holds), else 0",
                            value=1.0 if leader is not None else 0.0)
    yield GaugeMetricFamily("swarm_monitor_poller_standbys", "Standby pollers seen recently (they take over if "
                            "the leader stops)", value=pollers.get("standbys_seen", 0))
    yield GaugeMetricFamily("swarm_monitor_poller_takeovers", "Recent take-overs (a standby replacing a leader it "
                            "lost) among the latest terms", value=len(pollers.get("takeovers", ())))
    problems = GaugeMetricFamily("swarm_monitor_poller_problem", "1 per poller seen recently that cannot reach "
                                 "something (the DHT, the bootstrap peers), with what it says",
                                 labels=["host", "pid", "role", "problem"])
    for role, member in [("leader", leader)] + [("standby", m) for m in pollers.get("standbys", ())]:
        if member is not None and member.get("problem"):
            problems.add_metric([label(member["host"]), str(member["pid"]), role, label(member["problem"])], 1.0)
    yield problems


def request_families(d, cur: queries.Current) -> Iterable:
    """Statistics from real requests (``web.request_stats``: the stored request rows), per watched
    model: gauges over fixed windows (label values: the models, the windows, the quantiles), read
    once per store change and minute, as the API's and the model page's."""
    ratio = GaugeMetricFamily("swarm_monitor_requests_success_ratio", "Share of the chat's requests answered "
                              "(those their clients left not counted), over the window", labels=["model", "window"])
    count = GaugeMetricFamily("swarm_monitor_requests", "Requests the chat served and judged, over the window",
                              labels=["model", "window"])
    first = GaugeMetricFamily("swarm_monitor_request_first_token_seconds", "Time to the first token of the chat's "
                              "answered requests: exact quantiles over the window", labels=["model", "window", "quantile"])
    speed = GaugeMetricFamily("swarm_monitor_request_tokens_per_second", "Decode tokens per second of the chat's "
                              "answered requests: exact quantiles over the window", labels=["model", "window", "quantile"])
    within = GaugeMetricFamily("swarm_monitor_forecast_within_range_ratio", "Share of the chat's answered requests "
                               "whose figure fell within the range their forecast stated (for 0.8), over the window",
                               labels=["model", "window", "figure"])
    error = GaugeMetricFamily("swarm_monitor_forecast_median_error_ratio", "Median relative error of the forecasts' "
                              "medians (|real - median| / real), over the window", labels=["model", "window", "figure"])
    wrong = GaugeMetricFamily("swarm_monitor_forecast_gone_wrong", "1 when the figure's stated ranges held for under "
                              "65 % of the newest 100 answered requests", labels=["model", "figure"])
    now = time.time()
    for model in cur.models:
        found = request_stats.cached(d, cur, ("request-stats-model", model.dht_prefix), now,
                                     lambda: request_stats.model_stats(d.store, model.dht_prefix, now, servers=False))
        for window, figures in found["success"].items():
            count.add_metric([label(model.dht_prefix), window], figures["requests"])
            if figures["rate"] is not None:
                ratio.add_metric([label(model.dht_prefix), window], figures["rate"])
        for window, figures in found["latency"].items():
            for family, key in ((first, "time_to_first_token"), (speed, "tokens_per_second")):
                for name, value in figures[key].items():
                    if value is not None:
                        family.add_metric([label(model.dht_prefix), window, str(int(name[1:]) / 100)], value)
        record = found["forecasts"]
        for window, by_figure in record["windows"].items():
            for figure, fared in by_figure.items():
                for family, key in ((within, "within_range"), (error, "median_error")):
                    if fared[key] is not None:
                        family.add_metric([label(model.dht_prefix), window, figure], fared[key])
        for figure in FIGURES:
            wrong.add_metric([label(model.dht_prefix), figure], float(figure in record["gone_wrong"]))
    yield from (ratio, count, first, speed, within, error, wrong)


class StoreCollector:
    """Reads the store on every scrape (the latest state through the app's cache: once per change)."""

    def __init__(self, d):
        self.d = d  # the app's WebDeps
        self.store = d.store
        self.settings = d.settings

    def describe(self):
        return []

    def collect(self):
        cur = queries.current(self.d)
        yield from poll_families(cur, queries.poll_stats(self.store))
        yield from alert_families(self.store)
        yield from probe_views.metric_families(self.store, cur.assessments)  # server probes
        yield from poller_families(queries.pollers(self.d, cur, time.time()))
        yield bootstrap_family(cur, self.settings.resolved_initial_peers)
        if cur.snapshot is None:
            return
        yield from server_families(cur)
        yield from model_families(cur)
        yield from peer_families(cur, self.settings.resolved_initial_peers)
        yield from request_families(self.d, cur)


class ProcessSeries:
    """What operators graph first, of the process answering the scrape: prometheus_client's own
    process (memory, CPU, open files), platform (``python_info``) and garbage-collector series, each
    labelled ``pid`` — the process's id when it is scraped, so gunicorn's workers (forked after the
    app is made) are told apart."""

    def __init__(self):
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        own = CollectorRegistry(auto_describe=False)  # (where they register themselves; read from here only)
        self._collectors = (ProcessCollector(registry=own), PlatformCollector(registry=own), GCCollector(registry=own))

    def collect(self):
        from prometheus_client import Metric

        pid = str(os.getpid())
        for collector in self._collectors:
            for family in collector.collect():
                labelled = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    labelled.add_sample(sample.name, {**sample.labels, "pid": pid}, sample.value, sample.timestamp,
                                        sample.exemplar)
                yield labelled


def registry_for(d) -> CollectorRegistry:
    """An app's own registry (made by ``create_app``): nothing in prometheus_client's global one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(d))
    registry.register(ProcessSeries())
    return registry


@bp.get("/metrics")
@bp.get("/api/prometheus")
def metrics():
    return Response(generate_latest(current_app.extensions[REGISTRY]), content_type=CONTENT_TYPE_LATEST)

