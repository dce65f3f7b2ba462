"""Specs of the "fail" chaos control on a real private swarm: a failing server stays ONLINE,
announced and reachable, and every inference and forward step through it raises with the server's
own error — which a speed probe records as the server's error, told apart from a timeout.

One swarm for the module (tiny Llama, two servers of all 8 blocks: "steady" and "flaky"), a real
SQLite store, the real poller and measuring job run round by round.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from monitor.core.probes import SERVER_ERROR, TIMEOUT
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.server_process import FAIL_MESSAGE
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.swarm import check_servers
from monitor.swarm.speed import ProbeLoop, SpanTarget
from support import STEADY_UPDATE_PERIOD, polled_prober, sqlite_store, tiny_settings

SPECS = (ServerSpec("steady", 0, TINY_NUM_BLOCKS, throughput=100.0),
         ServerSpec("flaky", 0, TINY_NUM_BLOCKS, throughput=100.0))


@pytest.fixture(scope="module")
def chaos(tiny_model, tmp_path_factory):
    """(swarm, prober, store): the poller has scraped once; rounds are run by the specs."""
    data_dir = tmp_path_factory.mktemp("chaos-fail")
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        settings = tiny_settings(swarm, data_dir, tiny_model, speed_probe_period=2.0, speed_probe_max_share=0.5,
                                 speed_probe_timeout=10)
        store = sqlite_store(data_dir)
        _, prober = polled_prober(settings, store, swarm.dht)
        try:
            yield swarm, prober, store
        finally:
            swarm.unfail("flaky")
            prober.close()
            store.close()


def probe_once(swarm, name: str, *, timeout: float = 10):
    loop = ProbeLoop(swarm.dht, concurrency=1)
    try:
        (result,) = loop.probe([SpanTarget(swarm.peer_id(name), TINY_DHT_PREFIX, 0, TINY_NUM_BLOCKS)],
                               timeout=timeout)
    finally:
        loop.close()
    return result.probe


def test_a_failing_server_stays_online_and_reachable_while_its_probes_fail_with_its_own_error(chaos):
    swarm, prober, store = chaos
    flaky, steady = swarm.peer_id("flaky"), swarm.peer_id("steady")
    swarm.fail("flaky")
    try:
        assert swarm.is_failing("flaky") and swarm.describe()[1]["failing"]
        (reachability,) = check_servers(swarm.dht, [flaky], timeout=5, concurrency=1).results
        assert reachability.ok, reachability.error  # rpc_info answers
        assert swarm.server_states(range(TINY_NUM_BLOCKS)).get(flaky) == {"ONLINE"}

        started = time.time()
        probes = {p.peer_id: p for p in prober.run_once()}  # the job's own round: both are due
        assert probes[steady].ok and probes[steady].error_kind is None, probes[steady].error
        failed = probes[flaky]
        assert not failed.ok and failed.error_kind == SERVER_ERROR
        assert failed.error == FAIL_MESSAGE  # the server's own text, out of hivemind's wrapping
        assert failed.duration is not None and failed.duration < 5  # it answered at once, no timeout
        stored = {p.peer_id: p for p in store.recent_server_probes(started - 1)}
        assert (stored[flaky].error_kind, stored[flaky].error) == (SERVER_ERROR, FAIL_MESSAGE)
    finally:
        swarm.unfail("flaky")
    assert not swarm.is_failing("flaky")
    again = probe_once(swarm, "flaky")
    assert again.ok and again.error_kind is None, again.error  # unfail restores it


def test_a_failing_server_fails_every_forward_step_too_with_its_own_error(chaos, tiny_model):
    import torch

    from chat.remote_model import load_remote_model, sequence_manager_of

    swarm, _, _ = chaos
    model = load_remote_model(tiny_model, swarm.dht, allowed_servers=[swarm.peer_id("flaky")], max_retries=1)
    try:
        hidden = torch.randn(1, 3, model.config.hidden_size)
        assert model.transformer.h(hidden).shape == hidden.shape  # works before
        swarm.fail("flaky")
        with pytest.raises(Exception) as failure:
            model.transformer.h(hidden)
        assert FAIL_MESSAGE in str(failure.value)
    finally:
        swarm.unfail("flaky")
        sequence_manager_of(model).shutdown()


def test_a_server_whose_compute_hangs_times_out_which_is_not_the_servers_error(chaos):
    swarm, _, _ = chaos
    pid = swarm.pid("steady")
    os.kill(pid, signal.SIGSTOP)  # the compute runtime stops; p2pd and the handlers still answer
    try:
        hung = probe_once(swarm, "steady", timeout=2)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not hung.ok and hung.error_kind == TIMEOUT, (hung.error_kind, hung.error)
    assert FAIL_MESSAGE not in (hung.error or "")
