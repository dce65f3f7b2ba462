"""Specs of the speed probes: every ONLINE server measured through its own span, a few real
tokens at a time, on a real private swarm — and what the monitor and the chat make of it.

The session swarm (tiny Llama: first-half 0:4, second-half 4:8, full 0:8; a spec that throttles a
server puts it back), a real SQLite store, the real poller and measuring job run round by round (no scheduler: rounds by hand).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from chat.feedback import StoreWeights, probe_speeds
from monitor.core.assess import server_assessments
from monitor.core.assessment import Assessment, ServerAssessment
from monitor.app.jobs import Poller
from monitor.app.probing import ServerProber
from monitor.settings import ModelConfig, Settings
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
from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.swarm.speed import ProbeLoop, SpanTarget

from support import SESSION_SPECS, polled_prober, sqlite_store, tiny_settings

HALF = TINY_NUM_BLOCKS // 2
SPECS = SESSION_SPECS  # the session swarm's servers (its specs put back whatever they change)
PERIOD = 2.0  # seconds between two probes of a server (the demo uses 20, the default is 300)
MAX_SHARE = 0.5


# ---- pure ----------------------------------------------------------------------------------------


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
    """bench_churn --honest: a server joining with one block of the tiny model was named slow — its
    sub-millisecond compute measured 3.5× the others' is the round trip's jitter, adding a millisecond
    to a route. Slowness must cost a route through the span MIN_SLOW_EXCESS (5 ms) per token; any
    real slow server costs far more (a throttled tiny server: tens of ms; a 3× slow demo server of
    15 blocks: ~30 ms)."""
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
    assert slowness(0.004, 1000.0, [], blocks=2).slow  # 6 ms more over two blocks
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
    # a probe worth confirming: half a period, unless the share bound says later
    assert next_probe_delay(0.5, period=20, max_share=0.25, confirm=True) == pytest.approx(20 * CONFIRM_AFTER)
    assert next_probe_delay(4.0, period=20, max_share=0.25, confirm=True) == pytest.approx(16)


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


# ---- on a real swarm -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(swarm, tiny_model, tmp_path_factory):
    """(swarm, poller, prober, store) on the session swarm (a spec that throttles one of its servers
    puts it back): the poller has scraped once; rounds are run by the specs."""
    data_dir = tmp_path_factory.mktemp("speed-probes")
    settings = tiny_settings(swarm, data_dir, tiny_model, speed_probe_period=PERIOD, speed_probe_max_share=MAX_SHARE,
                             speed_probe_timeout=10)
    store = sqlite_store(data_dir)
    poller, prober = polled_prober(settings, store, swarm.dht)
    try:
        yield swarm, poller, prober, store
    finally:
        prober.close()
        store.close()


def run_until(prober: ServerProber, done, timeout: float = 90.0) -> list[ServerProbe]:
    """Run rounds as the job does (one per tick) until ``done(probes so far)``; returns them."""
    seen: list[ServerProbe] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(prober.run_once())
        if done(seen):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"not done within {timeout:.0f} s; probes: {seen}")


def test_every_online_server_is_measured_through_its_own_span(measured):
    swarm, _, prober, store = measured
    probes = {p.peer_id: p for p in prober.run_once()}
    assert set(probes) == {swarm.peer_id(spec.name) for spec in SPECS}
    for spec in SPECS:
        p = probes[swarm.peer_id(spec.name)]
        assert p.ok, p.error
        assert (p.start, p.end) == (spec.start, spec.end)
        # an empty step is a round trip without compute: on a quiet machine a fifth of a one-token
        # step here, but under load its jitter may exceed the tiny model's compute (which
        # seconds_per_token_per_block allows for), so only their bounds are asserted
        assert 0 < p.rtt < 5 and 0 < p.seconds_per_token < 5
        assert p.prefill_seconds > 0 and p.duration >= p.seconds_per_token
        assert p.verdict == "ok"  # honest float32 servers match the monitor's own blocks
    stored = {p.peer_id for p in store.recent_server_probes(time.time() - 60)}
    assert stored == set(probes)


def test_a_probe_of_a_peer_that_does_not_answer_fails_with_its_reason(measured):
    swarm, _, _, _ = measured
    loop = ProbeLoop(swarm.dht, concurrency=1)
    try:
        nobody = "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"  # a valid id no peer of this swarm has
        wrong_blocks = SpanTarget(swarm.peer_id("first-half"), TINY_DHT_PREFIX, HALF, TINY_NUM_BLOCKS)
        results = loop.probe([SpanTarget(nobody, TINY_DHT_PREFIX, 0, 1), wrong_blocks], timeout=3)
    finally:
        loop.close()
    assert [r.probe.ok for r in results] == [False, False]
    assert all(r.probe.error for r in results)


def test_a_throttled_server_is_ranked_slow_by_probes_alone(measured):
    swarm, poller, prober, store = measured
    full = swarm.peer_id("full")
    run_until(prober, lambda seen: {p.peer_id for p in seen} >= {swarm.peer_id(s.name) for s in SPECS})
    swarm.throttle("full", duty=0.9, period=0.25)
    throttled_at = time.time()
    try:
        def measured_around(seen) -> bool:
            """Two probes of the throttled server (each its median of three turns), and the estimate
            routed around it (the others' figures are medians too: one probe of theirs slowed by
            a loaded machine can keep it on the route a round longer)."""
            if sum(p.peer_id == full and p.at > throttled_at for p in seen) < 2:
                return False
            return full not in {peer for peer, _, _ in store.latest_assessments()[TINY_DHT_PREFIX].route}

        run_until(prober, measured_around, timeout=120)  # no chat
        servers = store.latest_assessments()[TINY_DHT_PREFIX].servers  # what every reader reads
        speeds = {peer: server.measured for peer, server in servers.items() if server.measured is not None}
        assert max(speeds, key=speeds.get) == full
        others = [s for peer, s in speeds.items() if peer != full]
        assert slowness(speeds[full], None, others).vs_others >= SLOW_FACTOR

        health = store.latest_assessments()[TINY_DHT_PREFIX]  # re-diagnosed after the round
        assert any(reason.startswith("full (0:8) is slow") for reason in health.reasons), health.reasons
        assert full not in {peer for peer, _, _ in health.route}  # the estimate goes around it
        assert health.speed_source == "measured"

        scored = poller.refresh_scores()  # speed in the scores comes from the probes: no chat either
        speed = {peer: scored[peer].components["chat_speed"][0] for peer in speeds}
        assert min(speed, key=speed.get) == full and "speed probes measure" in scored[full].explanation[3]

        weights = StoreWeights(store, period=3600).refresh()  # what the chat routes by: no chat needed
        measured_weights = {p: w.seconds_per_token_per_block for p, w in weights.items()}
        assert set(measured_weights) >= {swarm.peer_id(s.name) for s in SPECS}
        assert max(measured_weights, key=measured_weights.get) == full
    finally:
        swarm.unthrottle("full")



def test_a_probe_round_rediagnoses_the_newest_poll_even_if_one_landed_during_the_round(measured, tmp_path):
    """A poll stored while the round probes was diagnosed without the round's probes; the round then
    diagnoses that newest poll again with them (not the poll it started from, which is no longer the
    latest: that re-diagnosis would be dropped, and the round's findings wait for a later poll)."""
    swarm, _, _, _ = measured
    settings = Settings(data_dir=tmp_path, initial_peers=swarm.initial_peers,
                        models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS)],
                        speed_probe_period=PERIOD, speed_probe_max_share=MAX_SHARE, speed_probe_timeout=10)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")  # no server probe stored yet
    store.migrate()
    poller = Poller(settings, store, swarm.dht)
    started_from = poller.poll_once()
    assert store.latest_assessments()[TINY_DHT_PREFIX].speed_source == "announced"

    def snapshot_then_a_poll_lands():
        snapshot = poller._last_snapshot
        assert poller.poll_once() is not None  # meanwhile: a newer poll, diagnosed before the round's probes
        return snapshot

    rediagnosed: list[bool] = []
    prober = ServerProber(settings, store, swarm.dht, snapshot=snapshot_then_a_poll_lands,
                              after_round=lambda: rediagnosed.append(poller.assess_latest()))
    try:
        assert {p.peer_id for p in prober.run_once() if p.ok} == {swarm.peer_id(s.name) for s in SPECS}
    finally:
        prober.close()
    try:
        newest = store.latest_snapshot()
        assert newest.taken_at > started_from.taken_at and rediagnosed == [True]
        health = store.latest_assessments()[TINY_DHT_PREFIX]  # the newest poll's, with the round's probes
        assert health.speed_source == "measured", health.reasons
    finally:
        store.close()


def test_no_server_was_probed_sooner_than_its_schedule_nor_beyond_its_time_share(measured):
    """Over every probe of this module (the throttled server's long ones included): a second probe
    within a period only to confirm one that would change the verdict, and never beyond the share."""
    _, _, _, store = measured
    by_peer: dict[str, list[ServerProbe]] = {}
    for p in store.recent_server_probes(0):
        by_peer.setdefault(p.peer_id, []).append(p)
    assert len(by_peer) == len(SPECS) and all(len(probes) >= 2 for probes in by_peer.values())
    for probes in by_peer.values():
        for before, after in zip(probes, probes[1:]):
            gap = after.at - before.at
            assert gap >= CONFIRM_AFTER * PERIOD
            assert before.duration / gap <= MAX_SHARE  # the share of the server's time probes took
