"""Specs of the command line on the session swarm (tests/conftest.py), each command in its own
process as an operator runs it: ``report`` and ``poll --once`` (its old spelling) print the same
report, whichever side of the command ``--config`` is given. The commands' shape, without a
swarm: ``test_cli.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS


def report_in_a_process(tmp_path: Path, swarm, name: str, args_before_config: bool, *command: str) -> str:
    """The command's stdout, run as an operator would, with the swarm and model in its own config."""
    data = tmp_path / name
    config = tmp_path / f"{name}.toml"
    config.write_text(f'data_dir = "{data}"\ninitial_peers = {json.dumps(list(swarm.initial_peers))}\n'
                      f'discover_models = false\n[[models]]\ndht_prefix = "{TINY_DHT_PREFIX}"\n'
                      f"num_blocks = {TINY_NUM_BLOCKS}\n")
    options = ["--config", str(config)]
    args = [*command, *options] if args_before_config else [*options, *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_MONITOR_")}
    done = subprocess.run([sys.executable, "-m", "monitor.app.cli", *args], capture_output=True, text=True,
                          timeout=180, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (data / "monitor.db").exists()  # the config's data dir: it was read
    return done.stdout


def shape(report: str) -> list[str]:
    """The report with its numbers, paths and column padding taken out."""
    text = re.sub(r"sqlite:///\S+:", "sqlite:///DB:", report)
    return [re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?", "N", line)).rstrip() for line in text.splitlines()]


def test_report_and_poll_once_print_the_same_report(swarm, tmp_path):
    report = report_in_a_process(tmp_path, swarm, "report", False, "report")  # swarm-monitor --config F report
    old = report_in_a_process(tmp_path, swarm, "old", True, "poll", "--once")  # swarm-monitor poll --once --config F
    assert f"({TINY_DHT_PREFIX}, {TINY_NUM_BLOCKS} blocks): HEALTHY" in report, report
    for name in ("first-half", "second-half", "full"):
        assert name in report and name in old
    assert shape(report) == shape(old), f"report:\n{report}\npoll --once:\n{old}"
