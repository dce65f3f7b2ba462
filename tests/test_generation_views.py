"""What the pages, the state API and /metrics show of the generation checks: the overview's one
line per model, the model page's chart, the figures in JSON and Prometheus' text; and the checks
themselves without a swarm: an answer judged by the model's pattern, a pattern refused when the
settings load, the summary line, a failure naming a few servers by their error, pruning with the
raw rows. Checks through a real swarm: ``test_generation_check.py``.
"""

from __future__ import annotations

import re
import time

import pytest

from monitor.core.generation import (
    GenerationCheck,
    RouteSpan,
    compile_expect,
    is_current,
    judge_answer,
    servers_failed,
    summary,
)
from monitor.settings import SettingsError, load_settings
from monitor.store import Store
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
    assert "generation failed: answer did not match /Paris/" in text_of(overview)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r'^swarm_monitor_generation_check_ok\{model="tiny-llama"\} 0\.0$', metrics, re.M)


def test_a_check_recorded_after_a_page_was_read_shows_on_the_next_refresh(populated):
    app, store, settings, now = populated
    client = app.test_client()
    assert 'data-generation-ok' not in client.get("/").get_data(as_text=True)
    record(store, GenerationCheck(TINY.dht_prefix, at=time.time(), ok=True, answer="Paris", tokens=8,
                                  time_to_first_token=0.3, tokens_per_second=9.5))
    assert 'data-generation-ok="true"' in client.get("/").get_data(as_text=True)


# ---- the checks themselves ---------------------------------------------------------------------


def ok_check(answer: str, **kwargs) -> GenerationCheck:
    return GenerationCheck(model="m", at=1000.0, ok=True, answer=answer, time_to_first_token=0.41,
                           tokens_per_second=17.2, tokens=8, **kwargs)


def test_an_answer_is_judged_by_the_models_pattern_case_insensitively_and_anywhere_in_it():
    assert judge_answer(ok_check("The capital of France is Paris."), "paris").matched is True
    assert judge_answer(ok_check("The capital of France is Paris."), r"\bParis\b").ok
    unmatched = judge_answer(ok_check("Lyon, I think"), "Paris")
    assert not unmatched.ok and unmatched.matched is False
    assert unmatched.error == "answer did not match /Paris/: 'Lyon, I think'"
    anything = judge_answer(ok_check("zq zq"), None)  # no pattern: any answer is ok
    assert anything.ok and anything.matched is None and anything.expect is None
    failed = GenerationCheck(model="m", at=1.0, ok=False, error="boom")
    assert judge_answer(failed, "Paris") == GenerationCheck(model="m", at=1.0, ok=False, error="boom", expect="Paris")


def test_a_pattern_that_is_no_regular_expression_is_refused_when_the_settings_load():
    assert compile_expect("Par(is|ee)").search("PARIS")
    with pytest.raises(ValueError, match="not a regular expression"):
        compile_expect("Paris(")
    with pytest.raises(SettingsError, match="expect"):
        load_settings(environ={"SWARM_MONITOR_MODELS": '[{"dht_prefix": "m", "expect": "Paris("}]'})
    settings = load_settings(environ={"SWARM_MONITOR_MODELS": '[{"dht_prefix": "m", "expect": "Paris"}]'})
    assert settings.models[0].expect == "Paris"
    assert (settings.generation_check_period, settings.generation_check_tokens) == (300, 8)


def test_the_summary_line_says_ok_with_its_figures_or_failing_with_the_error():
    assert summary(ok_check("Paris"), now=1000.0 + 120) == "generation ok · 17 tok/s · first token 410 ms · 2 min ago"
    failing = GenerationCheck(model="m", at=1000.0, ok=False, error="answer did not match /Paris/: 'x'")
    assert summary(failing, now=1001.0) == "generation failed: answer did not match /Paris/: 'x'"
    assert summary(None, now=0.0) == "generation not checked yet"
    assert is_current(ok_check("x"), now=1000.0 + 3 * 300, period=300)
    assert not is_current(ok_check("x"), now=1000.0 + 3 * 300 + 1, period=300) and not is_current(None, 0, 300)


def test_a_failure_names_a_few_servers_grouped_by_their_error_and_counts_the_rest():
    spans = [RouteSpan(f"peer{i:06d}", 0, 8, error="CUDA error: out of memory") for i in range(5)]
    spans.append(RouteSpan("peerx00001", 0, 4, error="Cannot allocate KV cache"))
    spans.append(RouteSpan("peery00002", 4, 8))  # it answered: not named
    text = servers_failed(spans)
    assert text == ("…000000 (0:8), …000001 (0:8), …000002 (0:8) and 2 more failed: CUDA error: out of memory; "
                    "1 more server failed: Cannot allocate KV cache")
    assert servers_failed([RouteSpan("a", 0, 1)]) is None


def test_checks_are_pruned_with_the_raw_rows(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        now = time.time()
        old = GenerationCheck(model="m", at=now - 5 * 86400, ok=False, error="old")
        new = GenerationCheck(model="m", at=now - 60, ok=True, answer="Paris", tokens=3,
                              route=(RouteSpan("p", 0, 8),))
        store.record_generation_checks([old, new])
        assert store.generation_check_history("m", 0) == [old, new]
        counts = store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=90)
        assert counts["generation_checks"] == 1
        assert store.generation_check_history("m", 0) == [new] and store.latest_generation_checks() == {"m": new}
    finally:
        store.close()
