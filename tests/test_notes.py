"""Spec: incident notes (README: Dashboard, API, Security) — operators post, update and resolve a note
on a model, a peer or the swarm, by token or from the status page's forms; visitors read it beside
the state on the overview, the model page and the status page, with its times and history. Anonymous
or hostile requests change nothing; the text is always text.
"""

from __future__ import annotations

import re

import pytest

from monitor.core.incidents import MAX_TEXT
from monitor.web import auth
from support import MALICIOUS_NAME, PEERS, TINY

TOKEN = {}


@pytest.fixture
def app(populated):
    """The populated app; its operator token is the one it generated into its data dir."""
    app, store, settings, now = populated
    TOKEN["value"] = auth.resolve_token(settings, create=False)
    return app, store


def bearer() -> dict:
    return {"Authorization": f"Bearer {TOKEN['value']}"}


def notes_in(store) -> list:
    return store.notes(resolved_since=0)


def test_an_operator_posts_updates_and_resolves_a_note_and_its_history_is_kept(app):
    app, store = app
    client = app.test_client()
    posted = client.post("/api/v1/notes", headers=bearer(), json={
        "scope": "model", "target": TINY.dht_prefix, "text": "server-7 is being upgraded, back at 14:00",
        "author": "alice"})
    assert posted.status_code == 201, posted.get_data(as_text=True)
    note = posted.get_json()["note"]
    assert note["open"] and note["author"] == "alice" and note["scope"] == "model"
    updated = client.post(f"/api/v1/notes/{note['id']}", headers=bearer(), json={"text": "back at 15:00 instead"})
    assert updated.status_code == 200 and updated.get_json()["note"]["text"] == "back at 15:00 instead"
    resolved = client.post(f"/api/v1/notes/{note['id']}/resolve", headers=bearer(), data={"text": "all back"})
    body = resolved.get_json()["note"]
    assert resolved.status_code == 200 and not body["open"] and body["text"] == "all back"
    assert [u["action"] for u in body["updates"]] == ["posted", "updated", "resolved"]
    assert [u["text"] for u in body["updates"]] == ["server-7 is being upgraded, back at 14:00",
                                                    "back at 15:00 instead", "all back"]
    # resolving again changes nothing; anyone reads it, with its history
    again = client.post(f"/api/v1/notes/{note['id']}/resolve", headers=bearer(), json={})
    assert len(again.get_json()["note"]["updates"]) == 3
    listed = app.test_client().get("/api/v1/notes").get_json()["notes"]
    assert [n["id"] for n in listed] == [note["id"]] and listed[0]["resolved_at"] is not None
    assert app.test_client().get("/api/v1/notes?days=0").get_json()["notes"] == []  # resolved: gone from "open"


def test_open_notes_show_beside_the_state_with_times_and_their_text_escaped(app):
    app, store = app
    client = app.test_client()
    for scope, target, text in [("swarm", None, "The bootstrap peer moves tonight"),
                                ("model", TINY.dht_prefix, "Tiny is slow: " + MALICIOUS_NAME),
                                ("peer", PEERS["first"], "first-half restarts at 14:00")]:
        assert client.post("/api/v1/notes", headers=bearer(), json={"scope": scope, "target": target,
                                                                     "text": text}).status_code == 201
    overview = client.get("/").get_data(as_text=True)
    model = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
    status = client.get("/status").get_data(as_text=True)
    for page in (overview, model, status):
        assert "The bootstrap peer moves tonight" in page  # the swarm's notes everywhere
        assert "Tiny is slow: &lt;img src=x onerror=alert(1)&gt;" in page and MALICIOUS_NAME not in page
        assert re.search(r"posted \d{4}-\d\d-\d\d \d\d:\d\d UTC \(\d+ s ago\) by operator", page)
    assert "first-half restarts at 14:00" in overview and "first-half restarts at 14:00" in model  # one of its servers
    other = client.get("/models/other-model").get_data(as_text=True)
    assert "Tiny is slow" not in other and "The bootstrap peer moves tonight" in other


def test_anonymous_and_cross_site_requests_change_nothing(app):
    app, store = app
    client = app.test_client()
    [first] = [client.post("/api/v1/notes", headers=bearer(), json={"scope": "swarm", "text": "kept"}).get_json()["note"]]
    before = notes_in(store)
    answers = [
        client.post("/api/v1/notes", json={"scope": "swarm", "text": "anonymous"}),
        client.post("/api/v1/notes", headers={"Authorization": "Bearer " + "x" * 32}, json={"scope": "swarm", "text": "x"}),
        client.post(f"/api/v1/notes/{first['id']}", json={"text": "defaced"}),
        client.post(f"/api/v1/notes/{first['id']}/resolve", json={}),
        client.post("/notes", data={"scope": "swarm", "text": "a form without a CSRF token"},
                    headers={"Origin": "https://evil.example"}),
    ]
    assert [a.status_code for a in answers] == [401, 401, 401, 401, 403]
    assert notes_in(store) == before


def test_a_logged_in_browser_posts_from_the_status_page_with_its_csrf_token(app):
    app, store = app
    client = app.test_client()
    assert client.get(f"/login?token={TOKEN['value']}").status_code == 303
    page = client.get("/status").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert 'action="/notes"' in page  # the operator's form
    posted = client.post("/notes", data={"csrf_token": csrf, "scope": "peer", "target": PEERS["second"],
                                         "text": "second-half\nis moving to a new machine", "author": "bob"})
    assert posted.status_code == 303 and posted.headers["Location"].startswith("/status#note-")
    [note] = notes_in(store)
    assert note.text == "second-half\nis moving to a new machine" and note.author == "bob"
    assert note.updates[0].via == "browser session"
    assert client.post(f"/notes/{note.id}/resolve", data={"csrf_token": csrf}).status_code == 303
    assert not store.note(note.id).open
    # a session is not enough on the API (no CSRF there: operators' scripts use the token)
    assert client.post("/api/v1/notes", json={"scope": "swarm", "text": "x"}).status_code == 401


@pytest.mark.parametrize("fields, says", [
    ({"scope": "swarm", "text": "x" * (MAX_TEXT + 1)}, "at most 1000"),
    ({"scope": "swarm", "text": "   "}, "empty"),
    ({"scope": "swarm", "text": "ring the bell\x07"}, "control character"),
    ({"scope": "swarm", "text": "reads \u202eotherwise"}, "bidirectional"),
    ({"scope": "swarm", "text": "ok", "author": "a" * 81}, "author"),
    ({"scope": "swarm", "text": "ok", "author": "eve\x00"}, "author"),
    ({"scope": "galaxy", "text": "ok"}, "scope must be one of"),
    ({"scope": "model", "text": "ok"}, "needs its target"),
    ({"scope": "model", "target": "../../etc/passwd", "text": "ok"}, "not a DHT prefix"),
    ({"scope": "peer", "target": "not-a-peer", "text": "ok"}, "not a peer id"),
    ({"scope": "swarm", "target": TINY.dht_prefix, "text": "ok"}, "takes no target"),
    ({"scope": "swarm", "text": 42}, "must be a string"),
])
def test_hostile_fields_are_refused_with_400_saying_what_is_wrong(app, fields, says):
    app, store = app
    response = app.test_client().post("/api/v1/notes", headers=bearer(), json=fields)
    assert response.status_code == 400 and says in response.get_json()["error"], response.get_json()
    assert notes_in(store) == []


def test_bad_and_unknown_ids(app):
    app, store = app
    client = app.test_client()
    assert client.post("/api/v1/notes/abc", headers=bearer(), json={"text": "x"}).status_code == 400
    assert client.post("/api/v1/notes/-1/resolve", headers=bearer(), json={}).status_code == 400
    assert client.post("/api/v1/notes/" + "9" * 40, headers=bearer(), json={"text": "x"}).status_code == 400
    assert client.post("/api/v1/notes/12345", headers=bearer(), json={"text": "x"}).status_code == 404
    assert client.get("/api/v1/notes/12345").status_code == 404
    assert client.get("/api/v1/notes/1e9").status_code == 400
    assert client.get("/api/v1/notes?days=-3").status_code == 400
    assert client.post("/api/v1/notes", headers=bearer(), data=b"[1, 2]",
                       content_type="application/json").status_code == 400
    assert notes_in(store) == []
