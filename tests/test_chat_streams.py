"""Spec: the chat's one stream from worker threads to the request's thread (``chat.streams``), and
its one context-length check (``chat.errors.check_fits_context``). Pure: threads and events only."""

from __future__ import annotations

import threading
import time

import pytest

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
