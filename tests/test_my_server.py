"""Specs of "is my server OK?": the report at the top of a peer's page, and its live check.

Two kinds of evidence. The real swarm of the session (tests/conftest.py: first-half 0:4,
second-half 4:8, full 0:8 of the tiny model), polled and probed by the real poller, with live
checks through the real DHT. And a store filled through its own write path with a made-up week
in which servers leave, announce OFFLINE, move to another model, load, run an old version or
cannot be reached, diagnosed and scored by the poller's own analysis (no DHT needed for that).
"""

from __future__ import annotations

import re
import time
from html import unescape

import pytest

from monitor.app.jobs import Poller
from monitor.settings import ModelConfig, Settings
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.swarm import check_servers
from monitor.web import create_app
from support import peer, text_of

N = TINY_NUM_BLOCKS


def words(html: str) -> str:
    return text_of(unescape(html))


def report_of(client, peer_id: str) -> str:
    """The "Is this server OK?" section of the peer's page, as text."""
    response = client.get(f"/peers/{peer_id}")
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    text = words(response.get_data(as_text=True))
    return text[text.index("Is this server OK?"):text.index("What it announces now")]


# ---- a real swarm, the real poller, live checks through the DHT --------------------------------


@pytest.fixture(scope="module")
def live(swarm, tmp_path_factory):
    """The session swarm polled, probed and scored into a SQLite store; ``dials`` counts the live
    checks that reached the DHT (the service's own check: ``check_servers`` through its DHT)."""
    path = tmp_path_factory.mktemp("my-server")
    settings = Settings(data_dir=path, initial_peers=swarm.initial_peers, reachability_timeout=5,
                        models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=N)],
                        reachability_rate_limit="3 per minute")
    store = Store(f"sqlite:///{path / 'monitor.db'}")
    store.migrate()
    poller = Poller(settings, store, swarm.dht)
    assert poller.poll_once() is not None, poller.stats.last_error
    assert poller.check_reachability_once() is not None, poller.stats.last_error
    assert poller.refresh_scores(), poller.stats.last_error
    dials = []

    def check(peer_id: str):
        dials.append(peer_id)
        batch = check_servers(swarm.dht, [peer_id], timeout=settings.reachability_timeout, concurrency=1)
        return batch.results[0] if batch.results else None

    yield settings, store, check, dials
    store.close()


def test_a_serving_server_is_visible_reachable_useful_and_scored(live, swarm):
    settings, store, check, _ = live
    client = create_app(settings, store, reachability_check=check).test_client()
    first = swarm.peer_id("first-half")
    report = report_of(client, first)
    assert "is visible, reachable and serving 0:4 of tiny-llama" in report
    assert "Seen in this swarm's DHT by the latest poll" in report
    assert f"Announces ONLINE on blocks 0:{N // 2}" in report
    assert "The latest probe reached it in" in report
    assert f"serves blocks 0:{N // 2}; one other server shares 0:{N // 2}" in report  # the full server
    assert "Health score" in report and "online 100% of the last 24 h" in report
    assert "--block_indices" in report  # where petals' own block selection would put a new server
    full = report_of(client, swarm.peer_id("full"))
    assert f"serves blocks 0:{N}; one other server shares 0:{N}" in full  # each half also has its half-server
    # the htmx refresh of the report is the report alone
    part = client.get(f"/peers/{first}", headers={"HX-Request": "true", "HX-Target": "my-server"})
    body = part.get_data(as_text=True)
    assert part.status_code == 200 and "<html" not in body and "Visible" in body and "History" not in body
    assert client.get("/peers/not-a-peer-id!/reachability").status_code == 400


def test_a_live_check_reaches_the_server_once_a_minute_within_is_reachables_budget(live, swarm):
    settings, store, check, dials = live
    client = create_app(settings, store, reachability_check=check).test_client()
    full = swarm.peer_id("full")
    dials.clear()
    stranger = client.get(f"/peers/{peer('not in this swarm')}/reachability")  # 1 of 3: never dialled
    assert "not announced in the swarm's DHT in the latest poll" in words(stranger.get_data(as_text=True))
    answer = client.get(f"/peers/{full}/reachability")  # 2 of 3: dials
    text = words(answer.get_data(as_text=True))
    assert answer.status_code == 200 and "reachable" in text and "live check" in text, text
    assert dials == [full]
    again = client.get(f"/api/v1/is_reachable/{full}")  # 3 of 3, the same budget; the answer is reused
    assert again.get_json()["success"] is True and dials == [full]
    refused = client.get(f"/peers/{full}/reachability")  # over the budget: said in words, still a 200 for htmx
    assert refused.status_code == 200 and "wait a minute" in words(refused.get_data(as_text=True))
    assert int(refused.headers["Retry-After"]) >= 1
    assert client.get(f"/api/v1/is_reachable/{full}").status_code == 429


# ---- a made-up week through the write path -----------------------------------------------------

WEEK_MODEL = ModelInfo("week-model", 12, name="Week Model")
RETIRED = ModelInfo("retired-model", 4)


def row(name: str, start: int, end: int, state: str = ONLINE, model: ModelInfo = WEEK_MODEL,
        version: str = "2.2.0") -> ServerRow:
    return ServerRow(peer(name), model.dht_prefix, start, end, state, throughput=100.0, version=version,
                     public_name=name)


@pytest.fixture
def week(tmp_path):
    """Polls every 10 minutes for a day. "steady" serves 0:12 and is alone on 8:12; "helper" 0:8;
    "leaver" left 3 hours ago without a word; "quitter" announced OFFLINE 3 hours ago, then left;
    "mover" served a model the swarm no longer announces; "joiner" is loading; "old" runs an old
    petals; "walled" announces ONLINE but its probes fail."""
    settings = Settings(data_dir=tmp_path, models=[ModelConfig(dht_prefix=WEEK_MODEL.dht_prefix, num_blocks=12)])
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    poller = Poller(settings, store, dht=None)
    now = time.time()
    start = now - 86400
    at = start
    while at < now - 60:
        ago = now - at
        rows = [row("steady", 0, 12), row("helper", 0, 8), row("walled", 0, 12), row("old", 0, 4, version="2.0.1")]
        rows.append(row("joiner", 4, 8, JOINING if ago < 1800 else ONLINE))
        if ago > 3 * 3600:
            rows.append(row("leaver", 0, 6))
        if ago > 3 * 3600 + 600:
            rows.append(row("quitter", 6, 12))
        elif ago > 3 * 3600:
            rows.append(row("quitter", 6, 12, OFFLINE))
        models = (WEEK_MODEL,)
        if ago > 6 * 3600:
            rows.append(row("mover", 0, 4, model=RETIRED))
            models = (WEEK_MODEL, RETIRED)
        snapshot = Snapshot(taken_at=at, duration=1.0, models=models, servers=tuple(rows))
        probes = ReachabilityBatch(at + 5, 1.0, tuple(
            ReachabilityResult(r.peer_id, "server", r.public_name != "walled", rtt=0.02 if r.public_name != "walled" else None,
                        error="Failed to connect in 5 sec" if r.public_name == "walled" else None)
            for r in rows if r.state == ONLINE))
        store.record_reachability(probes)
        store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))
        at += 600
    store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=30)
    poller.refresh_scores(now)
    yield create_app(settings, store).test_client(), store
    store.close()


def test_a_server_that_left_says_when_and_how(week):
    client, _ = week
    leaver = report_of(client, peer("leaver"))
    assert re.search(r"Not in the latest poll\. It was last seen 3 h ago \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\), "
                     r"ONLINE on blocks 0:6 of Week Model, and left without announcing OFFLINE", leaver), leaver
    assert "left without announcing OFFLINE" in leaver and "restart it" in leaver
    as_json = client.get(f"/api/v1/peers/{peer('leaver')}/report").get_json()
    assert as_json["status"] == "bad" and as_json["checks"][0]["name"] == "visible"
    assert "left without announcing OFFLINE" in as_json["checks"][0]["text"] and as_json["checks"][0]["advice"]
    never = client.get(f"/api/v1/peers/{peer('never here')}/report").get_json()
    assert never["checks"][0]["text"].startswith("Never seen in this swarm's DHT")
    quitter = report_of(client, peer("quitter"))
    assert "It announced OFFLINE 3 h ago" in quitter and "clean shutdown" in quitter
    mover = report_of(client, peer("mover"))
    assert "serving retired-model, a model this monitor does not see in the DHT any more" in mover
    assert "week-model" in mover  # what this monitor does watch
    assert "Health score" in leaver  # still scored: it was seen this week


def test_a_server_that_is_there_but_not_serving_says_why_and_what_to_do(week):
    client, _ = week
    walled = report_of(client, peer("walled"))
    assert "could not reach it: Failed to connect in 5 sec" in walled
    assert "port is reachable from the internet" in walled
    assert "does not count it as serving its blocks" in walled
    joiner = report_of(client, peer("joiner"))
    assert "Announces JOINING on blocks 4:8 of Week Model" in joiner and "still loading its blocks" in joiner
    old = report_of(client, peer("old"))
    assert "It runs petals 2.0.1; most servers run 2.2.0" in old


def test_a_server_alone_on_some_blocks_is_told_so_and_where_a_new_one_helps(week):
    client, _ = week
    steady = report_of(client, peer("steady"))
    assert "is visible, reachable and serving 0:12 of Week Model" in steady
    assert "it is the only server of 8:12" in steady  # walled does not count: unreachable
    assert "Where a server helps most now" in steady
    start, end = map(int, re.search(r"--block_indices (\d+):(\d+) —", steady).groups())
    assert start <= 8 and end == 12  # petals' block selection covers the blocks only steady serves


def test_the_report_follows_the_store(week):
    client, store = week
    assert "JOINING" in report_of(client, peer("joiner"))
    latest = store.latest_snapshot()
    rows = tuple(r if r.public_name != "joiner" else ServerRow(**{**vars(r), "state": ONLINE}) for r in latest.servers)
    store.record_poll(Snapshot(taken_at=time.time(), duration=1.0, models=latest.models, servers=rows))
    assert "Announces ONLINE on blocks 4:8" in report_of(client, peer("joiner"))  # a new poll: read again



def test_a_contributor_pastes_their_peer_id_and_learns_how_their_server_is(live, swarm, browser, artifacts_dir):
    """The whole path in a real browser: the search box on the overview, the results as one types,
    the report on the peer's page, and a live check from it."""
    import threading

    from playwright.sync_api import expect
    from werkzeug.serving import make_server

    settings, store, check, _ = live
    server = make_server("127.0.0.1", 0, create_app(settings, store, reachability_check=check), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    problems = []
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)
        page.goto(base + "/")
        mine = swarm.peer_id("second-half")
        box = page.get_by_role("searchbox", name="Find a server by peer id or public name")
        box.fill(mine[:12])
        result = page.locator("#search-results a").first
        expect(result).to_contain_text(mine[-6:])  # listed while typing (htmx), without a reload
        expect(result).to_contain_text("online")
        page.screenshot(path=str(artifacts_dir / "search-box.png"))
        box.fill(mine)
        box.press("Enter")  # the whole id: straight to its report
        expect(page.locator("#my-server")).to_contain_text("is visible, reachable and serving", timeout=10_000)
        assert page.url.endswith(f"/peers/{mine}#my-server")
        expect(page.locator("#my-server")).to_contain_text(f"Announces ONLINE on blocks {N // 2}:{N}")
        page.get_by_role("button", name="Check reachability now").click()
        expect(page.locator("#reachability-live")).to_contain_text("live check", timeout=30_000)
        expect(page.locator("#reachability-live .badge")).to_have_text("reachable")
        page.screenshot(path=str(artifacts_dir / "my-server.png"), full_page=True)
    finally:
        server.shutdown()
        thread.join(10)
    assert not problems, problems
