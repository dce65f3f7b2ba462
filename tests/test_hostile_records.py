"""Specs of hostile peers' records without a swarm or PostgreSQL: the demo's hostile peer announces
what petals itself accepts; Prometheus labels made of announced text stay bounded in count and
length; the overview names a row the database refused and lists the reachability issues of the
latest poll only. A hostile peer in a real swarm, and many generated records through the real
store on SQLite and PostgreSQL: ``test_hostile.py``.
"""

from __future__ import annotations

import random

from monitor.app.jobs import Poller
from monitor.settings import ModelConfig, Settings
from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow, Snapshot
from monitor.harness.hostile import LARGEST_UINT
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.web import create_app
from monitor.web.metrics import MAX_LABEL_CHARS, MAX_VERSION_LABELS
from support import metric_families, metric_sample, seeded_peer_id, strict_json

N = TINY_NUM_BLOCKS
TINY = ModelInfo(TINY_DHT_PREFIX, N, official=True)
INT64_MAX = 2**63 - 1


def test_metric_labels_from_announced_text_are_bounded_in_count_and_length(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        rng = random.Random(3)
        versions = [f"2.{i}." + "9" * (i * 3) for i in range(MAX_VERSION_LABELS + 12)]
        rows = [ServerRow(seeded_peer_id(rng), TINY_DHT_PREFIX, 0, N, ONLINE, throughput=1.0, version=v) for v in versions]
        rows += [ServerRow(seeded_peer_id(rng), TINY_DHT_PREFIX, 0, N, ONLINE, throughput=1.0, version=versions[-1])]
        snapshot = Snapshot(taken_at=1_700_000_000.0, duration=0.5, models=(TINY,), servers=tuple(rows))
        settings = Settings(data_dir=tmp_path, models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)])
        store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, {}))

        family = metric_families(create_app(settings, store).test_client())["server_version"]
        labels = {s.labels["version_number"]: s.value for s in family.samples}
        assert len(labels) == MAX_VERSION_LABELS + 1 and labels["other"] == len(rows) - MAX_VERSION_LABELS - 1
        assert all(len(v) <= MAX_LABEL_CHARS for v in labels)
        assert sum(labels.values()) == len(rows)
        long_kept = [v for v in labels if v != "other" and len(v) == MAX_LABEL_CHARS]
        assert long_kept and len(set(long_kept)) == len(long_kept)  # cut, and still distinct
    finally:
        store.close()


def test_the_overview_names_refused_rows_and_lists_reachability_issues_of_the_latest_poll_only(tmp_path):
    import time

    from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult

    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        rng, now = random.Random(8), time.time()
        honest, left, huge = seeded_peer_id(rng), seeded_peer_id(rng), seeded_peer_id(rng)
        settings = Settings(data_dir=tmp_path, models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)])
        poller = Poller(settings, store, dht=None)

        def poll(at, rows):
            snapshot = Snapshot(taken_at=at, duration=0.5, models=(TINY,), servers=tuple(rows))
            store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))

        def server(peer, **extra):
            return ServerRow(peer, TINY_DHT_PREFIX, 0, N, ONLINE, throughput=5.0, **extra)

        store.record_reachability(ReachabilityBatch(now - 130, 1.0, (ReachabilityResult(honest, "server", True, rtt=0.01),
                                                        ReachabilityResult(left, "server", False, error="timeout"))))
        poll(now - 120, [server(honest), server(left)])
        poll(now - 60, [server(honest), server(huge, cache_tokens_left=LARGEST_UINT)])  # past the edge: a bug there

        client = create_app(settings, store).test_client()
        overview = client.get("/").get_data(as_text=True)
        assert 'data-dropped-rows="1"' in overview and "was not stored: the database refused it" in overview
        state = strict_json(client.get("/api/v1/state").get_data(as_text=True))
        assert state["reachability_issues"] == []  # the peer that left is not an issue forever
        assert [row["peer_id"] for row in state["model_reports"][0]["server_rows"]] == [honest]
        families = metric_families(client)
        assert metric_sample(families, "swarm_monitor_last_poll_ok") == 1
        assert metric_sample(families, "swarm_monitor_last_poll_dropped_rows") == 1
        assert metric_sample(families, "swarm_monitor_dropped_rows_24h") == 1
        assert metric_sample(families, "swarm_monitor_unreachable_peers") == 0
    finally:
        store.close()


def test_the_hostile_records_are_what_petals_itself_accepts():
    """The demo's hostile peer is a real threat: petals' own parser takes its records at the edges
    (its RTTs that are NaN or negative it refuses; the monitor drops just those entries)."""
    from petals.data_structures import ServerInfo

    from monitor.harness.hostile import hostile_records

    accepted = {"integers at the edge of the wire format", "floats at the edge of the wire format",
                "text with control and bidi characters, far too long"}
    for record in hostile_records(N, random.Random(5)):
        if record.what in accepted:
            info = ServerInfo.from_tuple(record.value)
            assert info.start_block == 0 and info.end_block == N
    ints = hostile_records(N, random.Random(5))[0]
    assert ServerInfo.from_tuple(ints.value).cache_tokens_left == LARGEST_UINT > INT64_MAX
