"""Specs of the peer health score: neutral when new, earned by evidence, lost by absence and slowness.
(The score job's SQL against these per-observation scores, on SQLite and PostgreSQL:
``test_score_aggregates.py``.)"""

from __future__ import annotations

import json

import pytest

import monitor.core.scores as scores
from monitor.core.scores import FORMULA, WEIGHTS
from monitor.core.snapshot import OFFLINE, ONLINE, ChatOutcome, Observation, PeerHistory, ReachabilityResult
from support import score_peer, score_swarm, swarm_reference

NOW = 1_700_000_000.0
HOUR, DAY = 3600.0, 86400.0
POLL = 300.0  # one poll every 5 minutes


def polls(*, days: float = 7, up=lambda at: True, model: str = "m") -> tuple[Observation, ...]:
    """Regular polls up to NOW; `up(at)` says whether that poll saw the peer ONLINE (else it was gone)."""
    count = int(days * DAY / POLL)
    rows = []
    for i in range(count, 0, -1):
        at = NOW - i * POLL + 1
        if up(at):
            rows.append(Observation(at=at, model=model, state=ONLINE, start=0, end=8, inference_rps=300.0))
        else:
            rows.append(Observation(at=at, model=model, state=OFFLINE, seen=False))
    return tuple(rows)


def checks(ok: int = 10, failed: int = 0, rtt: float = 0.012, joining: int = 0) -> tuple:
    results = [ReachabilityResult("p", "server", ok=True, rtt=rtt) for _ in range(ok)]
    results += [ReachabilityResult("p", "server", ok=False, error="timed out") for _ in range(failed)]
    results += [ReachabilityResult("p", "server", ok=False, joining=True) for _ in range(joining)]
    return tuple((NOW - (i + 1) * 600, result) for i, result in enumerate(results))


def chats(peer: str, sec_per_block: float, ok: int = 5, failed: int = 0, blocks: int = 8) -> tuple:
    rows = [ChatOutcome(at=NOW - (i + 1) * 60, peer_id=peer, model="m", start=0, end=blocks, ok=True,
                        seconds_per_token=sec_per_block * blocks) for i in range(ok)]
    rows += [ChatOutcome(at=NOW - (ok + i + 1) * 60, peer_id=peer, model="m", start=0, end=blocks, ok=False,
                         error="connection reset") for i in range(failed)]
    return tuple(rows)


def steady(peer: str = "steady", sec_per_block: float = 0.01, **changes) -> PeerHistory:
    fields = dict(observations=polls(), reachability=checks(), outcomes=chats(peer, sec_per_block), first_seen=NOW - 7 * DAY)
    fields.update(changes)
    return PeerHistory(peer_id=peer, **fields)


def test_a_new_peer_starts_neutral_not_perfect():
    new = score_peer(PeerHistory("new"), NOW)
    assert new.score == 50.0
    assert all(value == 0.5 for value, _, _ in new.components.values())

    barely_seen = PeerHistory("new", observations=polls(days=2 * POLL / DAY), reachability=checks(ok=1))
    assert 50 < score_peer(barely_seen, NOW).score < 60


def test_confidence_grows_with_the_evidence():
    by_polls = [score_peer(PeerHistory("p", observations=polls(days=n * POLL / DAY)), NOW).score for n in (1, 10, 100)]
    assert 50 < by_polls[0] < by_polls[1] < by_polls[2]
    one_failure = score_peer(PeerHistory("p", reachability=checks(ok=0, failed=1)), NOW)
    assert 45 < one_failure.score < 50


def test_a_steady_peer_with_ok_reachability_checks_and_fast_chat_scores_high():
    assert score_peer(steady(), NOW, reference_sec_per_block=0.01).score > 80


def test_a_peer_that_disappears_and_returns_loses_uptime():
    gone = lambda at: not (NOW - 5 * HOUR <= at < NOW - 2 * HOUR)  # noqa: E731  away for 3 hours today
    returned = score_peer(steady(observations=polls(up=gone)), NOW, reference_sec_per_block=0.01)
    always = score_peer(steady(), NOW, reference_sec_per_block=0.01)
    assert returned.components["uptime"][0] < always.components["uptime"][0]
    assert returned.score < always.score
    assert "online 88% of the last 24 h" in returned.explanation[0]
    assert "1 state flap in 24 h" in returned.explanation[2]


def test_a_flapping_peer_scores_well_below_a_steady_one():
    half_hours = lambda at: int((NOW - at) // 1800) % 2 == 0  # noqa: E731
    flapping = score_peer(steady(observations=polls(up=half_hours)), NOW, reference_sec_per_block=0.01)
    always = score_peer(steady(), NOW, reference_sec_per_block=0.01)
    assert flapping.components["stability"][0] < 0.1
    assert "24 state flaps in 24 h" in flapping.explanation[2]
    assert flapping.score < always.score - 20


def test_a_peer_slow_in_chat_scores_lower_than_fast_peers():
    histories = [steady("fastA", 0.010), steady("fastB", 0.012), steady("throttled", 0.045)]
    assert swarm_reference(histories, NOW) == pytest.approx(0.012)
    result = score_swarm(histories, NOW)
    slow = result["throttled"]
    assert slow.score < min(result["fastA"].score, result["fastB"].score) - 5
    assert slow.components["chat_speed"][0] < result["fastB"].components["chat_speed"][0]
    assert "chat: 5/5 ok, 0.045 s/token/block — 3.8× slower than the swarm median" in slow.explanation[3]
    assert "faster than the swarm median" in result["fastA"].explanation[3]


def test_failed_reachability_checks_and_failed_chats_lower_the_score():
    healthy = score_peer(steady(), NOW, reference_sec_per_block=0.01)
    unreachable = score_peer(steady(reachability=checks(ok=2, failed=8)), NOW, reference_sec_per_block=0.01)
    erroring = score_peer(steady(outcomes=chats("steady", 0.01, ok=1, failed=6)), NOW, reference_sec_per_block=0.01)
    assert unreachable.score < healthy.score and erroring.score < healthy.score
    assert "reachability checks ok 2/10" in unreachable.explanation[1] and "timed out" in unreachable.explanation[1]
    assert "chat: 1/7 ok" in erroring.explanation[3] and "connection reset" in erroring.explanation[3]


def test_reachability_checks_that_answer_joining_are_not_failures():
    loading = score_peer(PeerHistory("p", reachability=checks(ok=0, joining=5)), NOW)
    assert loading.components["reachability_success"][0] == 0.5
    assert "5 answered JOINING" in loading.explanation[1]


def test_a_peer_always_down_with_failing_reachability_checks_and_chats_scores_low():
    down = PeerHistory("down", observations=polls(up=lambda at: False), reachability=checks(ok=0, failed=10),
                       outcomes=chats("down", 0.01, ok=0, failed=5))
    result = score_peer(down, NOW)
    assert result.score < 30  # what keeps it above 0: no evidence on RTT, flaps or chat speed (neutral)
    assert "online 0% of the last 24 h" in result.explanation[0] and "never ONLINE" in result.explanation[2]


def test_old_evidence_falls_out_of_the_windows():
    old = PeerHistory("old", reachability=tuple((at - 2 * DAY, r) for at, r in checks(failed=10, ok=0)),
                      outcomes=tuple(ChatOutcome(at=NOW - 8 * DAY, peer_id="old", model="m", start=0, end=8, ok=False)
                                     for _ in range(5)))
    assert score_peer(old, NOW).score == 50.0


def test_the_explanation_has_a_sentence_for_each_component():
    explanation = score_swarm([steady()], NOW)["steady"].explanation
    assert explanation[0].startswith("online 100% of the last 24 h (1 h: 100%, 7 d: 100%)")
    assert explanation[1] == "reachability checks ok 10/10, median RTT 12 ms"
    assert explanation[2].startswith("0 state flaps in 24 h")
    assert explanation[3].startswith("chat: 5/5 ok, 0.01 s/token/block — about the swarm median")
    assert "advertises 0.00333 s/token/block" in explanation[3]

    empty = score_peer(PeerHistory("new"), NOW).explanation
    for word, sentence in zip(("online", "reachability", "flaps", "chat"), empty):
        assert word in sentence


def test_the_formula_is_documented_and_matches_the_components():
    assert sum(WEIGHTS.values()) == 100
    result = score_peer(steady(), NOW, reference_sec_per_block=0.01)
    assert result.components.keys() == WEIGHTS.keys()
    assert result.score == pytest.approx(sum(points for _, _, points in result.components.values()), abs=0.05)
    for name, weight in WEIGHTS.items():
        assert f"{name.replace('_', ' '):<21} {weight:>2}" in FORMULA.lower()
    assert FORMULA in scores.__doc__
    as_json = json.loads(json.dumps(result.to_dict()))
    assert as_json["components"]["uptime"]["weight"] == 30
    assert result.at == as_json["at"] == NOW  # when it was computed: what the store keeps and the API shows


# ---- medians from histograms --------------------------------------------------------------------


def test_histogram_medians_are_exact_for_equal_values_and_within_the_bound_otherwise():
    import random
    import statistics

    from monitor.core import quantiles

    assert quantiles.histogram([0.012] * 7).median() == pytest.approx(0.012)
    assert quantiles.histogram([]).median() is None
    rng = random.Random(3)
    for n in (1, 2, 5, 50, 501):
        values = [rng.lognormvariate(-3, 1.5) for _ in range(n)]
        estimate = quantiles.histogram(values).median()
        exact = statistics.median(values)
        assert abs(estimate - exact) <= quantiles.MAX_RELATIVE_ERROR * exact * 1.0001, (n, estimate, exact)
    # bins merge: two halves summed are the whole (what GROUP BY over rollups or windows relies on)
    left, right = values[:200], values[200:]
    merged = quantiles.from_bins(quantiles.histogram(left).bins + quantiles.histogram(right).bins)
    whole = quantiles.histogram(values)
    assert [(i, n) for i, n, _ in merged.bins] == [(i, n) for i, n, _ in whole.bins]
    assert merged.median() == pytest.approx(whole.median(), rel=1e-12)
