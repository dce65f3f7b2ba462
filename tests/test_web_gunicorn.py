"""Production serving: gunicorn (threaded workers) runs ``monitor.web.wsgi:app`` against PostgreSQL,
reads settings from the environment, serves the pages, and runs no poller of its own; while
PostgreSQL is away, the overview keeps showing the last state it read."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from monitor.store import Store
from monitor.web import create_app
from support import BOOTSTRAP_ADDR, PEERS, free_port, text_of, wait_until, web_settings

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).parent / "gunicorn"


def _get(url: str) -> tuple[int, str, dict]:
    with urllib.request.urlopen(url, timeout=20) as response:
        return response.status, response.read().decode(), dict(response.headers)


@pytest.fixture
def gunicorn(populated_postgres_url, tmp_path):
    """gunicorn on 127.0.0.1 serving a populated PostgreSQL store; yields (base_url, store, process)."""
    postgres_url, _ = populated_postgres_url  # migrated and populated (``support.populate``)
    store = Store(postgres_url)
    port = free_port()
    env = dict(os.environ, SWARM_MONITOR_DATABASE_URL=postgres_url, SWARM_MONITOR_INITIAL_PEERS=BOOTSTRAP_ADDR,
               SWARM_MONITOR_REFRESH_SECONDS="5", SWARM_MONITOR_DATA_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SWARM_MONITOR_CONFIG", None)
    log = open(tmp_path / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [str(GUNICORN), "--worker-class", "gthread", "--workers", "2", "--threads", "4",
         "--bind", f"127.0.0.1:{port}", "--timeout", "60", "monitor.web.wsgi:app"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    def serving() -> bool:
        try:
            return _get(base + "/metrics")[0] == 200
        except OSError:
            assert process.poll() is None, f"gunicorn exited: {(tmp_path / 'gunicorn.log').read_text()[-3000:]}"
            return False

    try:
        assert wait_until(serving, 60, step=0.3), f"gunicorn did not serve: {(tmp_path / 'gunicorn.log').read_text()[-3000:]}"
        yield base, store, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        store.close()


def test_gunicorn_serves_the_dashboard_from_postgres_and_runs_no_poller(gunicorn):
    base, store, process = gunicorn
    polls_before = store.last_poll().id

    status, html, headers = _get(base + "/")
    assert status == 200 and "Tiny Llama" in html and 'hx-trigger="every 5s"' in html
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, html, _ = _get(base + "/models/tiny-llama")
    assert status == 200 and 'data-state="unreachable"' in html and "--block_indices" in html
    status, html, _ = _get(base + f"/peers/{PEERS['full']}")
    assert status == 200 and "What it announces now" in html
    status, body, _ = _get(base + "/api/v1/state")
    state = json.loads(body)
    assert [m["dht_prefix"] for m in state["model_reports"]] == ["tiny-llama", "other-model"]
    assert state["bootstrap_states"] == ["online"]  # the initial peers came from the environment
    answered_by = set()
    for _ in range(4):  # both workers answer the same numbers, each its own process series
        status, text, _ = _get(base + "/metrics")
        assert 'swarm_monitor_model_state{model="tiny-llama",state="healthy"} 1.0' in text
        found = re.search(r'^process_resident_memory_bytes\{pid="(\d+)"\} [0-9.e+]+$', text, re.M)
        assert found and f'python_gc_objects_collected_total{{generation="0",pid="{found[1]}"}}' in text
        answered_by.add(int(found[1]))
    assert _get(base + "/static/vendor/plotly.js-cartesian-dist-min/plotly-cartesian.min.js")[0] == 200

    # no scheduler in the web workers: no new poll, no DHT daemon among gunicorn's processes
    time.sleep(2)
    assert store.last_poll().id == polls_before
    family = psutil.Process(process.pid).children(recursive=True)
    assert len(family) == 2 and not any("p2pd" in p.name() for p in family)
    assert answered_by <= {p.pid for p in family}  # the series name the worker that answered


# ---- PostgreSQL away ----------------------------------------------------------------------------


def test_while_the_database_is_away_the_overview_keeps_showing_the_last_state(tmp_path, postgres,
                                                                             populated_postgres_url):
    settings = web_settings(data_dir=tmp_path)
    url, _ = populated_postgres_url  # migrated and populated (``populate``)
    store = Store(url)
    try:
        client = create_app(settings, store).test_client()
        assert "database is unavailable" not in text_of(client.get("/").get_data(as_text=True))
        postgres.stop()
        try:
            page = client.get("/")
            assert page.status_code == 200
            text = text_of(page.get_data(as_text=True))
            assert "database is unavailable" in text and "Tiny Llama" in text
        finally:
            postgres.start()
        assert "database is unavailable" not in text_of(client.get("/").get_data(as_text=True))
    finally:
        store.close()
