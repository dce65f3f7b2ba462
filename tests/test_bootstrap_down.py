"""A monitor starts whatever the swarm does: ``swarm-monitor serve`` against a bootstrap peer that
is down starts anyway, says "cannot reach any bootstrap peer (…), retrying" on its dashboard, its
state API and /metrics, and fires ``bootstrap_down`` and ``monitor_stale`` as a running monitor
would; once the peer (and a server) start, its DHT client comes up by itself and the polls begin.
``report`` against a peer that is down fails at once with one clear line; start-up says what
it does without Alembic's lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.harness.webhook_receiver import WebhookReceiver
from support import free_port, keep_reading, stop_process, wait_until

PERIOD = 3  # scrape and reachability period: bootstrap-down fires after 2, monitor-stale after 3 of them
LIBRARY_NOISE = ("setup plugin", "Running upgrade", "Context impl", "Will assume")


def down_bootstrap(tiny_model, workdir, port: int) -> list[str]:
    """The multiaddr of a bootstrap peer that is down: its identity made, not started (the spec
    starts it later on the same port with the same identity, and checks the address is the one
    it reports)."""
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, workdir=workdir, bootstrap_port=port) as swarm:
        return swarm.future_initial_peers()


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.swarm
@pytest.mark.timeout(900)
def test_serve_starts_with_its_bootstrap_peer_down_says_so_alerts_and_polls_once_the_peer_is_up(tiny_model, tmp_path):
    port = free_port()
    peers = down_bootstrap(tiny_model, tmp_path / "swarm", port)
    place = f"127.0.0.1:{port}"
    with WebhookReceiver() as ops:
        config = tmp_path / "monitor.toml"
        config.write_text("\n".join([
            f"scrape_period = {PERIOD}", f"reachability_period = {PERIOD}", "reachability_timeout = 2",
            "score_period = 600", "discover_models = false",
            "[alerts]", "check_period = 1", "retry_backoff = 1",
            "[[alerts.webhooks]]", 'name = "ops"', f'url = "{ops.url}"']) + "\n")
        env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path / "data")}
        serve = subprocess.Popen(
            [sys.executable, "-m", "monitor.app.cli", "--config", str(config), "serve", "--port", "0",
             "--initial-peers", *peers, "--model", f"{TINY_DHT_PREFIX}:{TINY_NUM_BLOCKS}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        output: list[str] = []
        reader = None
        try:
            while True:
                line = serve.stdout.readline()
                assert line, "serve exited:\n" + "".join(output)
                output.append(line)
                found = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/", line)
                if found:
                    base = found.group(1)
                    break
            start_up = "".join(output)
            assert f"Swarm:     cannot reach any bootstrap peer ({place}), retrying" in start_up, start_up
            assert "Created the schema of" in start_up and "Leading: this poller" in start_up, start_up
            assert not any(noise in start_up for noise in LIBRARY_NOISE), start_up
            assert "Traceback" not in start_up, start_up
            reader = keep_reading(serve, output)  # (the pipe kept drained)

            # the pages, the API and /metrics say why nothing is polled
            banner = f"cannot reach any bootstrap peer ({place}), retrying"
            assert wait_until(lambda: banner in get(f"{base}/")[1], 30), get(f"{base}/")[1][-3000:]
            status, body = get(f"{base}/api/v1/state")
            assert status == 503 and banner in json.loads(body)["error"]
            # the poller reports its problem with its next claim of the lease (every quarter lease)
            problem = r'swarm_monitor_poller_problem\{[^}]*problem="cannot reach any bootstrap peer'
            metrics = wait_until(lambda: (lambda text: re.search(problem, text) and text)(get(f"{base}/metrics")[1]), 30)
            assert metrics, get(f"{base}/metrics")[1][-3000:]
            assert "swarm_monitor_last_poll_ok 0.0" in metrics
            assert re.search(r'swarm_monitor_bootstrap_peer_up\{peer_id="\w+"\} 0\.0', metrics), metrics[-3000:]

            # the alerts a running monitor would send
            def fired() -> set:  # (notices made together come as one message: a group)
                return {(n["rule"], n["event"]) for b in ops.accepted() if b for n in b.get("notices", [b])}

            assert wait_until(lambda: {("bootstrap-down", "firing"), ("monitor-stale", "firing")} <= fired(), 60), \
                fired()

            # the swarm comes up: the DHT client starts by itself, the polls begin, the alerts resolve
            with LocalSwarm(tiny_model, TINY_DHT_PREFIX, workdir=tmp_path / "swarm", bootstrap_port=port,
                            update_period=5) as swarm:
                swarm.start([ServerSpec("full", 0, TINY_NUM_BLOCKS, throughput=100.0)])
                assert swarm.initial_peers == peers

                def polled():
                    status, body = get(f"{base}/api/v1/state")
                    # (one server: every block served once, so degraded, not broken)
                    return status == 200 and json.loads(body)["model_reports"][0]["servers_online"] == 1

                assert wait_until(polled, 180), get(f"{base}/api/v1/state")
                assert wait_until(lambda: {("bootstrap-down", "resolved"), ("monitor-stale", "resolved")} <= fired(),
                                  60), fired()
                # (the poller says it with its next claim of the lease; the pages keep what they read 10 s)
                assert wait_until(lambda: banner not in get(f"{base}/")[1], 30), get(f"{base}/")[1][-3000:]
        finally:
            stopped = stop_process(serve, output, signum=signal.SIGTERM, timeout=60, reader=reader)
    log = "".join(output)
    assert stopped, "serve did not stop within 60 s of SIGTERM:\n" + log[-3000:]
    assert "a bootstrap peer answers" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.swarm
def test_a_report_with_its_bootstrap_peer_down_fails_at_once_with_one_clear_line(tiny_model, tmp_path):
    port = free_port()
    peers = down_bootstrap(tiny_model, tmp_path / "swarm", port)
    result = subprocess.run(
        [sys.executable, "-m", "monitor.app.cli", "report", "--initial-peers", *peers,
         "--model", f"{TINY_DHT_PREFIX}:{TINY_NUM_BLOCKS}"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path)})
    assert result.returncode != 0
    errors = result.stderr.strip().splitlines()
    assert errors == [f"Error: cannot reach any bootstrap peer (127.0.0.1:{port}): is the swarm up, and are these its "
                      "initial peers? (`swarm-monitor poll` starts anyway and keeps trying)"], result.stderr
    assert re.fullmatch(r"Created the schema of sqlite:///\S+: revision \d+\.", result.stdout.strip()), result.stdout


def test_a_daemon_that_exits_without_a_reason_is_named_by_whether_any_bootstrap_peer_accepts():
    """p2pd sometimes exits with a routine log line last instead of its bootstrap error: the one
    line is still "cannot reach" when no peer accepts a connection, and the daemon's words when
    one does (then the trouble is elsewhere)."""
    import socket

    from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

    from monitor.swarm.client import start_problem

    silent = P2PDaemonError('Daemon failed to start: {"level":"info","logger":"dht/RtRefreshManager",'
                            '"msg":"starting refreshing cpl 0 with key CIQAAAE"}')
    closed = free_port()
    assert start_problem([f"/ip4/127.0.0.1/tcp/{closed}/p2p/QmPeer"], silent) == \
        f"cannot reach any bootstrap peer (127.0.0.1:{closed})"
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        said = start_problem([f"/ip4/127.0.0.1/tcp/{port}/p2p/QmPeer"], silent)
    assert said.startswith("the DHT client did not start (P2PDaemonError: Daemon failed to start:"), said
