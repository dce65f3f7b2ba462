"""Specs of the correctness probes: a server that answers fast but wrong is found by comparing
its outputs with the monitor's own computation of its blocks (the model's local weights), or,
without weights, with other servers of the same blocks; it is flagged on the pages and in the
diagnosis, and the chat routes around it. Honest float32 servers are never flagged.

The session swarm (tiny Llama: first-half 0:4, second-half 4:8, full 0:8; the harness makes a
server corrupt its outputs, and each spec that does puts it back), a real SQLite store, the real poller and measuring job run
round by round, a real chat engine, and once the whole service with its scheduler.
"""

from __future__ import annotations

import time

import pytest

from chat.engine import ChatEngine, Finished, GenerationParams
from chat.feedback import StoreWeights, store_coverage_check, store_outcome_sink
from chat.policy import RoutingSettings
from monitor.app.probing import ServerProber
from monitor.app.service import Service
from monitor.settings import ModelConfig, Settings
from monitor.core.probes import (
    CORRECT,
    DISAGREES,
    WRONG,
    ServerProbe,
    cross_check,
    disagreeing_outputs,
    judge,
    tolerance,
)
from monitor.harness.demo_swarm import DemoControls
from monitor.harness.local_swarm import LocalSwarm
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS

from support import SESSION_SPECS, polled_prober, sqlite_store, tiny_settings

HALF = TINY_NUM_BLOCKS // 2
SPECS = SESSION_SPECS  # the session swarm's servers (its specs put back whatever they change)
PERIOD = 1.0


# ---- pure ----------------------------------------------------------------------------------------


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


def rounds_until(prober: ServerProber, done, timeout: float = 90.0) -> list:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(prober.run_once())
        if done(seen):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"not done within {timeout:.0f} s; probes: {seen}")


def test_honest_float32_servers_are_never_flagged(checked):
    swarm, _, prober, _ = checked
    peers = {swarm.peer_id(spec.name) for spec in SPECS}
    probes = rounds_until(prober, lambda seen: all(sum(p.peer_id == peer for p in seen) >= 3 for peer in peers))
    for p in probes:
        assert p.ok and p.verdict == CORRECT and p.checked_against == "reference", p
        assert p.error_ratio < p.tolerance / 100  # not a near miss: float32 agrees to rounding


def test_a_corrupting_server_is_flagged_in_one_round_and_the_chat_routes_around_it(checked, tiny_model):
    swarm, poller, prober, store = checked
    second = swarm.peer_id("second-half")
    swarm.corrupt("second-half")
    corrupted_at = time.time()
    try:
        probes = rounds_until(prober, lambda seen: any(p.peer_id == second and p.at > corrupted_at for p in seen))
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
                            coverage_check=store_coverage_check(store), routing=RoutingSettings(mode="health"))
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
    probes = rounds_until(prober, lambda seen: any(p.peer_id == second and p.at > fixed_at for p in seen))
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
        probes = rounds_until(prober, lambda seen: any(p.peer_id == second and p.verdict for p in seen)
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
