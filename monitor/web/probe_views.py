"""What the pages and /metrics show of the server probes: per server of a model, what its stored
assessment says (measured vs announced speed, the latest correctness verdict, failing); per peer,
its latest probes; probe counts. Reads the store only (no petals, no torch); every verdict is the
stored assessment's (``monitor.core.assessment``), none is drawn here from the probes."""

from __future__ import annotations

import logging
import time
from typing import Iterable, Mapping

from monitor.core.assess import flagged
from monitor.core.assessment import CAUSE_FAILING, CAUSE_WRONG, Assessment, ServerAssessment
from monitor.core.common import HOUR
from monitor.core.probes import CORRECT, DISAGREES, WRONG, ServerProbe
from monitor.store import StoreError

log = logging.getLogger(__name__)

PEER_PROBES_SHOWN = 10


def model_servers(assessment: Assessment | None) -> dict[str, ServerAssessment]:
    """peer -> what the model's assessment says of it (empty without one)."""
    return dict(assessment.servers) if assessment is not None else {}


def peer_probes(store, peer_id: str, assessments: Mapping[str, Assessment]) -> dict:
    """The peer's latest probes (newest first) and, per model it serves, what its assessment says."""
    try:
        probes = store.recent_server_probes(time.time() - 86400.0, peer_id=peer_id, limit=PEER_PROBES_SHOWN * 4)
    except StoreError as e:
        log.warning("server probes of %s not read: %s", peer_id, e)
        probes = []
    views = {model: a.servers[peer_id] for model, a in assessments.items() if peer_id in a.servers}
    latest: list[ServerProbe] = list(reversed(probes))[:PEER_PROBES_SHOWN]
    return {"latest": latest, "models": views}


def metric_families(store, assessments: Mapping[str, Assessment]) -> Iterable:
    """/metrics: the server probes of the last hour by result and verdict, and the servers whose
    outputs are wrong or who fail every probe (as the stored assessments say)."""
    from prometheus_client.core import GaugeMetricFamily

    now = time.time()
    try:
        probes = store.recent_server_probes(now - HOUR)
    except StoreError as e:
        log.warning("server probes not read for /metrics: %s", e)
        return
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
                            "their outputs wrong", value=len(flagged(assessments, CAUSE_WRONG)))
    yield GaugeMetricFamily("swarm_monitor_servers_failing", "Servers whose newest probes all failed with the "
                            "server's own error (ONLINE and reachable, but every inference fails)",
                            value=len(flagged(assessments, CAUSE_FAILING)))
