"""Spec: ``log_format = "json"`` — every line a ``swarm-monitor serve`` writes to stderr while it polls
the session swarm and chats is one JSON object (time, level, logger, message), hivemind's and
petals' lines included; lines of a request say which, lines of a job say which. Plain text stays the
default (every other spec's ``serve`` reads its text lines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import free_port, stop_process, wait_until


@pytest.mark.timeout(600)
def test_every_line_of_a_serve_that_polls_and_chats_is_one_json_object(swarm, tiny_model, tmp_path):
    port = free_port()
    config = tmp_path / "monitor.toml"
    config.write_text("\n".join([
        "[swarm]", f"initial_peers = {json.dumps(swarm.initial_peers)}", "discover_models = false",
        "[logs]", 'log_format = "json"', "[poller]", "scrape_period = 60 # (and a deprecated name, warned of as JSON)",
        "probe_period = 60",
        "[[models]]", f'dht_prefix = "{TINY_DHT_PREFIX}"', f"num_blocks = {TINY_NUM_BLOCKS}",
        f"path = {json.dumps(str(tiny_model))}"]) + "\n")
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path / "data")}
    with open(tmp_path / "stderr.log", "w") as errors:
        serve = subprocess.Popen(
            [sys.executable, "-m", "monitor.app.cli", "--config", str(config), "serve", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=errors, env=env, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            base = f"http://127.0.0.1:{port}"

            def answered() -> bool:
                body = json.dumps({"model": TINY_DHT_PREFIX, "prompt": "Hello", "max_tokens": 4}).encode()
                request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        return response.status == 200
                except OSError:
                    return False

            assert wait_until(answered, 240, step=2), (tmp_path / "stderr.log").read_text()[-3000:]
            with urllib.request.urlopen(f"{base}/models/no-such-model", timeout=30) as _:
                pass
        except urllib.error.HTTPError as e:
            assert e.code == 404  # a request that logs nothing special still may be logged: a 404
        finally:
            stop_process(serve, [], signum=signal.SIGINT, timeout=120)
    lines = (tmp_path / "stderr.log").read_text().splitlines()
    assert len(lines) > 5
    parsed = []
    for number, line in enumerate(lines, start=1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"stderr line {number} is not JSON: {line[:300]!r}")
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in parsed)
    loggers = {entry["logger"] for entry in parsed}
    assert any(name.startswith(("hivemind", "petals")) for name in loggers), loggers
    assert any("probe_period" in entry["message"] for entry in parsed if entry["logger"] == "monitor.settings"), \
        parsed[:3]  # what reading the settings logged, before their format was known
    assert any("POST /v1/completions" in entry["message"] for entry in parsed), loggers


def test_a_line_inside_a_request_or_a_job_says_which(tmp_path):
    """The context (``monitor.logs.about``): the poller's jobs run inside it (``Runner.run``), and every
    request of the web app (its first hook)."""
    import io
    import logging

    from monitor import logs
    from monitor.app.job_table import Job
    from monitor.settings import Settings
    from support import sqlite_store

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    said = logging.getLogger("spec.json-logs")
    said.addHandler(handler)
    said.propagate = False
    try:
        from monitor.app.job_context import JobContext, JobStats
        from monitor.app.runner import Runner, with_db_retry

        stats = JobStats()
        job = Job("scrape", "a job", lambda ctx: said.warning("inside the job"))
        Runner(JobContext(settings=Settings(), store=None, stats=stats, db=lambda call, name: with_db_retry(stats, call, name),
                          assess_step=lambda ctx: False), [job]).run(job)
        said.warning("outside")

        from monitor.web import create_app

        store = sqlite_store(tmp_path)
        app = create_app(Settings(data_dir=tmp_path, initial_peers=[]), store)
        app.add_url_rule("/spec-logs", "spec_logs", lambda: (said.warning("inside the request"), "ok")[1])
        app.add_url_rule("/spec-logs/<path:rest>", "spec_logs_rest", lambda rest: (said.warning("hostile path"), "ok")[1])
        assert app.test_client().get("/spec-logs?x=1").status_code == 200
        # a visitor's path forging a JSON field, and a huge one: still one line each, the path a string
        # inside it, cut at 300 characters (a line break never reaches a view: no route matches it)
        assert app.test_client().get('/spec-logs/a%22,%22level%22:%22CRITICAL').status_code == 200
        assert app.test_client().get("/spec-logs/" + "x" * 5000).status_code == 200
        store.close()
    finally:
        said.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["message"], line.get("job"), line.get("request")) for line in lines] == [
        ("inside the job", "scrape", None), ("outside", None, None), ("inside the request", None, "GET /spec-logs"),
        ("hostile path", None, 'GET /spec-logs/a","level":"CRITICAL'),
        ("hostile path", None, ("GET /spec-logs/" + "x" * 5000)[:300])]
    assert all(line["level"] == "WARNING" for line in lines)
    assert lines[0]["level"] == "WARNING" and lines[0]["logger"] == "spec.json-logs" and lines[0]["time"].endswith("Z")
