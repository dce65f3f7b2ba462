"""Spec of the front door: `swarm-monitor demo` serves a real model, the dashboard and a chat; and
the demo model answers through a swarm of its own as on this machine (the model itself, without a
swarm: ``test_demo_model.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from monitor.harness.demo_model import DEMO_DHT_PREFIX, DEMO_NUM_BLOCKS, greedy_answer_ids
from monitor.harness.demo_swarm import DEMO_ROUND_PERIOD
from support import STEADY_UPDATE_PERIOD, dashboard_url, start_demo, stop_process, swarm_processes, wait_until

pytestmark = pytest.mark.swarm  # the demo starts a swarm of its own


def _get(url: str, timeout: float = 30):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def _post_json(url: str, payload: dict, timeout: float = 120):
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read())


def test_the_demo_serves_a_healthy_model_and_a_chat_answer_and_stops_cleanly_on_ctrl_c(data_dir):
    started = time.time()
    demo = start_demo(["--port", "0"], env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir)})
    output = []
    try:
        base = dashboard_url(demo, output)

        def report() -> dict:
            reports = json.loads(_get(f"{base}/api/v1/state")[1])["model_reports"]
            return reports[0] if reports else {}

        assert wait_until(lambda: report().get("monitor_state") == "healthy", 120), report()

        status, page = _get(f"{base}/")
        assert status == 200 and "smollm2-135m-instruct" in page.lower()

        status, answer = _post_json(f"{base}/v1/chat/completions", {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 20, "temperature": 0,
        })
        assert status == 200
        assert "Paris" in answer["choices"][0]["message"]["content"]

        # chaos from the CLI: with server-2 (0:15) stopped, blocks 0:15 have one server left
        # (the CLI finds the running demo's operator token in the same data directory)
        chaos = subprocess.run([sys.executable, "-m", "monitor.app.cli", "chaos", "stop", "server-2", "--url", base],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir)})
        assert chaos.returncode == 0, chaos.stderr
        stopped = time.monotonic()
        degraded = wait_until(lambda: (lambda r: r if r.get("monitor_state") == "degraded" else None)(report()), 90)
        assert degraded, report().get("reasons")
        assert any("0:15" in reason for reason in degraded["reasons"]), degraded["reasons"]
        # the stop is polled at once, not at the next of the demo's scrapes (every 10 s)
        followed = time.monotonic() - stopped
        print(f"\nthe dashboard showed the stop {followed:.1f} s after it")
        assert followed < DEMO_ROUND_PERIOD / 2, followed
    finally:
        assert stop_process(demo, output, signum=signal.SIGINT, timeout=90), \
            "the demo did not stop within 90 s of Ctrl-C:\n" + "".join(output)[-3000:]
    assert demo.returncode == 0, "".join(output)[-3000:]
    assert output[-1] == "Stopped.\n", output[-3:]
    assert wait_until(lambda: not swarm_processes(since=started), 20), swarm_processes(since=started)


# ---- the demo model through a swarm of its own -------------------------------------------------


def test_greedy_tokens_through_a_two_server_swarm_equal_local_transformers(demo_checkpoint, demo_local_model,
                                                                          demo_tokenizer):
    from chat.remote_model import load_remote_model
    from monitor.harness.local_swarm import LocalSwarm, ServerSpec

    half = DEMO_NUM_BLOCKS // 2
    with LocalSwarm(demo_checkpoint, DEMO_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start([ServerSpec("first", 0, half), ServerSpec("second", half, DEMO_NUM_BLOCKS)])
        remote = load_remote_model(demo_checkpoint, swarm.dht)
        question = "Describe the Eiffel Tower in two sentences."  # longer than 10 tokens
        started = time.monotonic()
        through_swarm = greedy_answer_ids(remote, demo_tokenizer, question, max_new_tokens=10)
        elapsed = time.monotonic() - started
    on_this_machine = greedy_answer_ids(demo_local_model, demo_tokenizer, question, max_new_tokens=10)
    print(f"\n{len(through_swarm)} tokens through the swarm in {elapsed:.2f} s "
          f"({len(through_swarm) / elapsed:.1f} tokens/s)")
    assert through_swarm == on_this_machine
    assert len(through_swarm) == 10
