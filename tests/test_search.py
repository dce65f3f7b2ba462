"""Specs of finding a server: the search box on every page, its htmx results, its JSON API.

The store is populated through its own write path (``support.populate``: polls, reachability checks,
chat outcomes and scores as the poller writes them); the search runs over real SQLite here and
over SQLite and PostgreSQL in ``test_store.py`` (``-k search``).
"""

from __future__ import annotations

import statistics
import time
from html import unescape


from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow, Snapshot
from monitor.store import Store
from monitor.web import create_app
from monitor.web.search import MAX_QUERY_CHARS
from support import MALICIOUS_NAME, PEERS, elements, peer, text_of, web_settings

HTMX = {"HX-Request": "true", "HX-Target": "search-results"}


def words(html: str) -> str:
    """The page's text as a reader sees it (entities decoded)."""
    return text_of(unescape(html))


def search(client, query: str) -> dict:
    response = client.get("/api/v1/search", query_string={"q": query})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def test_a_public_name_finds_its_server_case_insensitively_with_its_state_and_score(client):
    found = search(client, "HALF")
    assert {r["peer_id"] for r in found["results"]} == {PEERS["first"], PEERS["second"]}
    first = next(r for r in found["results"] if r["peer_id"] == PEERS["first"])
    assert (first["public_name"], first["matched"], first["state"], first["models"]) == (
        "first-half", "public name", "online", ["tiny-llama"])
    assert 0 < first["score"] <= 100 and first["url"] == f"/peers/{PEERS['first']}"
    assert first["last_seen"] >= first["first_seen"]
    unreachable = search(client, "javascript")["results"]  # a name is only text, however it looks
    assert [(r["peer_id"], r["state"]) for r in unreachable] == [(PEERS["unreachable"], "unreachable")]


def test_a_peer_id_its_start_or_its_end_finds_the_server(client):
    target = PEERS["full"]
    whole = search(client, target)["results"]
    assert whole[0]["peer_id"] == target and whole[0]["matched"] == "peer id"
    assert search(client, target[:10])["results"][0]["matched"] == "peer id prefix"
    assert [r["peer_id"] for r in search(client, target[:10])["results"]] == [target]
    ending = search(client, "…" + target[-6:])["results"]  # as the dashboard shortens ids
    assert [(r["peer_id"], r["matched"]) for r in ending] == [(target, "peer id suffix")]
    assert [r["peer_id"] for r in search(client, "..." + target[-6:])["results"]] == [target]
    # a prefix is case-sensitive, as peer ids are
    assert target not in [r["peer_id"] for r in search(client, target[:10].swapcase())["results"]]


def test_the_search_box_is_on_every_page_and_answers_with_a_list_htmx_swaps_in(client, populated):
    for url in ("/", "/models/tiny-llama", f"/peers/{PEERS['full']}", "/search"):
        html = client.get(url).get_data(as_text=True)
        tags = elements(html)
        box = [a for tag, a in tags.tags if tag == "input" and a.get("hx-target") == "#search-results"]
        assert len(box) == 1, url
        assert box[0]["hx-get"] == "/search" and box[0]["maxlength"] == str(MAX_QUERY_CHARS)
        assert not [s for a, s in tags.scripts if s.strip()]  # no inline JS
    partial = client.get("/search?q=half", headers=HTMX)
    body = partial.get_data(as_text=True)
    assert partial.status_code == 200 and "<html" not in body and "<header" not in body
    assert body.count("<li>") == 2 and f'href="/peers/{PEERS["first"]}#my-server"' in body
    assert "first-half" in body and "score" in body
    nothing = client.get("/search?q=no-such-server", headers=HTMX).get_data(as_text=True)
    assert "No server matches" in nothing


def test_peer_announced_text_is_escaped_in_results(client):
    body = client.get("/search?q=onerror", headers=HTMX).get_data(as_text=True)
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "<img" not in body
    page = client.get("/search?q=onerror").get_data(as_text=True)
    assert "<img" not in page and "onerror=alert(1)&gt;" in page
    assert search(client, "onerror")["results"][0]["public_name"] == MALICIOUS_NAME  # JSON: the text as is
    echoed = client.get("/search", query_string={"q": "<script>x</script>"}).get_data(as_text=True)
    assert "<script>x</script>" not in echoed and "&lt;script&gt;x&lt;/script&gt;" in echoed


def test_queries_are_bounded_and_like_wildcards_are_literal(client, populated):
    too_long = client.get("/api/v1/search", query_string={"q": "x" * (MAX_QUERY_CHARS + 1)})
    assert too_long.status_code == 400 and f"at most {MAX_QUERY_CHARS}" in too_long.get_json()["error"]
    assert client.get("/search", query_string={"q": "x" * 500}).status_code == 400
    assert search(client, "   ") == {"query": "", "results": [], "more": False}
    assert search(client, "%")["results"] == [] and search(client, "_")["results"] == []
    assert search(client, "first%half")["results"] == []  # '%' is a character, not "anything"
    _, store, settings, _ = populated
    capped = create_app(web_settings(data_dir=settings.data_dir, search_max_results=1), store).test_client()
    found = capped.get("/api/v1/search?q=half").get_json()
    assert len(found["results"]) == 1 and found["more"] is True


def test_pasting_a_known_id_opens_its_report_and_an_unknown_one_says_it_was_never_seen(client):
    opened = client.get("/search", query_string={"q": f"  {PEERS['unreachable']} "})
    assert opened.status_code == 303 and opened.headers["Location"].endswith(f"/peers/{PEERS['unreachable']}#my-server")
    listed = client.get("/search", query_string={"q": PEERS["unreachable"]}, headers=HTMX)
    assert listed.status_code == 200 and PEERS["unreachable"][-6:] in listed.get_data(as_text=True)
    stranger = peer("a server started elsewhere")
    page = client.get("/search", query_string={"q": stranger})
    text = words(page.get_data(as_text=True))
    assert page.status_code == 200 and "Never seen in this swarm's DHT" in text
    assert "initial peers" in text and "tiny-llama" in text  # what to check, and what this monitor watches
    dropdown = words(client.get("/search", query_string={"q": stranger}, headers=HTMX).get_data(as_text=True))
    assert "was ever seen by this monitor" in dropdown


def test_search_answers_in_milliseconds_over_3000_peers(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    model = ModelInfo("big-model", 80)
    rows = tuple(ServerRow(peer(f"server-{i}"), model.dht_prefix, i % 70, i % 70 + 10, ONLINE,
                           public_name=f"volunteer-{i}" if i % 3 else None) for i in range(3000))
    store.record_poll(Snapshot(taken_at=time.time(), duration=1.0, models=(model,), servers=rows))
    target = peer("server-2024")
    try:
        for query, expected in ((target[:12], target), ("volunteer-2024", target), ("…" + target[-6:], target),
                                ("OLUNTEER-202", None)):
            found = store.search_peers(query, limit=20)
            assert found and (expected is None or found[0].peer_id == expected), query
            times = []
            for _ in range(20):
                started = time.perf_counter()
                store.search_peers(query, limit=20)
                times.append(time.perf_counter() - started)
            # milliseconds on a quiet machine; the bound leaves room for a loaded one
            assert statistics.median(times) < 0.05, (query, statistics.median(times))
        with store.engine.connect() as conn:  # the id prefix is a range on the unique index
            plan = " ".join(str(r) for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT peer_id FROM peers WHERE peer_id >= ? AND peer_id < ?", ("12D", "12E")))
            assert "USING COVERING INDEX" in plan or "USING INDEX" in plan, plan
    finally:
        store.close()
