"""Spec: the chat's capacity rules without a swarm (README: Chat capacity; ``chat.capacity``).

- generation slots are shared per client in turn, not first come first served; one client holds at
  most its share of the slots and of the queue; a refusal's Retry-After is estimated from how long
  slots were held and how many wait ahead; a kept-open session's turn waits in turn but is never
  refused for a full queue;
- kept-open sessions are bounded in all and per client; the least recently used idle one makes
  room, and only when none is idle is a newcomer refused; its owner learns it at once.

The same rules on a real swarm through the real web app: ``test_chat_slots.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from chat.capacity import IDLE, Capacity, OpenSessions, Slots
from chat.engine import Busy, SessionExpired
from support import wait_until


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def waiting_thread(slots, client, results, timeout=5.0):
    """acquire() on a thread of its own; the slot (or the Busy) lands in ``results`` as (client, slot)."""
    def run():
        try:
            results.append((client, slots.acquire(client, timeout=timeout)))
        except Busy as e:
            results.append((client, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def queued(slots, n):
    assert wait_until(lambda: slots.load().waiting == n, 5, step=0.01), slots.load()


# ---- slots -------------------------------------------------------------------------------------


def test_waiting_requests_are_served_per_client_in_turn_not_first_come_first_served():
    slots = Slots(Capacity(slots=1, queue_size=10, slots_share=1.0))
    running = slots.acquire("alice")
    served: list = []
    threads = []
    for client in ("alice", "alice", "alice", "bob", "carol"):  # alice asks three times before bob and carol
        threads.append(waiting_thread(slots, client, served))
        queued(slots, len(threads))
    running.release()
    for _ in range(5):
        assert wait_until(lambda: served and served[-1][1] is not None, 5, step=0.01)
        count = len(served)
        served[-1][1].release()
        wait_until(lambda: len(served) > count or len(served) == 5, 5, step=0.01)
    order = [client for client, _ in served]
    assert order == ["alice", "bob", "carol", "alice", "alice"], order  # in turn, each client's own in order


def test_a_waiting_request_is_told_its_place_in_the_turn_order_and_its_expected_wait():
    slots = Slots(Capacity(slots=1, queue_size=10, slots_share=1.0, retry_after=4), clock=Clock())
    running = slots.acquire("carol")
    told: dict = {}
    results: list = []

    def wait(client, key):
        def run():
            results.append(slots.acquire(client, timeout=10, on_wait=lambda p, w: told.setdefault(key, []).append((p, w))))
        thread = threading.Thread(target=run, daemon=True)
        thread.start()

    for client, key in (("alice", "a1"), ("alice", "a2"), ("bob", "b1")):
        wait(client, key)
        assert wait_until(lambda: key in told, 5, step=0.01)
    assert wait_until(lambda: told["a2"][-1][0] == 3, 3, step=0.05), told  # bob's first goes before alice's second
    assert told["a1"][-1] == (1, 4.0) and told["b1"][-1] == (2, 8.0) and told["a2"][-1] == (3, 12.0)
    running.release()  # alice's first is served: the others move up, and are told
    assert wait_until(lambda: told["b1"][-1][0] == 1 and told["a2"][-1][0] == 2, 5, step=0.05), told
    for _ in range(3):
        assert wait_until(lambda: results, 5, step=0.01)
        results.pop().release()
    assert slots.load().waiting == 0


def test_the_expected_wait_follows_when_each_held_slot_is_likely_to_free():
    clock = Clock()
    slots = Slots(Capacity(slots=3, queue_size=10, slots_share=1.0), clock=clock)
    for _ in range(4):  # four answers held a slot 6 s each: the median hold
        held = slots.acquire(None)
        clock.now += 6.0
        held.release()
    assert slots.expected_wait() == 0.0  # a slot is free
    first = slots.acquire("a")
    clock.now += 5.0
    second = slots.acquire("b")
    clock.now += 2.0
    third = slots.acquire("c")  # granted 7 s, 2 s and 0 s ago: they free in 0 (overdue), 4 and 6 s
    assert [round(slots._until(p), 3) for p in range(1, 7)] == [0.0, 4.0, 6.0, 6.0, 10.0, 12.0]
    assert slots.expected_wait() == 0.0  # the oldest is overdue: any moment now
    first.release()
    fourth = slots.acquire("d")
    assert slots.expected_wait() == 4.0  # the next to free: b's, 4 s from now
    for slot in (second, third, fourth):
        slot.release()


def test_one_client_holds_at_most_its_share_of_the_slots_and_of_the_queue():
    slots = Slots(Capacity(slots=4, queue_size=4, slots_share=0.5))
    mine = [slots.acquire("alice"), slots.acquire("alice")]
    results: list = []
    third = waiting_thread(slots, "alice", results)  # two slots free, but alice holds her share
    queued(slots, 1)
    assert slots.held_by("alice") == 2 and not results
    bob = slots.acquire("bob", timeout=0.1)  # others are served at once
    assert slots.held_by("bob") == 1
    waiting_thread(slots, "alice", results)
    queued(slots, 2)
    with pytest.raises(Busy, match=r"you already have 2 requests waiting .*at most 2 per client"):
        slots.acquire("alice", timeout=0.1)  # her share of the queue (4 × 0.5) is used up
    mine[0].release()
    third.join(5)
    assert results and results[0][0] == "alice" and slots.held_by("alice") == 2
    for slot in [mine[1], bob, results[0][1]]:
        slot.release()
    assert wait_until(lambda: len(results) == 2, 5, step=0.01)
    results[1][1].release()
    assert slots.load().busy == 0


def test_a_refusal_says_a_realistic_retry_after_from_recent_hold_times_and_the_queue():
    clock = Clock()
    slots = Slots(Capacity(slots=2, queue_size=0, retry_after=5), clock=clock)
    first, second = slots.acquire(None), slots.acquire(None)
    with pytest.raises(Busy) as before:  # nothing timed yet: the configured guess
        slots.acquire(None)
    assert before.value.retry_after == 5
    second.release()
    for seconds in (12.0, 14.0, 13.0, 13.0):  # answers took 12 to 14 s
        held = slots.acquire(None)
        clock.now += seconds
        held.release()
    other = slots.acquire(None)
    with pytest.raises(Busy) as full:
        slots.acquire(None)
    assert full.value.retry_after == 13 and "retry in 13 s" in str(full.value)
    assert slots.load().refused == {"queue_full": 2}
    for slot in (first, other):
        slot.release()

    deep_slots = Slots(Capacity(slots=2, queue_size=4, retry_after=10), clock=clock)
    held = [deep_slots.acquire(c) for c in ("a", "b")]
    results: list = []
    for client in ("c", "d", "e", "f"):
        waiting_thread(deep_slots, client, results, timeout=30)
    queued(deep_slots, 4)
    with pytest.raises(Busy) as deep:  # 4 ahead, 2 slots: 3 rounds of the 10 s guess
        deep_slots.acquire("g")
    assert deep.value.retry_after == 30
    for slot in held:
        slot.release()
    released = 0
    while released < 4:  # each waiter is served once a slot is given back
        assert wait_until(lambda: len(results) > released, 5, step=0.01)
        results[released][1].release()
        released += 1


def test_a_kept_open_sessions_turn_waits_its_turn_outside_the_full_queue():
    slots = Slots(Capacity(slots=1, queue_size=1, slots_share=1.0))
    held = slots.acquire("a")
    results: list = []
    waiting_thread(slots, "b", results)  # the queue's one place
    queued(slots, 1)
    with pytest.raises(Busy, match="1 requests are waiting"):
        slots.acquire("c", timeout=1)  # an HTTP request: refused at once
    turn: list = []
    thread = threading.Thread(target=lambda: turn.append(slots.acquire("c", timeout=5, queued=False)), daemon=True)
    thread.start()  # a WebSocket turn: waits, in turn
    queued(slots, 2)
    held.release()
    assert wait_until(lambda: results, 5, step=0.01) and results[0][0] == "b"
    results[0][1].release()
    thread.join(5)
    assert turn and turn[0].client == "c"
    turn[0].release()


def test_a_request_that_waits_too_long_leaves_the_queue_with_a_busy():
    slots = Slots(Capacity(slots=1, queue_size=2, queue_timeout=0.2))
    held = slots.acquire("a")
    began = time.monotonic()
    with pytest.raises(Busy, match="no generation slot became free within 0 s"):
        slots.acquire("b")
    assert 0.15 < time.monotonic() - began < 2
    assert slots.load().waiting == 0 and slots.load().refused == {"timeout": 1}
    held.release()
    assert slots.try_acquire("b") is not None


# ---- open sessions -----------------------------------------------------------------------------


class Member:
    def __init__(self, label):
        self.label = label
        self.expired_detail = None

    def expire(self, detail):
        self.expired_detail = detail


def test_the_least_recently_used_idle_session_makes_room_and_its_owner_is_told():
    clock = Clock()
    sessions = OpenSessions(Capacity(open_sessions=3, sessions_per_client=2), clock=clock)
    a, b, c = Member("a"), Member("b"), Member("c")
    for member, client in ((a, "alice"), (b, "bob"), (c, "carol")):
        sessions.admit(member, client)
        clock.now += 10
    sessions.set_state(a, "generating")  # alice is being answered: never taken
    d = Member("d")
    sessions.admit(d, "dave")
    assert b.expired_detail and "idle for 20 s" in b.expired_detail and a.expired_detail is None
    with pytest.raises(SessionExpired, match=r"^Session b expired: it was idle"):
        sessions.set_state(b, "waiting")  # bob's next turn: chat.petals.dev's page reopens on this
    sessions.set_state(a, IDLE)
    assert sessions.load().states == {"idle": 3, "waiting": 0, "generating": 0}
    assert sessions.load().expired == {"evicted": 1}


def test_a_client_at_its_bound_makes_room_with_its_own_idle_session_and_nobody_elses():
    sessions = OpenSessions(Capacity(open_sessions=10, sessions_per_client=2))
    first, second, other = Member("1"), Member("2"), Member("o")
    sessions.admit(other, "bob")
    sessions.admit(first, "alice")
    sessions.admit(second, "alice")
    sessions.admit(Member("3"), "alice")
    assert first.expired_detail and "2 sessions per client" in first.expired_detail
    assert other.expired_detail is None and second.expired_detail is None


def test_with_no_idle_session_a_newcomer_is_refused_and_nothing_is_taken():
    sessions = OpenSessions(Capacity(open_sessions=2, sessions_per_client=2))
    sessions.estimate_with(lambda: 9)
    busy = [Member("x"), Member("y")]
    for member in busy:
        sessions.admit(member, "alice" if member.label == "x" else "bob")
        sessions.set_state(member, "waiting")
    with pytest.raises(Busy) as refused:
        sessions.admit(Member("z"), "carol")
    assert refused.value.retry_after == 9 and "none is idle" in str(refused.value)
    assert all(m.expired_detail is None for m in busy) and sessions.load().refused == 1
