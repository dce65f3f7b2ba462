"""The rules of sessions kept after an answer (``chat.kept``), without a swarm: what a follow-up
must begin with to continue, whose a handle is, one taker at a time, time limits, bounds among the
open sessions (kept ones let go first, never displacing a conversation held open), and the price of
continuing against a fresh route. On a real swarm: ``test_kept_sessions.py``."""

from __future__ import annotations

import threading

import pytest

from chat.capacity import Capacity, OpenSessions
from chat.errors import Busy
from chat.kept import (GONE, HIT, OTHER_CHOICE, OTHER_MODEL, UNKNOWN, FollowUp, Kept, KeptSessions, Rendered,
                       continuation, rendered_after, worth_continuing)
from monitor.core.route_choice import RouteChoice

# a character-level "tokenizer": each character is a token, "<e>" one special token
SPECIAL = "<e>"


def encode(text: str) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        if text.startswith(SPECIAL, i):
            ids.append(0)
            i += len(SPECIAL)
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def decode(ids) -> str:
    return "".join(SPECIAL if t == 0 else chr(t) for t in ids)


def kept_of(rendered: str | None, answer: str, *, ends_with_eos: bool = True) -> tuple[Kept, list[int]]:
    """A kept entry whose prompt was ``rendered`` and whose answer was ``answer`` (then EOS, not sent)."""
    answer_ids = encode(answer) + ([0] if ends_with_eos else [])
    prompt_ids = encode(rendered) if rendered is not None else [7, 8, 9]
    committed = prompt_ids + answer_ids[:-1]
    return Kept("h", "me", "m", None, None, Rendered(rendered), tuple(answer_ids), answer, 0.0), committed


CHAT_BEFORE = "<u>hi<e>\n<a>"


def test_a_chat_follow_up_continues_after_the_session_s_own_tokens():
    kept, committed = kept_of(CHAT_BEFORE, "Hello!")
    follow = FollowUp("h", before=CHAT_BEFORE, answer="Hello!", after="<e>\n<u>more<e>\n<a>")
    ids = continuation(kept, follow, decode=decode, encode=encode, committed=committed)
    # the EOS the answer ended with (not sent yet) is taken by the template's own end of turn, then what is new
    assert decode(ids) == "<e>\n<u>more<e>\n<a>"
    assert rendered_after(kept, follow) == CHAT_BEFORE + "Hello!<e>\n<u>more<e>\n<a>"
    # a client that stripped the answer's spaces still continues, on the session's own text
    spaced, committed = kept_of(CHAT_BEFORE, " Hello! ")
    stripped = FollowUp("h", before=CHAT_BEFORE, answer="Hello!", after="<e>\n<u>more<e>\n<a>")
    assert decode(continuation(spaced, stripped, decode=decode, encode=encode, committed=committed)) == \
        "<e>\n<u>more<e>\n<a>"


@pytest.mark.parametrize("follow", [
    FollowUp("h", before=CHAT_BEFORE, answer="Hello?", after="<e>\n<u>more<e>\n<a>"),  # an edited answer
    FollowUp("h", before="<u>bye<e>\n<a>", answer="Hello!", after="<e>\n<u>more<e>\n<a>"),  # other earlier turns
    FollowUp("h", text="<u>hi<e>\n<a>Hola"),  # a text that leaves the answer
    FollowUp("h", ids=(1, 2, 3)),  # ids that are not the session's
    FollowUp("h"),  # nothing to match
])
def test_a_follow_up_that_does_not_begin_with_the_session_s_text_does_not_continue(follow):
    kept, committed = kept_of(CHAT_BEFORE, "Hello!")
    assert continuation(kept, follow, decode=decode, encode=encode, committed=committed) is None


def test_a_text_prompt_continues_after_the_answer_whatever_ended_it():
    # cut by max_tokens: the last token (not sent) is replaced by the text's own next token
    kept, committed = kept_of("Once", " upon a ti", ends_with_eos=False)
    ids = continuation(kept, FollowUp("h", text="Once upon a time there"), decode=decode, encode=encode,
                       committed=committed)
    assert decode(ids) == "ime there"
    # a stop sequence the answer generated and its text left out: the follow-up's own text goes on
    kept, committed = kept_of("User: hi\nAssistant:", " Hello\nUser", ends_with_eos=False)
    ids = continuation(kept, FollowUp("h", text="User: hi\nAssistant: Hello\nUser: more\nAssistant:"),
                       decode=decode, encode=encode, committed=committed)
    assert decode(ids) == "r: more\nAssistant:"


def test_token_ids_continue_when_they_begin_with_the_session_s_ids():
    kept, committed = kept_of(None, "ab")
    assert continuation(kept, FollowUp("h", ids=tuple(committed) + (5, 6)), decode=decode, encode=encode,
                        committed=committed) == (5, 6)
    assert continuation(kept, FollowUp("h", ids=tuple(committed)), decode=decode, encode=encode,
                        committed=committed) is None  # nothing new
    assert continuation(kept, FollowUp("h", text="anything"), decode=decode, encode=encode,
                        committed=committed) is None  # ids were sent: no text to match


def test_continuing_is_priced_like_any_route_prefill_included():
    # the same route: continuing skips the prefill
    assert worth_continuing(0.01, 0.01, new_tokens=20, all_tokens=900, max_tokens=80)
    # a kept route that turned 3x slower is no bargain for a short prompt, but is for a long one
    assert not worth_continuing(0.03, 0.01, new_tokens=20, all_tokens=200, max_tokens=80)
    assert worth_continuing(0.012, 0.01, new_tokens=20, all_tokens=900, max_tokens=80)
    assert not worth_continuing(None, 0.01, new_tokens=1, all_tokens=900, max_tokens=80)  # its servers are gone
    assert worth_continuing(0.01, None, new_tokens=1, all_tokens=900, max_tokens=80)


class Member:
    def __init__(self, label: str, max_length: int = 100):
        self.label, self.max_length = label, max_length
        self.expired_detail = None
        self.closed = False
        self.holds_cache = True
        self.opened_at = float("inf")  # (never too old)
        self.on_expire = None
        self.peers = {"p"}

    def expire(self, detail: str) -> None:
        self.expired_detail = detail
        self.closed = True
        told, self.on_expire = self.on_expire, None
        if told is not None:
            told()

    def close(self, reason=None) -> None:
        self.closed = True

    def holds(self, peer: str) -> bool:
        return peer in self.peers


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sessions(open_sessions: int = 3, per_client: int = 2) -> tuple[OpenSessions, KeptSessions, Clock]:
    clock = Clock()
    registry = OpenSessions(Capacity(open_sessions=open_sessions, sessions_per_client=per_client), clock=clock)
    return registry, KeptSessions(registry, keep_seconds=60, clock=clock, sweep_every=3600), clock


def keep(kept: KeptSessions, handle: str, owner: str, member: Member, *, model="m", choice=None) -> bool:
    return kept.keep(handle, owner=owner, model=model, choice=choice, session=member, rendered=Rendered("x"),
                     answer_ids=[1, 2], answer_text="y")


def test_a_handle_is_taken_once_by_its_owner_for_its_model_and_choice_while_it_is_kept():
    registry, kept, clock = sessions(open_sessions=10)
    member = Member("a")
    assert keep(kept, "h1", "me", member)
    assert kept.take("h1", owner="stranger", model="m", choice=None) == (None, UNKNOWN)
    assert kept.take("nope", owner="me", model="m", choice=None) == (None, UNKNOWN)
    assert kept.take("x" * 1000, owner="me", model="m", choice=None) == (None, UNKNOWN)
    entry, why = kept.take("h1", owner="me", model="m", choice=None)
    assert why == HIT and entry.session is member
    # (taken above: spent)
    assert kept.take("h1", owner="me", model="m", choice=None) == (None, UNKNOWN)
    assert registry.load().kept == 0  # a taken session leaves the open sessions (its taker holds it)

    assert keep(kept, "h2", "me", Member("b"))
    entry, why = kept.take("h2", owner="me", model="other", choice=None)
    assert why == OTHER_MODEL and entry is not None  # (taken, not continued: the taker closes it)
    assert keep(kept, "h3", "me", Member("c"), choice=RouteChoice(sort="latency"))
    assert kept.take("h3", owner="me", model="m", choice=None)[1] == OTHER_CHOICE
    gone = Member("d")
    assert keep(kept, "h4", "me", gone)
    gone.holds_cache = False  # it let go of its servers' caches for another session
    assert kept.take("h4", owner="me", model="m", choice=None)[1] == GONE
    assert keep(kept, "h5", "me", Member("e"))
    clock.now += 61
    assert kept.take("h5", owner="me", model="m", choice=None) == (None, UNKNOWN)  # past its time


def test_one_of_many_concurrent_takers_gets_the_session():
    registry, kept, _ = sessions(open_sessions=10)
    assert keep(kept, "h", "me", Member("a"))
    got, barrier = [], threading.Barrier(8)

    def take():
        barrier.wait()
        got.append(kept.take("h", owner="me", model="m", choice=None)[1])

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [HIT] + [UNKNOWN] * 7


def test_kept_sessions_are_bounded_let_go_first_and_never_displace_a_conversation_held_open():
    registry, kept, clock = sessions(open_sessions=3, per_client=2)
    held = [Member(f"ws{i}") for i in range(2)]
    for i, member in enumerate(held):
        registry.admit(member, f"c{i}")
    first, second = Member("k1"), Member("k2")
    assert keep(kept, "k1", "c9", first)
    # full: a kept session makes room only with another kept one (the least recently kept)
    assert keep(kept, "k2", "c8", second)
    assert first.closed and "k1" not in kept._kept and not held[0].closed
    # a conversation held open (WebSocket) lets a kept session go before any idle conversation
    newcomer = Member("ws-new")
    registry.admit(newcomer, "c7")
    assert second.closed and "k2" not in kept._kept and not any(m.closed for m in held)
    # no kept session left and every conversation busy: a kept session is simply not kept
    for member in held + [newcomer]:
        registry.set_state(member, "generating")
    third = Member("k3")
    assert not keep(kept, "k3", "c6", third) and third.closed
    with pytest.raises(Busy):
        registry.admit(Member("ws-more"), "c5")
    # per client: a client's kept sessions count against its share, and go first
    registry2, kept2, _ = sessions(open_sessions=10, per_client=2)
    conversation = Member("mine")
    registry2.admit(conversation, "me")
    assert keep(kept2, "a", "me", Member("ka"))
    assert keep(kept2, "b", "me", Member("kb"))  # (the client's older kept one made room)
    assert list(kept2._kept) == ["b"] and not conversation.closed
    # cache room: kept sessions are the first to let go of it
    registry3, kept3, _ = sessions(open_sessions=10, per_client=10)
    idle_conversation = Member("conversation")
    registry3.admit(idle_conversation, "x")
    kept_one = Member("kept")
    assert keep(kept3, "k", "y", kept_one)
    assert registry3.idle_holding("p", 10) == [kept_one]


def test_kept_sessions_past_their_time_are_closed_and_keeping_can_be_turned_off():
    registry, kept, clock = sessions(open_sessions=10)
    member = Member("a")
    assert keep(kept, "h", "me", member)
    clock.now += 30
    assert kept.sweep() == 0 and not member.closed
    clock.now += 31
    assert kept.sweep() == 1 and member.closed and registry.load().kept == 0
    assert registry.load().expired == {"kept": 1}
    off = KeptSessions(registry, keep_seconds=0)
    other = Member("b")
    assert not off.enabled and not keep(off, "h", "me", other) and other.closed
