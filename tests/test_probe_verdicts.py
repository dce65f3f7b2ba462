"""Specs of what the probes' measurements and comparisons mean, without a swarm
(``monitor.core.probes``). Speed: a server's measured speed is the median of its newest three
probes, so one outlier moves nothing; it is slow only when a route through it costs noticeably
more, and only on two slow probes; each server is probed once a period (less often when its probes
are long, sooner when it is judged bad or a probe would change its verdict); the chat's router
takes a probe only where it is newer than its own measurement. Correctness: the tolerance follows
precision, quantization and the blocks; a cross-check outvotes one wrong server, and a disagreement
nobody outvotes is a reason in the diagnosis, a few lines however many servers disagree. The probes
on a real swarm: ``test_speed_probes.py``, ``test_correctness_probes.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from chat.feedback import probe_speeds
from monitor.core.assess import server_assessments
from monitor.core.assessment import Assessment, ServerAssessment
from monitor.core.coverage import DEGRADED
from monitor.swarm.routing import diagnose
from monitor.core.probes import (
    CONFIRM_AFTER,
    SLOW_FACTOR,
    RecentProbes,
    ServerProbe,
    measured_speeds,
    RECOVERY_AFTER,
    RECOVERY_CONFIRM_AFTER,
    RECOVERY_SHARE_FACTOR,
    next_probe_delay,
    slowness,
    worth_confirming,
)
from monitor.core.probes import CORRECT, DISAGREES, WRONG, cross_check, disagreeing_outputs, judge, tolerance
from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow


# ---- speed -------------------------------------------------------------------------------------


def probe(peer: str, at: float, seconds: float, *, start: int = 0, end: int = 4, rtt: float = 0.0) -> ServerProbe:
    return ServerProbe(peer_id=peer, model="m", start=start, end=end, at=at, ok=True, seconds_per_token=seconds,
                       rtt=rtt, duration=seconds)


def test_a_measured_speed_is_the_median_of_the_newest_three_probes_so_one_outlier_moves_nothing():
    now = 1000.0
    calm = [probe("a", now - 30 + i, 0.04) for i in range(3)]
    assert measured_speeds(calm, now=now, max_age=60) == {"a": pytest.approx(0.01)}  # 0.04 s / 4 blocks
    one_spike = calm + [probe("a", now - 1, 0.4)]
    assert measured_speeds(one_spike, now=now, max_age=60)["a"] == pytest.approx(0.01)
    two_spikes = one_spike + [probe("a", now, 0.4)]
    assert measured_speeds(two_spikes, now=now, max_age=60)["a"] == pytest.approx(0.1)
    assert measured_speeds(calm, now=now + 100, max_age=60) == {}  # too old to count
    # the empty step (network and handler, no compute) is not charged to the blocks
    assert measured_speeds([probe("b", now, 0.05, rtt=0.01)], now=now, max_age=60)["b"] == pytest.approx(0.01)


def test_a_server_is_slow_only_when_it_costs_a_route_through_it_noticeably_more():
    """bench_churn --honest: servers joining with one block of the tiny model were named slow — a
    step's fixed cost on the server (~5 ms here) counted as its one block's compute is 3–7× the
    others' per block, adding a few milliseconds to a route. Slowness must cost a route through the
    span MIN_SLOW_EXCESS (20 ms) per token; any real slow server costs far more (a throttled tiny
    server: ~80 ms; a 3× slow demo server of 15 blocks: ~60 ms)."""
    others = [0.0002, 0.0002, 0.0003]  # seconds per token per block
    jitter = slowness(0.0008, None, others, blocks=1)  # 3.2× the median, 0.56 ms more per token
    assert jitter.vs_others >= SLOW_FACTOR and not jitter.beyond_factor and not jitter.slow
    assert worth_confirming(0.0008, 0.0005, None, others) and not worth_confirming(0.0008, 0.0005, None, others, blocks=1)
    throttled = slowness(0.02, None, others, blocks=4)  # 100×, 79 ms more per token over 4 blocks
    assert throttled.beyond_factor and throttled.slow
    demo = slowness(0.006, None, [0.002, 0.002], blocks=15)  # 3×, 60 ms more over 15 blocks
    assert demo.slow
    announced = slowness(0.004, 1000.0, [], blocks=1)  # 4× what it announces (1 ms), 3 ms more: not slow
    assert announced.vs_announced >= SLOW_FACTOR and not announced.slow
    assert slowness(0.004, 1000.0, [], blocks=8).slow  # 24 ms more over eight blocks
    # the honest hour's one-block joiners: 6.2 ms "per block" (the step's fixed cost) against 1.3 ms
    fixed_cost = slowness(0.0062, None, [0.0013, 0.0012, 0.0014], blocks=1)
    assert fixed_cost.vs_others >= SLOW_FACTOR and not fixed_cost.slow
    assert slowness(0.0008, None, others).slow  # its span unknown: the factor alone, as before


def test_one_probe_calls_no_server_slow_two_slow_ones_do():
    """A server's first probe alone names nothing: after a monitor starts, or a new leader takes over,
    one noisy probe would otherwise hold the model degraded until its confirmation half a period
    later. Of two probes the faster counts, of three the middle one: two slow ones call it slow."""
    now, model = 1000.0, ModelInfo("m", 6)
    rows = [ServerRow(peer_id="a", model="m", start=0, end=2, state=ONLINE, cache_tokens_left=100_000)]
    rows += [ServerRow(peer_id=p, model="m", start=2, end=6, state=ONLINE, cache_tokens_left=100_000) for p in "bc"]
    calm = [probe(p, now - 50, 0.04, start=2, end=6) for p in "bc"]  # 10 ms per block
    slow, fast = 0.2, 0.02  # a's probes of its two blocks: 100 ms per block (10× the others), or 10 ms

    def judged(a_probes: list[float]):
        probes = calm + [probe("a", now - 40 + i, seconds, end=2) for i, seconds in enumerate(a_probes)]
        recent = RecentProbes(probes, now, 60)
        health = diagnose(model, rows, measured=recent.speeds("m"), confirmed=recent.confirmed("m"))
        view = server_assessments(recent, "m", {r.peer_id: None for r in rows}, health.excluded_causes)["a"]
        named = [r for r in health.reasons if r.startswith("…a (0:2) is slow") or r.startswith("slow blocks 0:2")]
        return health, view, named

    health, view, named = judged([slow])
    assert health.state == DEGRADED  # blocks 0:2 have one server: degraded, but not for its speed
    assert named == [] and not view.slow and view.slowness.beyond_factor
    assert view.measured == pytest.approx(0.1) and "one probe so far" in view.slowness.describe()  # still shown

    for a_probes in ([slow, fast], [fast, slow], [slow, fast, fast], [fast, slow, fast, slow, fast]):
        _, view, named = judged(a_probes)
        assert named == [] and not view.slow and view.measured == pytest.approx(0.01), a_probes

    for a_probes in ([slow, slow], [slow, fast, slow], [fast, fast, slow, slow]):
        _, view, named = judged(a_probes)
        assert len(named) == 2 and view.slow and "one probe so far" not in view.slowness.describe(), a_probes


def test_a_server_is_probed_once_per_period_or_less_often_when_its_probes_are_long():
    assert next_probe_delay(0.5, period=300, max_share=0.02) == 300  # 0.5 s of 300 s: well within 2 %
    assert next_probe_delay(12.0, period=300, max_share=0.02) == pytest.approx(600)  # 12 s at most 2 %
    assert next_probe_delay(None, period=20, max_share=0.1) == 20  # a failed probe: the period
    # a probe worth confirming: half a period, unless the share bound (relaxed for this one probe) says later
    assert next_probe_delay(0.5, period=20, max_share=0.25, confirm=True) == pytest.approx(20 * CONFIRM_AFTER)
    assert next_probe_delay(12.0, period=20, max_share=0.1, confirm=True) == pytest.approx(
        12.0 / (0.1 * RECOVERY_SHARE_FACTOR))
    # at the defaults, the bench's throttled tiny server (a 1.5 s probe) is confirmed after half a period
    assert next_probe_delay(1.5, period=100, max_share=0.02, confirm=True) == pytest.approx(100 * CONFIRM_AFTER)


def test_a_server_judged_bad_is_probed_sooner_and_its_recovery_confirmed_within_a_minute_at_the_defaults():
    """Recovering (judged slow, wrong or failing): a quarter period, within RECOVERY_SHARE_FACTOR
    times the share; a probe that would clear it confirmed after RECOVERY_CONFIRM_AFTER. The worst
    case at the defaults: healed just after a slow probe of d_slow, the next (fast) probe waits
    out the share bound, its confirmation a few seconds more — the two fast probes a recovery
    needs (the low median of SPEED_SAMPLES) land well within 60 s while d_slow ≤ 1.5 s."""
    from monitor.settings import Settings

    defaults = Settings()
    period, share = defaults.speed_probe_period, defaults.speed_probe_max_share
    assert next_probe_delay(0.1, period, share, recovering=True) == pytest.approx(RECOVERY_AFTER * period)
    assert next_probe_delay(0.1, period, share, recovering=True, confirm=True) == pytest.approx(
        RECOVERY_CONFIRM_AFTER * period)
    d_slow, d_fast = 1.5, 0.3  # the bench's throttled tiny server, and healthy
    assert next_probe_delay(d_slow, period, share, recovering=True) == pytest.approx(
        d_slow / (share * RECOVERY_SHARE_FACTOR))  # the share bound still holds, relaxed
    assert next_probe_delay(d_slow, period, share) == pytest.approx(max(period, d_slow / share))  # not recovering
    second_fast = (next_probe_delay(d_slow, period, share, recovering=True) + d_fast
                   + next_probe_delay(d_fast, period, share, recovering=True, confirm=True) + d_fast)
    assert second_fast <= 45, second_fast  # + a tick, the re-assessment and the page: under 60 s
    assert next_probe_delay(1.0, period=10, max_share=0.4, recovering=True) == pytest.approx(2.5)  # ≤ half


def test_a_probe_that_would_change_a_servers_verdict_is_confirmed_sooner():
    others = [0.01, 0.012]
    assert worth_confirming(0.05, 0.011, None, others)  # throttled: slow alone, not so far
    assert worth_confirming(0.011, 0.05, None, others)  # back to its speed: not slow alone, slow so far
    assert worth_confirming(0.004, 0.013, None, others)  # 3× faster than so far: also a change worth confirming
    assert not worth_confirming(0.013, 0.011, None, others)  # the usual jitter
    assert not worth_confirming(0.06, 0.05, None, others)  # slow, and already measured slow
    assert worth_confirming(0.05, 0.011, 100.0, [])  # alone: 5× what it announces, nobody to compare with
    assert worth_confirming(0.05, None, None, others) and not worth_confirming(0.011, None, None, others)
    assert not worth_confirming(None, 0.011, None, others)  # a failed probe measured nothing


def test_a_throttled_server_is_named_slow_within_two_periods_whenever_the_throttle_began():
    """The worst case: throttled just after a probe. Its next probe (a period later) is the first slow
    one; the confirmation comes half a period after it (its duration d within the share bound),
    and the diagnosis names it slow once that one is stored: 1.5 periods + d, below 2 periods while
    d / share ≤ half a period and d ≤ half a period. The demo's settings keep that for its throttle."""
    from monitor.harness.demo_swarm import DEMO_SPEED_PROBE_MAX_SHARE, DEMO_SPEED_PROBE_PERIOD

    period, share, d = DEMO_SPEED_PROBE_PERIOD, DEMO_SPEED_PROBE_MAX_SHARE, 4.2  # d: its probes' steps, throttled
    first_slow = period  # throttled just after a probe: the next one is a period later
    confirmed = first_slow + next_probe_delay(d, period, share, confirm=True) + d
    assert confirmed <= 2 * period - 2  # (a round's pauses, schema call and re-diagnosis take about a second)
    unconfirmed = first_slow + next_probe_delay(d, period, share) + d
    assert unconfirmed > 2 * period  # probed at the period only, two periods would not do


def test_slow_means_measured_many_times_what_it_announces_or_what_the_others_take():
    announced = slowness(0.05, 100.0, [0.012, 0.011])  # announces 10 ms per block
    assert announced.slow and announced.vs_announced == pytest.approx(5)
    quiet = slowness(0.05, None, [0.01, 0.012])  # announces nothing: judged against the others
    assert quiet.slow and not quiet.announces and quiet.vs_others == pytest.approx(0.05 / 0.011)
    assert not slowness(0.012, None, [0.01, 0.012]).slow
    assert slowness(None, 100.0, [0.01]) is None


def test_the_router_takes_a_probe_only_where_it_is_newer_than_the_chats_own_measurement():
    from monitor.core.snapshot import ChatOutcome

    measured = {p: ServerAssessment(p, "serving", measured=0.02, round_trip=0.02, measured_at=100.0) for p in "ab"}
    assessments = {"m": replace(Assessment.not_diagnosed("m", 4, "unused"), servers=measured)}
    chat = [ChatOutcome(at=200.0, peer_id="a", model="m", start=0, end=4, ok=True, seconds_per_token=0.02)]
    speeds = probe_speeds(assessments, chat)
    assert speeds == {"b": pytest.approx(0.02)}  # a: the chat measured it after the probe


# ---- correctness -------------------------------------------------------------------------------


def test_tolerance_follows_precision_and_quantization_and_grows_with_the_blocks():
    assert tolerance("float32", None, 8) < tolerance("float16", None, 8) < tolerance("bfloat16", None, 8)
    assert tolerance("bfloat16", None, 8) < tolerance("bfloat16", "nf4", 8)
    assert tolerance("float32", None, 1) < tolerance("float32", None, 30)
    assert tolerance("float16", "int8", 80) <= 0.5  # never so loose that half the output may be off
    assert judge(1e-6, tolerance("float32", None, 8)) == CORRECT
    assert judge(0.9, tolerance("bfloat16", "nf4", 80)) == WRONG
    assert judge(float("nan"), 0.5) == WRONG


def test_cross_check_outvotes_one_wrong_server_and_shows_a_disagreement_nobody_outvotes():
    allowed = {pair: 0.01 for pair in [("a", "b"), ("a", "c"), ("b", "c")]}
    one_off = {("a", "b"): 1e-6, ("a", "c"): 0.8, ("b", "c"): 0.8}
    assert cross_check(one_off, allowed) == {"a": (CORRECT, ()), "b": (CORRECT, ()), "c": (WRONG, ("a", "b"))}
    two = {("a", "b"): 0.8}
    assert cross_check(two, {("a", "b"): 0.01}) == {"a": (DISAGREES, ("b",)), "b": (DISAGREES, ("a",))}


def test_a_disagreement_nobody_outvotes_is_a_reason_in_the_diagnosis_and_both_servers_still_serve():
    from monitor.swarm.routing import diagnose
    from monitor.core.assessment import DEGRADED
    from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow

    def checked(peer, at, start, end, verdict):
        return ServerProbe(peer_id=peer, model="m", start=start, end=end, at=at, ok=True, seconds_per_token=0.01,
                           verdict=verdict, error_ratio=0.9 if verdict == DISAGREES else 1e-6, tolerance=0.01,
                           checked_against="peers", detail="disagrees with …x" if verdict == DISAGREES else None)

    # "full" serves two segments, checked in turn: its agreement on 0:4 does not clear its disagreement on 4:8
    probes = [checked("full", 10, 4, 8, DISAGREES), checked("second", 10, 4, 8, DISAGREES),
              checked("full", 20, 0, 4, CORRECT), checked("first", 20, 0, 4, CORRECT)]
    disagreeing = disagreeing_outputs(probes, now=30, max_age=60, model="m")
    assert set(disagreeing) == {"full", "second"} and "blocks 4:8" in disagreeing["full"]
    assert disagreeing_outputs(probes + [checked("second", 25, 4, 8, CORRECT)], now=30, max_age=60) == {
        "full": disagreeing["full"]}  # a newer agreement on the same blocks clears it
    assert disagreeing_outputs(probes, now=100, max_age=60) == {}  # too old to count

    rows = [ServerRow(peer, "m", start, end, ONLINE, throughput=10.0, public_name=peer)
            for peer, start, end in (("first", 0, 4), ("second", 4, 8), ("full", 0, 8))]
    health = diagnose(ModelInfo("m", 8), rows, disagreeing=disagreeing)
    assert health.state == DEGRADED and health.min_redundancy == 2 and not health.excluded_peers
    for peer in ("full", "second"):
        assert any(r.startswith(f"{peer} outputs disagree with other servers") and "cannot tell which" in r
                   for r in health.reasons), health.reasons


def test_a_thousand_disagreeing_servers_make_a_diagnosis_of_a_few_lines():
    """Anyone can announce servers: 1,000 of them disagreeing (or wrong) name a few and count the
    rest, so a diagnosis (stored with every poll, shown on every page) stays small."""
    from monitor.core.coverage import MAX_NAMED
    from monitor.swarm.routing import diagnose
    from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow
    from monitor.core.assessment import DEGRADED

    rows = [ServerRow(f"s{i:04d}", "m", 0, 8, ONLINE, throughput=10.0, public_name=f"s{i:04d}") for i in range(1000)]
    disagreeing = {row.peer_id: "outputs disagree with other servers on blocks 0:8" for row in rows}
    health = diagnose(ModelInfo("m", 8), rows, disagreeing=disagreeing)
    named = [r for r in health.reasons if "cannot tell which" in r]
    assert len(named) == MAX_NAMED and f"and {1000 - MAX_NAMED} more servers that disagree with others" in health.reasons
    assert health.state == DEGRADED and len(health.reasons) <= 2 * MAX_NAMED
