"""Pages as Chromium draws them (headless, from Debian, driven by Playwright; conftest's
``browser``), what no test client can judge: the image a badge's Markdown points to renders as a
README shows it; the status page's bars have the right colours and say each day on hover and on
keyboard focus; at 500 servers the overview and a model page stay a readable height. What the same
pages say, without a browser: ``test_badges.py``, ``test_status_page.py``, ``test_scale_readable.py``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from werkzeug.serving import make_server

from support import PEERS, STATUS_EXPECTED, TINY, day_start, serve

GREEN = "1f7a3f"  # the badges' green


# ---- badges ------------------------------------------------------------------------------------


def test_the_image_the_markdown_to_paste_points_to_renders_as_a_green_online_badge(populated, browser):
    """The peer page's Markdown (``test_badges.py``) points to this image: as a README would show it."""
    app = populated[0]
    with serve(app) as base:
        tab = browser.new_page()
        tab.set_content(f'<img id="b" src="{base}/badges/peers/{PEERS["first"]}/state.svg">')
        tab.wait_for_function("document.getElementById('b').complete")
        size = tab.evaluate("[document.getElementById('b').naturalWidth, document.getElementById('b').naturalHeight]")
        assert size[0] > 60 and size[1] == 20
        tab.goto(f"{base}/badges/peers/{PEERS['first']}/state.svg")
        assert tab.locator("text").nth(1).text_content() == "online"
        assert tab.locator(f'rect[fill="#{GREEN}"]').count() == 1  # the message's side, green
        tab.close()


# ---- the status page ---------------------------------------------------------------------------

# the page's colours (static/app.css, light scheme)
COLOURS = {"healthy": "rgb(46, 157, 87)", "degraded": "rgb(212, 154, 22)", "broken": "rgb(214, 69, 69)",
           "maintenance": "rgb(59, 111, 212)", "no data": "rgb(201, 206, 214)"}


def test_the_bars_render_in_chromium_with_the_right_colours_and_say_each_day_on_hover_and_focus(status_app, browser,
                                                                                                artifacts_dir):
    app, store, now = status_app
    with serve(app) as base:
        page = browser.new_page(color_scheme="light", viewport={"width": 1280, "height": 900})
        page.goto(base + "/status")
        bar = page.locator(f'section[data-model="{TINY.dht_prefix}"] ol.days')
        assert bar.locator("li.day").count() == 90
        for age, state in STATUS_EXPECTED.items():
            day = time.strftime("%Y-%m-%d", time.gmtime(day_start(now, age)))
            cell = bar.locator(f'li[data-day="{day}"]')
            assert cell.get_attribute("data-state") == state, day
            colour = cell.evaluate("el => getComputedStyle(el).backgroundColor")
            assert colour == COLOURS[state], (day, state, colour)
        # hover: the day's figures appear beside it
        broken = bar.locator(f'li[data-day="{time.strftime("%Y-%m-%d", time.gmtime(day_start(now, 7)))}"]')
        broken.hover()
        tip = broken.locator(".tip")
        assert tip.bounding_box()["width"] > 100
        assert "broken" in tip.inner_text() and "up" in tip.inner_text()
        held = bar.locator(f'li[data-day="{time.strftime("%Y-%m-%d", time.gmtime(day_start(now, 6)))}"] .tip')
        assert "maintenance 4 h (left out of uptime)" in held.text_content()
        # the keyboard reaches the days, and a focused day shows its figures too
        page.mouse.move(0, 0)
        for _ in range(60):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.classList.contains('day')"):
                break
        focused = page.locator("li.day:focus")
        assert focused.count() == 1 and focused.locator(".tip").bounding_box()["width"] > 100
        page.screenshot(path=str(artifacts_dir / "status-page.png"), full_page=True)
        # uptime figures, with the maintenance left out said so
        section = page.locator(f'section[data-model="{TINY.dht_prefix}"]')
        assert section.locator('[data-uptime="24h"] dd').inner_text().startswith("100%")
        assert "4 h maintenance left out" in section.locator('[data-uptime="30d"] dd').inner_text()
        page.close()


# ---- at scale ----------------------------------------------------------------------------------

MAX_OVERVIEW_PX = 3000  # 4 models, at 1280 px wide
MAX_STATE_BOX_PX = 900  # the model page's state panel


def test_the_overview_and_the_model_page_stay_a_readable_height(simulated_swarm, browser):
    app, models, _ = simulated_swarm
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


# ---- the vendored browser assets ---------------------------------------------------------------

LOCK = json.loads((Path(__file__).resolve().parent.parent / "static" / "vendor" / "vendor.json").read_text())


def test_every_chart_draws_and_htmx_swaps_with_the_vendored_htmx_and_plotly_cartesian_bundle(populated, browser):
    """The files ``static/vendor/vendor.json`` locks (scripts/vendor_assets.py) draw every chart of the
    overview, a model page (its coverage heatmap too) and a peer page, and htmx still swaps a page's
    live part and the charts in it are drawn again — with no error in the console."""
    app = populated[0]
    pages = {"/": 1, f"/models/{TINY.dht_prefix}": 3, f"/peers/{PEERS['full']}": 2}
    with serve(app) as base:
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        for path, at_least in pages.items():
            tab.goto(base + path)
            tab.wait_for_function("() => document.querySelectorAll('.chart').length > 0 && "
                                  "[...document.querySelectorAll('.chart')].every(c => c.querySelector('.main-svg'))")
            assert tab.locator(".chart").count() >= at_least, path
            assert tab.evaluate("window.Plotly.version") == LOCK["plotly.js-cartesian-dist-min"]["version"]
            assert tab.evaluate("window.htmx.version") == LOCK["htmx.org"]["version"]
            traces = tab.evaluate("[...document.querySelectorAll('.chart')].flatMap(c => c.data.map(t => t.type))")
            assert traces and set(traces) <= {"scatter", "bar", "heatmap"}, traces
            if path.startswith("/models/"):
                assert "heatmap" in traces
                assert tab.locator(".chart .heatmaplayer image").count() >= 1  # the heatmap is drawn, not skipped
        # the overview's live part, refreshed by htmx as its every-N-seconds trigger would, sooner
        tab.goto(base + "/")
        tab.wait_for_function("() => document.querySelector('#overview-live .chart .main-svg')")
        tab.evaluate("""() => { window.__swaps = 0;
            document.body.addEventListener('htmx:afterSwap', () => { window.__swaps += 1 });
            document.querySelector('#overview-live .chart').dataset.old = '1';
            const live = document.getElementById('overview-live');
            live.setAttribute('hx-trigger', 'every 1s'); htmx.process(live); }""")
        tab.wait_for_function("() => window.__swaps >= 1", timeout=15_000)
        tab.wait_for_function("() => document.querySelector('#overview-live .chart .main-svg')")
        assert tab.evaluate("document.querySelector('#overview-live .chart').dataset.old") is None  # new content
        assert errors == []
        tab.close()
