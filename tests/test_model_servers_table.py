"""The model page's servers table: every announced server with whether it serves and why not,
filterable by cause and sortable; a failing server shown failing with its own error, and a model
the store holds no diagnosis for shown as not diagnosed (the web diagnoses nothing itself)."""

from __future__ import annotations

import re
import time

from monitor.core.probes import SERVER_ERROR, ServerProbe
from monitor.core.snapshot import Snapshot
from monitor.app.jobs import Poller
from support import PEERS, TINY

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def causes_shown(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-peer-id="([^"]+)" data-state="[^"]*" data-cause="([^"]+)"', html))


def test_every_server_is_listed_with_its_cause_and_the_list_filters_and_sorts(client):
    page = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    shown = causes_shown(page)
    assert shown[PEERS["unreachable"]] == "unreachable" and shown[PEERS["joining"]] == "JOINING"
    assert shown[PEERS["full"]] == "serving"
    only = causes_shown(client.get(f"/models/{TINY.dht_prefix}?cause=unreachable").get_data(as_text=True))
    assert set(only) == {PEERS["unreachable"]}
    by_cause = list(causes_shown(client.get(f"/models/{TINY.dht_prefix}?sort=cause").get_data(as_text=True)).values())
    assert by_cause.index("unreachable") < by_cause.index("JOINING") < by_cause.index("serving")
    assert client.get(f"/models/{TINY.dht_prefix}?cause=nonsense").status_code == 400
    assert client.get(f"/models/{TINY.dht_prefix}?sort=" + "x" * 5000).status_code == 400


def test_a_failing_server_is_shown_failing_with_its_error_and_the_model_degraded(populated):
    app, store, settings, now = populated
    client = app.test_client()
    full = PEERS["full"]
    at = time.time()
    store.record_server_probes([ServerProbe(full, TINY.dht_prefix, 0, 8, at=at - 2 - i, ok=False, error=OOM,
                                            error_kind=SERVER_ERROR) for i in range(2)])
    snapshot = store.latest_snapshot()
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=snapshot.models, servers=snapshot.servers),
                      Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    report = next(r for r in client.get("/api/v1/state").get_json()["model_reports"]
                  if r["dht_prefix"] == TINY.dht_prefix)
    assert report["monitor_state"] in ("degraded", "broken")
    assert any("is ONLINE but failing: CUDA out of memory" in r for r in report["reasons"]), report["reasons"]
    page = client.get(f"/models/{TINY.dht_prefix}?cause=failing").get_data(as_text=True)
    assert causes_shown(page) == {full: "failing"} and OOM in page
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r"^swarm_monitor_servers_failing 1\.0$", metrics, re.M)


def test_a_model_without_a_stored_diagnosis_is_shown_not_diagnosed(populated):
    app, store, settings, now = populated
    snapshot = store.latest_snapshot()
    store.record_poll(Snapshot(taken_at=time.time(), duration=1.0, models=snapshot.models, servers=snapshot.servers))
    state = app.test_client().get("/api/v1/state").get_json()
    tiny = next(r for r in state["model_reports"] if r["dht_prefix"] == TINY.dht_prefix)
    assert tiny["monitor_state"] == "unknown"
    assert tiny["reasons"][0].startswith("not diagnosed: the poller stored this poll without a diagnosis")
    assert "not diagnosed" in app.test_client().get("/").get_data(as_text=True)
