"""Specs of the monitor end to end: a real swarm, the real poller, a real database."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from apscheduler.events import EVENT_JOB_EXECUTED

from monitor.app.jobs import Poller
from monitor.harness.local_swarm import ServerSpec
from monitor.settings import ModelConfig, Settings
from monitor.core.common import DAY, HOUR
from monitor.core.snapshot import ChatOutcome, ReachabilityBatch, ReachabilityResult
from monitor.store import Store
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import migrated_store, wait_until

N = TINY_NUM_BLOCKS


def make_settings(swarm, tmp_path, **extra) -> Settings:
    return Settings(
        data_dir=tmp_path,
        initial_peers=swarm.initial_peers,
        models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)],
        reachability_timeout=3,
        **extra,
    )


@pytest.fixture
def sqlite_store(tmp_path):
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}") as store:
        yield store


def poll(poller: Poller):
    """One scheduler round, as the jobs run it: reachability checks, then the scrape and its diagnosis."""
    poller.check_reachability_once()
    snapshot = poller.poll_once()
    assert snapshot is not None, poller.stats.last_error
    return poller.store.latest_model_status()[TINY_DHT_PREFIX]


def poll_until(poller: Poller, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = poll(poller)
        if predicate(status) or time.monotonic() > deadline:
            return status
        time.sleep(1)


def test_all_servers_online_is_healthy(swarm, sqlite_store, tmp_path):
    poller = Poller(make_settings(swarm, tmp_path), sqlite_store, swarm.dht)
    status = poll(poller)
    assert status["state"] == "healthy", status["reasons"]
    assert status["coverage_pct"] == 100
    assert status["min_redundancy"] == 2
    assert status["servers_online"] == 3


def test_outage_is_diagnosed_named_and_kept_in_history(swarm, sqlite_store, tmp_path):
    s = swarm  # first-half 0:N/2, full 0:N, second-half N/2:N
    poller = Poller(make_settings(s, tmp_path), sqlite_store, s.dht)
    assert poll(poller)["state"] == "healthy"

    s.stop("full")  # every block now has one server
    status = poll_until(poller, lambda st: st["state"] != "healthy")
    assert status["state"] == "degraded"
    single = " ".join(r for r in status["reasons"] if "served only by" in r)
    assert f"0:{N // 2}" in single and f"{N // 2}:{N}" in single, status["reasons"]

    s.kill("first-half")  # the only server of 0:N/2
    outage_started = time.time()
    status = poll_until(poller, lambda st: st["state"] == "broken")
    assert status["state"] == "broken"
    assert any(f"0:{N // 2}" in reason for reason in status["reasons"]), status["reasons"]
    assert not any(f"{N // 2}:{N}" in reason and "no" in reason.lower() for reason in status["reasons"])

    s.restart("first-half")
    s.restart("full")
    status = poll_until(poller, lambda st: st["state"] == "healthy")
    assert status["state"] == "healthy", status["reasons"]

    outages = sqlite_store.outage_intervals(TINY_DHT_PREFIX, outage_started - 120, time.time() + 1)
    assert len(outages) == 1
    start, end = outages[0]
    assert start >= outage_started - 1 and end is not None and end > start


def test_a_reachability_round_rediagnoses_the_latest_poll_without_waiting_for_the_next_scrape(swarm, sqlite_store,
                                                                                              tmp_path):
    s = swarm
    poller = Poller(make_settings(s, tmp_path), sqlite_store, s.dht)
    poll(poller)
    assert sqlite_store.latest_assessments()[TINY_DHT_PREFIX].min_redundancy == 2

    s.kill("full")  # its record stays in the DHT until it expires; its reachability check fails at once
    poller.check_reachability_once()
    diagnosis = sqlite_store.latest_assessments()[TINY_DHT_PREFIX]
    assert diagnosis.min_redundancy == 1
    assert "unreachable" in diagnosis.excluded_peers[s.peer_id("full")]
    assert sqlite_store.latest_model_status()[TINY_DHT_PREFIX]["min_redundancy"] == 2  # the poll's, until the next
    s.restart("full")


def test_a_poller_checks_the_servers_its_first_poll_finds_at_once_not_a_reachability_period_later(
        swarm, sqlite_store, tmp_path):
    """The verdict stored for a server may be older than the poller: "full" was found unreachable
    before this poller started (stopped then, as the demo's chaos does, and back since). The first
    poll finds it ONLINE and checks it before the poll is assessed, so the poll's one assessment
    counts it — within seconds, though the next reachability round is ten minutes away."""
    full = swarm.peer_id("full")
    sqlite_store.record_reachability(ReachabilityBatch(time.time() - 60, 1.0, (
        ReachabilityResult(full, "server", False, error="failed to dial: connection refused"),)))
    stored_with: list = []  # the assessments each poll is stored with (its first, before any other input)
    record_poll = sqlite_store.record_poll
    sqlite_store.record_poll = lambda snapshot, assessments=(): (stored_with.append(assessments),
                                                                   record_poll(snapshot, assessments))[1]
    poller = Poller(make_settings(swarm, tmp_path, scrape_period=600, reachability_period=600, score_period=600),
                    sqlite_store, swarm.dht)
    started = time.monotonic()
    poller.start()
    try:
        counted = wait_until(lambda: (lambda d: d is not None and full not in d.excluded_peers and d)(
            sqlite_store.latest_assessments().get(TINY_DHT_PREFIX)), 30)
        assert counted, sqlite_store.latest_assessments()
        assert counted.state == "healthy" and counted.min_redundancy == 2, counted.reasons
        assert sqlite_store.latest_reachability()[full].ok
        first = next(a for a in stored_with[0] if a.model == TINY_DHT_PREFIX)
        assert full not in first.excluded_peers and first.state == "healthy", first.reasons  # assessed once, right
        print(f"\n{full[:8]}… counted {time.monotonic() - started:.1f} s after the poller started")
    finally:
        poller.shutdown()


def test_a_peer_that_disappears_and_returns_loses_uptime(swarm, sqlite_store, tmp_path):
    s = swarm  # "flaky" and "steady": the session swarm's two halves, alike but for that
    poller = Poller(make_settings(s, tmp_path), sqlite_store, s.dht)
    for _ in range(3):
        poll(poller)
    s.stop("first-half")
    poll_until(poller, lambda st: st["servers_online"] == 2)
    for _ in range(3):
        poll(poller)
    s.restart("first-half")
    poll_until(poller, lambda st: st["servers_online"] == 3)

    poller.refresh_scores()
    scores = sqlite_store.latest_scores()
    steady, flaky = scores[s.peer_id("second-half")], scores[s.peer_id("first-half")]
    assert flaky.score < steady.score
    assert any("online" in line for line in flaky.explanation)


def test_a_throttled_peer_scores_lower_once_chat_outcomes_show_it_slow(make_swarm, sqlite_store, tmp_path, tiny_model):
    import torch
    from transformers import AutoTokenizer

    from chat.remote_model import load_remote_model

    s = make_swarm([ServerSpec("fast", 0, N), ServerSpec("slow", 0, N)])
    poller = Poller(make_settings(s, tmp_path), sqlite_store, s.dht)
    poll(poller)
    s.throttle("slow", duty=0.8, period=0.2)

    input_ids = AutoTokenizer.from_pretrained(tiny_model)("Hello", return_tensors="pt")["input_ids"]
    for name in ("fast", "slow"):
        peer = s.peer_id(name)
        model = load_remote_model(tiny_model, s.dht, allowed_servers=[peer])
        for _ in range(2):
            started = time.perf_counter()
            with torch.no_grad():
                model.generate(input_ids, max_new_tokens=8, do_sample=False)
            seconds_per_token = (time.perf_counter() - started) / 8
            sqlite_store.record_chat_outcome(ChatOutcome(at=time.time(), peer_id=peer, model=TINY_DHT_PREFIX,
                                                         start=0, end=N, ok=True,
                                                         seconds_per_token=seconds_per_token))
    poll(poller)
    poller.refresh_scores()
    scores = sqlite_store.latest_scores()
    assert scores[s.peer_id("slow")].score < scores[s.peer_id("fast")].score
    assert any("chat" in line for line in scores[s.peer_id("slow")].explanation)


def test_a_locked_sqlite_database_skips_polls_without_crashing_and_writing_resumes(swarm, tmp_path):
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}", timeout=1) as store:  # a write waits 1 s for the lock
        poller = Poller(make_settings(swarm, tmp_path), store, swarm.dht)
        poll(poller)
        polls_before = store.last_poll()

        locker = sqlite3.connect(tmp_path / "monitor.db", timeout=0.1)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            assert poller.poll_once() is not None  # scrape works; the write is skipped, not fatal
            assert poller.stats.failures.get("scrape", 0) >= 1
        finally:
            locker.rollback()
            locker.close()

        poll(poller)
        assert store.last_poll().id > polls_before.id


def test_a_stopped_postgres_skips_polls_without_crashing_and_writing_resumes(swarm, postgres, tmp_path):
    store = Store(postgres.url)
    store.migrate()
    try:
        poller = Poller(make_settings(swarm, tmp_path), store, swarm.dht)
        poll(poller)
        first = store.last_poll().id
        postgres.stop()
        try:
            poller.poll_once()
            poller.check_reachability_once()
            assert poller.stats.failures.get("scrape", 0) >= 1
        finally:
            postgres.start()
        poll(poller)
        assert store.last_poll().id > first
    finally:
        store.close()


def test_report_prints_a_report_per_model_and_its_output_ends_when_it_exits(swarm, tmp_path):
    """The report, read through one pipe for stdout and stderr as a script (``… 2>&1 | grep``)
    reads it: the pipe ends when the command exits, not 2 s later when torch's shared-memory
    manager (which hivemind's DHT starts) would exit, had it inherited our stderr."""
    import os
    import subprocess
    import sys
    import threading

    command = subprocess.Popen(
        [sys.executable, "-m", "monitor.app.cli", "report",
         "--initial-peers", *swarm.initial_peers, "--model", f"{TINY_DHT_PREFIX}:{N}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path)},
    )
    read: list[str] = []
    ended: list[float] = []
    reader = threading.Thread(target=lambda: (read.append(command.stdout.read()), ended.append(time.monotonic())))
    reader.start()
    try:
        returncode = command.wait(120)
        exited = time.monotonic()
        reader.join(30)
    finally:
        command.kill()
    out = "".join(read)
    assert returncode == 0, out[-2000:]
    assert f"({TINY_DHT_PREFIX}, {N} blocks): HEALTHY" in out
    for name in ("first-half", "second-half", "full"):
        assert name in out
    assert "--block_indices" in out
    assert ended and ended[0] - exited < 1.0, f"the output ended {ended[0] - exited:.1f} s after the exit"


# ---- the scheduled rollup job ----------------------------------------------------------------


def _rolled_up_polls(store, hour: float):
    """(polls, ok_polls) of the hour's rollup, or None while the hour is not rolled up."""
    with store.engine.connect() as conn:
        found = conn.execute(sa.text("SELECT polls, ok_polls FROM hourly_polls WHERE hour = :h"), {"h": hour}).first()
    return tuple(found) if found else None


def _raw_polls(store, hour: float) -> int:
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT COUNT(*) FROM polls WHERE at >= :a AND at < :b"),
                            {"a": hour, "b": hour + HOUR}).scalar()


def test_the_scheduler_rolls_completed_hours_up_every_rollup_period(swarm, sqlite_store, tmp_path):
    """The poller's scheduler runs the rollup job every ``rollup_period`` seconds, nobody calling
    it: completed hours of raw polls become hourly rollups, raw rows older than the raw retention
    go (their history then reads from the rollups), and an hour written into after it was rolled
    up is rolled up again at the next run. The other jobs wait for their own (default) periods."""
    settings = make_settings(swarm, tmp_path, rollup_period=1, raw_retention_days=1)
    poller = Poller(settings, sqlite_store, swarm.dht)
    scraped = poller.poll_once()  # what the scrape job stores: the real swarm, now
    assert scraped is not None, poller.stats.last_error
    assessments = poller.assess(scraped, {})
    this_hour = time.time() // HOUR * HOUR
    old, recent = this_hour - 3 * DAY, this_hour - 2 * HOUR  # past the raw retention of a day / within it
    for hour in (old, recent):  # six polls an hour, as if the poller had been running then
        for i in range(6):
            sqlite_store.record_poll(replace(scraped, taken_at=hour + 600 * i), assessments)
    assert _rolled_up_polls(sqlite_store, old) is None and _rolled_up_polls(sqlite_store, recent) is None

    runs: list[datetime] = []  # when the scheduler meant to run the rollup job, each time it did
    started = datetime.now(timezone.utc)
    scheduler = poller.start(run_now=False)
    scheduler.add_listener(lambda event: event.job_id == "rollup" and runs.append(event.scheduled_run_time),
                           EVENT_JOB_EXECUTED)
    try:
        # (a run rolls each hour up in a transaction of its own, then prunes in another: both seen)
        assert wait_until(lambda: _rolled_up_polls(sqlite_store, recent) == (6, 6)
                          and _raw_polls(sqlite_store, old) == 0, 30, step=0.2), poller.stats.last_error
        assert _rolled_up_polls(sqlite_store, old) == (6, 6)
        assert _raw_polls(sqlite_store, old) == 0 and _raw_polls(sqlite_store, recent) == 6
        model = TINY_DHT_PREFIX
        [hourly] = sqlite_store.model_status_history(model, old, old + HOUR - 1)  # one row for the hour
        state = next(h.state for h in assessments if h.model == model)
        assert (hourly["at"], hourly["samples"], hourly["states"]) == (old, 6, {state: 6})
        full = sqlite_store.peer_history(swarm.peer_id("full"), old, old + HOUR - 1).observations
        assert [(o.at, o.samples, o.seen) for o in full] == [(old, 6, True)]

        # a poll of the recent hour that finished storing after the hour was rolled up
        sqlite_store.record_poll(replace(scraped, taken_at=recent + 3000), assessments)
        assert wait_until(lambda: _rolled_up_polls(sqlite_store, recent) == (7, 7), 30, step=0.2), poller.stats.last_error
        assert wait_until(lambda: len(runs) >= 2, 30, step=0.2)
    finally:
        poller.shutdown()
    assert poller.stats.runs["rollup"] >= 2 and "rollup" not in poller.stats.failures
    # on its schedule: not at start, then once per period (a run missed under load is coalesced)
    period = settings.rollup_period
    assert (runs[0] - started).total_seconds() >= period - 0.01
    for before, after in zip(runs, runs[1:]):
        gap = (after - before).total_seconds()
        assert gap >= period - 1e-6 and abs(gap / period - round(gap / period)) < 1e-6
