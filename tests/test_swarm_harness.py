"""Specs of the swarm harness: a real private swarm on loopback, that we can break and clean up."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from chat.remote_model import load_remote_model
from monitor.harness.local_swarm import LocalSwarm, ServerSpec, SwarmError
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import swarm_processes, wait_until

HALF = TINY_NUM_BLOCKS // 2


def test_greedy_generation_through_the_swarm_equals_local_transformers(swarm, tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    input_ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]

    remote = load_remote_model(tiny_model, swarm.dht)
    local = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    with torch.no_grad():
        through_swarm = remote.generate(input_ids, max_new_tokens=24, do_sample=False)
        on_this_machine = local.generate(input_ids, max_new_tokens=24, do_sample=False)

    assert through_swarm.shape[1] == input_ids.shape[1] + 24
    assert through_swarm.tolist() == on_this_machine.tolist()


def test_every_server_of_the_session_swarm_is_online(swarm):
    states = swarm.server_states(range(TINY_NUM_BLOCKS))
    for name in ("first-half", "second-half", "full"):
        assert states[swarm.peer_id(name)] == {"ONLINE"}


def test_every_p2pd_we_started_has_nat_traversal_and_relays_off(swarm):
    daemons = [p for p in swarm_processes() if "p2pd" in p.name()]
    # bootstrap + 3 servers + this process's DHT client at least
    assert len(daemons) >= 5
    for daemon in daemons:
        args = daemon.cmdline()
        for flag in ("-natPortMap=0", "-autonat=0", "-relay=0", "-autoRelay=0"):
            assert flag in args, f"p2pd pid {daemon.pid} lacks {flag}: {' '.join(args)}"
        listen = [a for a in args if a.startswith("-hostAddrs=")]
        assert listen and all("/ip4/127.0.0.1/" in a for a in listen), args


def test_a_server_checks_another_peers_reachability_for_whoever_asks_as_petals_servers_do(swarm):
    """petals' reachability service (``rpc_check``) runs on every server; its probe daemon starts
    when first asked (``server_process._ProbeOnFirstUse``), not with the server. A peer that asks
    it to check a made-up peer id (3,000 bytes of garbage) is told "not reachable" at once."""
    import asyncio

    from hivemind import DHT
    from hivemind.p2p import P2P, PeerID
    from petals.server.reachability import ReachabilityProtocol

    import psutil

    asker, other = (PeerID.from_base58(swarm.peer_id(name)) for name in ("first-half", "second-half"))
    server = psutil.Process(swarm.pid("first-half"))
    daemons = lambda: sum("p2pd" in p.name() for p in server.children(recursive=True))  # noqa: E731

    address = swarm.dht.run_coroutine(DHT._get_p2p_daemon_listen_maddr)

    async def ask() -> tuple:  # (a replica of our own, in this event loop: the DHT's cached one may be another's)
        p2p = await P2P.replicate(address)
        try:
            protocol = ReachabilityProtocol(probe=p2p)
            return (await protocol.call_check(asker, check_peer=other),  # first-half dials second-half
                    await protocol.call_check(asker, check_peer=asker),  # it answers for itself
                    await protocol.call_check(asker, check_peer=PeerID(b"\xff" * 3000)))  # garbage: not reachable
        finally:
            await p2p.shutdown()

    assert daemons() == 1  # its DHT's (no spec of the session asks first-half before this one)
    started = time.monotonic()
    assert asyncio.run(ask()) == (True, True, False)
    assert time.monotonic() - started < 10  # the garbage peer is refused, not waited for
    assert daemons() == 2  # and now its probe's


def test_a_killed_server_disappears_from_the_dht_and_a_restart_brings_it_back(make_swarm):
    # announced every 2 s, a record expires 4 s after the last (petals: twice the update period)
    s = make_swarm([ServerSpec("a", 0, HALF), ServerSpec("b", 0, TINY_NUM_BLOCKS)], update_period=2)
    peer_a = s.peer_id("a")
    s.kill("a")
    assert not s.servers["a"].alive()

    wait_until(lambda: "ONLINE" not in s.server_states(range(HALF)).get(peer_a, set()), 60, step=1)
    assert "ONLINE" not in s.server_states(range(HALF)).get(peer_a, set())
    assert s.server_states(range(HALF))[s.peer_id("b")] == {"ONLINE"}

    assert s.restart("a") == peer_a  # same identity, same peer id, ONLINE again
    assert s.server_states(range(HALF))[peer_a] == {"ONLINE"}


def test_a_throttled_server_keeps_running_and_is_released(swarm):
    s = swarm
    s.throttle("full", duty=0.8, period=0.2)
    samples = []
    for _ in range(20):
        samples.append(open(f"/proc/{s.pid('full')}/stat").read().split()[2])
        time.sleep(0.03)
    assert "T" in samples, "the main process is never stopped"
    assert s.servers["full"].alive()
    s.unthrottle("full")
    time.sleep(0.1)
    assert open(f"/proc/{s.pid('full')}/stat").read().split()[2] != "T"
    assert s.server_states(range(TINY_NUM_BLOCKS))[s.peer_id("full")] == {"ONLINE"}


def test_a_server_that_cannot_start_is_named_with_its_log(tiny_model):
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, start_timeout=60) as s:
        with pytest.raises(SwarmError) as failure:
            s.start([ServerSpec("broken", 0, TINY_NUM_BLOCKS + 5)])
    message = str(failure.value)
    assert "broken" in message and "log" in message
    assert len(message.splitlines()) > 2  # the log tail comes along


def test_the_harness_leaves_nothing_behind_even_if_its_process_is_killed(tiny_model, tmp_path):
    before = time.time()
    script = (
        "import sys, time\n"
        "from monitor.harness.local_swarm import LocalSwarm, ServerSpec\n"
        f"s = LocalSwarm({str(tiny_model)!r}, {TINY_DHT_PREFIX!r}, workdir={str(tmp_path / 'swarm')!r})\n"
        # (a workdir of the spec's: the killed harness cannot remove one of its own)
        f"s.start([ServerSpec('x', 0, {TINY_NUM_BLOCKS})])\n"
        "print('UP', flush=True)\n"
        "time.sleep(600)\n"
    )
    marker = f"harness-killed-{os.getpid()}-{time.time()}"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)),
                             env={**os.environ, "SWARM_MONITOR_HARNESS_TEST": marker})
    try:
        assert child.stdout.readline().strip() == "UP"
        assert swarm_processes(since=before)
        child.kill()  # no teardown code runs in the harness process
        child.wait(10)
        wait_until(lambda: not swarm_processes(since=before) and not _marked(marker), 20)
        assert swarm_processes(since=before) == []
        assert _marked(marker) == [], "processes of the killed harness (e.g. its DHT fork) outlived it"
    finally:
        if child.poll() is None:
            child.kill()


def _marked(marker: str) -> list[int]:
    """Every live process that inherited the marker: servers, p2pd, forks, watchdogs alike."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("SWARM_MONITOR_HARNESS_TEST") == marker:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
