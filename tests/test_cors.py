"""Spec: other sites may read us, never act for our operators (README: API, Security).

Read-only JSON APIs, badges, the Atom feed and /metrics answer any origin, without credentials; the
chat APIs the origins an operator lists (``chat_cors_origins``, default any); answers to operators'
changes carry no CORS header at all. Checked with a real browser: Chromium opens a page on another
origin (another loopback port) whose script fetches from the monitor, as a status widget or an
in-browser chat client would. (The headers themselves, without a browser: ``test_web_security.py``.)
"""

from __future__ import annotations

import time

import pytest
from werkzeug.wrappers import Response

from chat.engine import ChatEngine
from chat.http import create_blueprint
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from monitor.store import Store
from monitor.web import auth, create_app
from support import PEERS, TINY, populate, serve, web_settings


def other_site(environ, start_response):
    """Another origin: a page with nothing of ours on it."""
    return Response("<!doctype html><title>another site</title><p>a status widget</p>", mimetype="text/html")(
        environ, start_response)


FETCH = """async ([url, options]) => {
  try { const r = await fetch(url, options || {}); return {ok: true, status: r.status, body: await r.text()}; }
  catch (e) { return {ok: false, error: String(e)}; }
}"""


@pytest.fixture
def two_origins(tmp_path, tiny_model):
    """The monitor (with the chat's blueprint, the chat APIs open to one listed origin) and two
    other sites, each on its own loopback port: three origins."""
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    with serve(other_site) as listed, serve(other_site) as unlisted:
        settings = web_settings(data_dir=tmp_path, chat_cors_origins=[listed])
        populate(store, settings, time.time())
        engine = ChatEngine(None, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                            assessment_check=lambda model: (False, "no server announces it in this spec"))
        app = create_app(settings, store, chat_blueprints=[create_blueprint(engine)])
        with serve(app) as monitor:
            yield monitor, listed, unlisted, store, auth.resolve_token(settings, create=False)
        engine.close()
    store.close()


def test_a_page_on_another_origin_reads_the_state_in_chromium_but_cannot_act(two_origins, browser):
    monitor, listed, unlisted, store, token = two_origins
    page = browser.new_page()
    page.goto(unlisted + "/")
    state = page.evaluate(FETCH, [monitor + "/api/v1/state"])
    assert state["ok"] and state["status"] == 200, state
    assert '"model_reports"' in state["body"] and TINY.dht_prefix in state["body"]
    badge = page.evaluate(FETCH, [f"{monitor}/badges/peers/{PEERS['first']}/state.json"])
    assert badge["ok"] and '"online"' in badge["body"]
    assert page.evaluate(FETCH, [monitor + "/status/feed.atom"])["ok"]
    # what the browser refuses: a read with the visitor's cookies, a page, an operator's change
    assert not page.evaluate(FETCH, [monitor + "/api/v1/state", {"credentials": "include"}])["ok"]
    assert not page.evaluate(FETCH, [monitor + "/status"])["ok"]
    before = store.notes(resolved_since=0)
    with_token = page.evaluate(FETCH, [monitor + "/api/v1/notes", {
        "method": "POST", "headers": {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        "body": '{"scope": "swarm", "text": "posted by another site with a stolen token"}'}])
    assert not with_token["ok"], with_token  # the preflight allows no POST: the request is never sent
    simple = page.evaluate(FETCH, [monitor + "/api/v1/notes", {
        "method": "POST", "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        "body": "scope=swarm&text=anonymous"}])
    assert not simple["ok"]  # sent (no preflight for a form), refused (401), and unreadable
    assert store.notes(resolved_since=0) == before
    # the chat APIs: the listed origin may call them, another may not
    assert not page.evaluate(FETCH, [monitor + "/v1/models"])["ok"]
    page.goto(listed + "/")
    models = page.evaluate(FETCH, [monitor + "/v1/models"])
    assert models["ok"] and TINY_DHT_PREFIX in models["body"], models
    answer = page.evaluate(FETCH, [monitor + "/v1/completions", {
        "method": "POST", "headers": {"Content-Type": "application/json", "Authorization": "Bearer sk-anything"},
        "body": f'{{"model": "{TINY_DHT_PREFIX}", "prompt": "hi", "max_tokens": 2}}'}])
    assert answer["ok"] and answer["status"] == 503 and "not fully served" in answer["body"]  # readable, in full
    page.close()


