"""Spec: a plain petals script routes by the monitor with ``route_with`` (``swarm_monitor_client``).

A real private swarm (tiny Llama): A serves the first half of the blocks, B the second, C and D all
of them, every server announcing the same throughput, so petals' own routing prefers the one-hop
routes through C or D. C is throttled (answers slowly), D fails every step. The monitor is the
real poller and speed-probe job writing a real store, and the real web app on 127.0.0.1 serving
the routing view. The script (``scripts/plain_petals.py``, a subprocess: petals' own model and
``generate``) with ``route_with`` takes A+B from its first request and never meets D's failures;
without it, petals walks into C or D. The monitor stopped in the middle of an answer changes
nothing of that answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from monitor.core.assessment import CAUSE_FAILING, CAUSE_SLOW
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.web import create_app
from support import STEADY_UPDATE_PERIOD, polled_prober, reap_group, run_in_group, sqlite_store, tiny_settings, wait_until

ROOT = Path(__file__).resolve().parent.parent
HALF = TINY_NUM_BLOCKS // 2
SPECS = (ServerSpec("a", 0, HALF, throughput=100.0), ServerSpec("b", HALF, TINY_NUM_BLOCKS, throughput=100.0),
         ServerSpec("c", 0, TINY_NUM_BLOCKS, throughput=100.0), ServerSpec("d", 0, TINY_NUM_BLOCKS, throughput=100.0))


class Monitor:
    """The web app of ``store`` on a real HTTP server on 127.0.0.1, stoppable mid-spec."""

    def __init__(self, app):
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(10)


@pytest.fixture(scope="module")
def trap(tiny_model, tmp_path_factory):
    """(swarm, monitor, causes): C throttled and D failing, both judged so in the stored assessment."""
    data_dir = tmp_path_factory.mktemp("route-with")
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        settings = tiny_settings(swarm, data_dir, tiny_model, speed_probe_period=2.0, speed_probe_max_share=0.5,
                                 speed_probe_timeout=10)
        store = sqlite_store(data_dir)
        poller, prober = polled_prober(settings, store, swarm.dht)
        wait_next_pings(swarm, "a", "b")  # petals' steady state: A announced its ping to B (else the
        # A→B hop is priced at petals' 150 ms "unknown" delay: BENCHMARKS, the trap)
        swarm.throttle("c", duty=0.9, period=0.2)  # ~10× slower: far beyond the probes' noise
        swarm.fail("d")
        monitor = None
        try:
            peers = {name: swarm.peer_id(name) for name in "abcd"}
            causes = {}
            for _ in range(8):  # probe rounds until both verdicts are drawn (two probes each)
                prober.due_now(set(peers.values()))
                prober.run_once()
                servers = store.latest_assessments()[TINY_DHT_PREFIX].servers
                causes = {name: servers[peer].cause for name, peer in peers.items() if peer in servers}
                if causes.get("c") == CAUSE_SLOW and causes.get("d") == CAUSE_FAILING:
                    break
            monitor = Monitor(create_app(settings, store))
            yield swarm, monitor, causes
        finally:
            if monitor is not None:
                monitor.stop()
            swarm.unthrottle("c")
            swarm.unfail("d")
            prober.close()
            store.close()


def wait_next_pings(swarm, first: str, second: str, timeout: float = 150.0) -> None:
    from monitor.core.snapshot import ModelInfo
    from monitor.swarm import scrape

    want_from, want_to = swarm.peer_id(first), swarm.peer_id(second)
    assert wait_until(lambda: any(row.peer_id == want_from and want_to in (row.next_pings or {}) for row in
                                  scrape(swarm.dht, [ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS)], discover=False).servers),
                      timeout, step=2), f"{first} never announced a ping to {second}"


def script(swarm, model_path, *, monitor=None, requests=2, tokens=8, progress=False):
    args = [sys.executable, str(ROOT / "scripts" / "plain_petals.py"), "--path", str(model_path),
            "--requests", str(requests), "--tokens", str(tokens)]
    for peer in swarm.initial_peers:
        args += ["--peer", peer]
    if monitor:
        args += ["--monitor", monitor]
    if progress:
        args.append("--progress")
    return args


def results(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{") and '"tokens"' in line]


def names_on(route: str, swarm) -> set[str]:
    """Server names in a route petals logged ("0:4 via …abc123 => 4:8 via …def456")."""
    tails = {swarm.peer_id(name)[-6:]: name for name in "abcd"}
    return {name for tail, name in tails.items() if f"…{tail}" in route}


def test_route_with_avoids_the_throttled_and_the_failing_server_from_the_first_request(trap, tiny_model):
    swarm, monitor, causes = trap
    assert causes.get("c") == CAUSE_SLOW and causes.get("d") == CAUSE_FAILING, causes

    routed = run_in_group(script(swarm, tiny_model, monitor=monitor.url), timeout=300)
    assert routed.returncode == 0, routed.stderr[-3000:]
    header = json.loads(routed.stdout.splitlines()[0])
    assert header["routed"] and header["route_with_seconds"] < 2.5  # the first view, within its bound
    answers = results(routed.stdout)
    assert len(answers) == 2 and all(a["ok"] for a in answers), answers
    for answer in answers:
        assert answer["weights"] >= 4 and answer["retries"] == 0, answer  # D's failures never met
        assert answer["routes"] and all(names_on(r, swarm) == {"a", "b"} for r in answer["routes"]), \
            (answer["routes"], {name: swarm.peer_id(name)[-6:] for name in "abcd"})

    # petals' own routing, same script without route_with: the one-hop routes through C or D
    plain = run_in_group(script(swarm, tiny_model, requests=3), timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    met = set().union(*(names_on(r, swarm) for a in results(plain.stdout) for r in a["routes"]))
    assert met & {"c", "d"}, results(plain.stdout)


def test_the_monitor_stopped_mid_answer_changes_nothing_of_the_answer(trap, tiny_model):
    swarm, monitor, _ = trap
    reference = run_in_group(script(swarm, tiny_model, monitor=monitor.url, requests=1, tokens=24), timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    [expected] = results(reference.stdout)

    process = subprocess.Popen(script(swarm, tiny_model, monitor=monitor.url, requests=1, tokens=24, progress=True),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.strip() == "token":  # the answer has begun: the monitor goes away
                monitor.stop()
                break
        rest, err = process.communicate(timeout=300)
    finally:
        reap_group(process)  # the script, and its DHT process and p2pd if it left them
    assert process.returncode == 0, err[-3000:]
    [answer] = results("".join(lines) + rest)
    assert answer["ok"] and answer["tokens"] == expected["tokens"] and answer["retries"] == 0, answer
