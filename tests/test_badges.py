"""Spec: badges (README: Dashboard, Badges) — a model's and a server's state and uptime as SVG and as
shields.io's endpoint JSON, readable without login from any origin, cacheable, an unknown model or
peer a grey "unknown" badge; the peer page and "is my server OK?" give the Markdown to paste (the
image it points to, drawn by Chromium: ``test_pages_in_chromium.py``).
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET

from monitor.core.maintenance import MaintenanceWindow
from support import PEERS, TINY

SVG = "{http://www.w3.org/2000/svg}"
GREEN, AMBER, RED, GREY, BLUE = "1f7a3f", "9a6700", "b3362a", "5f6b7a", "2f6fcb"


def svg_badge(response) -> tuple[str, list[str], str]:
    """(title, texts, message colour) of a badge, parsed as SVG (fails on anything else)."""
    assert response.status_code == 200 and response.mimetype == "image/svg+xml", response.status_code
    root = ET.fromstring(response.data)
    assert root.tag == f"{SVG}svg" and root.get("role") == "img" and int(root.get("width")) > 40
    texts = [t.text for t in root.iter(f"{SVG}text")]
    rects = [r.get("fill") for r in root.iter(f"{SVG}rect")]
    return root.findtext(f"{SVG}title"), texts, rects[2].lstrip("#")


def shields(response) -> dict:
    assert response.status_code == 200 and response.mimetype == "application/json"
    body = json.loads(response.data)
    assert set(body) == {"schemaVersion", "label", "message", "color"} and body["schemaVersion"] == 1
    assert re.fullmatch(r"[0-9a-f]{6}", body["color"]) and all(isinstance(body[k], str) for k in ("label", "message"))
    return body


def test_state_badges_of_a_model_and_its_servers_as_svg_and_shields_json(client):
    title, texts, colour = svg_badge(client.get(f"/badges/models/{TINY.dht_prefix}/state.svg"))
    assert (title, texts, colour) == ("Tiny Llama: healthy", ["Tiny Llama", "healthy"], GREEN)
    assert shields(client.get(f"/badges/models/{TINY.dht_prefix}/state.json")) == {
        "schemaVersion": 1, "label": "Tiny Llama", "message": "healthy", "color": GREEN}
    for name, state, colour in [("first", "online", GREEN), ("joining", "joining", AMBER),
                                ("unreachable", "unreachable", RED)]:
        title, texts, found = svg_badge(client.get(f"/badges/peers/{PEERS[name]}/state.svg"))
        assert texts[1] == state and found == colour, (name, texts)
        assert shields(client.get(f"/badges/peers/{PEERS[name]}/state.json"))["message"] == state
    # the announced public name is the label, escaped (it is the peer's text)
    title, texts, _ = svg_badge(client.get(f"/badges/peers/{PEERS['joining']}/state.svg"))
    assert texts[0] == "<img src=x onerror=alert(1)>" and b"<img" not in client.get(
        f"/badges/peers/{PEERS['joining']}/state.svg").data


def test_uptime_badges_over_24h_7d_and_30d(client, populated):
    for window in ("24h", "7d", "30d"):
        title, texts, colour = svg_badge(client.get(f"/badges/peers/{PEERS['first']}/uptime/{window}.svg"))
        assert texts == [f"uptime {window}", "100%"] and colour == GREEN  # online at every poll since it appeared
        body = shields(client.get(f"/badges/models/{TINY.dht_prefix}/uptime/{window}.json"))
        assert body["label"] == f"uptime {window}" and re.fullmatch(r"\d+(\.\d\d)?%", body["message"]), body
        assert 0 < float(body["message"].rstrip("%")) < 100  # broken at the first poll, healthy since
        assert body["color"] == RED
    title, texts, colour = svg_badge(client.get(f"/badges/peers/{PEERS['joining']}/uptime/7d.svg"))
    assert texts[1] == "0%" and colour == RED  # JOINING at the one poll that saw it: never ONLINE yet


def test_unknown_models_peers_and_windows_get_a_grey_unknown_badge_not_an_error(client):
    for path in ["/badges/models/no-such-model/state.svg", f"/badges/models/{'x' * 300}/state.svg",
                 f"/badges/peers/{'Qm' + '1' * 44}/state.svg", "/badges/peers/not-a-peer-id/state.svg",
                 f"/badges/peers/{PEERS['first']}/uptime/1y.svg", "/badges/models/a%3Cb/uptime/7d.svg",
                 "/badges/peers/%3Cscript%3E/uptime/7d.svg"]:
        title, texts, colour = svg_badge(client.get(path))
        assert texts[1] == "unknown" and colour == GREY, path
        assert "<script" not in client.get(path).get_data(as_text=True)
    assert shields(client.get("/badges/models/nope/state.json"))["message"] == "unknown"
    assert client.get(f"/badges/models/{TINY.dht_prefix}/state.gif").status_code == 404


def test_badges_are_cacheable_and_readable_by_any_origin_without_login(client):
    path = f"/badges/peers/{PEERS['first']}/state.svg"
    first = client.get(path, headers={"Origin": "https://github.com"})
    assert first.headers["Cache-Control"] == "public, max-age=60" and first.headers["ETag"]
    assert first.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in first.headers
    again = client.get(path, headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""
    other = client.get(f"/badges/peers/{PEERS['second']}/state.svg", headers={"If-None-Match": first.headers["ETag"]})
    assert other.status_code == 200
    # ?label= replaces the left-hand text, as shields' own does (printable, short)
    assert svg_badge(client.get(path + "?label=my%20server"))[1][0] == "my server"
    assert svg_badge(client.get(path + "?label=" + "a" * 200))[1][0] == "a" * 40


def test_a_maintenance_window_shows_on_the_badges(populated):
    app, store, settings, now = populated
    store.create_maintenance_window(MaintenanceWindow(
        id=0, scope="peer", target=PEERS["second"], starts_at=time.time() - 60, ends_at=time.time() + 3600,
        reason="upgrading petals", created_at=time.time(), created_by="spec"), via="api token")
    client = app.test_client()
    assert svg_badge(client.get(f"/badges/peers/{PEERS['second']}/state.svg"))[1:] == (
        ["second-half", "maintenance"], BLUE)
    assert svg_badge(client.get(f"/badges/peers/{PEERS['first']}/state.svg"))[1][1] == "online"


def test_the_peer_page_and_my_server_report_give_the_markdown_to_paste(client):
    """The Markdown of a README badge; the image it points to renders in Chromium (``test_pages_in_chromium.py``)."""
    page = client.get(f"/peers/{PEERS['first']}").get_data(as_text=True)
    markdown = re.findall(r"\[!\[petals server status\]\((http://[^)]+)\)\]\((http://[^)]+)\)", page)
    assert markdown == [(f"http://localhost/badges/peers/{PEERS['first']}/state.svg",
                         f"http://localhost/peers/{PEERS['first']}")]
    assert "img.shields.io/endpoint?url=http%3A%2F%2Flocalhost%2Fbadges%2Fpeers%2F" in page
    report = client.get(f"/peers/{PEERS['first']}", headers={"HX-Request": "true", "HX-Target": "my-server"})
    assert "petals server status" in report.get_data(as_text=True)
