"""Spec: ``swarm-monitor demo --checkpoint PATH`` rehearses an operator's own model locally — for
the families petals' main branch serves, Llama 3.x and Mixtral.

Each family's tiny checkpoint saved by the reference transformers (published layout, pair-format
tokenizer) is served by the demo's three servers: the model comes up healthy, its generation check
passes, its model page names its family, a greedy ``/v1/completions`` of 16 tokens equals the
reference transformers' ``generate`` token for token, and a server corrupted from the CLI's chaos
command is flagged as returning wrong outputs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from monitor.harness import reference
from monitor.harness.tiny_model import tiny_model
from support import dashboard_url, start_demo, stop_process, swarm_processes, wait_until

pytestmark = pytest.mark.swarm

TOKENS = 16
PROMPTS = ("The monitor shows which models are", "Servers announce block ranges and", "Hello, world! How are you",
           "Petals runs large language models", "Numbers: 1 2 3 4 5", "It's a swarm: you'll see servers")
LABELS = {"llama3": "Llama 3.x", "mixtral": "Mixtral"}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def full_length_prompts(path) -> list[tuple[str, list[int], str]]:
    """(prompt, the reference's 16 greedy ids, their text) for the prompts it continues 16 tokens
    without ending the text."""
    ids = reference.run("reference", {"path": str(path), "texts": list(PROMPTS)})["ids"]
    out = reference.run("reference", {"path": str(path), "generate": ids, "max_new_tokens": TOKENS})
    return [(prompt, new, text) for prompt, new, text in zip(PROMPTS, out["generated"], out["generated_text"])
            if len(new) == TOKENS]


@pytest.mark.parametrize("family", ["llama3", "mixtral"])
def test_the_demo_serves_a_local_checkpoint_of_the_family_end_to_end(family, data_dir, tmp_path):
    model = tiny_model(data_dir, family)
    expected = full_length_prompts(model.path)
    assert expected, "the reference ends the text within 16 tokens for every prompt"
    started = time.time()
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path / "data")}
    demo = start_demo(["--checkpoint", str(model.path), "--servers", "3", "--port", "0"], env=env)
    output: list[str] = []
    try:
        base = dashboard_url(demo, output)
        assert any(f"as {model.dht_prefix} (8 blocks)" in line for line in output), output

        def report() -> dict:
            reports = json.loads(_get(f"{base}/api/v1/state"))["model_reports"]
            return next((r for r in reports if r["dht_prefix"] == model.dht_prefix), {})

        assert wait_until(lambda: report().get("monitor_state") == "healthy", 180), report()
        assert wait_until(lambda: (report().get("generation_check") or {}).get("ok"), 120), report()
        assert LABELS[family] in _get(f"{base}/models/{model.dht_prefix}")

        for prompt, ids, text in expected:
            answer = _post(f"{base}/v1/completions", {"model": model.dht_prefix, "prompt": prompt,
                                                      "max_tokens": TOKENS, "temperature": 0})
            assert answer["choices"][0]["text"] == text and answer["usage"]["completion_tokens"] == TOKENS, \
                (prompt, answer["choices"][0]["text"], text)

        chaos = subprocess.run([sys.executable, "-m", "monitor.app.cli", "chaos", "corrupt", "server-2", "--url", base],
                               capture_output=True, text=True, timeout=120, env=env)
        assert chaos.returncode == 0, chaos.stderr
        flagged = wait_until(lambda: any("wrong outputs" in reason for reason in report().get("reasons", [])), 150)
        assert flagged, report().get("reasons")
    finally:
        assert stop_process(demo, output, signum=signal.SIGINT, timeout=90), "".join(output)[-3000:]
    assert wait_until(lambda: not swarm_processes(since=started), 20), swarm_processes(since=started)
