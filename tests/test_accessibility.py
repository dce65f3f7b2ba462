"""Spec: every page passes axe-core with no serious or critical violation (README: Dashboard).

axe-core (Deque's engine, shipped by axe-playwright-python) runs in Chromium on every page of the
dashboard — overview, model pages, peer pages (one with an HTML public name), alerts, status,
search (results, and an id never seen), login, the chat page and an error page — in the light and
the dark scheme, as a visitor and as a logged-in operator (whose pages carry forms), with an
incident note, a maintenance window and a silence in force so that everything they add is drawn.
Contrast, links told apart from text, landmarks, names of controls and charts' text alternatives
are among its rules.
"""

from __future__ import annotations

import time

import pytest
from axe_playwright_python.sync_playwright import Axe

from chat.conversations import ConversationStore
from chat.engine import ChatEngine
from chat.http import create_blueprint
from monitor.core.maintenance import MaintenanceWindow
from monitor.core.muting import Silence, parse_matcher
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from monitor.web import auth, create_app
from support import PEERS, TINY, serve

BLOCKING = ("serious", "critical")
VISITOR_PAGES = [
    "/", f"/models/{TINY.dht_prefix}", "/models/other-model", f"/peers/{PEERS['first']}",
    f"/peers/{PEERS['joining']}", f"/peers/{PEERS['unreachable']}?hours=168", "/alerts", "/status",
    "/search?q=first", f"/search?q={'Qm' + 'a' * 44}", "/login", "/chat", "/no-such-page", "/contributors?window=all",
]
OPERATOR_PAGES = ["/", f"/peers/{PEERS['first']}", "/alerts", "/status", "/login"]


@pytest.fixture
def site(populated, tiny_model):
    """The populated store behind the whole app, the chat's page included (its engine needs no
    swarm to draw the page), with a note, a maintenance window and a silence in force."""
    _, store, settings, now = populated
    store.post_note("model", TINY.dht_prefix, "server-7 is being upgraded, back at 14:00 UTC", author="ops",
                    via="api token")
    store.create_maintenance_window(MaintenanceWindow(
        id=0, scope="peer", target=PEERS["second"], starts_at=time.time() - 60, ends_at=time.time() + 3600,
        reason="upgrading petals", created_at=time.time(), created_by="ops"), via="api token")
    store.create_silence(Silence(id=0, matchers=(parse_matcher(f"peer={PEERS['first']}"),),
                                 starts_at=time.time() - 60, ends_at=time.time() + 600, created_by="ops",
                                 comment="restarting first-half", created_at=time.time()), via="api token")
    engine = ChatEngine(None, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        assessment_check=lambda model: (False, "no server announces it in this spec"))
    app = create_app(settings, store, chat_blueprints=[create_blueprint(engine, conversations=ConversationStore(store))])
    with serve(app) as base:
        yield base, auth.resolve_token(settings, create=False)
    engine.close()


def violations(page) -> list[str]:
    """axe's serious and critical violations on the page, one line per rule with where."""
    found = Axe().run(page).response["violations"]
    return [f"{v['impact']} {v['id']} ({len(v['nodes'])}): {v['help']} — at {[n['target'] for n in v['nodes'][:5]]}: "
            f"{v['nodes'][0]['failureSummary'][:300]}" for v in found if v["impact"] in BLOCKING]


SCHEMES = ("light", "dark")
DRAWN = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"  # (the charts too)


def test_every_page_passes_axe_core_in_light_and_dark_for_visitors_and_operators(site, browser):
    """Each page is loaded once and checked in both schemes: the second is switched to on the loaded
    page, as a visitor's system does at dusk (the stylesheet follows, and the charts redraw)."""
    base, token = site
    context = browser.new_context(color_scheme=SCHEMES[0], viewport={"width": 1280, "height": 900})
    page = context.new_page()
    found = {}
    for role, paths in (("visitor", VISITOR_PAGES), ("operator", OPERATOR_PAGES)):
        if role == "operator":
            page.goto(f"{base}/login?token={token}")
        for path in paths:
            page.emulate_media(color_scheme=SCHEMES[0])
            response = page.goto(base + path)  # until "load": every page is drawn on the server (no partial
            assert response.status == (404 if path == "/no-such-page" else 200), path  # is fetched after)
            if role == "operator" and path == "/status":
                assert page.locator('form[action="/notes"]').count() == 1  # logged in: the forms are there
            for scheme in SCHEMES:
                if scheme != SCHEMES[0]:
                    page.emulate_media(color_scheme=scheme)
                page.evaluate(DRAWN)
                assert page.evaluate(f"matchMedia('(prefers-color-scheme: {scheme})').matches"), scheme
                problems = violations(page)
                if problems:
                    found[f"{role} {path} ({scheme})"] = problems
    context.close()
    assert not found, "\n".join(f"{where}:\n  " + "\n  ".join(lines) for where, lines in found.items())
