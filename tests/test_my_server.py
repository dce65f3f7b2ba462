"""Specs of "is my server OK?": the report at the top of a peer's page, and its live check, on the
real swarm of the session (tests/conftest.py: first-half 0:4, second-half 4:8, full 0:8 of the
tiny model), polled and checked by the real poller, with live checks through the real DHT, and a
contributor's visit in Chromium. The report on a made-up week of every kind of server:
``test_server_report.py``.
"""

from __future__ import annotations

import pytest

from monitor.app.jobs import Poller
from monitor.settings import ModelConfig, Settings
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.swarm import check_servers
from monitor.web import create_app
from support import peer, report_of, words

N = TINY_NUM_BLOCKS


# ---- a real swarm, the real poller, live checks through the DHT --------------------------------


@pytest.fixture(scope="module")
def live(swarm, tmp_path_factory):
    """The session swarm polled, checked for reachability and scored into a SQLite store; ``dials``
    counts the live checks that reached the DHT (the service's own check: ``check_servers`` through
    its DHT)."""
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
    assert "The latest reachability check reached it in" in report
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


# ---- a contributor in Chromium -----------------------------------------------------------------


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
