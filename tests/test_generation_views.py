"""What the pages, the state API and /metrics show of the generation checks: the overview's one
line per model, the model page's chart, the figures in JSON and Prometheus' text."""

from __future__ import annotations

import re
import time

from monitor.core.generation import GenerationCheck, RouteSpan
from support import PEERS, TINY, text_of


def record(store, *checks):
    store.record_generation_checks(checks)


def test_the_overview_api_metrics_and_model_page_carry_the_newest_check(populated):
    app, store, settings, now = populated
    at = time.time()
    record(store, GenerationCheck(TINY.dht_prefix, at=at - 600, ok=False, error="every span failed: boom"),
           GenerationCheck(TINY.dht_prefix, at=at - 120, ok=True, answer="Paris is the capital", expect="Paris",
                           matched=True, time_to_first_token=0.42, tokens_per_second=17.2, tokens=8, duration=0.9,
                           route=(RouteSpan(PEERS["full"], 0, 8),)))
    client = app.test_client()
    overview = text_of(client.get("/").get_data(as_text=True))
    assert "generation ok · 17 tok/s · first token 420 ms · 2 min ago" in overview
    report = next(r for r in client.get("/api/v1/state").get_json()["model_reports"] if r["dht_prefix"] == TINY.dht_prefix)
    check = report["generation_check"]
    assert (check["ok"], check["tokens_per_second"], check["time_to_first_token"], check["route"]) == (
        True, 17.2, 0.42, [PEERS["full"]])
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r'^swarm_monitor_generation_check_ok\{model="tiny-llama"\} 1\.0$', metrics, re.M)
    assert re.search(r'^swarm_monitor_generation_check_tokens_per_second\{model="tiny-llama"\} 17\.2$', metrics, re.M)
    page = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    assert 'id="gen-h"' in page and "every span failed: boom" in page  # the failure is on the chart's hover


def test_a_failing_check_reads_failing_with_its_error(populated):
    app, store, settings, now = populated
    record(store, GenerationCheck(TINY.dht_prefix, at=time.time() - 5, ok=False,
                                  error="answer did not match /Paris/: 'zzzz'"))
    client = app.test_client()
    overview = client.get("/").get_data(as_text=True)
    assert 'data-generation-ok="false"' in overview
    assert "failing: answer did not match /Paris/" in text_of(overview)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r'^swarm_monitor_generation_check_ok\{model="tiny-llama"\} 0\.0$', metrics, re.M)


def test_a_check_recorded_after_a_page_was_read_shows_on_the_next_refresh(populated):
    app, store, settings, now = populated
    client = app.test_client()
    assert 'data-generation-ok' not in client.get("/").get_data(as_text=True)
    record(store, GenerationCheck(TINY.dht_prefix, at=time.time(), ok=True, answer="Paris", tokens=8,
                                  time_to_first_token=0.3, tokens_per_second=9.5))
    assert 'data-generation-ok="true"' in client.get("/").get_data(as_text=True)
