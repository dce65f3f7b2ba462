"""Specs of the speed probes: every ONLINE server measured through its own span, a few real
tokens at a time, on a real private swarm — and what the monitor and the chat make of it.

The session swarm (tiny Llama: first-half 0:4, second-half 4:8, full 0:8; a spec that throttles a
server puts it back), a real SQLite store, the real poller and measuring job run round by round (no scheduler: rounds by hand).
What the measurements mean, without a swarm: ``test_probe_verdicts.py``.
"""

from __future__ import annotations

import time

import pytest

from chat.feedback import StoreWeights
from monitor.app.jobs import Poller
from monitor.app.probing import ServerProber
from monitor.settings import ModelConfig, Settings
from monitor.core.probes import CONFIRM_AFTER, SLOW_FACTOR, ServerProbe, slowness
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.swarm.speed import ProbeLoop, SpanTarget

from support import SESSION_SPECS, polled_prober, probe_rounds_until, sqlite_store, tiny_settings

HALF = TINY_NUM_BLOCKS // 2
SPECS = SESSION_SPECS  # the session swarm's servers (its specs put back whatever they change)
PERIOD = 2.0  # seconds between two probes of a server (the demo uses 20, the default is 300)
MAX_SHARE = 0.5


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
    probe_rounds_until(prober, lambda seen: {p.peer_id for p in seen} >= {swarm.peer_id(s.name) for s in SPECS})
    swarm.throttle("full", duty=0.9, period=0.25)
    throttled_at = time.time()
    try:
        def measured_around(seen) -> bool:
            """Two probes of the throttled server (each its median of three turns), and the estimate
            routed around it (the others' figures are medians too: one probe of theirs slowed by
            a loaded machine can keep it on the route a round longer)."""
            if sum(p.peer_id == full and p.at > throttled_at for p in seen) < 2:
                return False
            assessment = store.latest_assessments()[TINY_DHT_PREFIX]
            # a probe that happens to fall into the throttle's running tenth measures it faster than
            # it is: the verdict is waited for, then checked against the figures it stored
            return (full not in {peer for peer, _, _ in assessment.route}
                    and any(reason.startswith("full (0:8) is slow") for reason in assessment.reasons))

        probe_rounds_until(prober, measured_around, timeout=120)  # no chat
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
