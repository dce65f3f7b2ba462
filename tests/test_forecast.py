"""Spec of the forecast's choice of evidence (pure, ``monitor.core.forecast``): a request's figures
come from the answered requests most like it — the same route at a similar load first."""

from __future__ import annotations

import time

import pytest

from monitor.core.forecast import (MIN_REQUESTS, PROBES, REQUESTS, ForecastInputs, Observed, forecast, inputs, like,
                                   loads)
from monitor.core.requests import ERROR as FAILED, OK, RequestRecord
from support import wait_until

A, B, C = "peer-a", "peer-b", "peer-c"


def record(at: float, *, waited: float = 0.0, ttft: float = 0.5, tokens: int = 11, tps: float = 10.0,
           route=((A, 0, 8),), outcome: str = OK) -> RequestRecord:
    return RequestRecord(at=at, model="m", api="openai", outcome=outcome, route=tuple(route), waited=waited,
                         time_to_first_token=ttft, tokens=tokens, tokens_per_second=tps)


def test_a_requests_load_is_the_requests_on_its_busiest_server_averaged_over_its_time():
    # each generates for ttft + (tokens - 1) / tps = 0.5 + 1.0 = 1.5 s from the end of its wait:
    # 0.0-1.5, 0.2-1.7, 1.3-2.8 (waited 0.3), 3.0-4.5; the last generated nothing (a moment at 3.1)
    records = [record(0.0), record(0.2), record(1.0, waited=0.3), record(3.0), record(3.1, ttft=None, tokens=0,
                                                                                      tps=None, outcome=FAILED)]
    # the first: the second beside it for 1.3 of its 1.5 s, the third for 0.2 — those that came while it
    # ran count as much as those there before; the fourth: alone (a moment beside it is no time);
    # the one without a first token: the fourth was generating when it came
    assert loads(records) == pytest.approx([1 + 1.5 / 1.5, 1 + 1.7 / 1.5, 1 + 0.6 / 1.5, 1.0, 2.0])
    # what counts is sharing a server, and the busiest of its servers: on B+C, the one beside it on C
    elsewhere = record(0.3, route=((B, 0, 4), (C, 4, 8)))
    beside = record(0.4, route=((C, 0, 8),))
    assert loads([*records[:3], elsewhere, beside]) == pytest.approx(
        [2.0, 1 + 1.7 / 1.5, 1 + 0.6 / 1.5, 1 + 1.4 / 1.5, 1 + 1.4 / 1.5])
    # one without a route shares a server with every other
    unknown = record(0.3, route=())
    assert loads([records[0], unknown])[1] == pytest.approx(1 + 1.2 / 1.5)


def test_the_evidence_is_the_same_route_at_a_similar_load_then_wider():
    fast = [Observed(route=(B, C), load=16, time_to_first_token=0.3, tokens_per_second=4.8)] * MIN_REQUESTS
    slow = [Observed(route=(A,), load=16, time_to_first_token=0.9, tokens_per_second=0.8)] * MIN_REQUESTS
    alone = [Observed(route=(A,), load=1, time_to_first_token=0.1, tokens_per_second=12.0)] * MIN_REQUESTS
    observed = fast + slow + alone
    assert like(observed, route=(A,), load=15) == slow  # 15 is within 25 % of 16
    assert like(observed, route=(B, C), load=16) == fast
    assert like(observed, route=(A,), load=1) == alone
    assert like(observed, route=(B, C), load=1) == alone  # no such route alone: a similar load on any route
    assert like(observed, route=(B, C), load=8) == fast  # nobody at 8: the same route at any load
    assert like(observed, route=("unknown",), load=8) == observed  # nothing alike: all of them
    assert like(observed, route=None, load=None) == observed
    assert like(fast[:2] + slow, route=(B, C), load=16) == fast[:2] + slow  # two are too few to rest on

    known = ForecastInputs("m", requests=len(observed), time_to_first_token=0.3, tokens_per_second=4.8,
                           observed=tuple(observed))
    got = forecast(known, wait=0.0, prompt_tokens=10, max_tokens=33, load=16, route=(A,))
    assert (got.source, got.based_on, got.tokens_per_second, got.time_to_first_token) == (REQUESTS, 5, 0.8, 0.9)
    assert got.total == pytest.approx(0.9 + 32 / 0.8)


def test_a_forecast_says_what_eight_in_ten_requests_alike_got():
    alike = [Observed(route=(A,), load=4, time_to_first_token=0.1 * i, tokens_per_second=float(i)) for i in range(1, 11)]
    got = forecast(ForecastInputs("m", observed=tuple(alike)), wait=0.0, prompt_tokens=5, max_tokens=10, load=4,
                   route=(A,))
    assert (got.tokens_per_second, got.time_to_first_token) == (5.0, pytest.approx(0.5))  # the medians
    assert got.tokens_per_second_range == (1.0, 9.0)  # the 10th and 90th percentiles (nearest rank) of ten
    assert got.time_to_first_token_range == pytest.approx((0.1, 0.9))
    assert got.to_dict()["tokens_per_second_range"] == [1.0, 9.0]
    # from the probes, or nothing: no requests to spread over
    probes = forecast(ForecastInputs("m", est_tokens_per_s=5.0), wait=0, prompt_tokens=1, max_tokens=2, load=1)
    assert probes.tokens_per_second_range is None and probes.to_dict()["time_to_first_token_range"] is None


def test_inputs_keep_each_answered_request_with_its_route_and_load():
    records = [record(0.0, route=((A, 0, 4), (B, 4, 8))), record(0.2), record(0.4, outcome=FAILED, ttft=None,
                                                                             tokens=0, tps=None)]
    known = inputs("m", records, None, now=10.0)
    assert known.requests == 2 and [o.route for o in known.observed] == [(A, B), (A,)]
    assert [o.load for o in known.observed] == pytest.approx([1 + 1.3 / 1.5, 1 + 1.3 / 1.5])
    # too few answered requests: the probes' estimate, as before
    assert forecast(ForecastInputs("m", est_tokens_per_s=5.0), wait=0, prompt_tokens=1, max_tokens=2,
                    load=1, route=(A,)).source == PROBES


def test_forecasts_are_read_again_soon_after_this_process_stored_rows_of_its_own():
    from chat.feedback import StoreForecasts, StoreRequests

    class Store:
        reads = 0

        def latest_assessments(self):
            return {}

        def requests_since(self, since, *, model):
            Store.reads += 1
            return [record(time.time() - 1.0)]

        def record_requests(self, rows):
            pass

    store = Store()
    forecasts = StoreForecasts(store, ["m"], period=3600, min_gap=0.3).start()
    rows = StoreRequests(store, period=3600, on_written=forecasts.refresh_soon)
    try:
        assert forecasts.refreshes == 1 and forecasts()["m"].model == "m"
        assert rows.flush() == 0 and forecasts.refreshes == 1  # nothing written: nothing to read again
        rows(record(time.time()))
        started = time.monotonic()
        assert rows.flush() == 1
        rows(record(time.time()))
        rows.flush()  # twice within min_gap: read again once, min_gap after the last read
        assert wait_until(lambda: forecasts.refreshes == 2, 5, step=0.01)
        assert time.monotonic() - started < 3600 and Store.reads == 2
        time.sleep(0.5)
        assert forecasts.refreshes == 2
    finally:
        forecasts.close()
        rows.close()


def test_a_follow_up_s_forecast_rests_on_what_continued_requests_got():
    """A follow-up that continues its kept session sends only its new tokens: its first token is
    forecast from the requests that continued, a fresh request's from the fresh ones (each when there
    are enough of them), and the stored rows say which was which."""
    fresh = [Observed(route=(A,), load=1, time_to_first_token=4.0, tokens_per_second=10.0)] * MIN_REQUESTS
    continued = [Observed(route=(A,), load=1, time_to_first_token=0.2, tokens_per_second=10.0, continued=True)] \
        * MIN_REQUESTS
    known = ForecastInputs("m", requests=2 * MIN_REQUESTS, observed=tuple(fresh + continued))
    assert forecast(known, wait=0, prompt_tokens=900, max_tokens=80, route=(A,), load=1,
                    continued=True).time_to_first_token == 0.2
    assert forecast(known, wait=0, prompt_tokens=900, max_tokens=80, route=(A,), load=1,
                    continued=False).time_to_first_token == 4.0
    few = ForecastInputs("m", requests=MIN_REQUESTS + 1, observed=tuple(fresh + continued[:1]))
    assert forecast(few, wait=0, prompt_tokens=900, max_tokens=80, route=(A,), load=1,
                    continued=True).time_to_first_token == 4.0  # (too few continued: all of them)
    now = time.time()
    rows = [RequestRecord(at=now - 10, model="m", api="openai", outcome=OK, time_to_first_token=0.2, tokens=8,
                          tokens_per_second=9.0, follow_up=True, continued=True, tokens_not_resent=500),
            RequestRecord(at=now - 5, model="m", api="openai", outcome=OK, time_to_first_token=3.0, tokens=8,
                          tokens_per_second=9.0)]
    assert [o.continued for o in inputs("m", rows, None, now=now).observed] == [True, False]


def test_a_forecast_s_cache_room_is_what_one_session_may_hold_on_every_block():
    """Petals announces ``cache_tokens_left`` over one block's keys, and a session keeps the keys
    and values of every block it runs on a server: one announcing 16,384 over its 8 blocks holds a
    session of 1,024 tokens, not 16,384 — the forecast says the caches are nearly full beyond that."""
    import dataclasses

    from monitor.core.coverage import block_coverage
    from support import STORE_LLAMA, store_health, store_row

    rows = [store_row("a", cache_tokens_left=16_384)]  # 8 blocks
    known = inputs(STORE_LLAMA.dht_prefix, [], dataclasses.replace(store_health(STORE_LLAMA, "healthy"),
                                                                   blocks=block_coverage(STORE_LLAMA, rows)), now=10.0)
    assert known.session_room == 1024
    assert forecast(known, wait=0, prompt_tokens=24, max_tokens=1000).cache_room is True
    assert forecast(known, wait=0, prompt_tokens=24, max_tokens=1001).cache_room is False
    known = inputs(STORE_LLAMA.dht_prefix, [], store_health(STORE_LLAMA, "healthy"), now=10.0)  # nothing announced
    assert known.session_room is None and forecast(known, wait=0, prompt_tokens=24, max_tokens=1001).cache_room is None


def test_a_request_that_will_wait_is_forecast_on_any_route_at_that_load_not_the_route_planned_now():
    """One that waits for a slot takes a leaver's place, on whichever route frees first: the chat
    forecasts it from requests alike on any route (the forecast bench's queued condition: 177 of the
    181 requests that took the slower route had been forecast on the faster one planned when they
    asked, 20 % too fast). One that starts at once is forecast on its route."""
    from chat.admission import Admission
    from chat.capacity import Capacity, Slots
    from chat.server_load import ServerLoad
    from swarm_monitor_client.policy import RoutingSettings

    fast = [Observed(route=(A,), load=2.0, time_to_first_token=0.3, tokens_per_second=5.0) for _ in range(10)]
    slow = [Observed(route=(B, C), load=2.0, time_to_first_token=0.4, tokens_per_second=4.0) for _ in range(10)]
    known = ForecastInputs("m", requests=20, observed=tuple(fast + slow))
    slots, server_load = Slots(Capacity(slots=2, slots_share=1.0)), ServerLoad()
    admission = Admission(None, slots, server_load, routing=RoutingSettings(), forecast_source=lambda: {"m": known})
    held = slots.try_acquire("someone")
    server_load.enter([A])
    at_once = admission._forecast("m", 10, 32, [A])
    assert at_once.wait == 0 and at_once.tokens_per_second == 5.0  # its route, beside the one there
    other = slots.try_acquire("another")
    assert held is not None and other is not None and slots.expected_wait() > 0
    queued = admission._forecast("m", 10, 32, [A])
    assert queued.wait > 0 and 4.0 <= queued.tokens_per_second < 5.0  # any route
