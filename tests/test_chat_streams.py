"""Spec: the chat's one stream from worker threads to the request's thread (``chat.streams``), and
its one context-length check (``chat.errors.check_fits_context``). Pure: threads and events only."""

from __future__ import annotations

import threading
import time

import pytest

from chat.decoding import Delta
from chat.errors import GenerationFailed, InvalidRequest, check_fits_context
from chat.streams import ThreadStream


def test_every_producer_s_items_arrive_in_order_and_the_stream_ends_when_all_are_done():
    def producer(tag: str, n: int):
        def produce(emit, cancelled):
            for i in range(n):
                emit((tag, i))
        return produce

    stream = ThreadStream([producer("a", 50), producer("b", 30)], name="spec")
    got = list(stream.items(stall_timeout=5))
    stream.close(5)
    assert [i for tag, i in got if tag == "a"] == list(range(50))
    assert [i for tag, i in got if tag == "b"] == list(range(30))


def test_a_producer_s_failure_is_raised_in_the_consumer_through_as_error():
    def produce(emit, cancelled):
        emit(1)
        raise RuntimeError("the server answered with an error")

    stream = ThreadStream([produce], name="spec")
    items = stream.items(stall_timeout=5, as_error=lambda e: GenerationFailed(f"failed: {e}"))
    assert next(items) == 1
    with pytest.raises(GenerationFailed, match="failed: the server answered"):
        next(items)
    stream.close(5)


def test_a_stalled_producer_makes_the_consumer_give_up_and_close_stops_it():
    stopped = threading.Event()

    def produce(emit, cancelled):
        cancelled.wait(30)  # a swarm that sends nothing, until the consumer leaves
        stopped.set()

    stream = ThreadStream([produce], name="spec")
    started = time.monotonic()
    with pytest.raises(GenerationFailed, match="no token"):
        list(stream.items(stall_timeout=0.3, on_stall=lambda: GenerationFailed("no token for 0.3 s")))
    assert time.monotonic() - started < 5
    stream.close(5)
    assert stopped.is_set()


@pytest.mark.parametrize("tokens, context, fits", [(0, 8, True), (7, 8, True), (8, 8, False), (10**9, 8, False)])
def test_one_context_check_names_the_parameter_and_the_figures(tokens, context, fits):
    if fits:
        check_fits_context("prompt", tokens, context)
        return
    with pytest.raises(InvalidRequest) as refused:
        check_fits_context("messages", tokens, context, what="the prompt", hint="shorten it")
    assert refused.value.param == "messages"
    assert f"the prompt is {tokens} tokens; the model's context is {context} tokens, so at most 7 fit; shorten it" \
        == str(refused.value)


# -- the one place a slot is taken and given back (chat.capacity.Slots.take, InSlot) -------------
class _Group:
    """A group's session as BatchAnswer drives it: rows' events, then Finished per row (or a failure)."""

    def __init__(self, rows, fail=False, release=None):
        self.rows, self.fail, self.release, self.closed = rows, fail, release, False

    def generate_rows(self, rows, params, stop_event=None):
        for index in range(len(rows)):
            if self.release is not None:
                self.release.wait(5)
            if self.fail:
                raise GenerationFailed("the swarm's servers failed")
            yield index, Delta(text="x", token_count=1)
        for index in range(len(rows)):
            yield index, "finished"

    def close(self):
        self.closed = True


def _batch(slots, groups, fail=False, release=None):
    from chat.decoding import GenerationParams
    from chat.request import BatchAnswer, Group

    opened = []

    def open_group(prompts, params):  # (a group's session, and the input it goes on with)
        opened.append(_Group(prompts, fail, release))
        return opened[-1], prompts

    planned: list[Group] = [(indices, [[1]] * len(indices), GenerationParams(max_new_tokens=1)) for indices in groups]
    return BatchAnswer(open_group, planned, slots.take(None, wanted=len(planned))), opened


def _slots(n):
    from chat.capacity import Capacity, Slots

    return Slots(Capacity(slots=n))


def test_an_answer_never_iterated_gives_its_slot_back_when_closed():
    slots = _slots(2)
    batch, opened = _batch(slots, [[0]])
    assert slots.load().busy == 1
    batch.close()
    assert slots.load().busy == 0 and opened == []  # nothing was computed


def test_a_batch_in_several_slots_gives_each_back_as_its_groups_end():
    slots = _slots(4)
    release = threading.Event()
    batch, opened = _batch(slots, [[0, 1], [2], [3, 4, 5]], release=release)
    assert slots.load().busy == 3
    release.set()
    events = list(batch)
    assert sorted(row for row, event in events if event == "finished") == [0, 1, 2, 3, 4, 5]
    deadline = time.monotonic() + 5
    while slots.load().busy and time.monotonic() < deadline:  # each producer gives its own back as it ends
        time.sleep(0.01)
    assert slots.load().busy == 0 and all(group.closed for group in opened)
    batch.close()
    assert slots.load().busy == 0


def test_a_failing_group_and_a_consumer_that_leaves_give_their_slots_back():
    slots = _slots(2)
    batch, opened = _batch(slots, [[0]], fail=True)
    with pytest.raises(GenerationFailed):
        list(batch)
    assert slots.load().busy == 0 and opened[0].closed
    release = threading.Event()
    batch, opened = _batch(slots, [[0], [1, 2]], release=release)
    assert slots.load().busy == 2
    release.set()
    next(iter(batch))
    batch.close()  # the consumer left after one event
    assert slots.load().busy == 0


def test_slots_are_taken_and_given_back_in_one_place_each():
    """No chat module but chat.capacity calls acquire/try_acquire (Slots.take does) or release (InSlot does)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    calls: dict[str, list[str]] = {"acquire": [], "try_acquire": [], "release": []}
    for path in sorted((root / "chat").rglob("*.py")):  # (the monitor's leases acquire and release too)
        tree = ast.parse(path.read_text())
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(scope):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in calls and "lock" not in ast.unparse(node.func.value).lower():
                    calls[node.func.attr].append(f"{path.relative_to(root)}:{scope.name}")
    assert set(calls["acquire"]) | set(calls["try_acquire"]) == {"chat/capacity.py:take"}, calls
    assert set(calls["release"]) == {"chat/capacity.py:close"}, calls
