"""Readable at any scale: the simulated 500-server swarm of the benchmarks (``scripts/simulate_swarm``'s
plan, 4 models), most servers announcing ONLINE but answering no reachability check, as on a
public swarm full of NAT-ed peers. Each model's reasons stay a few short sentences, and the
overview and the model page stay a readable height in Chromium; the servers table lists everyone."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from monitor import compat  # noqa: F401  (before petals)
from monitor.app.jobs import Poller
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.settings import Settings
from monitor.store import Store
from monitor.web import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from simulate_swarm import plan_swarm, planned_rows, sim_models  # noqa: E402

SERVERS, ANSWERING = 500, 8
MAX_REASON_CHARS = 300  # one short sentence
MAX_REASONS = 12  # per model, whatever the swarm's size
MAX_OVERVIEW_PX = 3000  # 4 models, at 1280 px wide
MAX_STATE_BOX_PX = 900  # the model page's state panel


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """(app, models, snapshot) of one poll of the simulated swarm, diagnosed as the poller does."""
    tmp = tmp_path_factory.mktemp("scale")
    planned = plan_swarm(SERVERS, sim_models(4), unreachable=0.1)
    models, rows = planned_rows(planned, sim_models(4))
    now = time.time()
    answering = {s.peer_id for s in planned[:ANSWERING]}
    checks = tuple(ReachabilityResult(row.peer_id, "server", True, rtt=0.02) if row.peer_id in answering else
                   ReachabilityResult(row.peer_id, "server", False, error="routing: not found")
                   for row in {r.peer_id: r for r in rows}.values())
    settings = Settings(data_dir=tmp, initial_peers=[], discover_models=False, correctness_checks=False)
    store = Store(f"sqlite:///{tmp / 'monitor.db'}")
    store.migrate()
    store.record_reachability(ReachabilityBatch(taken_at=now - 5, duration=1.0, results=checks))
    snapshot = Snapshot(taken_at=now, duration=3.0, models=tuple(models), servers=tuple(rows))
    store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    yield create_app(settings, store), models, snapshot
    store.close()


def test_every_reason_is_one_short_sentence_and_the_servers_table_lists_everyone(big):
    app, models, snapshot = big
    state = app.test_client().get("/api/v1/state").get_json()
    assert len(state["model_reports"]) == 4
    for report in state["model_reports"]:
        assert report["monitor_state"] == "broken"  # 8 answering servers cannot cover four models
        assert 1 <= len(report["reasons"]) <= MAX_REASONS, report["reasons"]
        for reason in report["reasons"]:
            assert len(reason) <= MAX_REASON_CHARS, reason
        page = app.test_client().get(f"/models/{report['dht_prefix']}").get_data(as_text=True)
        assert page.count("data-cause=") == len(snapshot.rows_for(report["dht_prefix"]))
    assert any("ONLINE but unreachable" in r and "see the servers table" in r
               for report in state["model_reports"] for r in report["reasons"])


def test_the_overview_and_the_model_page_stay_a_readable_height(big, browser):
    app, models, _ = big
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/")
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height <= MAX_OVERVIEW_PX, f"the overview is {height} px tall"
        page.goto(f"{base}/models/{models[0].dht_prefix}")
        box = page.locator("section[aria-labelledby=state-h]").bounding_box()
        assert box["height"] <= MAX_STATE_BOX_PX, f"the state box is {box['height']} px tall"
        page.close()
    finally:
        server.shutdown()
        thread.join(10)
