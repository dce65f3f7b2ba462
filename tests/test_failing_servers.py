"""Specs of the "failing" verdict: a server that is up, announced and reachable, but answers every
inference with an error of its own, serves nothing — in the diagnosis, the scores, the alerts,
"is my server OK?" and the chat's weights — and the reasons stay short at any scale."""

from __future__ import annotations

from monitor import compat  # noqa: F401  (before petals)
from monitor.core import alert_rules
from monitor.core.coverage import BROKEN, DEGRADED, HEALTHY, MAX_IN_REASON
from monitor.swarm.routing import diagnose
from monitor.core.assessment import CAUSE_FAILING, CAUSE_UNREACHABLE, Assessment
from monitor.core.probes import (
    CLIENT_ERROR,
    FAILING_CONFIRMATIONS,
    SERVER_ERROR,
    TIMEOUT,
    RecentProbes,
    ServerProbe,
    failing_servers,
    first_server_error,
    recent_window,
)
from monitor.core.scores import PeerAggregates, score_all
from monitor.core.server_check import BAD, ServerFacts, check
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityResult, ServerRow

MODEL = ModelInfo("demo-model", 30)
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"
NOW = 10_000.0
PERIOD = 20.0


def row(peer: str, start: int, end: int, state: str = ONLINE, **fields) -> ServerRow:
    fields.setdefault("throughput", 100.0)
    fields.setdefault("inference_rps", 300.0)
    fields.setdefault("cache_tokens_left", 100_000)
    return ServerRow(peer_id=peer, model=MODEL.dht_prefix, start=start, end=end, state=state, **fields)


def probe(peer: str, at: float, *, ok: bool = False, kind: str | None = SERVER_ERROR, error: str = OOM) -> ServerProbe:
    if ok:
        return ServerProbe(peer, MODEL.dht_prefix, 0, 30, at=at, ok=True, seconds_per_token=0.01, rtt=0.001)
    return ServerProbe(peer, MODEL.dht_prefix, 0, 30, at=at, ok=False, error=error, error_kind=kind)


WINDOW = recent_window(PERIOD)


# ---- the verdict from probes -------------------------------------------------------------------


def test_two_server_errors_in_a_row_make_a_server_failing_with_the_newest_error():
    assert FAILING_CONFIRMATIONS == 2
    probes = [probe("a", NOW - 30, error="older"), probe("a", NOW - 5)]
    assert failing_servers(probes, now=NOW, max_age=WINDOW) == {"a": OOM}


def test_one_flaky_step_changes_nothing():
    probes = [probe("a", NOW - 30, ok=True), probe("a", NOW - 5)]
    assert failing_servers(probes, now=NOW, max_age=WINDOW) == {}
    assert first_server_error(probes[1], probes[0])  # ... but it is confirmed soon
    assert not first_server_error(probe("a", NOW, kind=TIMEOUT), None)


def test_timeouts_and_the_monitors_own_failures_are_not_the_servers_fault():
    for kind in (TIMEOUT, CLIENT_ERROR, None):
        probes = [probe("a", NOW - 30, kind=kind), probe("a", NOW - 5, kind=kind)]
        assert failing_servers(probes, now=NOW, max_age=WINDOW) == {}, kind


def test_a_success_ends_it_and_old_errors_no_longer_count():
    assert failing_servers([probe("a", NOW - 30), probe("a", NOW - 20), probe("a", NOW - 5, ok=True)],
                           now=NOW, max_age=WINDOW) == {}
    stale = [probe("a", NOW - WINDOW - 20), probe("a", NOW - WINDOW - 10)]
    assert failing_servers(stale, now=NOW, max_age=WINDOW) == {}


def test_every_reader_asks_the_same_recent_view():
    recent = RecentProbes([probe("a", NOW - 30), probe("a", NOW - 5), probe("b", NOW - 5, ok=True)], NOW, WINDOW)
    assert recent.failing() == recent.failing(MODEL.dht_prefix) == {"a": OOM}
    assert set(recent.speeds()) == {"b"}


# ---- the diagnosis -----------------------------------------------------------------------------


def demo_rows():
    return [row("s1", 0, 30, public_name="server-1"), row("s2", 0, 15, public_name="server-2"),
            row("s3", 15, 30, public_name="server-3")]


def test_a_failing_server_serves_nothing_and_is_named_with_its_error():
    healthy = diagnose(MODEL, demo_rows())
    assert healthy.state == HEALTHY
    health = diagnose(MODEL, demo_rows(), failing={"s2": OOM})
    assert health.state == DEGRADED
    assert health.excluded_peers["s2"] == f"ONLINE but failing: {OOM}"
    assert health.excluded_causes["s2"] == CAUSE_FAILING
    assert all("s2" not in b.peers for b in health.blocks)
    assert any("server-2 (0:15) is ONLINE but failing: CUDA out of memory" in r for r in health.reasons), health.reasons
    assert all(hop.peer_id != "s2" for hop in health.route)


def test_with_two_failing_only_the_third_serves_and_with_all_three_the_model_is_broken():
    two = diagnose(MODEL, demo_rows(), failing={"s2": OOM, "s3": OOM})
    assert two.state == DEGRADED and [hop.peer_id for hop in two.route] == ["s1"]
    everyone = diagnose(MODEL, demo_rows(), failing={"s1": OOM, "s2": OOM, "s3": OOM})
    assert everyone.state == BROKEN
    assert everyone.reasons[0].startswith(f"every server of blocks 0:30 fails: {OOM}"), everyone.reasons
    assert "server-1, server-2, server-3" in everyone.reasons[0]


def test_a_failed_diagnosis_is_stored_as_such():
    health = Assessment.not_diagnosed(MODEL.dht_prefix, 30, "ValueError: boom")
    again = Assessment.from_dict(health.to_dict())
    assert again.state == "unknown" and again.reasons == ("not diagnosed: ValueError: boom",)
    assert again.recommendation is None


def test_reasons_stay_short_when_hundreds_of_servers_are_announced_but_do_not_serve():
    model = ModelInfo("big", 80)
    rows = [ServerRow(peer_id=f"virtual-{i}", model="big", start=0, end=80, state=ONLINE, throughput=1.0)
            for i in range(119)]
    rows += [ServerRow(peer_id=f"joining-{i}", model="big", start=0, end=80, state=JOINING) for i in range(4)]
    rows += [ServerRow(peer_id=f"offline-{i}", model="big", start=0, end=80, state=OFFLINE) for i in range(2)]
    rows += [ServerRow(peer_id=f"failing-{i}", model="big", start=0, end=80, state=ONLINE) for i in range(3)]
    checks = {f"virtual-{i}": ReachabilityResult(f"virtual-{i}", "server", False, error="routing: not found")
              for i in range(119)}
    health = diagnose(model, rows, checks, failing={f"failing-{i}": OOM * 5 for i in range(3)})
    assert health.state == BROKEN and len(health.reasons) == 1
    reason = health.reasons[0]
    assert reason == ("blocks 0:80 have no serving server: 3 ONLINE but failing, 119 ONLINE but unreachable, "
                      "4 JOINING, 2 OFFLINE — see the servers table — clients cannot run this model")
    assert len(health.excluded_peers) == 128  # every server, with its cause, for the table
    assert sum(c == CAUSE_UNREACHABLE for c in health.excluded_causes.values()) == 119


def test_a_few_servers_are_named_each_with_its_cause_and_a_cut_error():
    rows = [row("a", 0, 30), row("b", 0, 30, state=JOINING)]
    health = diagnose(MODEL, rows, {"a": ReachabilityResult("a", "server", False, error="x" * 500)})
    assert len(health.reasons[0]) < 300 and "a is ONLINE but unreachable" in health.reasons[0]
    assert MAX_IN_REASON == 3


# ---- scores, alerts, "is my server OK?" ------------------------------------------------------------


def test_a_failing_server_scores_zero_with_the_error_in_its_explanation():
    scores = score_all([PeerAggregates("a"), PeerAggregates("b")], NOW, failing={"a": OOM})
    assert scores["a"].score == 0.0 and any(OOM in line for line in scores["a"].explanation)
    assert scores["b"].score > 0.0


def test_an_alert_rule_watches_a_failing_peer():
    rule = alert_rules.Rule("s2-failing", alert_rules.PEER_FAILING, peers=("server-2",))
    view = alert_rules.SwarmView(at=NOW, scrape_period=60, last_ok_poll_at=NOW, watching_since=0, models=(),
                                 peers=(alert_rules.PeerView("s2", public_name="server-2", state=ONLINE, reachable=True,
                                                             failing=OOM),), bootstrap=())
    condition = alert_rules.conditions(rule, view)["server-2"]
    assert condition.active and condition.state == "failing" and OOM in condition.details[0]
    assert "fails every probe with its own error" in condition.summary


def test_is_my_server_ok_says_bad_with_the_error_and_what_to_try():
    rows = demo_rows()
    health = diagnose(MODEL, rows, failing={"s2": OOM})
    facts = ServerFacts(peer_id="s2", now=NOW, poll_at=NOW, models=(MODEL,), rows=(rows[1],),
                        reachability=ReachabilityResult("s2", "server", True, rtt=0.01), assessments={MODEL.dht_prefix: health})
    report = check(facts)
    assert report.status == BAD
    useful = next(c for c in report.checks if c.name == "useful" and c.status == BAD)
    assert OOM in useful.text and "GPU memory" in useful.advice
    assert OOM in report.headline


def test_a_failed_generation_check_breaks_the_model_whatever_its_blocks_look_like():
    from monitor.core.generation import GenerationCheck

    bad = GenerationCheck(MODEL.dht_prefix, at=NOW, ok=False, error="answer did not match /Paris/: 'zzz'")
    health = diagnose(MODEL, demo_rows(), generation=bad)
    assert health.state == BROKEN
    assert health.reasons[0].startswith("the generation check failed: answer did not match /Paris/")
    assert not any(r.startswith("every block is served") for r in health.reasons)
    good = GenerationCheck(MODEL.dht_prefix, at=NOW, ok=True, answer="Paris", tokens=8)
    assert diagnose(MODEL, demo_rows(), generation=good).state == HEALTHY
