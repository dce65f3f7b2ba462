"""Spec: what compute checks say (``core/compute_checks.py``) and how the one assessment takes it —
two failed checks name a server, one success clears it, the newest evidence wins over an older
reachability round, and a user's failure asks for a confirming check (pure: no swarm)."""

from __future__ import annotations

import pytest

from monitor.app import assessing
from monitor.core.assess import assess
from monitor.core.assessment import CAUSE_FAILING, CAUSE_OFFLINE, CAUSE_SERVING, CAUSE_UNREACHABLE
from monitor.core.compute_checks import (
    CONFIRM_DELAY, PROBE_REQUEST_INTERVAL, REQUEST_INTERVAL, ComputeCheck, confirming_request, due_after, verdicts,
)
from monitor.core.probes import CLIENT_ERROR, SERVER_ERROR, TIMEOUT
from monitor.core.snapshot import OFFLINE, ChatOutcome, ReachabilityResult, Snapshot
from monitor.swarm.routing import PETALS_ROUTING
from support import PEERS, TINY, poll_rows, web_settings

NOW = 1_700_000_000.0
OOM = "CUDA error: out of memory"
FULL = PEERS["full"]


def check(at: float, ok: bool = True, kind: str | None = None, peer: str = FULL, error: str | None = None):
    return ComputeCheck(peer, TINY.dht_prefix, 0, at=NOW + at, ok=ok, duration=0.01,
                        error=error or (None if ok else "failed"), error_kind=None if ok else kind)


def test_two_failed_checks_name_a_server_and_one_success_clears_it():
    failed_once = [check(-20), check(-2, False, SERVER_ERROR, error=OOM)]
    assert verdicts(failed_once, now=NOW, max_age=60).failing == {}  # one failure names nobody
    twice = failed_once + [check(0, False, SERVER_ERROR, error=OOM)]
    found = verdicts(twice, now=NOW, max_age=60)
    assert found.failing == {FULL: OOM} and found.silent == {}
    silent = verdicts([check(-2, False, TIMEOUT), check(0, False, CLIENT_ERROR)], now=NOW, max_age=60)
    assert list(silent.silent) == [FULL] and "no answer to its last 2 compute checks" in silent.silent[FULL]
    mixed = verdicts([check(-2, False, TIMEOUT), check(0, False, SERVER_ERROR)], now=NOW, max_age=60)
    assert (mixed.failing, mixed.silent) == ({}, {})  # two failures of two kinds: neither is confirmed
    healed = verdicts(twice + [check(1)], now=NOW + 1, max_age=60)
    assert (healed.failing, healed.silent) == ({}, {})
    old = verdicts(twice, now=NOW + 61, max_age=60)
    assert old.failing == {}  # past the window


def test_a_failure_is_confirmed_seconds_later_and_a_confirmed_one_looked_at_every_period():
    first = check(0, False, SERVER_ERROR)
    assert due_after(first, check(-20), 20) == pytest.approx(first.at + CONFIRM_DELAY)
    assert due_after(first, None, 20) == pytest.approx(first.at + CONFIRM_DELAY)
    second = check(2, False, SERVER_ERROR)
    assert due_after(second, first, 20) == pytest.approx(second.at + 20)
    assert due_after(check(0), check(-20), 20) == pytest.approx(NOW + 20)


def assessed(computed, reachable=True):
    settings = web_settings(compute_check_period=20)
    snapshot = Snapshot(taken_at=NOW - 1, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    reachability = {peer: ReachabilityResult(peer, "server", True, rtt=0.004) for peer in
                    (PEERS["first"], PEERS["second"], FULL)}
    if not reachable:
        reachability[FULL] = ReachabilityResult(FULL, "server", False, error="timed out")
    (assessment,) = assess(snapshot, reachability, [], {}, now=NOW, thresholds=assessing.thresholds(settings),
                           routing=PETALS_ROUTING, compute=computed)
    return assessment


def test_the_assessment_takes_the_confirmed_verdicts_as_the_newest_evidence():
    failing = assessed([check(-2, False, SERVER_ERROR, error=OOM), check(0, False, SERVER_ERROR, error=OOM)])
    server = failing.servers[FULL]
    assert (server.cause, server.failing, server.confirmed) == (CAUSE_FAILING, OOM, True)
    assert server.checked.at == NOW and failing.flagged(CAUSE_FAILING) == {FULL: OOM}
    assert any("ONLINE but failing" in reason for reason in failing.reasons)

    silent = assessed([check(-2, False, TIMEOUT), check(0, False, TIMEOUT)])
    assert (silent.servers[FULL].cause, silent.servers[FULL].confirmed) == (CAUSE_UNREACHABLE, True)
    assert silent.flagged(CAUSE_UNREACHABLE) == {FULL: "ONLINE but unreachable"}
    assert silent.confirmed([FULL])  # what the alerts tell at once

    answering = assessed([check(0)], reachable=False)  # a check newer than the failed rpc_info round
    assert answering.servers[FULL].cause == CAUSE_SERVING
    unconfirmed = assessed([check(0, False, TIMEOUT)], reachable=False)  # the round alone: not confirmed
    assert unconfirmed.servers[FULL].cause == CAUSE_UNREACHABLE and not unconfirmed.servers[FULL].confirmed
    assert not unconfirmed.confirmed([FULL])


def test_a_server_that_left_is_never_confirmed_so_a_clean_restart_waits_out_for():
    settings = web_settings()
    rows = [row if row.peer_id != FULL else row.__class__(**{**row.__dict__, "state": OFFLINE})
            for row in poll_rows(1)]
    snapshot = Snapshot(taken_at=NOW, duration=0.5, models=(TINY,), servers=tuple(rows))
    (assessment,) = assess(snapshot, {}, [], {}, now=NOW, thresholds=assessing.thresholds(settings),
                           routing=PETALS_ROUTING)
    assert assessment.servers[FULL].cause == CAUSE_OFFLINE and not assessment.confirmed([FULL])


def test_a_reachability_round_that_caught_a_server_stopping_names_nobody_once_it_is_back():
    """A round that ran while a server stopped (announced ONLINE still) stored its failure; a poll
    then saw it away, and it is back ONLINE: that failure is of the server that left (#52's honest
    hour named such servers unreachable up to a minute after a clean restart). A failure after its
    return still names it, and readers show no stale failure as its reachability."""
    from monitor.core.assess import assessed_reachability

    settings = web_settings()
    snapshot = Snapshot(taken_at=NOW, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    failed = {FULL: ReachabilityResult(FULL, "server", False, error="connection refused", at=NOW - 40)}

    def judged(away):
        (assessment,) = assess(snapshot, failed, [], {}, now=NOW, thresholds=assessing.thresholds(settings),
                               routing=PETALS_ROUTING, away=away)
        return assessment

    stale = judged({FULL: NOW - 30})  # away after the failure: a restart since
    assert stale.servers[FULL].cause == CAUSE_SERVING and stale.servers[FULL].back_at == NOW - 30
    assert FULL not in assessed_reachability(failed, {TINY.dht_prefix: stale})
    for away in ({}, {FULL: NOW - 50}):  # never away, or away before it: the failure stands
        named = judged(away)
        assert named.servers[FULL].cause == CAUSE_UNREACHABLE and named.servers[FULL].back_at is None
        assert not assessed_reachability(failed, {TINY.dht_prefix: named})[FULL].ok


def test_the_assessment_keeps_each_server_s_reachability_as_it_judged_it_and_readers_read_that():
    """#48: the judgment of reachability is made once, in the assess step, and stored with the
    assessment (``Assessment.reachability``); the pages, /metrics and the alerts read it
    (``judged_reachability``), not the raw rounds — the bootstrap peers and unassessed servers
    excepted, and assessments stored before it was kept, which are judged from the rounds as then."""
    from dataclasses import replace

    from monitor.core.assess import judged_reachability
    from monitor.core.assessment import Assessment

    settings = web_settings()
    snapshot = Snapshot(taken_at=NOW, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    failed = {FULL: ReachabilityResult(FULL, "server", False, error="connection refused", at=NOW - 40)}
    boot = ReachabilityResult("boot", "bootstrap", True, rtt=0.01, address="/ip4/127.0.0.1/tcp/1", at=NOW - 5)

    def judged(away):
        (assessment,) = assess(snapshot, failed, [], {}, now=NOW, thresholds=assessing.thresholds(settings),
                               routing=PETALS_ROUTING, away=away)
        return assessment

    named, stale = judged({}), judged({FULL: NOW - 30})  # never away / a restart since the failure
    assert not named.reachability[FULL].ok and FULL not in stale.reachability
    for assessment in (named, stale):  # stored whole: read back as judged
        assert Assessment.from_dict(assessment.to_dict()).reachability == assessment.reachability
    # readers read the stored judgment: the raw round no longer needed, nor able to overrule it
    assert not judged_reachability({"boot": boot}, {TINY.dht_prefix: named})[FULL].ok
    assert FULL not in judged_reachability({**failed, "boot": boot}, {TINY.dht_prefix: stale})
    assert judged_reachability({**failed, "boot": boot}, {TINY.dht_prefix: stale})["boot"] == boot
    older = replace(stale, reachability=None)  # stored before the judgment was kept
    assert Assessment.from_dict({k: v for k, v in older.to_dict().items() if k != "reachability"}).reachability is None
    assert FULL not in judged_reachability(failed, {TINY.dht_prefix: older})
    assert not judged_reachability(failed, {TINY.dht_prefix: replace(named, reachability=None)})[FULL].ok


def test_a_server_that_answered_users_after_its_failed_checks_is_busy_not_unreachable(tmp_path):
    """Under sixteen sessions at once a small server can take longer than a check's timeout to get to
    it while it serves every request it has (#49's forecast bench: the chat refused a hundred requests
    as "not fully served" while streaming through the servers it called unreachable). Unanswered
    compute checks or a failed round older than the server's newest successful chat span
    (``Store.answered_since``) name nobody; answers before them change nothing (a server that
    froze answered last before it froze), nor do they excuse the server's own errors."""
    from support import sqlite_store

    def answered(chats):  # what the assess step reads: a fresh store's newest successful span per peer
        here = tmp_path / str(len(list(tmp_path.iterdir())))
        here.mkdir()
        store = sqlite_store(here)
        try:
            store.record_chat_outcomes(chats)
            return store.answered_since(NOW - 60)
        finally:
            store.close()

    settings = web_settings()
    snapshot = Snapshot(taken_at=NOW, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
    silent = [check(-10, False, TIMEOUT), check(-5, False, TIMEOUT)]
    erring = [check(-10, False, SERVER_ERROR, error=OOM), check(-5, False, SERVER_ERROR, error=OOM)]
    failed_round = {FULL: ReachabilityResult(FULL, "server", False, error="Failed to connect in 5 sec", at=NOW - 3)}

    def cause(compute, reachability, chats):
        (assessment,) = assess(snapshot, reachability, [], {}, now=NOW, thresholds=assessing.thresholds(settings),
                               routing=PETALS_ROUTING, compute=compute, answered=answered(chats))
        return assessment.servers[FULL].cause, assessment

    def chat(at: float, ok: bool = True):
        return ChatOutcome(NOW + at, FULL, TINY.dht_prefix, 0, 8, ok=ok, seconds_per_token=0.05 if ok else None)

    assert cause(silent, {}, [])[0] == CAUSE_UNREACHABLE
    assert cause(silent, {}, [chat(-20), chat(-1, ok=False)])[0] == CAUSE_UNREACHABLE  # before, or a failure
    busy, assessment = cause(silent, {}, [chat(-20), chat(-2)])  # it answered a user after its checks
    assert busy == CAUSE_SERVING and assessment.state != "broken"
    assert cause([], failed_round, [])[0] == CAUSE_UNREACHABLE
    heard, assessment = cause([], failed_round, [chat(-1)])
    assert heard == CAUSE_SERVING and assessment.reachability[FULL].ok  # and the pages say it answers
    assert cause(erring, {}, [chat(-1)])[0] == CAUSE_FAILING  # its own error stands
    assert answered([chat(-9), chat(-2), chat(-1, ok=False), chat(-30)]) == {FULL: NOW - 2}
    assert answered([chat(-90)]) == {}  # (before the window read)


def test_a_user_s_failure_asks_for_a_compute_check_and_a_slow_span_for_a_probe():
    failed = ChatOutcome(NOW, FULL, TINY.dht_prefix, 0, 8, ok=False, error=OOM)
    request = confirming_request(failed, None)
    assert (request.job, request.peer_id, request.min_interval) == ("compute-check", FULL, REQUEST_INTERVAL)
    assert OOM in request.why
    slow = ChatOutcome(NOW, FULL, TINY.dht_prefix, 0, 8, ok=True, seconds_per_token=8 * 0.04)
    probe = confirming_request(slow, probed=0.01)  # 0.04 s a block against 0.01 s probed: 4×
    assert (probe.job, probe.min_interval) == ("probes", PROBE_REQUEST_INTERVAL) and "4.0×" in probe.why
    assert confirming_request(slow, probed=0.02) is None  # 2×: within what one request may vary
    assert confirming_request(slow, probed=None) is None  # nothing to compare with


def test_the_chat_s_failures_reach_the_leader_as_one_request_per_server_per_interval(tmp_path):
    import time

    from chat.feedback import store_outcome_sink
    from support import sqlite_store

    store = sqlite_store(tmp_path)
    try:
        sink = store_outcome_sink(store)
        now = time.time()
        for i in range(5):  # a busy chat meeting the same failing server again and again
            sink(ChatOutcome(now + i * 0.1, FULL, TINY.dht_prefix, 0, 8, ok=False, error=OOM))
        sink(ChatOutcome(now, PEERS["first"], TINY.dht_prefix, 0, 4, ok=True, seconds_per_token=0.01))
        pending = store.pending_job_requests()
        assert [(r.job, r.target, r.by) for r in pending] == [("compute-check", FULL, "chat")]
        assert OOM in pending[0].why
        assert len(store.recent_chat_outcomes(now - 1)) == 6  # every outcome is still recorded
    finally:
        store.close()


def test_a_failure_counts_only_once_a_poll_after_it_still_announces_the_server():
    pair = [check(-2, False, CLIENT_ERROR), check(0, False, CLIENT_ERROR)]
    assert verdicts(pair, now=NOW, max_age=60, poll_at=NOW - 3).silent == {}  # no poll since: did it leave?
    assert list(verdicts(pair, now=NOW, max_age=60, poll_at=NOW - 1).silent) == [FULL]


def test_checks_that_failed_before_a_server_came_back_count_against_nobody():
    """A clean restart quicker than the window: two checks failed while it was down, a poll saw it
    OFFLINE (or JOINING), and the poll now announces it ONLINE again — not unreachable."""
    pair = [check(-20, False, CLIENT_ERROR), check(-18, False, CLIENT_ERROR)]
    assert list(verdicts(pair, now=NOW, max_age=60, poll_at=NOW).silent) == [FULL]  # still announced: named
    assert verdicts(pair, now=NOW, max_age=60, poll_at=NOW, away={FULL: NOW - 10}).silent == {}  # it came back
    assert list(verdicts(pair, now=NOW, max_age=60, poll_at=NOW, away={FULL: NOW - 30}).silent) == [FULL]  # away before
    after = pair + [check(-5, False, SERVER_ERROR), check(-3, False, SERVER_ERROR)]
    assert list(verdicts(after, now=NOW, max_age=60, poll_at=NOW, away={FULL: NOW - 10}).failing) == [FULL]  # back, broken


def test_one_failed_dial_names_nobody_a_failure_is_checked_once_more_before_it_is_stored():
    """bench_churn --honest: a server restarted on a new port was dialled at its old address a few
    seconds after it came back, and named unreachable until the next round. A round's failures
    (not a joining server's, not a bootstrap peer's) are checked again; the second check is stored."""
    from monitor.core.snapshot import ReachabilityBatch, confirmed, to_confirm

    first = ReachabilityBatch(taken_at=NOW, duration=1.0, results=(
        ReachabilityResult(FULL, "server", False, error="failed to dial"),
        ReachabilityResult("joining-peer", "server", False, error="joining", joining=True),
        ReachabilityResult("fine-peer", "server", True, rtt=0.01),
        ReachabilityResult("boot", "bootstrap", False, error="refused")))
    assert to_confirm(first) == [FULL]
    again = ReachabilityBatch(taken_at=NOW + 3, duration=0.5,
                              results=(ReachabilityResult(FULL, "server", True, rtt=0.02),))
    merged = {r.peer_id: r for r in confirmed(first, again).results}
    assert merged[FULL].ok and merged["joining-peer"].joining and merged["fine-peer"].ok and not merged["boot"].ok
    still = ReachabilityBatch(taken_at=NOW + 3, duration=0.5,
                              results=(ReachabilityResult(FULL, "server", False, error="failed to dial"),))
    assert not {r.peer_id: r for r in confirmed(first, still).results}[FULL].ok  # failed twice: stored failed


def test_a_round_that_caught_a_server_away_names_nobody_once_a_later_poll_sees_it_back(tmp_path):
    """#52's fourth and fifth honest hours: a poll saw a server OFFLINE (a clean restart), and the
    reachability round that ran beside it — from the poll before's list — failed to dial it; it was
    back before the next poll. No poll saw it away *after* the failure, but the failure is of its
    time away: the poll that sees it back is assessed naming nobody — before it is stored (as the
    poller assesses) and after — and a failure after its return still names it."""
    from monitor.core.compute_checks import away_ended
    from monitor.core.snapshot import ONLINE, ReachabilityBatch
    from support import sqlite_store

    store = sqlite_store(tmp_path)
    settings = web_settings()
    try:
        def poll(at: float, full_state: str, stored: bool = True) -> Snapshot:
            rows = tuple(row if row.peer_id != FULL else row.__class__(**{**row.__dict__, "state": full_state})
                         for row in poll_rows(1))
            snapshot = Snapshot(taken_at=at, duration=0.5, models=(TINY,), servers=rows)
            if stored:
                store.record_poll(snapshot)
            return snapshot

        def cause(snapshot, reachability) -> str:
            (assessment,) = assessing.assess_poll(store, settings, snapshot, reachability, now=NOW)
            return assessment.servers[FULL].cause

        poll(NOW - 120, ONLINE)
        poll(NOW - 60, OFFLINE)  # stopping: it announced OFFLINE
        failed = ReachabilityResult(FULL, "server", False, error="all dials failed", at=NOW - 59.9)
        store.record_reachability(ReachabilityBatch(NOW - 59.9, 2.0, (failed,)))
        assert store.last_away([FULL], NOW - 200) == {FULL: (NOW - 60, None)}
        back = poll(NOW - 5, ONLINE, stored=False)  # restarted meanwhile: the poll that sees it back
        assert cause(back, store.latest_reachability()) == CAUSE_SERVING  # assessed before it is stored
        store.record_poll(back)
        assert store.last_away([FULL], NOW - 200) == {FULL: (NOW - 60, NOW - 5)}  # its time away ended there
        assert cause(back, store.latest_reachability()) == CAUSE_SERVING  # and after
        later = ReachabilityResult(FULL, "server", False, error="all dials failed", at=NOW - 1)
        assert cause(back, {FULL: later}) == CAUSE_UNREACHABLE  # a failure since it is back still names it
        assert store.last_away([PEERS["first"]], NOW - 200) == {}  # never away
        # when the time away ended: the first poll back, stored or being assessed; else not yet
        assert away_ended({FULL: (NOW - 60, NOW - 5)}, NOW, {FULL}) == {FULL: NOW - 5}
        assert away_ended({FULL: (NOW - 60, None)}, NOW, {FULL}) == {FULL: NOW}
        assert away_ended({FULL: (NOW - 60, None)}, NOW, set()) == {FULL: NOW - 60}  # still away
    finally:
        store.close()
