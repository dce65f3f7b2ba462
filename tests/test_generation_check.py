"""Specs of the generation check: a few tokens of a fixed prompt, end to end through the chat's own
engine and routing, on a real private swarm — stored with its figures and route, failing with the
servers' own errors when every server of some blocks fails, failing when the answer does not match
the model's expected pattern, and never taking a user's chat place nor counting as a user's chat.

One swarm for the module (tiny Llama: "first" 0:4, "second" 4:8, "full" 0:8), a real SQLite store,
the chat's engine with its real outcome sink (the store); checks run round by round. The checks
judged without a swarm, and what the pages show of them: ``test_generation_views.py``.
"""

from __future__ import annotations

import re
import time

import pytest

from chat.decoding import GenerationParams
from chat.engine import Busy, ChatEngine
from chat.feedback import store_outcome_sink
from monitor.app.generation_check import GenerationChecker
from monitor.app.jobs import Poller
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.server_process import FAIL_MESSAGE
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.settings import ModelConfig
from monitor.store import Store
from support import STEADY_UPDATE_PERIOD, sqlite_store, tiny_settings, wait_until

HALF = TINY_NUM_BLOCKS // 2
SPECS = (ServerSpec("first", 0, HALF, throughput=50.0), ServerSpec("second", HALF, TINY_NUM_BLOCKS, throughput=50.0),
         ServerSpec("full", 0, TINY_NUM_BLOCKS, throughput=100.0))
TOKENS = 8


# ---- on a real swarm -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked(tiny_model, tmp_path_factory):
    """(swarm, engine, store, settings): the chat's engine records its users' outcomes in the store."""
    data_dir = tmp_path_factory.mktemp("generation-check")
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        settings = tiny_settings(swarm, data_dir, tiny_model, generation_check_tokens=TOKENS,
                                 generation_check_period=3600)
        store = sqlite_store(data_dir)
        engine = ChatEngine(swarm.dht, settings.models, outcome_sink=store_outcome_sink(store),
                            slots=1, queue_size=0, queue_timeout=1)
        try:
            yield swarm, engine, store, settings
        finally:
            for name in swarm.servers:
                swarm.unfail(name)
            engine.close()
            store.close()


def checker_for(checked, **model_fields) -> GenerationChecker:
    swarm, engine, store, settings = checked
    models = [m.model_copy(update=model_fields) for m in settings.models]
    return GenerationChecker(settings.model_copy(update={"models": models}), store, engine=lambda: engine)


def test_a_check_generates_through_the_swarm_and_is_stored_with_its_figures_and_route(checked):
    swarm, engine, store, _ = checked
    started = time.time()
    (check,) = checker_for(checked).run_once()
    assert check.ok, check.error
    assert check.model == TINY_DHT_PREFIX and check.tokens == TOKENS and check.answer
    assert 0 < check.time_to_first_token < check.duration and check.tokens_per_second > 0
    assert check.matched is None and check.error is None  # no pattern: any answer is ok
    peers = {swarm.peer_id(name) for name in swarm.servers}
    assert check.route and set(check.route_peers) <= peers and not check.failed_peers
    assert check.route[0].start == 0 and check.route[-1].end == TINY_NUM_BLOCKS  # the route covers every block
    assert store.latest_generation_checks() == {TINY_DHT_PREFIX: check}
    assert store.generation_check_history(TINY_DHT_PREFIX, started - 1) == [check]
    assert store.recent_chat_outcomes(0) == []  # its per-server outcomes are not users' chats

    # the same prompt through the users' chat gives the same greedy answer, and is recorded as a chat
    ids, stops = engine.models.encode_chat(TINY_DHT_PREFIX, [{"role": "user", "content": "What is the capital of France?"}])
    with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=TOKENS, stop_sequences=stops)) as answer:
        users = [event for event in answer][-1]
    assert users.text[:len(check.answer)] == check.answer
    assert store.recent_chat_outcomes(0)


def test_the_check_runs_while_every_chat_place_is_held(checked):
    _, engine, _, _ = checked
    ids = engine.encode(TINY_DHT_PREFIX, "Once upon a time")
    held = engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=400))  # the engine's only slot
    try:
        with pytest.raises(Busy):
            engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2))  # a user now waits (here: is refused)
        began = time.monotonic()
        (check,) = checker_for(checked).run_once()
        assert check.ok, check.error
        assert time.monotonic() - began < 60
    finally:
        held.close()


def test_an_answer_that_cannot_match_the_expected_pattern_is_a_failure_with_the_answer(checked):
    (plain,) = checker_for(checked).run_once()
    assert plain.ok and plain.answer
    (matching,) = checker_for(checked, expect=re.escape(plain.answer[:3])).run_once()
    assert matching.ok and matching.matched is True  # greedy: the same answer, which matches

    (check,) = checker_for(checked, expect="Zanzibar").run_once()  # a word the tiny model never says
    assert not check.ok and check.matched is False and check.expect == "Zanzibar"
    assert check.answer == plain.answer and check.tokens == TOKENS and check.tokens_per_second > 0
    assert check.error == f"answer did not match /Zanzibar/: {plain.answer!r}"


def test_with_every_server_of_some_blocks_failing_the_check_records_the_servers_own_error(checked):
    swarm, _, store, _ = checked
    failing = {swarm.peer_id("first"), swarm.peer_id("full")}  # every server of blocks 0:4
    chats = store.recent_chat_outcomes(0)
    for name in ("first", "full"):
        swarm.fail(name)
    try:
        (check,) = checker_for(checked).run_once()
    finally:
        for name in ("first", "full"):
            swarm.unfail(name)
    assert not check.ok and check.answer is None and check.tokens == 0
    assert FAIL_MESSAGE in check.error and "failed: " in check.error, check.error
    assert set(check.failed_peers) <= failing and check.failed_peers
    # the servers' own error is in the route (a retry of one on a loaded machine may end otherwise,
    # a timeout say: it is in the route too, with what the client saw)
    assert any(span.error == FAIL_MESSAGE for span in check.route if span.peer_id in failing), check.route
    assert store.latest_generation_checks()[TINY_DHT_PREFIX] == check
    assert store.recent_chat_outcomes(0) == chats  # none of its failures was recorded as a chat's

    (recovered,) = checker_for(checked).run_once()  # unfailed: the next check goes through again
    assert recovered.ok, recovered.error


def test_after_a_failed_check_the_job_checks_again_soon_not_a_period_later(checked, monkeypatch):
    """The job's own thread, period an hour: a failed round is followed by the next after
    RETRY_AFTER (a model a failed check called broken is seen working again within a minute),
    then, once it succeeds, by nothing for the period."""
    from monitor.app import generation_check

    monkeypatch.setattr(generation_check, "RETRY_AFTER", 2.0)
    swarm, _, store, _ = checked
    started = time.time()
    for name in ("first", "full"):
        swarm.fail(name)
    checker = checker_for(checked).start()
    try:
        assert wait_until(lambda: checker.rounds >= 1, 120), "no first round"
        for name in ("first", "full"):
            swarm.unfail(name)
        assert wait_until(lambda: checker.rounds >= 2, 60), "no second round soon after the failed one"
        checks = store.generation_check_history(TINY_DHT_PREFIX, started)
        assert [c.ok for c in checks][:1] == [False] and checks[-1].ok, checks
        rounds = checker.rounds
        time.sleep(5)
        assert checker.rounds == rounds  # succeeded: the next is a period (an hour) away
    finally:
        checker.close()
        for name in ("first", "full"):
            swarm.unfail(name)


def test_the_pollers_job_checks_every_model_with_a_path_on_its_own_engine(checked, tmp_path):
    """``swarm-monitor poll`` alone (no chat in the process): the job makes an engine of its own."""
    swarm, _, _, settings = checked
    settings = settings.model_copy(update={"data_dir": tmp_path, "scrape_period": 3600, "reachability_period": 3600,
                                           "score_period": 3600, "speed_probe_period": 3600,
                                           "models": [*settings.models, ModelConfig(dht_prefix="no-path", num_blocks=2)]})
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    poller = Poller(settings, store, swarm.dht)
    try:
        poller.start(run_now=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not poller.stats.runs.get("generation"):
            time.sleep(0.5)
        checks = store.latest_generation_checks()
        assert list(checks) == [TINY_DHT_PREFIX] and checks[TINY_DHT_PREFIX].ok, checks
        assert poller.stats.runs.get("generation") == 1 and not poller.stats.failures.get("generation")
        assert store.recent_chat_outcomes(0) == []
    finally:
        poller.shutdown()
        store.close()
