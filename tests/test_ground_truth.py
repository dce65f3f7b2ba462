"""Ground truth on a real swarm: servers that are up, announced and reachable but fail every
inference step are failing — for the diagnosis, the dashboard's API, "is my server OK?", the
chat's routing and its refusal — and the generation check says what a user gets.

The demo's layout on the tiny Llama (one full server and two halves, every block served twice),
the whole service in one process (poller, probes, generation checks, chat), everything fast:
a scrape and a reachability round every 2 s, each server probed every 3 s, a generation check
every 4 s. Chaos "fail" keeps a server ONLINE and reachable while every step raises.
"""

from __future__ import annotations

import time

import pytest

from monitor.app.service import Service
from monitor.harness.local_swarm import ServerSpec
from monitor.harness.server_process import FAIL_MESSAGE
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.settings import Settings
from support import STEADY_UPDATE_PERIOD, wait_until

HALF = TINY_NUM_BLOCKS // 2
SPECS = (ServerSpec("server-1", 0, TINY_NUM_BLOCKS, throughput=100.0, public_name="server-1"),
         ServerSpec("server-2", 0, HALF, throughput=50.0, public_name="server-2"),
         ServerSpec("server-3", HALF, TINY_NUM_BLOCKS, throughput=50.0, public_name="server-3"))
VERDICT_TIMEOUT = 60  # seconds: two probes of a server (3 s apart, confirmed sooner) and a re-diagnosis, loaded machine
ASK = {"model": TINY_DHT_PREFIX, "prompt": "hello", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def service(tiny_model, tmp_path_factory):
    from monitor.harness.local_swarm import LocalSwarm

    data_dir = tmp_path_factory.mktemp("ground-truth")
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        settings = Settings(
            data_dir=data_dir, initial_peers=swarm.initial_peers, discover_models=False,
            models=[{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS, "path": str(tiny_model)}],
            scrape_period=2, reachability_period=2, reachability_timeout=3, score_period=600,
            speed_probe_period=3, speed_probe_max_share=0.5, speed_probe_timeout=10,
            generation_check_period=4, generation_check_tokens=4, min_peer_score=0,
        )
        svc = Service(settings).start()
        try:
            yield svc, swarm
        finally:
            for spec in SPECS:
                swarm.unfail(spec.name)
            svc.close()


def diagnosis(svc):
    return svc.store.latest_assessments().get(TINY_DHT_PREFIX)


def report_of(client, peer_id: str) -> dict:
    return client.get(f"/api/v1/peers/{peer_id}/report").get_json()


def test_failing_servers_are_failing_for_every_reader_and_the_chat_routes_around_them(service):
    svc, swarm = service
    client = svc.app.test_client()
    ids = {spec.name: swarm.peer_id(spec.name) for spec in SPECS}
    assert wait_until(lambda: (h := diagnosis(svc)) is not None and h.state == "healthy", VERDICT_TIMEOUT), diagnosis(svc)
    check = wait_until(lambda: svc.store.latest_generation_checks().get(TINY_DHT_PREFIX), VERDICT_TIMEOUT)
    assert check is not None and check.ok, check

    # one failing server: degraded, named with its error; "is my server OK?" says BAD
    swarm.fail("server-2")
    failed_at = time.monotonic()
    health = wait_until(lambda: (h := diagnosis(svc)) and ids["server-2"] in h.excluded_peers and h, VERDICT_TIMEOUT)
    assert health, diagnosis(svc).reasons
    detected = time.monotonic() - failed_at
    assert health.state == "degraded" and health.excluded_causes[ids["server-2"]] == "failing"
    assert any(r.startswith("server-2 (0:4) is ONLINE but failing") and FAIL_MESSAGE in r for r in health.reasons)
    report = report_of(client, ids["server-2"])
    assert report["status"] == "bad" and FAIL_MESSAGE in report["headline"]
    assert report_of(client, ids["server-1"])["status"] != "bad"
    state = client.get("/api/v1/state").get_json()
    assert next(r for r in state["model_reports"] if r["dht_prefix"] == TINY_DHT_PREFIX)["monitor_state"] == "degraded"

    # two failing: only server-1 serves, the chat answers through it and no route touches the others
    swarm.fail("server-3")
    assert wait_until(lambda: ids["server-3"] in diagnosis(svc).excluded_peers, VERDICT_TIMEOUT), diagnosis(svc).reasons
    assert [hop.peer_id for hop in diagnosis(svc).route] == [ids["server-1"]]
    since = time.time()
    for _ in range(3):
        answer = client.post("/v1/completions", json=ASK)
        assert answer.status_code == 200, answer.get_json()
    used = {o.peer_id for o in svc.store.recent_chat_outcomes(since) if o.ok}
    assert used == {ids["server-1"]}, used
    check = wait_until(lambda: (c := svc.store.latest_generation_checks()[TINY_DHT_PREFIX]).at > since and c,
                       VERDICT_TIMEOUT)
    assert check.ok and check.route_peers == (ids["server-1"],), check

    # all three failing: broken with the servers' error, and the chat refuses at once with it
    swarm.fail("server-1")
    broken = wait_until(lambda: (h := diagnosis(svc)).state == "broken" and h, VERDICT_TIMEOUT)
    assert broken, diagnosis(svc).reasons
    assert any(r.startswith("every server of blocks 0:8 fails") or r.startswith("the generation check failed")
               for r in broken.reasons), broken.reasons
    started = time.monotonic()
    refused = client.post("/v1/completions", json=ASK)
    assert refused.status_code == 503 and time.monotonic() - started < 5
    assert "fails" in refused.get_json()["error"]["message"] or "generation check" in refused.get_json()["error"]["message"]
    for name in ("server-1", "server-2", "server-3"):
        assert report_of(client, ids[name])["status"] == "bad", name

    # unfail: everything comes back by itself
    for spec in SPECS:
        swarm.unfail(spec.name)
    assert wait_until(lambda: diagnosis(svc).state == "healthy", 2 * VERDICT_TIMEOUT), diagnosis(svc).reasons
    assert wait_until(lambda: svc.store.latest_generation_checks()[TINY_DHT_PREFIX].ok, VERDICT_TIMEOUT)
    assert client.post("/v1/completions", json=ASK).status_code == 200
    print(f"failing server named in {detected:.1f} s")
