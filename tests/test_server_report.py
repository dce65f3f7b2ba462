"""Specs of "is my server OK?" on a made-up week: a store filled through its own write path in
which servers leave, announce OFFLINE, move to another model, load, run an old version or cannot
be reached, diagnosed and scored by the poller's own analysis (no DHT needed for that). The report
of a real swarm, its live check and a contributor's visit in Chromium: ``test_my_server.py``.
"""

from __future__ import annotations

import re
import time

import pytest

from monitor.app.jobs import Poller
from monitor.settings import ModelConfig, Settings
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.store import Store
from monitor.web import create_app
from support import peer, report_of

WEEK_MODEL = ModelInfo("week-model", 12, name="Week Model")
RETIRED = ModelInfo("retired-model", 4)


def row(name: str, start: int, end: int, state: str = ONLINE, model: ModelInfo = WEEK_MODEL,
        version: str = "2.2.0") -> ServerRow:
    return ServerRow(peer(name), model.dht_prefix, start, end, state, throughput=100.0, version=version,
                     public_name=name)


@pytest.fixture
def week(tmp_path):
    """Polls every 10 minutes for a day. "steady" serves 0:12 and is alone on 8:12; "helper" 0:8;
    "leaver" left 3 hours ago without a word; "quitter" announced OFFLINE 3 hours ago, then left;
    "mover" served a model the swarm no longer announces; "joiner" is loading; "old" runs an old
    petals; "walled" announces ONLINE but its reachability checks fail."""
    settings = Settings(data_dir=tmp_path, models=[ModelConfig(dht_prefix=WEEK_MODEL.dht_prefix, num_blocks=12)])
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    poller = Poller(settings, store, dht=None)
    now = time.time()
    start = now - 86400
    at = start
    while at < now - 60:
        ago = now - at
        rows = [row("steady", 0, 12), row("helper", 0, 8), row("walled", 0, 12), row("old", 0, 4, version="2.0.1")]
        rows.append(row("joiner", 4, 8, JOINING if ago < 1800 else ONLINE))
        if ago > 3 * 3600:
            rows.append(row("leaver", 0, 6))
        if ago > 3 * 3600 + 600:
            rows.append(row("quitter", 6, 12))
        elif ago > 3 * 3600:
            rows.append(row("quitter", 6, 12, OFFLINE))
        models = (WEEK_MODEL,)
        if ago > 6 * 3600:
            rows.append(row("mover", 0, 4, model=RETIRED))
            models = (WEEK_MODEL, RETIRED)
        snapshot = Snapshot(taken_at=at, duration=1.0, models=models, servers=tuple(rows))
        checks = ReachabilityBatch(at + 5, 1.0, tuple(
            ReachabilityResult(r.peer_id, "server", r.public_name != "walled", rtt=0.02 if r.public_name != "walled" else None,
                        error="Failed to connect in 5 sec" if r.public_name == "walled" else None)
            for r in rows if r.state == ONLINE))
        store.record_reachability(checks)
        store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))
        at += 600
    store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=30)
    poller.refresh_scores(now)
    yield create_app(settings, store).test_client(), store
    store.close()


def test_a_server_that_left_says_when_and_how(week):
    client, _ = week
    leaver = report_of(client, peer("leaver"))
    assert re.search(r"Not in the latest poll\. It was last seen 3 h ago \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\), "
                     r"ONLINE on blocks 0:6 of Week Model, and left without announcing OFFLINE", leaver), leaver
    assert "left without announcing OFFLINE" in leaver and "restart it" in leaver
    as_json = client.get(f"/api/v1/peers/{peer('leaver')}/report").get_json()
    assert as_json["status"] == "bad" and as_json["checks"][0]["name"] == "visible"
    assert "left without announcing OFFLINE" in as_json["checks"][0]["text"] and as_json["checks"][0]["advice"]
    never = client.get(f"/api/v1/peers/{peer('never here')}/report").get_json()
    assert never["checks"][0]["text"].startswith("Never seen in this swarm's DHT")
    quitter = report_of(client, peer("quitter"))
    assert "It announced OFFLINE 3 h ago" in quitter and "clean shutdown" in quitter
    mover = report_of(client, peer("mover"))
    assert "serving retired-model, a model this monitor does not see in the DHT any more" in mover
    assert "week-model" in mover  # what this monitor does watch
    assert "Health score" in leaver  # still scored: it was seen this week


def test_a_server_that_is_there_but_not_serving_says_why_and_what_to_do(week):
    client, _ = week
    walled = report_of(client, peer("walled"))
    assert "could not reach it: Failed to connect in 5 sec" in walled
    assert "port is reachable from the internet" in walled
    assert "does not count it as serving its blocks" in walled
    joiner = report_of(client, peer("joiner"))
    assert "Announces JOINING on blocks 4:8 of Week Model" in joiner and "still loading its blocks" in joiner
    old = report_of(client, peer("old"))
    assert "It runs petals 2.0.1; most servers run 2.2.0" in old


def test_a_server_alone_on_some_blocks_is_told_so_and_where_a_new_one_helps(week):
    client, _ = week
    steady = report_of(client, peer("steady"))
    assert "is visible, reachable and serving 0:12 of Week Model" in steady
    assert "it is the only server of 8:12" in steady  # walled does not count: unreachable
    assert "Where a server helps most now" in steady
    start, end = map(int, re.search(r"--block_indices (\d+):(\d+) —", steady).groups())
    assert start <= 8 and end == 12  # petals' block selection covers the blocks only steady serves


def test_the_report_follows_the_store(week):
    client, store = week
    assert "JOINING" in report_of(client, peer("joiner"))
    latest = store.latest_snapshot()
    rows = tuple(r if r.public_name != "joiner" else ServerRow(**{**vars(r), "state": ONLINE}) for r in latest.servers)
    store.record_poll(Snapshot(taken_at=time.time(), duration=1.0, models=latest.models, servers=rows))
    assert "Announces ONLINE on blocks 4:8" in report_of(client, peer("joiner"))  # a new poll: read again
