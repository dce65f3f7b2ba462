"""Readable at any scale: the simulated 500-server swarm of the benchmarks (conftest's
``simulated_swarm``: ``scripts/simulate_swarm``'s plan, 4 models), most servers announcing ONLINE but
answering no reachability check, as on a public swarm full of NAT-ed peers. Each model's reasons
stay a few short sentences, and the servers table lists everyone; the overview and the model page
stay a readable height in Chromium (``test_pages_in_chromium.py``)."""

from __future__ import annotations

MAX_REASON_CHARS = 300  # one short sentence
MAX_REASONS = 12  # per model, whatever the swarm's size


def test_every_reason_is_one_short_sentence_and_the_servers_table_lists_everyone(simulated_swarm):
    app, models, snapshot = simulated_swarm
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
