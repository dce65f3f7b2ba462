"""Specs of the SQL store, on SQLite and on a real PostgreSQL (tests/postgres.py).

Polls are written through the store's own write path (``record_poll``) with made-up times, so days
of history take a second; the swarm is not needed here. What only SQLite has (its file, its locks,
the size of thirty days): ``test_sqlite_store.py``.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
import sqlalchemy as sa

from monitor.core.common import DAY, HOUR, short_peer_id
from monitor.core.assessment import Assessment
from monitor.core.scores import PeerScore
from monitor.core.snapshot import (
    JOINING,
    OFFLINE,
    ONLINE,
    ChatOutcome,
    ModelInfo,
    ReachabilityBatch,
    ReachabilityResult,
    Snapshot,
)
from monitor.store import Store, StoreSchemaError, StoreUnavailable
from support import STORE_KINDS, STORE_LLAMA, migrated_store, peer_histories, store_url_of
from support import store_health as health, store_peer as peer, store_row as row, store_snapshot as snapshot

T0 = 1_699_999_200.0  # an hour boundary
LLAMA = STORE_LLAMA
MIXTRAL = ModelInfo("mixtral-hf", 4)


def stored_status(h: Assessment, at: float) -> dict:
    """What ``latest_model_status`` says of a poll recorded with ``h``."""
    return {"at": at, "state": h.state, "reasons": list(h.reasons), "coverage_pct": h.coverage_pct,
            "servers_online": h.servers_online, "min_redundancy": h.min_redundancy,
            "est_tokens_per_s": h.est_tokens_per_s}


@pytest.fixture(params=STORE_KINDS)
def store_url(request, tmp_path) -> str:
    return store_url_of(request, tmp_path / "db" / "monitor.db")


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as s:
        yield s


# ---- the latest poll -------------------------------------------------------------------------


def test_a_recorded_poll_comes_back_as_the_same_snapshot(store):
    full = row("full", throughput=101.5, inference_rps=12.25, forward_rps=300.0, network_rps=55.5,
               cache_tokens_left=2**33, version="2.2.0", torch_dtype="bfloat16", quant_type="nf4",
               using_relay=False, public_name="full 🦙", adapters=("a/lora",),
               next_pings={peer("half"): 0.012, peer("other"): 0.5})
    half = row("half", start=0, end=4, state=JOINING)
    mix = row("full", MIXTRAL, public_name="full 🦙")
    bare = row("bare", MIXTRAL, start=1, end=3, state=OFFLINE, using_relay=True)
    snap = snapshot(T0, [full, half, mix, bare], models=(LLAMA, MIXTRAL), invalid_records=3,
                    errors=("bad record from x",))

    llama = health(LLAMA, "degraded", blocks=[(2, 150.0)] * 4 + [(1, 101.5)] * 4, est_tokens_per_s=None)
    mixtral = health(MIXTRAL, "healthy")
    poll_id = store.record_poll(snap, [llama, mixtral])

    assert store.latest_snapshot() == snap
    last = store.last_poll()
    assert (last.id, last.at, last.ok, last.n_servers, last.n_models, last.invalid_records, last.errors) == (
        poll_id, T0, True, 4, 2, 3, ("bad record from x",))
    # each model's status, block coverage and diagnosis all come from its Assessment
    assert store.latest_model_status() == {LLAMA.dht_prefix: stored_status(llama, T0),
                                           MIXTRAL.dht_prefix: stored_status(mixtral, T0)}
    assert store.block_coverage_series(LLAMA.dht_prefix, T0, T0) == ([T0], [[2]] * 4 + [[1]] * 4)
    assert store.block_coverage_series(LLAMA.dht_prefix, T0, T0, value="throughput")[1][4] == [101.5]
    assert store.latest_assessments() == {LLAMA.dht_prefix: llama, MIXTRAL.dht_prefix: mixtral}
    assert store.peer_ids() == sorted([peer("full"), peer("half"), peer("bare")])


def test_the_latest_snapshot_is_the_latest_good_poll_not_a_failed_one(store):
    assert store.latest_snapshot() is None and store.last_poll() is None
    first = snapshot(T0, [row("a")])
    store.record_poll(first)
    store.record_poll(snapshot(T0 + 60, [row("a"), row("b")]))
    failed_id = store.record_failed_poll(T0 + 120, "TimeoutError: the DHT did not answer")

    assert store.latest_snapshot().taken_at == T0 + 60
    assert len(store.latest_snapshot().servers) == 2
    last = store.last_poll()
    assert (last.id, last.ok, last.errors) == (failed_id, False, ("TimeoutError: the DHT did not answer",))


def test_the_latest_polls_diagnoses_are_kept_and_replaced_and_change_the_marks(store):
    diagnosis = health(LLAMA, "healthy", est_tokens_per_s=float("inf"))
    marks = store.change_marks()
    store.record_poll(snapshot(T0, [row("a")]), [diagnosis])
    assert store.latest_assessments() == {LLAMA.dht_prefix: replace(diagnosis, est_tokens_per_s=None)}  # JSON: no inf
    assert store.latest_model_status()[LLAMA.dht_prefix]["est_tokens_per_s"] is None
    assert store.change_marks() != marks

    marks = store.change_marks()
    assert store.record_assessments([replace(diagnosis, state="degraded")], taken_at=T0)  # after a reachability round
    assert store.latest_assessments()[LLAMA.dht_prefix].state == "degraded"
    assert store.latest_model_status()[LLAMA.dht_prefix]["state"] == "healthy"  # the poll's status stays
    assert store.change_marks() != marks

    store.record_poll(snapshot(T0 + 60, [row("a")]))
    assert store.latest_assessments() == {}  # the older poll's diagnosis is not the newer poll's
    newer = health(LLAMA, "broken")
    store.record_poll(snapshot(T0 + 120, [row("a")]), [newer])
    # a re-diagnosis of an older poll that lands after a newer poll is dropped, not stored as the newer one's
    assert not store.record_assessments([diagnosis], taken_at=T0 + 60)
    assert store.latest_assessments() == {LLAMA.dht_prefix: newer}


def test_rows_the_database_refuses_cost_those_rows_not_the_poll(store):
    """Values the DHT edge should have bounded but did not (a bug there): a number beyond 64 bits
    costs its row, named and counted; a non-finite number is stored as NULL, counted."""
    good = row("good", throughput=10.0, next_pings={peer("huge"): 0.02})
    huge = row("huge", cache_tokens_left=2**64 - 1, public_name="huge")  # what msgpack carries, SQL does not
    nan = row("nan", throughput=float("nan"), inference_rps=float("inf"), forward_rps=-float("inf"),
              next_pings={peer("good"): float("nan")})
    snap = snapshot(T0, [good, huge, nan], clamped_values=2, errors=("one announcement beyond the cap",))
    diagnosis = health(LLAMA, "healthy", blocks=[(1, float("inf"))] + [(1, 1.0)] * 7, coverage_pct=float("nan"))
    poll_id = store.record_poll(snap, [diagnosis])

    last = store.last_poll()
    assert (last.id, last.ok, last.dropped_rows) == (poll_id, True, 1)
    assert last.clamped_values == 2 + 3 + 1 + 1  # the edge's 2; nan's three speeds; the block's inf; the NaN coverage
    assert last.errors[0] == "one announcement beyond the cap"
    [refusal] = last.errors[1:]
    assert refusal.startswith(f"server {short_peer_id(peer('huge'))} of {LLAMA.dht_prefix} (blocks 0:8) was not "
                              f"stored: the database refused it (")
    stored = {r.peer_id: r for r in store.latest_snapshot().servers}
    assert set(stored) == {peer("good"), peer("nan")}
    assert stored[peer("good")] == good
    assert (stored[peer("nan")].throughput, stored[peer("nan")].inference_rps, stored[peer("nan")].forward_rps) == (
        None, None, None)
    assert store.latest_model_status()[LLAMA.dht_prefix]["coverage_pct"] is None
    assert store.block_coverage_series(LLAMA.dht_prefix, T0, T0, value="throughput")[1][0] == [None]
    assert store.latest_assessments()[LLAMA.dht_prefix].blocks[0].total_throughput is None  # JSON: no inf
    counts = store.poll_counts(T0 - 1)
    assert (counts["ok"], counts["failed"], counts["dropped_rows"], counts["clamped_values"]) == (1, 0, 1, 7)

    # the next poll of the same peers is stored whole again
    store.record_poll(snapshot(T0 + 60, [good, replace(huge, cache_tokens_left=2**40)]))
    assert store.last_poll().dropped_rows == 0 and len(store.latest_snapshot().servers) == 2


def test_a_failed_poll_keeps_its_cause_in_one_line(store):
    store.record_poll(snapshot(T0, [row("a")]))
    cause = "storing the poll failed: the database refused its data (NumericValueOutOfRange: bigint out of range)"
    failed = store.record_failed_poll(T0 + 60, cause + "\nDETAIL: internals", duration=float("nan"))
    last = store.last_poll()
    assert (last.id, last.ok, last.errors, last.duration) == (failed, False, (cause,), 0.0)
    assert store.latest_snapshot().taken_at == T0
    assert store.poll_counts(T0 - 1)["failed"] == 1


def test_next_pings_are_kept_for_an_hour_only(store):
    pinging = row("a", next_pings={peer("b"): 0.01})
    store.record_poll(snapshot(T0, [pinging]))
    store.record_poll(snapshot(T0 + 2 * HOUR, [pinging]))
    assert store.latest_snapshot().servers[0].next_pings == {peer("b"): 0.01}
    with store.engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT at FROM server_pings")).scalars().all()
    assert kept == [T0 + 2 * HOUR]


def test_the_latest_reachability_checks_are_the_newest_per_peer(store):
    store.record_reachability(ReachabilityBatch(T0, 1.0, (ReachabilityResult(peer("a"), "server", True, rtt=0.02),
                                             ReachabilityResult(peer("b"), "server", False, error="timeout"))))
    store.record_reachability(ReachabilityBatch(T0 + 60, 1.0, (
        ReachabilityResult(peer("a"), "server", False, joining=True, error="protocol not supported"),
        ReachabilityResult(peer("boot"), "bootstrap", True, rtt=0.001, address="/ip4/127.0.0.1/tcp/1/p2p/x"))))
    store.record_reachability(ReachabilityBatch(T0 - 60, 1.0, (ReachabilityResult(peer("a"), "server", True, rtt=9.0),)))  # late

    latest = store.latest_reachability()
    assert latest == {
        peer("a"): ReachabilityResult(peer("a"), "server", False, joining=True, error="protocol not supported"),
        peer("b"): ReachabilityResult(peer("b"), "server", False, error="timeout"),
        peer("boot"): ReachabilityResult(peer("boot"), "bootstrap", True, rtt=0.001, address="/ip4/127.0.0.1/tcp/1/p2p/x"),
    }
    assert store.peer_ids() == []  # checked peers are not servers until a poll sees them


def test_scores_keep_the_latest_per_peer(store):
    store.record_scores([PeerScore(peer("a"), 40.0, {"uptime": (0.5, 30.0, 15.0)}, ("online 50%",), at=T0)])
    latest = PeerScore(peer("a"), 72.5, {"uptime": (0.9, 30.0, 27.0)}, ("online 90%",), at=T0 + 60)
    store.record_scores([latest])
    assert store.latest_scores() == {peer("a"): latest}

    before = time.time()
    store.record_scores([PeerScore(peer("b"), 50.0, {}, ())])  # not stamped: stored as of now
    assert before <= store.latest_scores()[peer("b")].at <= time.time()


def test_a_reopened_store_keeps_history(store_url):
    first = Store(store_url)
    first.migrate()
    snap = snapshot(T0, [row("a", throughput=3.0)])
    first.record_poll(snap, [health(LLAMA, "healthy")])
    first.record_chat_outcome(ChatOutcome(T0, peer("a"), LLAMA.dht_prefix, 0, 8, ok=False, error="timed out"))
    first.close()

    again = Store(store_url)  # a service restart
    again.migrate()  # a no-op at head
    try:
        assert again.latest_snapshot() == snap
        history = again.peer_history(peer("a"), T0 - 1, T0 + 1)
        assert history.outcomes[0].error == "timed out"
        assert history.first_seen == T0
    finally:
        again.close()


# ---- history ---------------------------------------------------------------------------------


def test_state_changes_and_outages_come_from_consecutive_polls(store):
    states = ["healthy", "healthy", "broken", "broken", "degraded", "broken", "healthy"]
    for i, state in enumerate(states):
        store.record_poll(snapshot(T0 + 60 * i, [row("a")]), [health(LLAMA, state)])

    changes = store.state_changes(LLAMA.dht_prefix, T0, T0 + 3600)
    assert [(c.at - T0, c.from_state, c.to_state) for c in changes] == [
        (0, None, "healthy"), (120, "healthy", "broken"), (240, "broken", "degraded"),
        (300, "degraded", "broken"), (360, "broken", "healthy")]
    assert changes[1].reasons == ("broken because",)
    assert store.outage_intervals(LLAMA.dht_prefix, T0, T0 + 3600) == [(T0 + 120, T0 + 240), (T0 + 300, T0 + 360)]
    # an outage that began before the window is returned whole; one still going has no end
    assert store.outage_intervals(LLAMA.dht_prefix, T0 + 200, T0 + 250) == [(T0 + 120, T0 + 240)]
    store.record_poll(snapshot(T0 + 420, [row("a")]), [health(LLAMA, "broken")])
    assert store.outage_intervals(LLAMA.dht_prefix, T0 + 400, T0 + 500) == [(T0 + 420, None)]
    assert [h["state"] for h in store.model_status_history(LLAMA.dht_prefix, T0, T0 + 3600)] == states + ["broken"]


def test_peer_history_counts_the_polls_that_did_not_see_the_peer(store):
    # "b" appears at the second poll, misses the fourth, and serves two models
    for i in range(5):
        rows = [row("a")]
        if i in (1, 2, 4):
            rows += [row("b", throughput=10.0 + i), row("b", MIXTRAL, state=JOINING if i == 1 else ONLINE)]
        store.record_poll(snapshot(T0 + 60 * i, rows, models=(LLAMA, MIXTRAL)))
    store.record_failed_poll(T0 + 300, "scrape failed")  # a failed poll is no evidence either way
    store.record_reachability(ReachabilityBatch(T0 + 30, 0.5, (ReachabilityResult(peer("b"), "server", True, rtt=0.05),)))
    store.record_chat_outcome(ChatOutcome(T0 + 90, peer("b"), LLAMA.dht_prefix, 0, 8, ok=True, seconds_per_token=0.4))

    history = store.peer_history(peer("b"), T0, T0 + 400)
    assert history.first_seen == T0 + 60
    seen = [(o.at - T0, o.model, o.state, o.seen) for o in history.observations]
    assert sorted(seen) == sorted([
        (60, LLAMA.dht_prefix, ONLINE, True), (60, MIXTRAL.dht_prefix, JOINING, True),
        (120, LLAMA.dht_prefix, ONLINE, True), (120, MIXTRAL.dht_prefix, ONLINE, True),
        (180, LLAMA.dht_prefix, OFFLINE, False), (180, MIXTRAL.dht_prefix, OFFLINE, False),
        (240, LLAMA.dht_prefix, ONLINE, True), (240, MIXTRAL.dht_prefix, ONLINE, True),
    ])
    assert [o.at for o in history.observations] == sorted(o.at for o in history.observations)
    assert history.observations[0].throughput == 11.0
    assert history.reachability == ((T0 + 30, ReachabilityResult(peer("b"), "server", True, rtt=0.05)),)
    assert history.outcomes == (ChatOutcome(T0 + 90, peer("b"), LLAMA.dht_prefix, 0, 8, ok=True, seconds_per_token=0.4),)

    everyone = {h.peer_id: h for h in peer_histories(store, T0, T0 + 400)}
    assert set(everyone) == {peer("a"), peer("b")}
    assert everyone[peer("b")] == history
    assert all(o.seen for o in everyone[peer("a")].observations) and len(everyone[peer("a")].observations) == 5
    recent = {h.peer_id: h for h in peer_histories(store, T0, T0 + 400, reachability_since=T0 + 60)}
    assert recent[peer("b")].reachability == () and recent[peer("b")].observations == history.observations
    assert store.peer_history(peer("nobody"), T0, T0 + 400).observations == ()


# ---- rollups and retention -------------------------------------------------------------------


PER_HOUR = 3  # polls an hour in the rollup spec's four days (every 20 minutes)
PER_DAY = 24 * PER_HOUR
GONE = 3 * PER_HOUR  # the polls that miss "flaky" (3 hours)


def _four_days(store) -> float:
    """Polls every 20 min for 4 days: "steady" always ONLINE; "flaky" gone on day 1, hours 3-5;
    the model broken (block 2 unserved) in day 1, hour 4; reachability checks of both every 10 min."""
    t = T0
    rng = random.Random(7)
    while t < T0 + 4 * DAY:
        gone = T0 + 3 * HOUR <= t < T0 + 6 * HOUR
        broken = T0 + 4 * HOUR <= t < T0 + 5 * HOUR
        rows = [row("steady", throughput=100.0)] + ([] if gone else [row("flaky", throughput=50.0)])
        blocks = [(2, 150.0)] * LLAMA.num_blocks
        if broken:
            blocks[2] = (0, 0.0)
        store.record_poll(snapshot(t, rows), [health(LLAMA, "broken" if broken else "healthy", blocks=blocks)])
        store.record_reachability(ReachabilityBatch(t + 5, 1.0, (
            ReachabilityResult(peer("steady"), "server", True, rtt=0.02 + rng.random() / 100),
            ReachabilityResult(peer("flaky"), "server", not gone, rtt=None if gone else 0.03,
                        error="timeout" if gone else None))))
        t += HOUR // PER_HOUR
    return t


def _uptime(observations) -> tuple[int, int]:
    return (sum(o.samples for o in observations if o.seen and o.state == ONLINE), sum(o.samples for o in observations))


def _flaps(observations) -> int:
    up = [o.seen and o.state == ONLINE for o in observations]
    return sum(1 for before, after in zip(up, up[1:]) if before and not after)


def test_rollups_replace_old_raw_rows_and_every_query_still_covers_the_whole_range(store):
    end = _four_days(store)
    now = end + 1800
    model = LLAMA.dht_prefix
    before = {
        "uptime": _uptime(store.peer_history(peer("flaky"), T0, now).observations),
        "outages": store.outage_intervals(model, T0, now),
        "changes": store.state_changes(model, T0, now),
        "status_polls": len(store.model_status_history(model, T0, now)),
    }
    assert before["uptime"] == (4 * PER_DAY - GONE, 4 * PER_DAY)
    raw = store.peer_history(peer("flaky"), T0, now).observations
    merged = store.peer_history(peer("flaky"), T0, now, merge_runs=True).observations
    assert (_uptime(merged), _flaps(merged)) == (_uptime(raw), _flaps(raw)) == (before["uptime"], 1)
    assert len(merged) == 4 * 24 and len(raw) == 4 * PER_DAY  # one row per hour while nothing changes
    assert before["outages"] == [(T0 + 4 * HOUR, T0 + 5 * HOUR)]

    counts = store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=30)

    cutoff = T0 + 2 * DAY  # now - 2 days, floored to the hour
    assert counts["hours_rolled_up"] == 4 * 24
    assert counts["polls"] == 2 * PER_DAY and counts["server_observations"] == 2 * PER_DAY * 2 - GONE
    assert counts["reachability_results"] == 2 * PER_DAY * 2
    history = store.model_status_history(model, T0, now)
    hourly = [h for h in history if h["samples"] > 1]
    assert [h["at"] for h in hourly] == [T0 + i * HOUR for i in range(48)]  # old part: one row per hour
    assert all(h["samples"] == 1 and h["at"] >= cutoff for h in history[48:])  # raw part: every poll
    assert len(history) == 48 + 2 * PER_DAY
    broken_hour = hourly[4]
    assert (broken_hour["state"], broken_hour["states"], broken_hour["reasons"]) == (
        "broken", {"broken": PER_HOUR}, ["broken because"])
    assert hourly[3]["states"] == {"healthy": PER_HOUR}

    # the peer's uptime, the state changes and the outages are exactly what the raw rows said
    assert _uptime(store.peer_history(peer("flaky"), T0, now).observations) == before["uptime"]
    assert store.outage_intervals(model, T0, now) == before["outages"]
    assert store.state_changes(model, T0, now) == before["changes"]
    flaky_old = [o for o in store.peer_history(peer("flaky"), T0, cutoff).observations if o.at < cutoff]
    assert {(o.at, o.seen, o.samples) for o in flaky_old if not o.seen} == {
        (T0 + h * HOUR, False, PER_HOUR) for h in (3, 4, 5)}

    # the heatmap: hourly columns (min per block) for the old part, every poll for the recent part
    times, matrix = store.block_coverage_series(model, T0, now)
    assert len(times) == 48 + 2 * PER_DAY and times == sorted(times) and times[0] == T0
    assert len(matrix) == LLAMA.num_blocks
    assert matrix[2][4] == 0 and matrix[2][3] == 2 and matrix[1][4] == 2
    _, mean = store.block_coverage_series(model, T0, T0 + 6 * HOUR, stat="mean")
    assert mean[2][4] == 0 and mean[0][4] == 2
    _, throughput = store.block_coverage_series(model, T0, T0 + 2 * HOUR, value="throughput")
    assert throughput[0][0] == 150.0

    checks = _reachability_counts(store, peer("flaky"), T0, now)
    assert [c["n"] for c in checks[:48]] == [PER_HOUR] * 48 and checks[4]["ok"] == 0 and checks[2]["ok"] == PER_HOUR
    assert sum(c["n"] for c in checks) == 4 * PER_DAY
    assert all(at >= cutoff for at, _ in store.peer_history(peer("flaky"), T0, now).reachability)

    # idempotent: running again changes nothing
    again = store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=30)
    assert again["hours_rolled_up"] == 0 and sum(again.values()) == 0
    assert store.model_status_history(model, T0, now) == history

    # rollups older than their retention go too; the last state change per model stays
    later = now + 40 * DAY
    gone = store.rollup_and_prune(later, raw_retention_days=2, rollup_retention_days=30)
    assert gone["hourly_model_status"] == 96 - 0 and gone["polls"] == 2 * PER_DAY
    assert store.model_status_history(model, T0, later) == []
    assert store.state_changes(model, T0, later)[-1].to_state == "healthy"


def test_rollup_uptime_does_not_count_polls_before_a_peer_first_appeared(store):
    for i in range(6):  # "late" appears at the 4th poll of the hour
        store.record_poll(snapshot(T0 + 600 * i, [row("early")] + ([row("late")] if i >= 3 else [])))
    store.rollup_and_prune(T0 + 3 * DAY, raw_retention_days=1, rollup_retention_days=30)
    assert _uptime(store.peer_history(peer("late"), T0, T0 + HOUR).observations) == (3, 3)
    assert _uptime(store.peer_history(peer("early"), T0, T0 + HOUR).observations) == (6, 6)


def _reachability_counts(store, peer_id: str, since: float, until: float) -> list[dict]:
    """Oldest first: ``{at, n, ok}`` per rolled-up hour of the peer's reachability checks, then per
    raw check: what the ``hourly_reachability`` rollup keeps of ``reachability_results`` (the scores count it)."""
    from monitor.store import latest
    from monitor.store.hours import raw_start, rollup_window
    from monitor.store.schema import HourlyReachabilityRow, ReachabilityCheckRow

    h, p = HourlyReachabilityRow.__table__.c, ReachabilityCheckRow.__table__.c
    with store.db.read("reading reachability counts") as conn:
        key = latest.peer_key(conn, peer_id)
        hourly = conn.execute(sa.select(h.hour, h.n, h.ok).where(
            h.peer == key, *rollup_window(h.hour, since, until, raw_start(conn, p.at))).order_by(h.hour)).all()
        raw = conn.execute(sa.select(p.at, p.ok).where(p.peer == key, p.at >= since, p.at <= until)
                           .order_by(p.at)).all()
    return ([{"at": at, "n": n, "ok": ok} for at, n, ok in hourly]
            + [{"at": at, "n": 1, "ok": int(bool(ok))} for at, ok in raw])


def _hourly_polls(store, hour: float):
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT polls, ok_polls FROM hourly_polls WHERE hour = :h"), {"h": hour}).first()


def test_a_poll_stored_after_its_hour_was_rolled_up_is_rolled_up_too(store):
    for i in range(6):  # hour 0: six polls
        store.record_poll(snapshot(T0 + 600 * i, [row("a")]))
    store.record_poll(snapshot(T0 + HOUR + 60, [row("a")]))
    store.rollup_and_prune(T0 + HOUR + 120, raw_retention_days=10, rollup_retention_days=30)
    assert tuple(_hourly_polls(store, T0)) == (6, 6)

    # a poll taken in hour 0 that finished storing after the rollup ran, and a late reachability round
    store.record_poll(snapshot(T0 + 3599, [row("a"), row("late")]))
    store.record_reachability(ReachabilityBatch(T0 + 3000, 1.0, (ReachabilityResult(peer("late"), "server", True, rtt=0.01),)))
    counts = store.rollup_and_prune(T0 + 2 * HOUR + 60, raw_retention_days=10, rollup_retention_days=30)
    assert counts["hours_rolled_up"] == 2  # hour 0 again, and hour 1
    assert tuple(_hourly_polls(store, T0)) == (7, 7)
    assert [c["n"] for c in _reachability_counts(store, peer("late"), T0, T0 + HOUR)] == [1]


def test_raw_rows_are_never_pruned_before_they_are_rolled_up(store):
    from monitor.store import rollups

    for i in range(3 * 24):  # hourly polls for three days
        store.record_poll(snapshot(T0 + HOUR * i, [row("a")]))
    store.rollup_and_prune(T0 + 3 * DAY, raw_retention_days=2, rollup_retention_days=30)
    late = T0 + DAY + 5 * HOUR  # within the raw retention: its hour is still complete in raw rows
    store.record_poll(snapshot(late + 30, [row("a")]))  # stored late: the watermark moves back to its hour

    with store.db.write() as conn:  # pruning alone (as if the rollup had not run yet) stops at the watermark
        rollups._prune_raw(conn, T0 + 3 * DAY)
    with store.engine.connect() as conn:
        oldest = conn.execute(sa.text("SELECT MIN(at) FROM polls")).scalar()
    assert oldest == late  # the hour not rolled up again keeps its raw rows

    store.rollup_and_prune(T0 + 3 * DAY, raw_retention_days=2, rollup_retention_days=30)
    assert tuple(_hourly_polls(store, late)) == (2, 2)  # rolled up again, with the late poll
    assert tuple(_hourly_polls(store, T0)) == (1, 1)  # older hours keep their rollups


def test_the_now_tables_keep_only_what_was_seen_within_retention(store):
    seen_once, later = T0, T0 + 100 * DAY
    store.record_poll(snapshot(seen_once, [row("gone"), row("stays"), row("gone", MIXTRAL)], models=(LLAMA, MIXTRAL)))
    store.record_reachability(ReachabilityBatch(seen_once, 1.0, (ReachabilityResult(peer("gone"), "server", False, error="timeout"),)))
    store.record_scores([PeerScore(peer("gone"), 40.0, {}, (), at=seen_once)])
    store.set_peer_policy(peer("gone"), "blocked", at=seen_once)
    store.set_peer_policy(peer("stays"), "pinned", at=seen_once)
    store.record_poll(snapshot(later, [row("stays")]))
    store.record_reachability(ReachabilityBatch(later, 1.0, (ReachabilityResult(peer("stays"), "server", True, rtt=0.01),)))
    store.record_scores([PeerScore(peer("stays"), 90.0, {}, (), at=later)])

    counts = store.rollup_and_prune(later + 60, raw_retention_days=2, rollup_retention_days=30)
    assert (counts["latest_reachability"], counts["peer_scores"], counts["models"], counts["peers"],
            counts["peer_policies"]) == (1, 1, 1, 1, 1)
    assert set(store.latest_reachability()) == {peer("stays")} and set(store.latest_scores()) == {peer("stays")}
    assert store.peer_ids() == [peer("stays")]
    assert store.peer_policies() == {peer("stays"): "pinned"}  # its peer is still seen
    assert store.latest_snapshot().models == (LLAMA,)
    again = store.rollup_and_prune(later + 60, raw_retention_days=2, rollup_retention_days=30)
    assert sum(again.values()) == 0


# ---- migrations ------------------------------------------------------------------------------


def head_revision() -> str:
    """The newest revision in ``monitor/store/migrations`` (what ``migrate()`` upgrades to)."""
    from alembic.script import ScriptDirectory

    from monitor.store.engine import MIGRATIONS_DIR

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def test_migrating_an_empty_database_gives_exactly_the_models_schema(store):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from monitor.store import metadata

    assert store.current_revision() == head_revision()
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata) == []


def test_upgrading_from_the_previous_revision_keeps_the_data(store_url):
    old = Store(store_url)
    old.migrate("0001")
    assert old.current_revision() == "0001"
    snap = snapshot(T0, [row("a", next_pings={peer("b"): 0.1}), row("b")])
    with pytest.raises(StoreSchemaError, match="migrate"):  # revision 1 has no latest_diagnoses
        old.record_poll(snap, [health(LLAMA, "healthy")])
    poll_id = _insert_as_revision_1(old.engine, snap)
    with pytest.raises(StoreSchemaError, match="migrate"):  # revision 1 has no reachability_results
        old.record_reachability(ReachabilityBatch(T0, 1.0, (ReachabilityResult(peer("a"), "server", True, rtt=0.01),)))
    with pytest.raises(StoreSchemaError, match="migrate"):  # revision 1 has no chat_outcomes.error
        old.record_chat_outcome(ChatOutcome(T0, peer("a"), LLAMA.dht_prefix, 0, 8, ok=False, error="boom"))
    with old.engine.begin() as conn:  # a status, a reachability check and an outcome as revision 1 wrote them
        conn.execute(sa.text("INSERT INTO model_status (poll_id, at, model, state) VALUES (:poll, :at, :model, :state)"),
                     {"poll": poll_id, "at": T0, "model": LLAMA.dht_prefix, "state": "healthy"})
        key = conn.execute(sa.text("SELECT id FROM peers WHERE peer_id = :p"), {"p": peer("a")}).scalar()
        for table in ("probe_results", "latest_probes"):
            conn.execute(sa.text(f"INSERT INTO {table} (at, peer, kind, ok, rtt, joining) "
                                 "VALUES (:at, :peer, 'server', :ok, 0.01, :joining)"),
                         {"at": T0, "peer": key, "ok": True, "joining": False})
        conn.execute(sa.text('INSERT INTO chat_outcomes (at, peer, model, start, "end", ok, seconds_per_token) '
                             "VALUES (:at, :peer, :model, 0, 8, :ok, 0.5)"),
                     {"at": T0, "peer": key, "model": LLAMA.dht_prefix, "ok": True})
    old.close()

    new = Store(store_url)
    new.migrate()
    try:
        assert new.current_revision() == head_revision()
        assert new.latest_snapshot() == snap
        last = new.last_poll()  # revision 5's columns: nothing was bounded or refused in older polls
        assert (last.id, last.clamped_values, last.dropped_rows) == (poll_id, 0, 0)
        assert new.latest_reachability()[peer("a")].rtt == 0.01
        assert new.latest_model_status()[LLAMA.dht_prefix]["state"] == "healthy"
        new.record_chat_outcome(ChatOutcome(T0 + 1, peer("a"), LLAMA.dht_prefix, 0, 8, ok=False, error="boom"))
        outcomes = new.peer_history(peer("a"), T0 - 1, T0 + 2).outcomes
        assert [(o.ok, o.seconds_per_token, o.error) for o in outcomes] == [(True, 0.5, None), (False, None, "boom")]
    finally:
        new.close()


def _insert_as_revision_1(engine, snap: Snapshot) -> int:
    """The snapshot's poll as revision 1 stored it (its tables, read from the database); the poll id."""
    meta, at = sa.MetaData(), snap.taken_at
    with engine.begin() as conn:
        polls, models, peers, observations, pings = (sa.Table(name, meta, autoload_with=conn) for name in (
            "polls", "models", "peers", "server_observations", "server_pings"))
        poll_id = conn.execute(polls.insert().values(
            at=at, duration=snap.duration, n_models=len(snap.models), n_servers=len(snap.servers),
            invalid_records=snap.invalid_records, errors=list(snap.errors),
            models=[m.dht_prefix for m in snap.models], ok=True).returning(polls.c.id)).scalar_one()
        for m in snap.models:
            conn.execute(models.insert().values(dht_prefix=m.dht_prefix, num_blocks=m.num_blocks, name=m.name,
                                                repository=m.repository, official=m.official,
                                                first_seen=at, last_seen=at))
        for r in snap.servers:
            key = conn.execute(peers.insert().values(peer_id=r.peer_id, first_seen=at, last_seen=at,
                                                     public_name=r.public_name).returning(peers.c.id)).scalar_one()
            conn.execute(observations.insert().values(
                poll_id=poll_id, at=at, model=r.model, peer=key, state=r.state, start=r.start, end=r.end,
                throughput=r.throughput, inference_rps=r.inference_rps, forward_rps=r.forward_rps,
                network_rps=r.network_rps, cache_tokens_left=r.cache_tokens_left, version=r.version,
                torch_dtype=r.torch_dtype, quant_type=r.quant_type, using_relay=r.using_relay,
                public_name=r.public_name, adapters=list(r.adapters) or None))
            if r.next_pings:
                conn.execute(pings.insert().values(poll_id=poll_id, at=at, peer=key, model=r.model,
                                                   next_pings=dict(r.next_pings)))
    return poll_id


def test_an_unmigrated_database_says_to_migrate(store_url):
    s = Store(store_url)
    try:
        with pytest.raises(StoreSchemaError, match="migrate"):
            s.latest_snapshot()
    finally:
        s.close()


# ---- resilience ------------------------------------------------------------------------------


def test_a_stopped_postgres_raises_store_unavailable_and_the_same_store_works_after_restart(postgres, postgres_url):
    store = Store(postgres_url, timeout=2.0)
    store.migrate()
    store.record_poll(snapshot(T0, [row("a")]))
    postgres.stop()
    try:
        started = time.monotonic()
        for call in (lambda: store.record_poll(snapshot(T0 + 60, [row("a")])), store.latest_snapshot):
            with pytest.raises(StoreUnavailable, match="unavailable"):
                call()
        assert time.monotonic() - started < 10
    finally:
        postgres.start()
    store.record_poll(snapshot(T0 + 120, [row("a")]))
    assert [store.last_poll().at, store.latest_snapshot().taken_at] == [T0 + 120, T0 + 120]
    store.close()


# ---- peer policies ---------------------------------------------------------------------------


def test_peer_policies_are_set_replaced_and_cleared(store):
    store.set_peer_policy(peer("a"), "blocked")
    store.set_peer_policy(peer("b"), "pinned")
    assert store.peer_policies() == {peer("a"): "blocked", peer("b"): "pinned"}
    store.set_peer_policy(peer("a"), "pinned")
    store.set_peer_policy(peer("b"), None)
    assert store.peer_policies() == {peer("a"): "pinned"}
    with pytest.raises(ValueError, match="pinned"):
        store.set_peer_policy(peer("a"), "banished")


# ---- finding a peer, and what the scores count -------------------------------------------


def test_search_finds_a_peer_by_id_its_start_or_end_or_a_piece_of_its_name(store):
    gamma = "gamma" * 8 + "Zeta"  # (44 characters: an id that does not end in padding)
    store.record_poll(snapshot(T0, [row("alpha", public_name="Alpha GPU farm"), row("beta", public_name="beta_100%"),
                                    row(gamma)]))
    found = store.search_peers(peer("alpha"))
    assert [(m.peer_id, m.matched, m.public_name, m.first_seen) for m in found] == [
        (peer("alpha"), "peer id", "Alpha GPU farm", T0)]
    assert {m.peer_id for m in store.search_peers("12D3KooW")} == {peer(n) for n in ("alpha", "beta", gamma)}
    assert [m.peer_id for m in store.search_peers("12D3KooW", limit=2)] and len(store.search_peers("12D3KooW", limit=2)) == 2
    assert [m.peer_id for m in store.search_peers("12d3koow")] == []  # ids are case-sensitive
    assert [(m.peer_id, m.matched) for m in store.search_peers("…" + peer(gamma)[-8:])] == [
        (peer(gamma), "peer id suffix")]
    assert store.search_peers("…" + peer(gamma)[-8:].lower()) == []  # (LIKE ignores case on SQLite)
    assert [m.peer_id for m in store.search_peers("gpu FARM")] == [peer("alpha")]  # names: any case, any part
    assert [m.peer_id for m in store.search_peers("_100%")] == [peer("beta")]  # wildcards are characters
    assert store.search_peers("a%c") == [] and store.search_peers("nobody") == []


def test_a_peers_last_announcements_come_from_raw_rows_then_from_rollups(store):
    store.record_poll(snapshot(T0, [row("a", start=0, end=4, version="2.2.0"), row("a", MIXTRAL, state=JOINING)],
                               models=(LLAMA, MIXTRAL)))
    store.record_poll(snapshot(T0 + 600, [row("a", start=2, end=6, state=OFFLINE)]))
    last = {a.model: a for a in store.last_announcements(peer("a"))}
    assert (last[LLAMA.dht_prefix].at, last[LLAMA.dht_prefix].state, last[LLAMA.dht_prefix].start) == (T0 + 600, OFFLINE, 2)
    assert (last[MIXTRAL.dht_prefix].at, last[MIXTRAL.dht_prefix].state) == (T0, JOINING)
    assert store.peer_record(peer("a")).last_seen == T0 + 600 and store.peer_record(peer("nobody")) is None
    store.rollup_and_prune(T0 + 3 * DAY, raw_retention_days=1, rollup_retention_days=30)  # raw rows gone
    hourly = {a.model: a for a in store.last_announcements(peer("a"))}
    assert hourly[LLAMA.dht_prefix].hourly and hourly[LLAMA.dht_prefix].at == T0
    assert hourly[MIXTRAL.dht_prefix].state == JOINING and store.last_announcements(peer("nobody")) == []


def test_rollups_keep_what_the_scores_count_flaps_and_rtt_histograms(store):
    import json

    from monitor.core import quantiles, scores

    # "b" flaps inside the hour (up, down, up, down) and leaves across its end; reachability checks with RTTs
    ups = [True, False, True, False, True, True]
    for i, up in enumerate(ups):
        store.record_poll(snapshot(T0 + 600 * i, [row("a")] + ([row("b")] if up else [])))
        store.record_reachability(ReachabilityBatch(T0 + 600 * i + 5, 1.0, (
            ReachabilityResult(peer("b"), "server", up, rtt=0.01 * (i + 1) if up else None, error=None if up else "timeout"),)))
    store.record_poll(snapshot(T0 + HOUR, [row("a")]))  # the next hour: "b" is gone
    store.rollup_and_prune(T0 + 2 * HOUR, raw_retention_days=2, rollup_retention_days=30)
    with store.engine.connect() as conn:
        flaps = dict(((r[0], (r[1], r[2])) for r in conn.execute(sa.text(
            "SELECT p.peer_id, h.flap_chances, h.flaps FROM hourly_observations h JOIN peers p ON p.id = h.peer "
            "WHERE h.hour = :hour"), {"hour": T0})))
        bins, error = conn.execute(sa.text("SELECT rtt_bins, last_error FROM hourly_reachability WHERE hour = :hour"),
                                   {"hour": T0}).one()
    # inside the hour: b was ONLINE at 4 polls followed by another poll of the hour, and left 2 times
    assert flaps == {peer("a"): (5, 0), peer("b"): (3, 2)}
    rtts = [0.01 * (i + 1) for i, up in enumerate(ups) if up]
    bins = bins if isinstance(bins, list) else json.loads(bins)  # (flat: bucket, count, sum, ...)
    assert quantiles.from_bins(zip(*[iter(bins)] * 3)).median() == pytest.approx(quantiles.histogram(rtts).median())
    assert error == "timeout"
    # the aggregates add the pair across the hour's end (b left) and equal the per-observation count
    now = T0 + HOUR + 60
    aggregates = {a.peer_id: a for a in store.peer_aggregates(now)}
    history = {h.peer_id: h for h in peer_histories(store, now - scores.SCORE_WINDOW, now)}
    for name in ("a", "b"):
        expected = scores.aggregate(history[peer(name)], now)
        got = aggregates[peer(name)]
        assert (got.flaps, got.flap_chances, got.uptime, got.reachability_ok, got.reachability_failed) == (
            expected.flaps, expected.flap_chances, expected.uptime, expected.reachability_ok, expected.reachability_failed), name
    assert (aggregates[peer("b")].flaps, aggregates[peer("b")].flap_chances) == (3, 4)
    # the histograms go with the raw rows: a day later they are pruned, the counts stay
    store.rollup_and_prune(T0 + 4 * DAY, raw_retention_days=1, rollup_retention_days=30)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT rtt_bins, n FROM hourly_reachability WHERE hour = :hour"),
                            {"hour": T0}).one() == (None, 6)
