"""The dashboard in a real browser (headless Chromium from Debian, driven by Playwright) against a real
private swarm and the running service (poller + web server on 127.0.0.1).

The page must follow the swarm by itself: a killed server turns the model from healthy to degraded,
and stopping the last one from the demo panel turns it broken, all without a reload. A peer that
announces HTML as its public name is shown as text. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import re

import pytest

from monitor.harness.demo_swarm import DemoControls
from monitor.harness.local_swarm import ServerSpec
from monitor.app.service import Service
from monitor.settings import Settings
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import MALICIOUS_NAME

STATE_TIMEOUT_MS = 90_000  # a state change needs a reachability round + a scrape (2 s each) and a refresh (1 s)


@pytest.fixture
def service(make_swarm, tmp_path):
    """Two full servers (so the model is healthy: every block twice), one announcing HTML as its name;
    the service polls every 2 s and the pages refresh every second."""
    swarm = make_swarm([
        ServerSpec("alpha", 0, TINY_NUM_BLOCKS, throughput=100.0, public_name="alpha"),
        ServerSpec("beta", 0, TINY_NUM_BLOCKS, throughput=100.0, public_name=MALICIOUS_NAME),
    ])
    settings = Settings(
        data_dir=tmp_path, initial_peers=swarm.initial_peers, discover_models=False,
        models=[{"dht_prefix": TINY_DHT_PREFIX, "num_blocks": TINY_NUM_BLOCKS, "name": "Tiny Llama"}],
        scrape_period=2, reachability_period=2, reachability_timeout=2, refresh_seconds=1,
    )
    svc = Service(settings, enable_chat=False, demo_controls=DemoControls(swarm)).start()
    try:
        port = svc.serve_in_thread("127.0.0.1", 0)
        yield svc, swarm, f"http://127.0.0.1:{port}"
    finally:
        svc.close()


def test_the_dashboard_follows_the_swarm_without_a_reload(service, browser, artifacts_dir):
    from playwright.sync_api import expect

    svc, swarm, base = service
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    dialogs, problems = [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)

    page.goto(base + "/")
    model_state = page.locator('tr[data-model="tiny-llama"] .badge').first
    expect(model_state).to_have_text("healthy", timeout=STATE_TIMEOUT_MS)
    expect(page.locator('tr[data-model="tiny-llama"] .chart.spark .main-svg').first).to_be_attached()
    page.evaluate("window.__not_reloaded = true")
    page.screenshot(path=str(artifacts_dir / "dashboard-overview.png"), full_page=True)

    # the model page: one row per server; the HTML public name is text, not an element
    page.goto(base + "/models/tiny-llama")
    beta = swarm.peer_id("beta")
    row = page.locator(f'tr[data-peer-id="{beta}"]')
    expect(row).to_contain_text(MALICIOUS_NAME)
    expect(row.locator(".badge").first).to_have_text("online")
    assert page.locator("main img").count() == 0
    expect(page.locator("#model-live .chart .main-svg").first).to_be_attached()
    page.screenshot(path=str(artifacts_dir / "dashboard-model.png"), full_page=True)

    page.goto(base + f"/peers/{beta}")
    expect(page.locator("h1")).to_have_text(MALICIOUS_NAME)
    expect(page.locator("#peer-live")).to_contain_text("What it announces now")
    page.screenshot(path=str(artifacts_dir / "dashboard-peer.png"), full_page=True)

    # an anonymous visitor sees no operator controls; an operator logs in with the token and pins
    assert page.locator("#peer-policy button").count() == 0
    page.locator("#peer-policy a", has_text="log in").click()
    page.locator("#token").fill((svc.settings.data_dir / "admin_token").read_text().strip())
    page.locator("form.login-form button[type=submit]").click()
    expect(page.locator("h1")).to_have_text(MALICIOUS_NAME)  # back on the peer's page
    page.locator("#peer-policy button", has_text="Pin").click()  # an htmx POST with the CSRF header
    expect(page.locator("#peer-policy")).to_contain_text("Pinned")
    assert svc.store.peer_policies() == {beta: "pinned"}
    page.locator("#peer-policy button", has_text="Clear").click()
    expect(page.locator("#peer-policy")).to_contain_text("Routed by health score")
    assert svc.store.peer_policies() == {}

    # refreshes keep the reader's place: an opened row stays open, the scroll position stays
    page.goto(base + "/models/tiny-llama")
    page.evaluate("window.__not_reloaded = true")
    pings = page.locator(f'tr[data-peer-id="{beta}"] details')
    expect(pings).to_be_attached(timeout=STATE_TIMEOUT_MS)  # once beta announces its pings
    pings.locator("summary").click()
    page.evaluate("window.scrollTo(0, 400)")
    page.evaluate("document.body.addEventListener('htmx:afterSwap', () => { window.__swaps = (window.__swaps || 0) + 1 })")
    for _ in range(150):  # (wait_for_function evaluates strings: our CSP forbids that, rightly)
        if page.evaluate("window.__swaps || 0") >= 3:
            break
        page.wait_for_timeout(200)
    assert page.evaluate("window.__swaps || 0") >= 3, "the model page did not refresh itself"
    assert page.locator(f'tr[data-peer-id="{beta}"] details').get_attribute("open") is not None
    assert page.evaluate("window.scrollY") == 400

    # kill a server: the still-open model page shows it unreachable and the model degraded
    swarm.kill("alpha")
    alpha_row = page.locator(f'tr[data-peer-id="{swarm.peer_id("alpha")}"]')
    expect(page.locator("#state-h .badge")).to_have_text("degraded", timeout=STATE_TIMEOUT_MS)
    expect(alpha_row).to_have_attribute("data-state", re.compile("unreachable|offline"))
    assert page.evaluate("window.__not_reloaded") is True

    # stop the last server from the overview's demo panel: the model is broken, still no reload
    page.goto(base + "/")
    page.evaluate("window.__not_reloaded = true")
    page.locator('tr[data-demo-server="beta"] button', has_text="Stop").click()
    expect(model_state).to_have_text("broken", timeout=STATE_TIMEOUT_MS)
    expect(page.locator('tr[data-model="tiny-llama"]')).to_contain_text("no serving server")
    expect(page.locator('tr[data-demo-server="beta"]')).to_contain_text("stopped", timeout=STATE_TIMEOUT_MS)
    assert page.evaluate("window.__not_reloaded") is True
    page.screenshot(path=str(artifacts_dir / "dashboard-overview-broken.png"), full_page=True)

    assert dialogs == [], f"a peer-announced string ran as script: {dialogs}"
    assert problems == [], problems
