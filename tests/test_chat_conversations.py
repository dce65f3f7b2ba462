"""Spec: the chat page's conversations kept in the store (``chat/conversations.py``,
``store/conversations.py``, ``chat/http/conversation_views.py``) — per visitor, listed, searched,
renamed, deleted, reopened where they were, bounded, pruned after their retention; a visitor's
cookie signed with the chat's own secret (not the operator's token); nothing of one visitor ever
readable by another. In Chromium on the session swarm (a reload and a restart of the service
between two turns keep the conversation; a second browser sees none of it):
``test_chat_page_in_chromium.py``."""

from __future__ import annotations

import pytest

from chat.conversations import ConversationLimits, ConversationStore, title_of
from chat.errors import Busy, InvalidRequest
from support import sqlite_store

DAY = 86400.0


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kept(tmp_path):
    store = sqlite_store(tmp_path)
    clock = Clock()
    yield ConversationStore(store, ConversationLimits(per_visitor=3, max_chars=5000, new_visitors_per_address=2,
                                                      retention_days=30), clock=clock), clock, store
    store.close()


def messages(*texts):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def test_each_visitor_reads_lists_searches_renames_and_deletes_only_their_own(kept):
    kept, clock, store = kept
    alice, alice_cookie = kept.new_visitor("10.0.0.1")
    bob, _ = kept.new_visitor("10.0.0.2")
    assert kept.visitor_of(alice_cookie) == alice and kept.visitor_of(alice_cookie + "x") is None
    kept.save(alice, "a1", model="m", system="", messages=messages("What is a  swarm?\nmore", "Servers."))
    clock.now += 10
    kept.save(alice, "a2", model="m", system="", messages=messages("Tell me about Petals", "It runs LLMs."))
    kept.save(bob, "b1", model="m", system="", messages=messages("Secret of Bob", "ok"))
    assert [c["id"] for c in kept.listed(alice)] == ["a2", "a1"]  # the most recent first
    assert [c["title"] for c in kept.listed(alice)] == ["Tell me about Petals", "What is a swarm?"]
    assert [c["id"] for c in kept.listed(alice, "SWARM")] == ["a1"]  # titles and text, any case
    assert [c["id"] for c in kept.listed(alice, "runs llms")] == ["a2"]
    assert kept.listed(alice, "Bob") == [] and kept.listed(alice, "%") == [] and kept.listed(alice, "_") == []
    assert kept.get(alice, "b1") is None and kept.get(bob, "a1") is None  # another's id answers as unknown
    # saving under another visitor's id never touches theirs
    kept.save(alice, "b1", model="m", system="", messages=messages("Alice's", "x"))
    assert kept.get(bob, "b1")["messages"][0]["content"] == "Secret of Bob"
    assert kept.get(alice, "b1") is None  # (the id is Bob's: Alice's copy was not made under it)
    assert not kept.rename(bob, "a1", "mine now") and kept.rename(alice, "a1", "  Swarms\n 101 ")
    assert kept.get(alice, "a1")["title"] == "Swarms 101"
    with pytest.raises(InvalidRequest, match="title"):
        kept.rename(alice, "a1", "x" * 121)
    with pytest.raises(InvalidRequest, match="title"):
        kept.rename(alice, "a1", " \n ")
    assert kept.delete(bob, "a1") == 0 and kept.delete(alice, "a1") == 1
    assert kept.delete(alice) == 1 and kept.listed(alice) == [] and len(kept.listed(bob)) == 1


def test_bounds_per_visitor_per_conversation_and_new_visitors_per_address(kept):
    kept, clock, store = kept
    visitor, _ = kept.new_visitor("10.0.0.9")
    for i in range(3):
        kept.save(visitor, f"c{i}", model="m", system="", messages=messages(f"q{i}", "a"))
    with pytest.raises(InvalidRequest, match="you keep 3 conversations"):
        kept.check_room(visitor, "c9", 10, new=True)
    kept.check_room(visitor, "c0", 10, new=False)  # an existing one goes on
    with pytest.raises(InvalidRequest, match="at most 5,000 are kept"):
        kept.check_room(visitor, "c0", 5001, new=False)
    kept.new_visitor("10.0.0.9")
    with pytest.raises(Busy, match="too many new chat visitors from your address"):
        kept.new_visitor("10.0.0.9")
    kept.new_visitor("10.0.0.10")  # another address is not held back
    clock.now += DAY + 1
    kept.new_visitor("10.0.0.9")  # a day later
    full = ConversationStore(kept.store, ConversationLimits(in_all=3))  # every visitor's, together
    other, _ = full.new_visitor("10.0.0.11")
    with pytest.raises(Busy, match="the most it keeps for all its visitors"):
        full.check_room(other, "x", 10, new=True)
    full.check_room(visitor, "c0", 10, new=False)


def test_conversations_go_after_their_retention_and_the_secret_is_the_chats_own(kept, tmp_path):
    kept, clock, store = kept
    visitor, cookie = kept.new_visitor("10.0.0.1")
    kept.save(visitor, "old", model="m", system="", messages=messages("old", "a"))
    clock.now += 20 * DAY
    kept.save(visitor, "new", model="m", system="", messages=messages("new", "a"))
    clock.now += 11 * DAY
    assert kept.prune(force=True) == 1
    assert [c["id"] for c in kept.listed(visitor)] == ["new"]
    # another process over the same store (a restart, another worker, a rotated operator token)
    again = ConversationStore(store, kept.limits)
    assert again.visitor_of(cookie) == visitor


def test_titles_come_from_the_first_question():
    assert title_of("\n\n  How do   I run\ta server?  \nDetails") == "How do I run a server?"
    assert title_of("") == "Conversation"
    assert len(title_of("x" * 500)) == 120 and title_of("x" * 500).endswith("…")


def test_export_as_markdown_and_json_and_import_of_that_json_to_go_on(kept):
    import json

    from chat.conversations import exported, imported

    kept, clock, store = kept
    visitor, _ = kept.new_visitor("10.0.0.1")
    answer = {"role": "assistant", "content": "It is **Paris**.",
              "meta": {"route": [{"peer_id": "Qm1", "start": 0, "end": 8}], "tokens_per_second": 12.5,
                       "time_to_first_token": 0.2}}
    kept.save(visitor, "c1", model="tiny", system="Be brief.",
              messages=[{"role": "user", "content": "Capital of France?"}, answer])
    stored = kept.get(visitor, "c1")
    markdown, kind = exported(stored, "md")
    assert kind.startswith("text/markdown") and "# Capital of France?" in markdown
    assert "**System:** Be brief." in markdown and "## You\n\nCapital of France?" in markdown
    assert "## Assistant\n\nIt is **Paris**." in markdown
    body, kind = exported(stored, "json")
    data = json.loads(body)
    assert kind == "application/json" and data["model"] == "tiny"
    assert data["messages"][:2] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    assert data["messages"][2]["petals"]["tokens_per_second"] == 12.5  # each answer's route and speed
    again = imported(body.encode(), kept.limits)
    assert again["system"] == "Be brief." and again["title"] == "Capital of France?" and again["model"] == "tiny"
    assert [m["content"] for m in again["messages"]] == ["Capital of France?", "It is **Paris**."]
    assert again["messages"][1]["meta"] == {"tokens_per_second": 12.5, "time_to_first_token": 0.2}
    # a plain OpenAI messages list imports too
    plain = imported(json.dumps([{"role": "user", "content": "hi"}]).encode(), kept.limits)
    assert plain["title"] == "hi"


BAD_IMPORTS = [
    (b"", "choose a conversation"),
    (b"\xff\xfe not json", "not JSON"),
    (b"{\"messages\": 5}", "no list of messages"),
    (b"[]", "no list of messages"),
    (b"[{\"role\": \"robot\", \"content\": \"x\"}]", "message 1"),
    (b"[{\"role\": \"user\", \"content\": {\"a\": 1}}]", "message 1"),
    (b"[{\"role\": \"assistant\", \"content\": \"x\"}]", "no question"),
    (("[" + ",".join(['{"role": "user", "content": "x"}'] * 1001) + "]").encode(), "at most 1000"),
    (("[{\"role\": \"user\", \"content\": \"" + "x" * 6000 + "\"}]").encode(), "at most 5,000"),
    (b"x" * 20_001, "bytes"),
]


@pytest.mark.parametrize("raw,words", BAD_IMPORTS, ids=[w for _, w in BAD_IMPORTS])
def test_a_malformed_or_oversized_import_is_refused_whole_with_a_clear_message(kept, raw, words):
    from chat.conversations import imported

    kept, clock, store = kept
    limits = kept.limits if words != "at most 1000" else ConversationLimits(max_chars=1_000_000)
    with pytest.raises(InvalidRequest, match=words):
        imported(raw, limits)


# ---- the chat page -----------------------------------------------------------------------------


def test_the_operator_can_turn_storing_off_and_the_page_says_which(tmp_path):
    from chat.engine import ChatEngine
    from chat.http import create_blueprint
    from monitor.settings import ModelConfig, Settings
    from monitor.web import create_app

    store = sqlite_store(tmp_path)
    engine = ChatEngine(None, [ModelConfig(dht_prefix="m")])
    pages = {}
    for keep in (True, False):
        settings = Settings(data_dir=tmp_path, chat_keep_conversations=keep, chat_conversation_retention_days=7)
        blueprint = create_blueprint(engine, conversations=ConversationStore(store, ConversationLimits.from_settings(settings)))
        pages[keep] = create_app(settings, store, chat_blueprints=[blueprint]).test_client().get("/chat").get_data(as_text=True)
    assert "kept on this server for 7 days" in pages[True] and 'id="chat-list"' in pages[True]
    assert "Conversations are not kept" in pages[False] and 'id="chat-list"' not in pages[False]
    client = create_app(settings, store, chat_blueprints=[create_blueprint(
        engine, conversations=ConversationStore(store))]).test_client()
    for hostile in ("x" * 10_000, "%00", "'; DROP TABLE chat_conversations; --"):  # an id nobody has
        page = client.get("/chat", query_string={"c": hostile})
        assert page.status_code == 200 and 'class="chat-turn' not in page.get_data(as_text=True)
    client.set_cookie("chat_visitor", "forged." + "A" * 300)
    assert "No conversations yet" in client.get("/chat/conversations").get_data(as_text=True)
    store.close()


def test_regenerate_and_edit_refuse_what_the_conversation_does_not_have():
    from chat.http.page import rewind

    talk = messages("q0", "a0", "q1", "a1")
    assert rewind(talk, "new", regenerate=False, edit=None) == (4, "new")
    assert rewind(talk, "", regenerate=True, edit=None) == (2, "q1")
    assert rewind(talk, "q0 again", regenerate=False, edit=0) == (0, "q0 again")
    assert rewind(talk, "q2", regenerate=False, edit=2) == (4, "q2")  # one past the last: asked anew
    # a question that got no answer, asked again where the conversation was left: by a live worker
    # that dropped it (edit 1 of q0 a0), or from the store of one that died before keeping it (edit 1 of all)
    assert rewind(messages("q0", "a0"), "q1", regenerate=False, edit=1) == (2, "q1")
    assert rewind(talk, "q1 again", regenerate=False, edit=1) == (2, "q1 again")
    for bad in (3, 10**5):
        with pytest.raises(InvalidRequest, match="there is no question"):
            rewind(talk, "x", regenerate=False, edit=bad)
    with pytest.raises(InvalidRequest, match="no answer to regenerate"):
        rewind(messages("q0"), "", regenerate=True, edit=None)
    with pytest.raises(InvalidRequest, match="no answer to regenerate"):
        rewind([], "", regenerate=True, edit=None)


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_nul_character_is_kept_as_unknown_and_workers_starting_at_once_share_one_secret(kind, tmp_path, request):
    """PostgreSQL's text holds no NUL: a model's answer that carries one (the tiny model's do) was
    refused whole, the conversation not kept. Stored, it reads U+FFFD. And chat workers that start
    at once, each making the chat's visitor secret, agree on one (the loser's insert yields)."""
    import threading

    from monitor.store import conversations as sql
    from support import open_migrated_store

    url = f"sqlite:///{tmp_path / 'monitor.db'}" if kind == "sqlite" else request.getfixturevalue("postgres").create_database()
    store = open_migrated_store(url)
    try:
        kept = ConversationStore(store, ConversationLimits(per_visitor=3, max_chars=5000, retention_days=30))
        visitor, _ = kept.new_visitor("127.0.0.1")
        kept.save(visitor, "c1", model="m", system="be\x00brief", messages=messages("why\x00?", "because\x00"))
        found = kept.get(visitor, "c1")
        assert [m["content"] for m in found["messages"]] == ["why\ufffd?", "because\ufffd"]
        assert found["system"] == "be\ufffdbrief" and kept.listed(visitor, "because")
        assert kept.rename(visitor, "c1", "a\x00title") and kept.get(visitor, "c1")["title"] == "a\ufffdtitle"

        with store.db.write("a fresh secret") as conn:  # (as if no worker had made it yet)
            conn.execute(sql.StoreMetaRow.__table__.delete().where(sql.StoreMetaRow.__table__.c.key == sql.SECRET_KEY))
        gate, made = threading.Barrier(4), []

        def make() -> None:
            gate.wait()
            with store.db.write("reading the chat's visitor secret") as conn:
                made.append(sql.visitor_secret(conn))

        threads = [threading.Thread(target=make) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(made) == 4 and len(set(made)) == 1
    finally:
        store.close()


def test_a_turn_whose_stream_never_came_gives_way_to_the_next_and_a_running_one_does_not():
    """The page's Regenerate after a lost connection asks again at once: a turn still waiting for
    its stream (its page gave up on it) gives way; one being written is refused with a message."""
    from chat.engine import GenerationParams
    from chat.http.page import _Conversations, _Turn

    conversations = _Conversations(per_visitor=3, max_visitors=10)
    conversation = conversations.get_or_create("visitor", None)
    first = _Turn("t1", conversation, "m", [1, 2], GenerationParams())
    conversations.start_turn(conversation, {"role": "user", "content": "q"}, first)
    again = _Turn("t2", conversation, "m", [1, 2], GenerationParams())
    conversations.start_turn(conversation, {"role": "user", "content": "q"}, again, keep=0)
    assert conversations.claim("visitor", "t1") is None  # given way: its stream finds nothing
    assert conversations.claim("visitor", "t2") is again  # (now being written)
    with pytest.raises(InvalidRequest, match="still being written"):
        conversations.start_turn(conversation, {"role": "user", "content": "q"},
                                 _Turn("t3", conversation, "m", [1, 2], GenerationParams()), keep=0)
    assert [m["content"] for m in conversation.messages] == ["q"]
