"""Specs of /metrics: Prometheus text that prometheus_client's own parser reads, health.petals.dev's
metric names where they fit, ours besides, and numbers read from the store at scrape time."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.jobs import Poller
from monitor.core.snapshot import ServerRow, Snapshot
from monitor.web import create_app
from support import PEERS, TINY, web_settings


def scrape(client, url="/metrics") -> dict:
    response = client.get(url)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    text = response.get_data(as_text=True)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for family in families.values():  # every family has HELP and TYPE lines (a counter's named with _total)
        name = f"{family.name}_total" if family.type == "counter" and f"# HELP {family.name} " not in text \
            else family.name
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, family.name
    return families


def samples(families, name) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name == name}


def value(families, name, **labels) -> float:
    return samples(families, name)[tuple(sorted(labels.items()))]


def test_metrics_parse_and_carry_health_petals_dev_names(client):
    f = scrape(client)
    assert value(f, "update_duration") == pytest.approx(3.25)
    assert value(f, "servers_num_total") == 6
    assert value(f, "servers_num_relay") == 1
    assert value(f, "n_blocks", model="tiny-llama") == 8
    assert value(f, "servers_num", model="tiny-llama") == 5
    assert value(f, "blocks", model="tiny-llama", state="online") == 4 + 4 + 8
    assert value(f, "blocks", model="tiny-llama", state="joining") == 4
    assert value(f, "blocks", model="tiny-llama", state="unreachable") == 8
    assert value(f, "blocks", model="tiny-llama", state="offline") == 0
    assert value(f, "blocks_online_min", model="tiny-llama") == 2
    assert value(f, "blocks_online_min", model="other-model") == 0
    # inference rps per block: first-half 40 on 0:4, second-half 30 on 4:8, full 60 everywhere
    assert value(f, "rps_min", model="tiny-llama", rps="inference") == 90
    assert value(f, "rps_avg", model="tiny-llama", rps="inference") == 95
    assert value(f, "server_version", version_number="2.2.0") == 5
    assert value(f, "server_version", version_number="2.3.0.dev0") == 1
    # finite RTTs between servers: 0.01, 0.015, 0.02 (the infinite one is left out)
    assert value(f, "ping_pct", pct="50") == pytest.approx(0.015)


def test_metrics_carry_our_model_states_scores_and_poll_health(client):
    f = scrape(client)
    assert value(f, "swarm_monitor_model_state", model="tiny-llama", state="healthy") == 1
    assert value(f, "swarm_monitor_model_state", model="tiny-llama", state="broken") == 0
    assert value(f, "swarm_monitor_model_state", model="other-model", state="broken") == 1
    assert value(f, "swarm_monitor_model_min_redundancy", model="tiny-llama") == 2
    assert value(f, "swarm_monitor_model_coverage_percent", model="other-model") == 50
    scores = samples(f, "swarm_monitor_peer_health_score")
    assert len(scores) == 6 and all(0 <= v <= 100 for v in scores.values())
    assert value(f, "swarm_monitor_last_poll_invalid_records") == 2
    assert value(f, "swarm_monitor_last_poll_ok") == 1
    assert value(f, "swarm_monitor_database_size_bytes") > 0
    assert value(f, "swarm_monitor_bootstrap_peer_up", peer_id=PEERS["bootstrap"]) == 1


def test_metrics_are_read_from_the_store_at_scrape_time_so_workers_agree(populated):
    app, store, settings, now = populated
    other_worker = create_app(settings, store).test_client()
    first = scrape(app.test_client(), "/api/prometheus")
    assert scrape(other_worker).keys() == first.keys()
    # a new poll in which only the first half is served: every worker reports it at once
    rows = (ServerRow(PEERS["first"], TINY.dht_prefix, 0, 4, "ONLINE", throughput=50.0),)
    snapshot = Snapshot(taken_at=time.time(), duration=0.5, models=(TINY,), servers=rows)
    store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    for client in (app.test_client(), other_worker):
        f = scrape(client)
        assert value(f, "update_duration") == 0.5
        assert value(f, "swarm_monitor_model_state", model="tiny-llama", state="broken") == 1
        assert value(f, "blocks_online_min", model="tiny-llama") == 0


def test_metrics_carry_the_process_series_operators_graph_first(client):
    """prometheus_client's process, platform and GC collectors, labelled with the answering process."""
    families = scrape(client)
    pid = str(os.getpid())
    assert value(families, "process_resident_memory_bytes", pid=pid) > 0
    assert value(families, "process_open_fds", pid=pid) > 0
    assert {"generation": "0", "pid": pid} in [sample.labels for sample in families["python_gc_objects_collected"].samples]
    assert families["python_info"].samples[0].labels["pid"] == pid


def test_metrics_before_the_first_poll_still_parse(tmp_path):
    from monitor.store import Store

    store = Store(f"sqlite:///{tmp_path / 'empty.db'}")
    store.migrate()
    f = scrape(create_app(web_settings(), store).test_client())
    assert "update_duration" not in f and "swarm_monitor_database_size_bytes" in f
    store.close()


def test_metrics_count_failed_polls_and_dropped_records_over_the_last_day(populated):
    app, store, _, now = populated
    store.record_failed_poll(now, "TimeoutError: the DHT did not answer")
    f = scrape(app.test_client())
    assert value(f, "swarm_monitor_polls_24h", result="ok") == 3
    assert value(f, "swarm_monitor_polls_24h", result="failed") == 1
    assert value(f, "swarm_monitor_invalid_records_24h") == 0 + 1 + 2
    assert value(f, "swarm_monitor_last_poll_ok") == 0


def test_metrics_carry_servers_speed_reachability_and_the_last_polls_time_and_errors(populated):
    """The gauges an operator's alerting reads, against what the populated store holds."""
    app, store, _, _ = populated
    f = scrape(app.test_client())
    diagnoses = store.latest_assessments()
    # first, second and full are online and reachable; joining is JOINING; unreachable failed its reachability check
    assert value(f, "swarm_monitor_model_servers_online", model="tiny-llama") == 3
    assert value(f, "swarm_monitor_model_servers_online", model="other-model") == 1
    assert value(f, "swarm_monitor_model_est_tokens_per_second", model="tiny-llama") == pytest.approx(
        diagnoses["tiny-llama"].est_tokens_per_s)
    assert value(f, "swarm_monitor_model_est_tokens_per_second", model="tiny-llama") > 0
    assert value(f, "swarm_monitor_unreachable_peers") == 1  # PEERS["unreachable"]
    last = store.last_poll()
    assert value(f, "swarm_monitor_last_poll_timestamp_seconds") == pytest.approx(last.at)
    assert value(f, "swarm_monitor_last_poll_errors") == len(last.errors) == 0
