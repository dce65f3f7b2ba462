"""Spec: on a public address an anonymous client can change nothing, exhaust nothing for long, and
learn nothing about the internals. Operators log in with a token (README: Security). Other sites
may read us, never act for our operators: read-only JSON APIs, badges, the Atom feed and /metrics
answer any origin without credentials, operators' changes carry no CORS header (README: API)."""

from __future__ import annotations

import re
import stat
import time

import pytest

from monitor.settings import Settings
from monitor.store import Store
from monitor.web import create_app
from support import PEERS, TINY, populate, web_settings

PEER = "QmNjDTuCnSD1KaBrqJXc4JxyC2HmnDaSdXDJx1dcnRLtsE"


@pytest.fixture()
def service(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    settings = Settings(data_dir=tmp_path, reachability_rate_limit="3 per minute")
    app = create_app(settings, store)
    yield app, store, (tmp_path / "admin_token").read_text().strip()
    store.close()


def csrf_token(client) -> str:
    page = client.get("/login").get_data(as_text=True)
    return re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)


def pin(client, **kwargs):
    return client.post(f"/peers/{PEER}/policy", data={"policy": "pinned", **kwargs.pop("data", {})}, **kwargs)


def test_the_generated_operator_token_is_kept_for_its_owner_only(service, tmp_path):
    _, _, token = service
    mode = (tmp_path / "admin_token").stat().st_mode
    assert len(token) >= 32 and stat.S_IMODE(mode) == 0o600


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost"},  # a forged Origin that names us
    {},  # no Origin at all (curl)
    {"Origin": "http://evil.example", "Referer": "http://evil.example/"},
    {"Authorization": "Bearer not-the-token-0123456789"},
])
def test_anonymous_state_changes_are_refused(service, headers):
    app, store, _ = service
    client = app.test_client()
    assert pin(client, headers=headers).status_code in (401, 403)
    assert store.peer_policies() == {}


def test_an_anonymous_visitor_with_a_valid_csrf_token_is_still_not_an_operator(service):
    app, store, _ = service
    client = app.test_client()
    response = pin(client, data={"csrf_token": csrf_token(client)})
    assert response.status_code == 401 and b"/login" in response.data
    assert store.peer_policies() == {}


def test_a_foreign_host_header_is_refused_before_anything_runs(service):
    """DNS rebinding: a name that resolves to us but is not ours."""
    app, store, token = service
    client = app.test_client()
    for method in (client.get, client.post):
        response = method(f"/peers/{PEER}/policy", headers={"Host": "rebind.evil.example",
                                                            "Origin": "http://rebind.evil.example",
                                                            "Authorization": f"Bearer {token}"})
        assert response.status_code == 400 and b"trusted_hosts" in response.data
    assert client.get("/", headers={"Host": "localhost:5000"}).status_code == 200
    assert store.peer_policies() == {}


def test_scripts_act_with_the_bearer_token(service):
    app, store, token = service
    response = pin(app.test_client(), headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 303
    assert store.peer_policies() == {PEER: "pinned"}


def test_a_browser_logs_in_with_the_token_and_then_needs_its_csrf_token(service):
    app, store, token = service
    client = app.test_client()
    wrong = client.post("/login", data={"token": "x" * 40, "csrf_token": csrf_token(client)})
    assert wrong.status_code == 403
    login = client.post("/login", data={"token": token, "csrf_token": csrf_token(client), "next": "//evil.example/"})
    assert login.status_code == 303 and login.headers["Location"] == "/"  # never to another site
    cookie = login.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert pin(client).status_code == 403  # the session alone is not enough: CSRF
    assert pin(client, data={"csrf_token": csrf_token(client)}).status_code == 303
    assert store.peer_policies() == {PEER: "pinned"}
    page = client.get(f"/peers/{PEER}").get_data(as_text=True)
    assert "Log out" in page

    client.post("/logout", data={"csrf_token": csrf_token(client)})
    assert pin(client, data={"csrf_token": csrf_token(client)}).status_code == 401


def test_the_printed_login_url_logs_in_and_drops_the_token_from_the_address(service):
    app, _, token = service
    client = app.test_client()
    response = client.get(f"/login?token={token}")
    assert response.status_code == 303 and token not in response.headers["Location"]
    assert "Log out" in client.get("/").get_data(as_text=True)


def test_oversized_bodies_are_refused_with_413(service):
    app, _, _ = service
    response = app.test_client().post("/login", data={"token": "x" * 2_000_000})
    assert response.status_code == 413


def test_live_reachability_checks_are_rate_limited_with_retry_after(service):
    app, _, _ = service
    client = app.test_client()
    answers = [client.get(f"/api/v1/is_reachable/{PEER}") for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert answers[3].status_code == 429 and int(answers[3].headers["Retry-After"]) > 0
    assert answers[3].get_json()["status"] == 429
    # another client is not affected
    other = client.get(f"/api/v1/is_reachable/{PEER}", environ_base={"REMOTE_ADDR": "127.0.0.9"})
    assert other.status_code == 200


def test_errors_say_nothing_of_the_internals(service, tmp_path):
    app, store, _ = service
    store.engine.dispose()
    (tmp_path / "monitor.db").unlink()
    (tmp_path / "monitor.db").mkdir()  # the database is gone: every read fails
    client = app.test_client()
    for path in ("/", "/api/v1/state", "/metrics"):
        body = client.get(path).get_data(as_text=True)
        assert str(tmp_path) not in body and "sqlite" not in body.lower() and "Traceback" not in body, path
    v1 = client.get("/v1/no-such-thing")
    assert v1.status_code == 404 and set(v1.get_json()["error"]) >= {"message", "type", "code"}


def test_one_clients_forwarded_prefix_never_shapes_another_clients_links(tmp_path):
    """Behind a proxy (``proxy_hops``) the app believes X-Forwarded-Prefix. The parts of a peer
    page every visitor sees alike are rendered once for all (``peer_view.rendered``): a prefix a
    client sent must shape only its own answer, never the cached HTML the next visitor gets."""
    settings = web_settings(data_dir=tmp_path, proxy_hops=1)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        populate(store, settings, time.time())
        client = create_app(settings, store).test_client()
        page = f"/peers/{PEERS['first']}"
        hostile = client.get(page, headers={"X-Forwarded-Prefix": "//evil.example"}).get_data(as_text=True)
        assert "//evil.example/peers/" in hostile  # (its own links: the proxy is believed)
        for target in (None, "my-server", "peer-live"):
            headers = {"HX-Request": "true", "HX-Target": target} if target else {}
            answer = client.get(page, headers=headers)
            assert answer.status_code == 200
            assert "evil.example" not in answer.get_data(as_text=True), target
    finally:
        store.close()


# ---- other origins (CORS; a real browser on another origin: test_cors.py) ----------------------


def test_the_dashboard_answers_reads_to_any_origin_and_changes_to_none(client):
    origin = {"Origin": "https://widgets.example"}
    for path in ("/api/v1/state", "/api/v1/models", f"/api/v1/peers/{PEERS['first']}", "/api/v1/notes",
                 f"/badges/models/{TINY.dht_prefix}/state.svg", "/status/feed.atom", "/metrics", "/healthz",
                 "/api/v1/no-such-thing"):
        response = client.get(path, headers=origin)
        assert response.headers.get("Access-Control-Allow-Origin") == "*", path
        assert "Access-Control-Allow-Credentials" not in response.headers, path
    for path in ("/", "/status", f"/models/{TINY.dht_prefix}", "/login"):  # pages: no cross-origin reads
        assert "Access-Control-Allow-Origin" not in client.get(path, headers=origin).headers, path
    # operators' changes: no CORS header on the answer, and a preflight allows no method
    for path in ("/api/v1/notes", "/api/v1/silences", "/api/v1/notes/1/resolve", f"/peers/{PEERS['first']}/policy"):
        answer = client.post(path, headers=origin, json={"scope": "swarm", "text": "x"})
        assert answer.status_code in (401, 403) and not any(h.startswith("Access-Control-") for h in answer.headers.keys()), path
        preflight = client.options(path, headers={**origin, "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "authorization, content-type"})
        assert "Access-Control-Allow-Methods" not in preflight.headers or "POST" not in preflight.headers[
            "Access-Control-Allow-Methods"], path
        assert "Access-Control-Allow-Credentials" not in preflight.headers, path


def test_chat_origins_are_checked_at_start():
    from monitor.web import cors

    assert cors.chat_origins([]) == "*" and cors.chat_origins(["*"]) == "*"
    assert cors.chat_origins(["https://chat.example.org", "http://127.0.0.1:8080/"]) == [
        "https://chat.example.org", "http://127.0.0.1:8080"]
    for bad in ("chat.example.org", "https://example.org/path", "javascript:alert(1)", "https://*.example.org"):
        with pytest.raises(ValueError, match="is not an origin"):
            cors.chat_origins([bad])
