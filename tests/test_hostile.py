"""Specs of the monitor against a hostile or broken peer: whatever a peer announces, every poll
is stored, the honest servers stay shown, every bound is enforced and counted, and a poll the
database refuses is recorded as failed with its real cause.

The end-to-end specs run a real private swarm into which a made-up peer announces hostile records
(``monitor.harness.hostile``, the demo's "hostile" chaos action), the real poller, a real SQLite and
PostgreSQL store, and the real pages, ``/api/v1/state`` and ``/metrics``. The property-style spec
feeds many generated records (valid, at the edges, invalid; a seeded ``random.Random``) through the
real parsing and the real store. Hostile records without a swarm or PostgreSQL (what petals
accepts, bounded metric labels, refused rows on the overview): ``test_hostile_records.py``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter

import pytest

from monitor.app.jobs import Poller
from monitor.settings import ModelConfig, Settings
from monitor.core.snapshot import ONLINE, ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.harness.hostile import LARGEST_FLOAT, LARGEST_UINT, announce_hostile
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.swarm.scrape import _rows_for_model  # the scrape's own spans (petals' compute_spans)
from monitor.swarm.announce import MAX_CACHE_TOKENS, MAX_RPS, MAX_TEXT_CHARS, InvalidRecord, parse_server_record
from monitor.web import create_app
from monitor.web.metrics import MAX_LABEL_CHARS
from support import (STEADY_UPDATE_PERIOD, STORE_KINDS, metric_families, metric_sample, migrated_store, seeded_peer_id,
                     strict_json)

N = TINY_NUM_BLOCKS
TINY = ModelInfo(TINY_DHT_PREFIX, N, official=True)
HONEST = (ServerSpec("honest-a", 0, N, throughput=40.0, public_name="honest-a"),
          ServerSpec("honest-b", 0, N, throughput=30.0, public_name="honest-b"))
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def hostile_swarm(tiny_model):
    """Two honest servers, and a made-up peer's hostile records on every block (``.hostile``)."""
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as s:
        s.start(HONEST)
        s.hostile = announce_hostile(s.dht, TINY_DHT_PREFIX, N, rng=random.Random(11))
        yield s


@pytest.fixture(params=STORE_KINDS)
def store(request, tmp_path):
    url = (f"sqlite:///{tmp_path / 'monitor.db'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))
    s = Store(url)
    s.migrate()
    yield s
    s.close()


def settings_for(swarm: LocalSwarm, tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, initial_peers=swarm.initial_peers, reachability_timeout=2,
                    models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)])


def expected_bounds(records) -> tuple[int, int]:
    """(values the real parser bounds, DHT entries it rejects) for these records on every block."""
    clamped = invalid = 0
    for record in records:
        try:
            clamped += parse_server_record(record.value, num_blocks=N, peer_id=record.peer_id).clamped
        except InvalidRecord:
            invalid += record.end - record.start
    return clamped, invalid


def poll_round(poller: Poller) -> None:
    poller.check_reachability_once()
    assert poller.poll_once() is not None


# ---- a hostile peer in a real swarm ---------------------------------------------------------------


def test_servers_announced_under_fresh_ids_cost_a_poll_one_batch_of_checks_a_stale_failure_first(
        hostile_swarm, tmp_path):
    """The made-up peer's records are ONLINE servers no poller has checked, as a peer announcing
    fresh ids every poll makes them: each poll checks at once at most one batch
    (``reachability_concurrency``) of the servers it finds new, the rest waiting for a later poll
    or the round; an honest server whose stored verdict is a failure (down before this poller
    started) is checked first."""
    honest_b = hostile_swarm.peer_id("honest-b")
    batch = 2
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}") as store:
        store.record_reachability(ReachabilityBatch(time.time() - 60, 1.0, (
            ReachabilityResult(honest_b, "server", False, error="failed to dial: connection refused"),)))
        settings = settings_for(hostile_swarm, tmp_path).model_copy(update={"reachability_concurrency": batch})
        poller = Poller(settings, store, hostile_swarm.dht)

        snapshot = poller.poll_once()
        online = {row.peer_id for row in snapshot.servers if row.state == "ONLINE"}
        assert len(online) >= 2 * batch + 1, online  # the honest two and the made-up ones: more than two batches
        checked = [set(store.latest_reachability()) & online]
        assert len(checked[0]) == batch and store.latest_reachability()[honest_b].ok  # the stale failure went first
        assert poller.poll_once() is not None
        checked.append(set(store.latest_reachability()) & online)
        assert checked[0] < checked[1] and len(checked[1]) == 2 * batch  # one more batch, of others


def test_hostile_announcements_cost_no_poll_and_hide_no_honest_server(hostile_swarm, store, tmp_path):
    settings = settings_for(hostile_swarm, tmp_path)
    poller = Poller(settings, store, hostile_swarm.dht)
    client = create_app(settings, store).test_client()
    clamped, invalid = expected_bounds(hostile_swarm.hostile)
    assert clamped >= 6 and invalid == 5 * N  # the records really are at and beyond the edges

    seen_polls = []
    for _ in range(3):  # every poll is stored, and the pages follow each one
        poll_round(poller)
        last = store.last_poll()
        assert last.ok, last.errors
        assert (last.clamped_values, last.invalid_records, last.dropped_rows) == (clamped, invalid, 0)
        seen_polls.append(strict_json(client.get("/api/v1/state").get_data(as_text=True))["last_updated"])
    assert poller.stats.failures.get("scrape", 0) == 0
    assert seen_polls == sorted(set(seen_polls))

    rows = {row.peer_id: row for row in store.latest_snapshot().rows_for(TINY_DHT_PREFIX)}
    honest = {hostile_swarm.peer_id(spec.name): spec for spec in HONEST}
    storable = {r.what: r.peer_id for r in hostile_swarm.hostile if r.storable}
    malformed = {r.peer_id for r in hostile_swarm.hostile if not r.storable}
    assert set(rows) == set(honest) | set(storable.values())  # the malformed ones are dropped
    assert not malformed & set(rows)
    for peer, spec in honest.items():
        assert (rows[peer].start, rows[peer].end, rows[peer].throughput, rows[peer].public_name) == (
            0, N, spec.throughput, spec.public_name)
    assert rows[storable["integers at the edge of the wire format"]].cache_tokens_left == MAX_CACHE_TOKENS
    floats = rows[storable["floats at the edge of the wire format"]]
    assert floats.throughput == floats.inference_rps == floats.network_rps == MAX_RPS
    text = rows[storable["text with control and bidi characters, far too long"]]
    assert len(text.public_name) <= MAX_TEXT_CHARS
    assert "\u202e" not in text.public_name and "\x1b" not in text.public_name

    # /api/v1/state: strict JSON, honest servers online, the model served, every number finite
    state = strict_json(client.get("/api/v1/state").get_data(as_text=True))
    [report] = state["model_reports"]
    by_peer = {row["peer_id"]: row for row in report["server_rows"]}
    assert all(by_peer[peer]["state"] == "online" for peer in honest)
    assert report["monitor_state"] != "broken" and report["coverage_pct"] == 100
    assert {issue["peer_id"] for issue in state["reachability_issues"]} <= set(rows)  # latest poll only
    assert state["poll"]["errors"] == []

    # the pages: honest names shown, hostile text escaped and cut
    overview = client.get("/").get_data(as_text=True)
    assert "honest-a" in overview and "honest-b" in overview
    model_page = client.get(f"/models/{TINY_DHT_PREFIX}").get_data(as_text=True)
    assert all(spec.public_name in model_page for spec in HONEST)
    assert "\x1b" not in model_page and "\u202e" not in model_page

    # /metrics: the truth about every poll, the bounded values counted, every sample finite
    families = metric_families(client)
    assert metric_sample(families, "swarm_monitor_last_poll_ok") == 1
    assert metric_sample(families, "swarm_monitor_polls_24h", result="ok") == 3
    assert metric_sample(families, "swarm_monitor_polls_24h", result="failed") == 0
    assert metric_sample(families, "swarm_monitor_clamped_values_24h") == 3 * clamped
    assert metric_sample(families, "swarm_monitor_invalid_records_24h") == 3 * invalid
    assert metric_sample(families, "swarm_monitor_last_poll_clamped_values") == clamped
    assert metric_sample(families, "swarm_monitor_dropped_rows_24h") == 0
    for family in families.values():
        for s in family.samples:
            assert math.isfinite(s.value), (s.name, s.labels, s.value)
            assert all(len(v) <= MAX_LABEL_CHARS for v in s.labels.values()), (s.name, s.labels)


def test_a_poll_the_database_refuses_is_recorded_as_failed_with_its_real_cause(hostile_swarm, store, tmp_path,
                                                                               caplog):
    settings = settings_for(hostile_swarm, tmp_path)
    poller = Poller(settings, store, hostile_swarm.dht)
    client = create_app(settings, store).test_client()
    poll_round(poller)
    assert store.last_poll().ok

    refuse_successful_polls(store, True)  # the database itself now refuses every successful poll
    try:
        with caplog.at_level(logging.WARNING, logger="monitor.app.runner"):
            assert poller.poll_once() is not None
        last = store.last_poll()
        assert not last.ok
        [error] = last.errors
        assert error.startswith("storing the poll failed: the database refused its data (") and "refuse" in error
        logged = [r.getMessage() for r in caplog.records if r.name == "monitor.app.runner"]
        assert any("refused the data" in line for line in logged), logged
        assert not any("unavailable" in line for line in logged), logged

        families = metric_families(client)
        assert metric_sample(families, "swarm_monitor_last_poll_ok") == 0
        assert metric_sample(families, "swarm_monitor_polls_24h", result="failed") == 1
        assert metric_sample(families, "swarm_monitor_last_poll_timestamp_seconds") == pytest.approx(last.at)
        overview = client.get("/").get_data(as_text=True)
        assert "The last poll failed" in overview and "the database refused its data" in overview
        assert "honest-a" in overview  # the last good state stays shown
    finally:
        refuse_successful_polls(store, False)

    poll_round(poller)  # once the database takes polls again, they are stored again
    assert store.last_poll().ok
    families = metric_families(client)
    assert metric_sample(families, "swarm_monitor_last_poll_ok") == 1
    assert metric_sample(families, "swarm_monitor_polls_24h", result="ok") == 2
    assert metric_sample(families, "swarm_monitor_polls_24h", result="failed") == 1


def refuse_successful_polls(store: Store, refuse: bool) -> None:
    """A real constraint in the database that refuses successful polls (failed ones pass)."""
    sqlite = store.db.dialect == "sqlite"
    with store.engine.begin() as conn:
        if sqlite and refuse:
            conn.exec_driver_sql("CREATE TRIGGER refuse_ok_polls BEFORE INSERT ON polls WHEN NEW.ok "
                                 "BEGIN SELECT RAISE(ABORT, 'successful polls refused by a test trigger'); END")
        elif sqlite:
            conn.exec_driver_sql("DROP TRIGGER refuse_ok_polls")
        elif refuse:
            conn.exec_driver_sql("ALTER TABLE polls ADD CONSTRAINT refuse_ok_polls CHECK (NOT ok) NOT VALID")
        else:
            conn.exec_driver_sql("ALTER TABLE polls DROP CONSTRAINT refuse_ok_polls")


# ---- many generated records through the real parsing and the real store ------------------------------

EDGE_NUMBERS = (0, 1, 0.5, 123.25, 1e9, 1e9 + 1, 2**31, 2**53 + 1, INT64_MAX, 2**63, LARGEST_UINT, 2**70,
                LARGEST_FLOAT, 5e-324, -0.0, -1, -1e308, math.nan, math.inf, -math.inf, True, None, "1", [1])
EDGE_TEXT = ("", "ok", "\x00", "a\u202eb\u200b", "x" * 300, "x" * 5000, "🦙" * 60, "\x1b[31m", 1, None, b"bytes")


def generated_record(rng: random.Random, num_blocks: int):
    """One announcement: mostly well-formed, with fields drawn from valid, edge and invalid values."""
    if rng.random() < 0.05:
        return rng.choice(("garbage", None, [], [2], (2,), 42, {"a": 1}, (2, 1.0, "extra")))

    def number():
        return rng.choice(EDGE_NUMBERS) if rng.random() < 0.1 else rng.uniform(0, 1000)

    extra: dict = {}
    if rng.random() < 0.8:
        start = rng.randrange(num_blocks)
        extra.update(start_block=start, end_block=rng.randint(start + 1, num_blocks))
    else:
        extra.update(start_block=rng.choice((0, -1, num_blocks, 2**63, None, 1.0)),
                     end_block=rng.choice((num_blocks, num_blocks + 1, 0, None, LARGEST_UINT)))
    for name in ("inference_rps", "forward_rps", "network_rps"):
        if rng.random() < 0.7:
            extra[name] = number()
    if rng.random() < 0.7:
        extra["cache_tokens_left"] = rng.choice(EDGE_NUMBERS) if rng.random() < 0.15 else rng.randrange(2**20)
    for name in ("public_name", "version", "torch_dtype", "quant_type"):
        if rng.random() < 0.5:
            extra[name] = rng.choice(EDGE_TEXT) if rng.random() < 0.3 else f"{name}-{rng.randrange(100)}"
    if rng.random() < 0.2:
        extra["adapters"] = rng.choice(([], ["a/lora"], ["\u202e" * 500], [1], "not-a-list", ["x"] * 100))
    if rng.random() < 0.3:
        extra["using_relay"] = rng.choice((True, False, True, False, "yes", 1))
    if rng.random() < 0.4:
        extra["next_pings"] = {seeded_peer_id(rng): number() for _ in range(rng.randrange(4))}
        if rng.random() < 0.05:
            extra["next_pings"]["not-a-peer"] = 0.1
    state = rng.choice((2,) * 8 + (1, 0, True, 7, -1, "2", 2.0))
    return (state, number(), extra)


def unbounded_row(rng: random.Random, peer: str) -> tuple[ServerRow, int, int]:
    """A row that did not pass the DHT edge (a bug there, or a future field): (row, rows the store
    must refuse, values it must bound) — the same on SQLite and PostgreSQL."""
    if rng.random() < 0.5:
        return ServerRow(peer, TINY_DHT_PREFIX, 0, N, ONLINE, throughput=1.0,
                         cache_tokens_left=rng.choice((2**63, LARGEST_UINT, 2**80))), 1, 0
    bad = rng.choice((math.nan, math.inf, -math.inf))
    return ServerRow(peer, TINY_DHT_PREFIX, 0, N, ONLINE, throughput=bad, inference_rps=bad, forward_rps=1.0), 0, 2


def _numbers(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_many_generated_records_through_parsing_and_storing_lose_no_poll(store, tmp_path):
    rng = random.Random(20241130)
    poller = Poller(Settings(data_dir=tmp_path, models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)]),
                    store, dht=None)
    polls, records_per_poll, t0 = 30, 25, 1_700_000_000.0
    outcomes: Counter = Counter()
    for i in range(polls):
        blocks: list[dict] = [{} for _ in range(N)]
        invalid = 0
        for _ in range(records_per_poll):
            peer, raw = seeded_peer_id(rng), generated_record(rng, N)
            try:
                record = parse_server_record(raw, num_blocks=N, peer_id=peer)
            except InvalidRecord:  # the only way the parser may refuse a record
                invalid += 1
                continue
            for block in range(record.start_block or 0, N if record.end_block is None else record.end_block):
                blocks[block][peer] = record
            outcomes["parsed"] += 1
        rows, clamped = _rows_for_model(TINY, blocks)
        refused = bounded = 0
        if rng.random() < 0.4:
            row, refused, bounded = unbounded_row(rng, seeded_peer_id(rng))
            rows.append(row)
        snapshot = Snapshot(taken_at=t0 + 60 * i, duration=0.5, models=(TINY,), servers=tuple(rows),
                            invalid_records=invalid, clamped_values=clamped)
        assessments = poller.assess(snapshot, {})  # as the poller does: a failed diagnosis costs no poll
        poll_id = store.record_poll(snapshot, assessments)

        last = store.last_poll()
        assert (last.id, last.ok) == (poll_id, True), last.errors
        assert (last.dropped_rows, last.clamped_values, last.invalid_records) == (refused, clamped + bounded, invalid)
        assert len([e for e in last.errors if "was not stored" in e]) == refused
        stored = store.latest_snapshot()
        assert len(stored.servers) == len(rows) - refused
        for row in stored.servers:
            for value in _numbers([row.throughput, row.inference_rps, row.forward_rps, row.network_rps,
                                   row.cache_tokens_left, row.start, row.end]):
                assert math.isfinite(value) and abs(value) <= INT64_MAX, row
        for health in store.latest_assessments().values():
            assert all(math.isfinite(v) for v in _numbers(health.to_dict()))
        outcomes["refused"] += refused
        outcomes["bounded"] += bounded
    counts = store.poll_counts(t0 - 1)
    assert (counts["ok"], counts["failed"]) == (polls, 0)
    assert counts["dropped_rows"] == outcomes["refused"] > 0 and outcomes["bounded"] > 0
    assert outcomes["parsed"] > polls * records_per_poll // 4  # the generator makes records that parse, too


# ---- the demo panel's hostile peer --------------------------------------------------------------------


def test_the_demo_panel_announces_hostile_records_for_operators_and_polls_go_on(hostile_swarm, tmp_path):
    """The demo's chaos action "hostile" (the panel's button, `swarm-monitor chaos hostile`)."""
    from monitor.harness.demo_swarm import DemoControls

    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        settings = settings_for(hostile_swarm, tmp_path)
        app = create_app(settings, store, demo_controls=DemoControls(hostile_swarm))
        client = app.test_client()
        assert client.post("/demo/hostile").status_code in (401, 403)  # anonymous: no chaos
        response = client.post("/demo/hostile", headers={"Authorization": f"Bearer {app.extensions['operator_token']}"})
        assert response.status_code == 200 and "failed" not in response.get_data(as_text=True)

        poller = Poller(settings, store, hostile_swarm.dht)
        poll_round(poller)
        last = store.last_poll()
        _, invalid = expected_bounds(hostile_swarm.hostile)
        assert last.ok and last.invalid_records == 2 * invalid  # the module's records and the panel's
        shown = {row.peer_id for row in store.latest_snapshot().servers}
        assert {hostile_swarm.peer_id(spec.name) for spec in HONEST} <= shown
    finally:
        store.close()
