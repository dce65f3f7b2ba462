"""What the pages and /metrics show of the server probes: per server of a model, measured vs
announced speed and the latest correctness verdict; per peer, its latest probes; probe counts. Reads the store only (no
petals, no torch); the figures come from ``monitor.core.probes``."""

from __future__ import annotations

import logging
import time
from typing import Iterable, Optional

from monitor.core.common import HOUR
from monitor.core.probes import (
    CORRECT,
    DISAGREES,
    WRONG,
    MeasuredServer,
    ServerProbe,
    failing_servers,
    recent_window,
    server_views,
    wrong_outputs,
)
from monitor.core.snapshot import Snapshot
from monitor.store import StoreError

log = logging.getLogger(__name__)

PEER_PROBES_SHOWN = 10


def model_servers(store, settings, snapshot: Optional[Snapshot], dht_prefix: str, now: float) -> dict[str, MeasuredServer]:
    """peer -> what the probes measured of it for this model (empty if the store cannot say)."""
    if snapshot is None:
        return {}
    max_age = recent_window(settings.speed_probe_period)
    try:
        probes = store.recent_server_probes(now - max_age, model=dht_prefix)
    except StoreError as e:
        log.warning("server probes of %s not read: %s", dht_prefix, e)
        return {}
    announced = {row.peer_id: row.inference_rps for row in snapshot.rows_for(dht_prefix)}
    return server_views(probes, announced, now=now, max_age=max_age, model=dht_prefix)


def peer_probes(store, settings, peer_id: str, snapshot: Optional[Snapshot], now: float) -> dict:
    """The peer's latest probes (newest first) and, per model it serves, what they add up to."""
    max_age = recent_window(settings.speed_probe_period)
    try:
        probes = store.recent_server_probes(now - max(max_age, 86400.0), peer_id=peer_id,
                                            limit=PEER_PROBES_SHOWN * 4)
    except StoreError as e:
        log.warning("server probes of %s not read: %s", peer_id, e)
        return {"latest": [], "models": {}}
    views = {}
    for model in sorted({p.model for p in probes}):
        rows = snapshot.rows_for(model) if snapshot is not None else []
        announced = {row.peer_id: row.inference_rps for row in rows}
        announced.setdefault(peer_id, None)
        try:
            others = store.recent_server_probes(now - max_age, model=model)
        except StoreError:
            others = [p for p in probes if p.model == model]
        views[model] = server_views(others, announced, now=now, max_age=max_age, model=model).get(peer_id)
    latest: list[ServerProbe] = list(reversed(probes))[:PEER_PROBES_SHOWN]
    return {"latest": latest, "models": views}


def metric_families(store, settings) -> Iterable:
    """/metrics: the server probes of the last hour by result and verdict, and the servers whose
    outputs are wrong or who fail every probe (within the recent window, as the diagnosis reads them)."""
    from prometheus_client.core import GaugeMetricFamily

    now = time.time()
    max_age = recent_window(settings.speed_probe_period)
    try:
        recent = store.recent_server_probes(now - max(HOUR, max_age))
    except StoreError as e:
        log.warning("server probes not read for /metrics: %s", e)
        return
    probes = [p for p in recent if p.at >= now - HOUR]
    results = GaugeMetricFamily("swarm_monitor_server_probes_1h", "Speed probes of servers' spans in the last hour, "
                                "by result (failed: the session did not run to the end)", labels=["result"])
    results.add_metric(["ok"], sum(1 for p in probes if p.ok))
    results.add_metric(["failed"], sum(1 for p in probes if not p.ok))
    yield results
    verdicts = GaugeMetricFamily("swarm_monitor_correctness_checks_1h", "Correctness checks of servers' outputs "
                                 "in the last hour, by verdict", labels=["verdict"])
    for verdict in (CORRECT, WRONG, DISAGREES):
        verdicts.add_metric([verdict], sum(1 for p in probes if p.verdict == verdict))
    yield verdicts
    yield GaugeMetricFamily("swarm_monitor_servers_wrong_outputs", "Servers whose latest correctness probe found "
                            "their outputs wrong", value=len(wrong_outputs(recent, now=now, max_age=max_age)))
    yield GaugeMetricFamily("swarm_monitor_servers_failing", "Servers whose newest probes all failed with the "
                            "server's own error (ONLINE and reachable, but every inference fails)",
                            value=len(failing_servers(recent, now=now, max_age=max_age)))
