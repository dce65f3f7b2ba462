"""Specs of the dashboard pages (Flask test client) on a store populated through its own write path.

``populate`` (tests/support.py) writes three polls an hour apart (the model broken, then healthy),
reachability checks, chat outcomes and scores exactly as the poller does (``Poller.analyse`` /
``Poller.refresh_scores``, which run ``coverage.diagnose`` and ``scores.score_all``); the API,
metrics and gunicorn specs read it too, each spec its own copy of a store populated once for the
session (conftest's ``populated``). The overview while PostgreSQL is away: ``test_web_gunicorn.py``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from monitor.app import assessing
from monitor.app.jobs import Poller
from monitor.core.scores import PeerScore
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
from monitor.store import Store
from monitor.web import create_app
from support import BOOTSTRAP_ADDR, OTHER, PEERS, TINY, elements, figures, peer, poll_rows, text_of, web_settings

ROOT = Path(__file__).resolve().parent.parent

# ---- pages -----------------------------------------------------------------------------------


def test_overview_lists_each_model_with_its_state_reasons_and_numbers(client):
    response = client.get("/")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    text = text_of(html)
    assert "Tiny Llama" in html and 'href="/models/tiny-llama"' in html
    assert 'href="/models/other-model"' in html
    # the tiny model is served twice everywhere by reachable servers; the other model misses blocks
    tiny_row = html[html.index('data-model="tiny-llama"'):html.index('data-model="other-model"')]
    assert "healthy" in tiny_row and "100%" in tiny_row
    other_row = html[html.index('data-model="other-model"'):]
    assert "broken" in other_row and "blocks 2:4 have no serving server" in other_row
    # servers announced / online, poll time and duration
    assert "Last poll" in text and "Poll took" in text and "3.2 s" in text
    # a 24 h coverage sparkline per model, as figure JSON for charts.js
    assert html.count('class="chart spark"') == 2


def test_overview_says_whether_a_models_estimated_speed_is_measured_or_announced(populated):
    from monitor.core.probes import ServerProbe

    app, store, settings, now = populated
    client = app.test_client()

    def speed_cell() -> str:
        html = client.get("/").get_data(as_text=True)
        row = html[html.index('data-model="tiny-llama"'):html.index('data-model="other-model"')]
        return row[row.index('data-label="Est. tokens/s"'):row.index('data-label="Coverage, 24 h"')]

    def tiny_report() -> dict:
        return next(m for m in client.get("/api/v1/models").get_json()["models"] if m["dht_prefix"] == TINY.dht_prefix)

    assert 'data-speed-source="announced"' in speed_cell() and "as announced, not measured" in speed_cell()
    assert tiny_report()["speed_source"] == "announced"

    # the speed probes measure every reachable server of the model; the poller diagnoses again
    store.record_server_probes([
        ServerProbe(PEERS[name], TINY.dht_prefix, start, end, at=time.time() - 10, ok=True, seconds_per_token=0.02,
                    rtt=0.004, duration=0.2)
        for name, start, end in (("first", 0, 4), ("second", 4, 8), ("full", 0, 8))])
    assert Poller(settings, store, dht=None).assess_latest()
    cell = speed_cell()
    assert 'data-speed-source="measured"' in cell and "measured" in text_of(cell) and "announced" not in cell
    assert tiny_report()["speed_source"] == "measured" and tiny_report()["est_tokens_per_s"] > 0
    other = client.get("/").get_data(as_text=True)
    other = other[other.index('data-model="other-model"'):]
    assert 'data-speed-source=""' in other  # broken: no route, no estimate to qualify


def test_overview_shows_bootstrap_peers_top_contributors_and_reachability_issues(client):
    html = client.get("/").get_data(as_text=True)
    boot = html[html.index('id="boot-h"'):html.index('id="top-h"')]
    assert "online" in boot and PEERS["bootstrap"][-6:] in boot
    top = html[html.index('id="top-h"'):html.index('id="reach-h"')]
    # blocks served online: full 8, first-half 4, second-half 4; the unreachable and joining ones do not count
    assert top.index("example.org/full") < top.index("first-half")
    assert "8 blocks" in top and "4 blocks" in top and "javascript" not in top
    reach = html[html.index('id="reach-h"'):]
    assert "Failed to connect in 5 sec" in reach and f'/peers/{PEERS["unreachable"]}' in reach
    assert "protocol not supported" not in reach  # a JOINING peer is loading, not unreachable


def test_an_htmx_refresh_gets_only_the_partial_its_target_names(client):
    full = client.get("/")
    partial = client.get("/", headers={"HX-Request": "true", "HX-Target": "overview-live"})
    assert partial.status_code == 200
    body = partial.get_data(as_text=True)
    assert "<html" not in body and "<header" not in body and 'id="overview-live"' not in body
    assert 'data-model="tiny-llama"' in body
    assert "HX-Request" in partial.headers.get("Vary", "")
    # the full page polls itself at settings.refresh_seconds (7 s here)
    assert 'hx-trigger="every 7s"' in full.get_data(as_text=True)


def test_model_page_draws_one_span_row_per_server_with_its_state_in_words(client):
    response = client.get("/models/tiny-llama")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    states = dict(re.findall(r'data-peer-id="([^"]+)" data-state="([^"]+)"', html))
    assert states == {PEERS["first"]: "online", PEERS["second"]: "online", PEERS["full"]: "online",
                      PEERS["joining"]: "joining", PEERS["unreachable"]: "unreachable"}
    # each bar spans the server's blocks over the model's 8 blocks
    assert '<rect class="seg joining" x="2" y="0" width="4" height="1">' in html
    assert '<rect class="seg unreachable" x="0" y="0" width="8" height="1">' in html
    text = text_of(html)
    for expected in ("bf16", "f16 (nf4)", "relay", "direct", "2.3.0.dev0", "guanaco-7b", "2048", "4096"):
        assert expected in text, expected
    assert "--block_indices" in html  # where a new server helps most
    assert "State changes, last 7 days" in text and "first poll" in text


def test_model_page_has_redundancy_chart_and_24h_and_7d_heatmaps(client):
    html = client.get("/models/tiny-llama").get_data(as_text=True)
    shipped = figures(html)
    assert len(shipped) == 3  # redundancy + two heatmaps
    assert [[t["type"] for t in f["data"]][:1] for f in shipped] == [["bar"], ["heatmap"], ["heatmap"]]
    heat = client.get("/models/tiny-llama", headers={"HX-Request": "true", "HX-Target": "model-heatmaps"})
    assert "Last 7 days" in heat.get_data(as_text=True) and "<html" not in heat.get_data(as_text=True)


def test_peer_page_shows_what_it_announces_its_score_and_history(client):
    response = client.get(f"/peers/{PEERS['full']}")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    text = text_of(html)
    for expected in ("What it announces now", "65536 tokens", "2.3.0.dev0", "artek0chumak/guanaco-7b",
                     "direct", "How the score is computed", "uptime", "Latest chat requests"):
        assert expected in text, expected
    assert re.search(r"Score: \d+ / 100", text)
    assert len(figures(html)) == 4  # state, throughput, reachability, chats


def test_a_peer_gone_from_the_latest_poll_still_has_a_page_and_unknown_ones_404(client):
    assert client.get(f"/peers/{peer('never-seen')}").status_code == 404
    assert client.get("/peers/not-a-peer-id!").status_code in (400, 404)
    assert client.get("/models/no-such-model").status_code == 404
    assert client.get(f"/peers/{PEERS['full']}?hours=5").status_code == 400
    for hostile in ("nan", "inf", "-24", "1e999", "24" * 5000):  # only the offered windows: nothing else is cached
        assert client.get(f"/peers/{PEERS['full']}", query_string={"hours": hostile}).status_code == 400


# ---- security --------------------------------------------------------------------------------


def test_peer_announced_strings_are_escaped_and_only_http_names_become_links(client):
    for url in ("/", "/models/tiny-llama", f"/peers/{PEERS['joining']}", f"/peers/{PEERS['unreachable']}"):
        html = client.get(url).get_data(as_text=True)
        tags = elements(html).tags
        assert not any(tag == "img" for tag, _ in tags), url
        assert not any(name.startswith("on") for _, attrs in tags for name in attrs), url
        assert not any((attrs.get("href") or "").lower().startswith("javascript:") for _, attrs in tags), url
    model_html = client.get("/models/tiny-llama").get_data(as_text=True)
    assert "&lt;img src=x onerror=alert(1)&gt;" in model_html
    links = [attrs for tag, attrs in elements(model_html).tags if tag == "a" and attrs.get("href") == "https://example.org/full"]
    assert links and all(a["rel"] == "nofollow noopener noreferrer" for a in links)
    assert "javascript:alert(1)" in model_html  # shown as text, not linked


def test_every_page_sends_a_csp_without_inline_scripts_and_has_none(client):
    for url in ("/", "/models/tiny-llama", f"/peers/{PEERS['full']}", "/no-such-page"):
        response = client.get(url)
        csp = response.headers["Content-Security-Policy"]
        script_src = next(part for part in csp.split(";") if part.strip().startswith("script-src"))
        assert script_src.split() == ["script-src", "'self'"]
        for attrs, text in elements(response.get_data(as_text=True)).scripts:
            assert attrs.get("src", "").startswith("/static/"), attrs  # charts' figures are attributes
            assert not ("src" in attrs and text.strip())


def test_htmx_plotly_and_swagger_ui_are_served_from_their_vendored_files_at_the_locked_versions(client):
    """static/vendor/vendor.json (scripts/vendor_assets.py) locks each package's version; the pages
    point at those files with the version in the address, and each file is what the lock says."""
    lock = json.loads((ROOT / "static" / "vendor" / "vendor.json").read_text())
    page = client.get("/").get_data(as_text=True)
    htmx = f"/static/vendor/htmx.org/htmx.min.js?v={lock['htmx.org']['version']}"
    assert htmx in page
    answer = client.get(htmx)
    assert answer.status_code == 200 and f'version:"{lock["htmx.org"]["version"]}"' in answer.get_data(as_text=True)
    plotly = f"/static/vendor/plotly.js-cartesian-dist-min/plotly-cartesian.min.js?v=" \
             f"{lock['plotly.js-cartesian-dist-min']['version']}"
    assert plotly in page
    head = client.get(plotly).data[:300].decode()
    assert f"plotly.js (cartesian - minified) v{lock['plotly.js-cartesian-dist-min']['version']}" in head
    for package, entry in lock.items():  # each with its licence
        assert "LICENSE" in entry["files"].values()
        assert client.get(f"/static/vendor/{package}/LICENSE").status_code == 200
    assert client.get("/static/app.css").status_code == 200
    assert client.get("/static/charts.js").status_code == 200


# ---- demo panel ------------------------------------------------------------------------------


class RecordingControls:
    """Demo controls over a dict (the real ones drive LocalSwarm; test_browser uses those)."""

    def __init__(self):
        self.state = {"server-1": {"running": True, "throttled": False}}
        self.calls = []

    def servers(self):
        return [{"name": n, "blocks": "0:8", "peer_id": PEERS["full"], **s} for n, s in self.state.items()]

    def _get(self, name):
        if name not in self.state:
            raise KeyError(f"no demo server named {name!r}")
        return self.state[name]

    def stop(self, name):
        self.calls.append(("stop", name))
        self._get(name)["running"] = False

    def start(self, name):
        self.calls.append(("start", name))
        self._get(name)["running"] = True

    def throttle(self, name):
        self._get(name)["throttled"] = True

    def unthrottle(self, name):
        self._get(name)["throttled"] = False


def operator(settings) -> dict:
    """What a script sends to act as operator (the token the app generated into the data dir)."""
    return {"Authorization": f"Bearer {(settings.data_dir / 'admin_token').read_text().strip()}"}


def test_demo_panel_acts_only_for_operators(populated):
    _, store, settings, _ = populated
    controls = RecordingControls()
    client = create_app(settings, store, demo_controls=controls).test_client()
    page = client.get("/").get_data(as_text=True)
    assert "Demo swarm" in page and "Log in as operator" in page and 'hx-post="/demo/' not in page
    assert client.get("/demo/servers/server-1/stop").status_code == 405
    assert client.post("/demo/servers/server-1/stop", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post("/demo/servers/server-1/stop", headers={"Origin": "http://localhost"}).status_code == 403
    assert client.post("/demo/servers/server-1/stop").status_code == 403  # no CSRF token, no bearer token
    assert controls.calls == []
    ok = client.post("/demo/servers/server-1/stop", headers={**operator(settings), "HX-Request": "true"})
    assert ok.status_code == 200 and controls.calls == [("stop", "server-1")]
    assert "Start" in ok.get_data(as_text=True)
    missing = client.post("/demo/servers/nope/stop", headers=operator(settings))
    assert missing.status_code == 404 and "no demo server named" in missing.get_data(as_text=True)
    assert "Demo swarm" not in create_app(settings, store).test_client().get("/").get_data(as_text=True)


def test_pages_say_when_no_poll_has_happened_yet(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'empty.db'}")
    store.migrate()
    client = create_app(web_settings(), store).test_client()
    assert "Waiting for the first poll" in client.get("/").get_data(as_text=True)
    assert client.get("/models/tiny-llama").status_code == 404
    store.close()


def test_an_operator_pins_blocks_and_clears_a_peer_for_the_chat_from_its_page(populated):
    app, store, _, _ = populated
    client = app.test_client()
    peer = PEERS["full"]
    same_origin = {**operator(app.extensions["swarm_monitor"].settings), "HX-Request": "true"}

    response = client.post(f"/peers/{peer}/policy", data={"policy": "blocked"}, headers=same_origin)
    assert response.status_code == 200 and "Blocked" in response.get_data(as_text=True)
    assert store.peer_policies() == {peer: "blocked"}
    assert "Blocked" in text_of(client.get(f"/peers/{peer}").get_data(as_text=True))

    client.post(f"/peers/{peer}/policy", data={"policy": "pinned"}, headers=same_origin)
    assert store.peer_policies() == {peer: "pinned"}
    client.post(f"/peers/{peer}/policy", data={"policy": ""}, headers=same_origin)
    assert store.peer_policies() == {}

    assert client.post(f"/peers/{peer}/policy", data={"policy": "blocked"},
                       headers={"Origin": "http://evil.example"}).status_code in (401, 403)
    assert client.post(f"/peers/{peer}/policy", data={"policy": "banished"}, headers=same_origin).status_code == 400
    assert client.post("/peers/not-a-peer!/policy", data={"policy": "blocked"}, headers=same_origin).status_code == 400
    assert store.peer_policies() == {}


def test_pages_reuse_what_they_read_until_a_poll_a_reachability_round_or_a_score_refresh_lands(populated):
    app, store, settings, now = populated
    client = app.test_client()

    def first_row() -> dict:
        state = client.get("/api/v1/state").get_json()
        tiny = next(r for r in state["model_reports"] if r["dht_prefix"] == TINY.dht_prefix)
        return next(row for row in tiny["server_rows"] if row["peer_id"] == PEERS["first"])

    before = first_row()
    assert before["state"] == "online" and before["span"]["server_info"]["throughput"] == 50.0
    assert first_row() == before  # nothing changed: the same state

    store.record_reachability(ReachabilityBatch(taken_at=now, duration=0.1, results=(
        ReachabilityResult(PEERS["first"], "server", False, error="Failed to connect in 5 sec"),)))
    assessing.assess_latest(store, settings, None)  # as the poller's assess step does after every round
    assert first_row()["state"] == "unreachable"

    rows = [replace(row, throughput=77.0) if row.peer_id == PEERS["first"] else row for row in poll_rows(2)]
    snapshot = Snapshot(taken_at=now + 1, duration=1.0, models=(TINY, OTHER), servers=tuple(rows))
    store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    assert first_row()["span"]["server_info"]["throughput"] == 77.0

    store.record_scores([PeerScore(PEERS["first"], 12.5, {}, ("a test",), at=now + 2)])
    assert first_row()["score"] == 12.5


WEB_WORKER = """
import json, sys
from monitor.settings import Settings
from monitor.store import Store
from monitor.web import create_app
client = create_app(Settings(**json.loads(sys.argv[2])), Store(sys.argv[1])).test_client()
statuses = {url: client.get(url).status_code for url in sys.argv[3:]}
heavy = sorted(name for name in ("torch", "petals", "hivemind", "transformers") if name in sys.modules)
print(json.dumps({"statuses": statuses, "imported": heavy}))
"""


@pytest.mark.parametrize("initial_peers", [[BOOTSTRAP_ADDR], ["public"]], ids=["multiaddr", "public"])
def test_a_web_worker_serves_every_page_without_importing_petals_or_torch(populated, tmp_path, initial_peers):
    """The poller stores each diagnosis, so a web worker stays a small process (no torch) — also
    when it watches the public swarm, whose bootstrap peers petals' constants name."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    urls = ["/", f"/models/{TINY.dht_prefix}", f"/peers/{PEERS['full']}", "/api/v1/state", "/metrics",
            f"/api/v1/models/{TINY.dht_prefix}", f"/api/v1/peers/{PEERS['full']}/history"]
    settings = {"initial_peers": initial_peers, "models": [{"dht_prefix": TINY.dht_prefix, "num_blocks": 8}]}
    done = subprocess.run([sys.executable, "-c", WEB_WORKER, f"sqlite:///{tmp_path / 'monitor.db'}",
                           json.dumps(settings), *urls],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["statuses"] == {url: 200 for url in urls}
    assert result["imported"] == []
