"""Specs of the compute checks (``core/compute_checks.py``, ``app/compute_checking.py``) on a real
private swarm: one token through the first block of each server names a server that fails every
step, that froze, or that a user met failing — confirmed by a second check seconds later, and
assessed at once so that every reader sees it — and the same server healthy again at its next check.

One swarm for the module (tiny Llama, three servers of all 8 blocks), a real SQLite store, the
real poller; compute-check rounds are run by the specs, at their own pace.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from monitor.app.compute_checking import ComputeChecker
from monitor.core.assessment import CAUSE_FAILING, CAUSE_SERVING, CAUSE_UNREACHABLE
from monitor.core.compute_checks import CONFIRM_DELAY
from monitor.core.probes import SERVER_ERROR, TIMEOUT
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.server_process import FAIL_MESSAGE
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.app.jobs import Poller
from support import STEADY_UPDATE_PERIOD, sqlite_store, tiny_settings, wait_until

SPECS = tuple(ServerSpec(name, 0, TINY_NUM_BLOCKS, throughput=100.0) for name in ("steady", "flaky", "frozen"))


@pytest.fixture(scope="module")
def checked(tiny_model, tmp_path_factory):
    """(swarm, poller, checker, store): the poller has scraped once; rounds are run by the specs."""
    data_dir = tmp_path_factory.mktemp("compute-checks")
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        settings = tiny_settings(swarm, data_dir, tiny_model, compute_check_period=20, compute_check_timeout=2)
        store = sqlite_store(data_dir)
        poller = Poller(settings, store, swarm.dht)
        assert poller.poll_once() is not None
        checker = ComputeChecker(settings, store, swarm.dht, snapshot=poller.latest_snapshot,
                                 after_change=poller.assess_latest)
        poller.compute_checker = checker  # (as the poller's rounds would: requested checks go to it)
        checker.poll_interval = 0.0  # (each spec's first failure asks for its own poll)
        try:
            yield swarm, poller, checker, store
        finally:
            swarm.unfail("flaky")
            checker.close()
            store.close()


def polled_again(poller, store) -> None:
    """The leader's requests job, as it runs every 2 s: a first failed check asked for a poll (a
    server that stopped cleanly would be seen leaving, not called unreachable)."""
    assert any(r.job == "scrape" and r.by == "compute-check" for r in store.pending_job_requests())
    poller.job_requests()


def causes(store) -> dict[str, str]:
    assessment = store.latest_assessments()[TINY_DHT_PREFIX]
    return {peer: server.cause for peer, server in assessment.servers.items()}


def test_every_server_computes_one_token_through_its_first_block(checked):
    swarm, poller, checker, store = checked
    started = time.time()
    checks = {c.peer_id: c for c in checker.run_once()}
    assert set(checks) == {swarm.peer_id(name) for name in ("steady", "flaky", "frozen")}
    for check in checks.values():
        assert check.ok and check.error is None and check.block == 0, check
        assert 0 < check.duration < 2
    stored = store.recent_compute_checks(started - 1)
    assert {c.peer_id for c in stored} == set(checks)
    assert checker.run_once() == []  # nobody is due before a period
    assert set(causes(store).values()) == {CAUSE_SERVING}


def test_a_server_failing_every_step_is_named_failing_once_a_second_check_confirms_it(checked):
    swarm, poller, checker, store = checked
    flaky = swarm.peer_id("flaky")
    swarm.fail("flaky")
    try:
        checker.next_due[(flaky, TINY_DHT_PREFIX)] = 0.0  # due now (as if its period had passed)
        (first,) = checker.run_once()
        assert (first.ok, first.error_kind, first.error) == (False, SERVER_ERROR, FAIL_MESSAGE)
        assert causes(store)[flaky] == CAUSE_SERVING  # one failure names nobody
        assert checker.next_due[(flaky, TINY_DHT_PREFIX)] == pytest.approx(first.at + CONFIRM_DELAY)
        polled_again(poller, store)  # the poll it asked for: still announced ONLINE
        time.sleep(CONFIRM_DELAY)
        (second,) = checker.run_once()
        assert not second.ok and second.error_kind == SERVER_ERROR
        assessment = store.latest_assessments()[TINY_DHT_PREFIX]
        server = assessment.servers[flaky]
        assert server.cause == CAUSE_FAILING and server.failing == FAIL_MESSAGE  # assessed at once
        assert server.checked is not None and server.checked.at == second.at
        assert assessment.flagged(CAUSE_FAILING) == {flaky: FAIL_MESSAGE}
        assert checker.next_due[(flaky, TINY_DHT_PREFIX)] == pytest.approx(second.at + checker.period)
    finally:
        swarm.unfail("flaky")
    checker.next_due[(flaky, TINY_DHT_PREFIX)] = 0.0
    (healed,) = checker.run_once()
    assert healed.ok
    assert causes(store)[flaky] == CAUSE_SERVING  # one success ends it, for every reader


def test_a_frozen_server_is_named_unreachable_and_serving_again_when_it_thaws(checked):
    swarm, poller, checker, store = checked
    frozen = swarm.peer_id("frozen")
    pid = swarm.pid("frozen")
    os.kill(pid, signal.SIGSTOP)
    try:
        for attempt in range(2):
            checker.next_due[(frozen, TINY_DHT_PREFIX)] = 0.0
            (check,) = checker.run_once()
            assert not check.ok and check.error_kind == TIMEOUT, check
            if attempt == 0:
                polled_again(poller, store)
        server = store.latest_assessments()[TINY_DHT_PREFIX].servers[frozen]
        assert server.cause == CAUSE_UNREACHABLE
    finally:
        os.kill(pid, signal.SIGCONT)

    def answers():
        checker.next_due[(frozen, TINY_DHT_PREFIX)] = 0.0
        return all(c.ok for c in checker.run_once())

    wait_until(answers, timeout=30, step=1)
    assert causes(store)[frozen] == CAUSE_SERVING


def test_a_user_s_failure_asks_the_leader_for_a_check_through_the_store(checked):
    swarm, poller, checker, store = checked
    flaky = swarm.peer_id("flaky")
    swarm.fail("flaky")
    try:
        assert store.request_job("compute-check", target=flaky, by="chat", why="a chat step failed")
        before = time.time()
        poller.job_requests()  # the leader's requests job: checks it now, out of turn
        asked = [c for c in store.recent_compute_checks(before, peer_id=flaky)]
        assert [(c.ok, c.requested_by) for c in asked] == [(False, "chat")]
        polled_again(poller, store)
        assert store.pending_job_requests() == []
        time.sleep(CONFIRM_DELAY)
        checker.run_once()  # its confirmation, due CONFIRM_DELAY later
        assert causes(store)[flaky] == CAUSE_FAILING
    finally:
        swarm.unfail("flaky")
    checker.next_due[(flaky, TINY_DHT_PREFIX)] = 0.0
    checker.run_once()
    assert causes(store)[flaky] == CAUSE_SERVING


def test_a_confirmed_failure_is_notified_at_once_not_after_the_rule_s_for(checked, tmp_path):
    from monitor.app.alerter import Alerter
    from monitor.harness.webhook_receiver import WebhookReceiver

    swarm, poller, checker, store = checked
    flaky = swarm.peer_id("flaky")
    with WebhookReceiver() as hook:
        settings = tiny_settings(swarm, tmp_path, alerts={
            "check_period": 1, "default_rules": False, "webhooks": [{"name": "ops", "url": hook.url}],
            "rules": [{"name": "flaky-box", "kind": "peer_failing", "peers": [flaky], "for": "10m"}]})
        alerter = Alerter(settings, store, watching_since=time.time() - 3600)
        assert alerter.evaluate().notices == ()
        swarm.fail("flaky")
        try:
            for attempt in range(2):  # the check and its confirmation
                checker.next_due[(flaky, TINY_DHT_PREFIX)] = 0.0
                checker.run_once()
                if attempt == 0:
                    polled_again(poller, store)
            started = time.time()
            (fired,) = alerter.evaluate().notices  # the rule's for is 10 minutes: the confirmation is enough
            assert (fired.event, fired.state, fired.peer) == ("firing", "failing", flaky)
            assert alerter.deliver()["delivered"] == 1
            assert [r.body["event"] for r in hook.received] == ["firing"] and time.time() - started < 10
        finally:
            swarm.unfail("flaky")
        checker.next_due[(flaky, TINY_DHT_PREFIX)] = 0.0
        checker.run_once()
        assert alerter.evaluate().notices == ()  # clear, but told on confirmation: it waits out a flap


def test_a_chat_that_meets_a_failing_server_asks_for_its_confirming_check(checked, tiny_model):
    from chat.engine import ChatEngine, ChatError, GenerationParams
    from chat.feedback import store_outcome_sink
    from chat.policy import RoutingSettings
    from monitor.settings import ModelConfig

    swarm, poller, checker, store = checked
    victim = swarm.peer_id("frozen")  # (no check of it was asked for yet: one per 10 s)
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        outcome_sink=store_outcome_sink(store), routing=RoutingSettings(pinned=(victim,)),
                        max_retries=1, request_timeout=5)
    swarm.fail("frozen")
    try:
        ids = engine.encode(TINY_DHT_PREFIX, "Petals runs large language models")
        with pytest.raises(ChatError):  # its only server fails every step
            with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2)) as answer:
                list(answer)
        asked = [r for r in store.pending_job_requests() if r.job == "compute-check"]
        assert [(r.target, r.by) for r in asked] == [(victim, "chat")]  # once, however often it retried
        assert FAIL_MESSAGE in asked[0].why
        poller.job_requests()  # the leader checks it now; its confirmation follows 2 s later
        polled_again(poller, store)
        time.sleep(CONFIRM_DELAY)
        checker.run_once()
        assert causes(store)[victim] == CAUSE_FAILING
    finally:
        swarm.unfail("frozen")
        engine.close()
    checker.next_due[(victim, TINY_DHT_PREFIX)] = 0.0
    checker.run_once()
    assert causes(store)[victim] == CAUSE_SERVING


def test_a_server_frozen_mid_answer_is_named_unreachable_though_users_heard_from_it_until_then(checked, tiny_model):
    """The assess step reads a server that answered users after its failed checks as busy, not gone
    (``compute_checks.heard_from``). A server that freezes while it answers a user must not pass
    for busy: the chat stamps the span it answered at its last answered step, before the freeze,
    not when the answer gave up on it after the checks had failed."""
    from chat.decoding import Delta
    from chat.engine import ChatEngine, ChatError, GenerationParams
    from chat.feedback import store_outcome_sink
    from chat.policy import RoutingSettings
    from monitor.settings import ModelConfig

    swarm, poller, checker, store = checked
    victim, pid = swarm.peer_id("frozen"), swarm.pid("frozen")
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        outcome_sink=store_outcome_sink(store), routing=RoutingSettings(pinned=(victim,)),
                        max_retries=1, request_timeout=3)
    froze, ended = threading.Event(), threading.Event()
    got: list = []
    frozen_at: list = []

    def user() -> None:  # five tokens come through it, then it freezes mid-answer
        try:
            ids = engine.encode(TINY_DHT_PREFIX, "Petals runs large language models")
            with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=120)) as answer:
                for event in answer:
                    got.append(event)
                    if not froze.is_set() and sum(isinstance(e, Delta) for e in got) >= 5:
                        os.kill(pid, signal.SIGSTOP)
                        frozen_at.append(time.time())
                        froze.set()
        except ChatError as e:
            got.append(e)
        finally:
            ended.set()

    started = time.time()
    thread = threading.Thread(target=user, daemon=True)
    thread.start()
    try:
        assert froze.wait(60) and not ended.is_set(), got  # frozen while a user's answer goes through it
        checks = []
        for attempt in range(2):  # its check and the confirmation, while the user's answer still waits on it
            checker.next_due[(victim, TINY_DHT_PREFIX)] = 0.0
            (check,) = checker.run_once()
            assert not check.ok and check.error_kind == TIMEOUT, check
            checks.append(check)
            if attempt == 0:
                polled_again(poller, store)
        assert ended.wait(60), "the answer did not give up on its frozen server"
        assert isinstance(got[-1], ChatError), got[-1]  # its only server froze
        answered = store.answered_since(started).get(victim)
        assert answered is not None and started < answered <= frozen_at[0]  # it did answer users, until it froze
        assert answered < checks[0].at
        poller.assess_latest()  # on everything stored since, the user's spans included
        server = store.latest_assessments()[TINY_DHT_PREFIX].servers[victim]
        assert server.cause == CAUSE_UNREACHABLE, server
    finally:
        os.kill(pid, signal.SIGCONT)
        thread.join(30)
        engine.close()

    def answers():
        checker.next_due[(victim, TINY_DHT_PREFIX)] = 0.0
        return all(c.ok for c in checker.run_once())

    wait_until(answers, timeout=30, step=1)
    assert causes(store)[victim] == CAUSE_SERVING


def test_a_clean_stop_is_seen_leaving_not_called_unreachable_nor_after_a_quick_restart(checked):
    """(Last: it stops and restarts a server.) A stopped server announces OFFLINE; the poll its first
    failed check asks for sees it leave, so no check confirms it unreachable and no alert is told
    at once: a clean restart waits out the rules' ``for``. Back within the checks' window, it is
    serving at the first poll that sees it, before its next check: the checks that failed while it
    was down count against nobody."""
    swarm, poller, checker, store = checked
    steady = swarm.peer_id("steady")
    swarm.stop("steady")
    for _ in range(2):  # its check and the confirmation, both before the poll it asked for
        checker.next_due[(steady, TINY_DHT_PREFIX)] = 0.0
        (failed,) = checker.run_once()
        assert not failed.ok
        time.sleep(CONFIRM_DELAY)
    server = store.latest_assessments()[TINY_DHT_PREFIX].servers[steady]  # assessed at once, on the old poll
    assert server.cause != CAUSE_UNREACHABLE and not server.confirmed  # not yet: did it leave?
    poller.check_reachability_once()  # a round that catches it stopping, still announced ONLINE: a failure
    stale = store.latest_reachability()[steady]
    assert not stale.ok
    polled_again(poller, store)  # the poll it asked for: OFFLINE (or gone), no longer ONLINE
    assert steady not in {c.peer_id for c in checker.run_once()}  # no ONLINE span left to check
    assessment = store.latest_assessments()[TINY_DHT_PREFIX]
    server = assessment.servers.get(steady)
    assert server is None or (server.cause != CAUSE_UNREACHABLE and not server.confirmed)
    assert not assessment.confirmed([steady])


    failed_at = time.time()
    swarm.restart("steady")  # back within the window: its failed checks are of the server that stopped
    poller.poll_once()  # ONLINE again; its next check is not due yet
    assert time.time() - failed_at < checker.max_age  # (the failed checks are still in the window)
    server = store.latest_assessments()[TINY_DHT_PREFIX].servers[steady]
    assert server.cause == CAUSE_SERVING, server
    # the round's failure was of the server that stopped: the first poll that sees it back checked
    # its reachability again at once, not a round later
    assert store.latest_reachability()[steady].ok and store.latest_reachability()[steady].at > stale.at
    (again,) = [c for c in checker.run_once() if c.peer_id == steady]
    assert again.ok
