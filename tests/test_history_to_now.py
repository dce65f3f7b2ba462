"""Spec: every state and throughput series runs to its latest observation (README: Dashboard).

A server online since "08:00" looked, at "08:15", as if its data stopped at 08:00: its merged
history holds one point per run (the run's start), and a line through the starts ends at the last
change. The peer page's State and Throughput charts now hold each run until the next one and the
last one to the latest poll — where the history API's observations end too; a server that left is
held OFFLINE to the latest poll while its throughput stops where it was last announced. The model
page's heatmap and the overview's sparkline end at the latest poll as well.
"""

from __future__ import annotations


import pytest

from monitor.app.jobs import Poller
from monitor.core.snapshot import JOINING, ONLINE, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.store import Store
from monitor.web import create_app
from monitor.web.charts import axis_time
from support import TINY, figures, peer, web_settings

STAYS, LEAVES = peer("stays-online"), peer("leaves")


def row(peer_id: str, state: str, throughput: float) -> ServerRow:
    return ServerRow(peer_id, TINY.dht_prefix, 0, TINY.num_blocks, state, throughput=throughput, inference_rps=10.0,
                     version="2.2.0", public_name=None)


@pytest.fixture
def history(tmp_path):
    """Polls every minute for 21 minutes: one server JOINING for 6, then ONLINE; another ONLINE
    until 5 minutes ago, then gone (not announced)."""
    import time

    now = time.time()
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    settings = web_settings(data_dir=tmp_path)
    poller = Poller(settings, store, dht=None)
    times = [now - 60 * k for k in range(21, -1, -1)]
    for i, at in enumerate(times):
        rows = [row(STAYS, JOINING if i < 6 else ONLINE, 50.0)] + ([row(LEAVES, ONLINE, 30.0)] if at < now - 300 else [])
        store.record_reachability(ReachabilityBatch(taken_at=at - 1, duration=0.1, results=tuple(
            ReachabilityResult(r.peer_id, "server", True, rtt=0.01) for r in rows)))
        snapshot = Snapshot(taken_at=at, duration=0.3, models=(TINY,), servers=tuple(rows))
        store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))
    app = create_app(settings, store)
    yield app, times
    store.close()


def test_the_peer_charts_run_to_the_latest_poll_like_the_api(history):
    app, times = history
    client = app.test_client()
    latest = axis_time(times[-1])
    api = client.get(f"/api/v1/peers/{STAYS}/history?since={times[0] - 1:.0f}").get_json()
    assert axis_time(max(o["at"] for o in api["observations"])) == latest
    states, throughput = figures(client.get(f"/peers/{STAYS}?hours=1").get_data(as_text=True))[:2]
    [line] = states["data"]
    assert line["x"][-1] == latest and line["y"][-1] == 2  # still online, as of the latest poll
    assert line["x"][0] == axis_time(times[0]) and line["y"][0] == 1  # joining first
    assert throughput["data"][0]["x"][-1] == latest and throughput["data"][0]["y"][-1] == 50.0


def test_a_server_that_left_is_held_offline_to_the_latest_poll_and_its_throughput_stops_when_it_left(history):
    app, times = history
    client = app.test_client()
    states, throughput = figures(client.get(f"/peers/{LEAVES}?hours=1").get_data(as_text=True))[:2]
    [line] = states["data"]
    assert line["x"][-1] == axis_time(times[-1]) and line["y"][-1] == 0  # offline (not announced) since it left
    gone = next(at for at in times if at >= times[-1] - 300)  # the first poll that missed it
    values = [(x, y) for x, y in zip(throughput["data"][0]["x"], throughput["data"][0]["y"]) if y is not None]
    assert values[-1] == (axis_time(gone), 30.0)  # held until the poll that no longer saw it, not beyond


def test_the_model_page_and_the_overview_end_at_the_latest_poll(history):
    app, times = history
    client = app.test_client()
    heatmaps = [f for f in figures(client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True))
                if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert heatmaps and all(f["data"][0]["x"][-1] >= axis_time(times[-1]) for f in heatmaps)
    [spark] = [f for f in figures(client.get("/").get_data(as_text=True)) if f["layout"]["height"] == 36]
    assert spark["data"][0]["x"][-1] == axis_time(times[-1])
