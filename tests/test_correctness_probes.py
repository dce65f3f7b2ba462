"""Specs of the correctness probes: a server that answers fast but wrong is found by comparing
its outputs with the monitor's own computation of its blocks (the model's local weights), or,
without weights, with other servers of the same blocks; it is flagged on the pages and in the
diagnosis, and the chat routes around it. Honest float32 servers are never flagged.

The session swarm (tiny Llama: first-half 0:4, second-half 4:8, full 0:8; the harness makes a
server corrupt its outputs, and each spec that does puts it back), a real SQLite store, the real poller and measuring job run
round by round, a real chat engine, and once the whole service with its scheduler. The tolerance,
the cross-check and the diagnosis they make, without a swarm: ``test_probe_verdicts.py``.
"""

from __future__ import annotations

import time

import pytest

from chat.engine import ChatEngine, Finished, GenerationParams
from chat.feedback import StoreWeights, store_assessment_check, store_outcome_sink
from chat.policy import RoutingSettings
from monitor.app.probing import ServerProber
from monitor.app.service import Service
from monitor.settings import ModelConfig, Settings
from monitor.core.probes import (
    CORRECT,
    DISAGREES,
    WRONG,
)
from monitor.harness.demo_swarm import DemoControls
from monitor.harness.local_swarm import LocalSwarm
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS

from support import SESSION_SPECS, polled_prober, probe_rounds_until, sqlite_store, tiny_settings

HALF = TINY_NUM_BLOCKS // 2
SPECS = SESSION_SPECS  # the session swarm's servers (its specs put back whatever they change)
PERIOD = 1.0


# ---- on a real swarm -------------------------------------------------------------------------------


def settings_for(swarm: LocalSwarm, data_dir, *, path=None, **overrides) -> Settings:
    values = dict(speed_probe_period=PERIOD, speed_probe_max_share=0.5, speed_probe_timeout=10)
    values.update(overrides)
    return tiny_settings(swarm, data_dir, path, **values)


@pytest.fixture(scope="module")
def checked(swarm, tiny_model, tmp_path_factory):
    """(swarm, poller, prober, store) with the tiny model's weights as the reference, on the session
    swarm (a spec that corrupts one of its servers puts it back)."""
    data_dir = tmp_path_factory.mktemp("correctness-probes")
    settings = settings_for(swarm, data_dir, path=tiny_model)
    store = sqlite_store(data_dir)
    poller, prober = polled_prober(settings, store, swarm.dht)
    try:
        yield swarm, poller, prober, store
    finally:
        prober.close()
        store.close()


def test_honest_float32_servers_are_never_flagged(checked):
    swarm, _, prober, _ = checked
    peers = {swarm.peer_id(spec.name) for spec in SPECS}
    probes = probe_rounds_until(prober, lambda seen: all(sum(p.peer_id == peer for p in seen) >= 3 for peer in peers))
    for p in probes:
        assert p.ok and p.verdict == CORRECT and p.checked_against == "reference", p
        assert p.error_ratio < p.tolerance / 100  # not a near miss: float32 agrees to rounding


def test_a_corrupting_server_is_flagged_in_one_round_and_the_chat_routes_around_it(checked, tiny_model):
    swarm, poller, prober, store = checked
    second = swarm.peer_id("second-half")
    swarm.corrupt("second-half")
    corrupted_at = time.time()
    try:
        probes = probe_rounds_until(prober, lambda seen: any(p.peer_id == second and p.at > corrupted_at for p in seen))
        verdicts = {p.peer_id: p.verdict for p in probes if p.at > corrupted_at}
        assert verdicts[second] == WRONG  # its first probe since it corrupts
        assert all(v == CORRECT for peer, v in verdicts.items() if peer != second)

        health = store.latest_assessments()[TINY_DHT_PREFIX]
        assert second in health.excluded_peers and "wrong outputs" in health.excluded_peers[second]
        assert any(r.startswith("second-half returns wrong outputs") for r in health.reasons), health.reasons
        assert all(second not in block.peers for block in health.blocks)
        scored = poller.refresh_scores()  # the peer scores lose it too
        assert scored[second].score == 0 and "wrong outputs" in scored[second].explanation[-1]
        assert all(scored[swarm.peer_id(n)].score > 0 for n in ("first-half", "full"))

        weights = StoreWeights(store, period=3600)
        weights.refresh()
        assert weights()[second].score == 0  # routing leaves it out wherever others cover its blocks
        engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                            score_source=weights, outcome_sink=store_outcome_sink(store, weights),
                            assessment_check=store_assessment_check(store), routing=RoutingSettings(mode="health"))
        try:
            ids = engine.encode(TINY_DHT_PREFIX, "Hello")
            with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=3)) as answer:
                finished = [e for e in answer if isinstance(e, Finished)]
            route = [hop.peer_id for hop in finished[0].route]
            assert route and second not in route  # the first request already avoids it
        finally:
            engine.close()
            weights.close()
    finally:
        swarm.uncorrupt("second-half")
    fixed_at = time.time()
    probes = probe_rounds_until(prober, lambda seen: any(p.peer_id == second and p.at > fixed_at for p in seen))
    assert [p.verdict for p in probes if p.peer_id == second and p.at > fixed_at][-1] == CORRECT
    assert second not in store.latest_assessments()[TINY_DHT_PREFIX].excluded_peers  # a correct verdict clears it


def test_without_weights_servers_of_the_same_blocks_are_compared_and_disagreements_shown(checked, tmp_path):
    swarm, poller, _, store = checked
    settings = settings_for(swarm, tmp_path)  # no path: nothing to compute a reference with
    prober = ServerProber(settings, store, swarm.dht, snapshot=lambda: poller._last_snapshot)
    second, full, first = (swarm.peer_id(name) for name in ("second-half", "full", "first-half"))
    swarm.corrupt("second-half")
    try:
        # full serves both segments, 0:4 (with first-half) and 4:8 (with second-half), in turn
        probes = probe_rounds_until(prober, lambda seen: any(p.peer_id == second and p.verdict for p in seen)
                                    and any(p.peer_id == full and (p.start, p.end) == (HALF, TINY_NUM_BLOCKS)
                                            and p.verdict for p in seen)
                                    and any(p.peer_id == first and p.verdict for p in seen))
    finally:
        swarm.uncorrupt("second-half")
        prober.close()
    assert all(p.checked_against == "peers" for p in probes if p.verdict)
    on_second_segment = [p for p in probes if (p.start, p.end) == (HALF, TINY_NUM_BLOCKS) and p.verdict]
    # two servers that disagree: nobody outvotes either, both are shown as disagreeing
    assert {p.verdict for p in on_second_segment} == {DISAGREES}
    assert {p.peer_id for p in on_second_segment} == {second, full}
    assert all(p.verdict == CORRECT for p in probes if (p.start, p.end) == (0, HALF) and p.verdict)

    # ...and in the model's diagnosis, as reasons (not only on the pages); both still serve
    assert poller.assess_latest()
    health = store.latest_assessments()[TINY_DHT_PREFIX]
    for name in ("second-half", "full"):
        assert any(r.startswith(f"{name} outputs disagree with other servers") for r in health.reasons), health.reasons
    assert not any(r.startswith("first-half outputs disagree") for r in health.reasons)
    assert health.state == "degraded" and second not in health.excluded_peers and full not in health.excluded_peers


def test_the_dashboard_shows_a_corrupting_server_without_anyone_chatting(checked, tiny_model, tmp_path):
    """The whole service, its scheduler included, the server corrupted from the demo panel: flagged on
    the model and peer pages within a probe period (plus one tick and a scrape)."""
    swarm = checked[0]
    settings = settings_for(swarm, tmp_path, path=tiny_model, speed_probe_period=4.0, scrape_period=2,
                            reachability_period=2, score_period=30)
    second = swarm.peer_id("second-half")
    service = Service(settings, enable_chat=False, demo_controls=DemoControls(swarm)).start()
    try:
        client = service.app.test_client()
        token = (tmp_path / "admin_token").read_text().strip()
        answer = client.post("/demo/servers/second-half/corrupt", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200 and swarm.is_corrupted("second-half")
        assert 'data-demo-server="second-half"' in answer.get_data(as_text=True)
        deadline = time.monotonic() + 120
        page = ""
        while time.monotonic() < deadline:
            page = client.get(f"/models/{TINY_DHT_PREFIX}").get_data(as_text=True)
            row = page[page.find(f'data-peer-id="{second}"'):]
            # its row in the servers table, and the model's diagnosis
            if 'data-verdict="wrong"' in row[:row.find("</tr>")] and "second-half returns wrong outputs" in page:
                break
            time.sleep(1)
        else:
            reasons = service.store.latest_assessments()[TINY_DHT_PREFIX].reasons
            raise AssertionError(f"the model page never flagged the corrupting server; diagnosis: {reasons}")
        peer_page = client.get(f"/peers/{second}").get_data(as_text=True)
        assert "wrong outputs" in peer_page[peer_page.find('id="measured-h"'):]
        metrics = client.get("/metrics").get_data(as_text=True)
        assert "swarm_monitor_servers_wrong_outputs 1.0" in metrics
        assert 'swarm_monitor_correctness_checks_1h{verdict="wrong"}' in metrics
    finally:
        swarm.uncorrupt("second-half")
        service.close()
