"""/metrics (and /api/prometheus): Prometheus metrics read from the store at scrape time.

A custom collector builds every family from the latest stored poll, so any number of web workers
answer the same numbers. Names follow health.petals.dev's where they mean the same thing
(``update_duration``, ``servers_num_total``, ``n_blocks{model}``, ``blocks{model,state}``, ...);
ours carry the ``swarm_monitor_`` prefix.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from typing import Iterable, Optional

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from monitor.core.common import is_stale
from monitor.web import deps, queries, state_api

bp = Blueprint("metrics", __name__)

PING_PERCENTILES = (25, 50, 75, 90, 95)
RPS_KINDS = ("network", "inference", "forward")
MODEL_STATES = ("healthy", "degraded", "broken")


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = (len(sorted_values) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def server_families(state: dict) -> Iterable:
    """Swarm-wide server metrics, health.petals.dev's names."""
    peers: dict[str, dict] = {}
    for report in state["model_reports"]:
        for row in report["server_rows"]:
            peers.setdefault(row["peer_id"], row["span"]["server_info"])
    pings = sorted(rtt for info in peers.values() for rtt in (info["next_pings"] or {}).values() if rtt is not None)
    versions = Counter(info["version"] for info in peers.values() if info["version"])

    yield GaugeMetricFamily("servers_num_total", "Servers (distinct peers) announcing any block", value=len(peers))
    yield GaugeMetricFamily("servers_num_relay", "Servers that reach the swarm through a libp2p relay",
                            value=sum(1 for info in peers.values() if info["using_relay"]))
    ping = GaugeMetricFamily("ping_pct", "Percentiles of RTTs (seconds) between servers, from their next_pings",
                             labels=["pct"])
    if pings:
        for pct in PING_PERCENTILES:
            ping.add_metric([str(pct)], _percentile(pings, pct))
    yield ping
    version = GaugeMetricFamily("server_version", "Servers per petals version", labels=["version_number"])
    for number, count in sorted(versions.items()):
        version.add_metric([number], count)
    yield version


def model_families(state: dict) -> Iterable:
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
    coverage = GaugeMetricFamily("swarm_monitor_model_coverage_percent", "Blocks served by an online, reachable server",
                                 labels=["model"])
    redundancy = GaugeMetricFamily("swarm_monitor_model_min_redundancy",
                                   "Serving servers on the least served block (0: the model is broken)", labels=["model"])
    online = GaugeMetricFamily("swarm_monitor_model_servers_online", "Servers online and reachable", labels=["model"])
    speed = GaugeMetricFamily("swarm_monitor_model_est_tokens_per_second",
                              "Estimated tokens/s of the best route for one client", labels=["model"])

    for report in state["model_reports"]:
        model, num = report["dht_prefix"], report["num_blocks"]
        rows = report["server_rows"]
        per_state = Counter()
        online_per_block = [0] * num
        rps = {kind: [0.0] * num for kind in RPS_KINDS}
        for row in rows:
            start, end = max(row["span"]["start"], 0), min(row["span"]["end"], num)
            per_state[row["state"]] += max(end - start, 0)
            info = row["span"]["server_info"]
            for block in range(start, end):
                if row["state"] == "online":
                    online_per_block[block] += 1
                for kind in RPS_KINDS:
                    rps[kind][block] += info[f"{kind}_rps"] or 0.0
        n_blocks.add_metric([model], num)
        servers_num.add_metric([model], len(rows))
        blocks_total.add_metric([model], sum(per_state.values()))
        for name in state_api.ROW_STATES:
            blocks.add_metric([model, name], per_state[name])
        online_min.add_metric([model], min(online_per_block) if num else 0)
        for kind in RPS_KINDS:
            rps_avg.add_metric([model, kind], statistics.fmean(rps[kind]) if num else 0.0)
            rps_min.add_metric([model, kind], min(rps[kind]) if num else 0.0)
        for name in MODEL_STATES:
            model_state.add_metric([model, name], 1.0 if report["monitor_state"] == name else 0.0)
        if report["coverage_pct"] is not None:
            coverage.add_metric([model], report["coverage_pct"])
        if report["min_redundancy"] is not None:
            redundancy.add_metric([model], report["min_redundancy"])
        if report["servers_online"] is not None:
            online.add_metric([model], report["servers_online"])
        if report["est_tokens_per_s"] is not None:
            speed.add_metric([model], report["est_tokens_per_s"])
    yield from (n_blocks, servers_num, blocks_total, blocks, online_min, rps_avg, rps_min,
                model_state, coverage, redundancy, online, speed)


def peer_families(state: dict) -> Iterable:
    score = GaugeMetricFamily("swarm_monitor_peer_health_score", "Peer health score, 0-100", labels=["peer_id"])
    for peer, data in state["scores"].items():
        score.add_metric([peer], data["score"])
    yield score
    boot = GaugeMetricFamily("swarm_monitor_bootstrap_peer_up", "1 if the bootstrap peer answered its latest probe",
                             labels=["peer_id"])
    for peer in state["bootstrap_peers"]:
        if peer["state"] != "unknown":
            boot.add_metric([peer["peer_id"]], 1.0 if peer["state"] == "online" else 0.0)
    yield boot
    yield GaugeMetricFamily("swarm_monitor_unreachable_peers", "Peers whose latest probe failed",
                            value=len(state["reachability_issues"]))


def poll_families(cur: queries.Current, stats: queries.PollStats) -> Iterable:
    snapshot = cur.snapshot
    if snapshot is not None:
        yield GaugeMetricFamily("update_duration", "Seconds the latest poll of the swarm took", value=snapshot.duration)
        yield GaugeMetricFamily("swarm_monitor_last_poll_timestamp_seconds", "Unix time of the latest poll",
                                value=snapshot.taken_at)
        yield GaugeMetricFamily("swarm_monitor_last_poll_invalid_records",
                                "DHT records the latest poll rejected as malformed", value=snapshot.invalid_records)
    if stats.last_poll_ok is not None:
        yield GaugeMetricFamily("swarm_monitor_last_poll_ok",
                                "1 if the latest poll scraped the swarm, 0 if it failed (see the dashboard for why)",
                                value=1.0 if stats.last_poll_ok else 0.0)
        yield GaugeMetricFamily("swarm_monitor_last_poll_errors", "Errors the latest poll reported",
                                value=stats.last_poll_errors)
    polls = GaugeMetricFamily("swarm_monitor_polls_24h", "Polls in the last 24 h, by result (failed: "
                              "the scrape or the database write failed)", labels=["result"])
    for result in ("ok", "failed"):
        polls.add_metric([result], stats.last_day[result])
    yield polls
    yield GaugeMetricFamily("swarm_monitor_invalid_records_24h",
                            "Malformed DHT records the polls of the last 24 h dropped",
                            value=stats.last_day["invalid_records"])
    if stats.database_size_bytes is not None:
        yield GaugeMetricFamily("swarm_monitor_database_size_bytes", "Size of the monitor's database",
                                value=stats.database_size_bytes)


class StoreCollector:
    """Reads the store on every scrape; nothing is cached in the worker."""

    def __init__(self, store, settings):
        self.store = store
        self.settings = settings

    def describe(self):
        return []

    def collect(self):
        cur = queries.current(self.store, self.settings)
        yield from poll_families(cur, queries.poll_stats(self.store))
        if cur.snapshot is None:
            return
        state = queries.state_dict(cur, self.settings)
        yield from server_families(state)
        yield from model_families(state)
        yield from peer_families(state)


def registry_for(store, settings) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, settings))
    return registry


@bp.get("/metrics")
@bp.get("/api/prometheus")
def metrics():
    registry: Optional[CollectorRegistry] = current_app.extensions.get("swarm_monitor_registry")
    if registry is None:
        d = deps()
        registry = current_app.extensions["swarm_monitor_registry"] = registry_for(d.store, d.settings)
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@bp.get("/healthz")
def healthz():
    """For load balancers and uptime checks: 200 while the database answers (the body says whether
    the poller keeps it fresh), 503 with the reason when it does not."""
    d = deps()
    last = d.store.last_poll()  # StoreError -> 503 JSON (app error handler)
    now = time.time()
    stale = is_stale(last.at if last else None, now, d.settings.scrape_period)
    return jsonify(ok=True, database="reachable", last_poll=last.at if last else None,
                   last_poll_ok=last.ok if last else None, poller_stale=stale)
