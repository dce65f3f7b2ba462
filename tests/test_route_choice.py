"""Spec: a request's own routing choices (``monitor.core.route_choice``, the ``petals`` object of the
OpenAI API and the same fields of chat.petals.dev's ``open_inference_session``), the ``models`` list
to fall back on, and load spread over the servers (``chat.server_load``).

On the session swarm (first-half 0:4, second-half 4:8, full 0:8): every constraint honoured in
every route taken — read back from the stored request rows — a choice nobody meets refused with a
422 naming it and what the swarm offers, bad values with a 400 naming the field, a broken model
giving way to the next, directed requests bounded per server, and sessions longer than a server
accepts sent to others. The choices decided without a swarm: ``test_route_choice_rules.py``.
"""

from __future__ import annotations

import time

import pytest

from chat.engine import ChatEngine, GenerationParams
from chat.policy import RoutingSettings
from monitor.core.requests import OK
from monitor.core.route_choice import (
    RouteChoice,
)
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from support import chat_app, wait_until

# ---- on the session swarm --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat(swarm, tiny_model, tmp_path_factory):
    models = [ModelConfig(dht_prefix="absent-model", path=tiny_model),  # announced by no server
              ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)]
    with chat_app(swarm, models, tmp_path_factory.mktemp("route-choice"),
                  slots=4, queue_size=4, queue_timeout=10, retry_after=1) as chat:
        yield chat


def completion(app, petals=None, **extra):
    body = {"model": TINY_DHT_PREFIX, "prompt": "Hello", "max_tokens": 4, **extra}
    if petals is not None:
        body["petals"] = petals
    return app.test_client().post("/v1/completions", json=body)


def test_every_route_taken_honours_the_request_s_choices(chat, swarm):
    engine, store, rows, app = chat
    full, first, second = (swarm.peer_id(n) for n in ("full", "first-half", "second-half"))
    started = time.time()
    asked = [{"only": [full]}, {"only": [first, second]}, {"ignore": [full]}, {"ignore": [first], "sort": "score"},
             {"sort": "latency"}, {"sort": "speed", "allow_fallbacks": False}]
    for choice in asked:
        done = completion(app, choice)
        assert done.status_code == 200, (choice, done.get_data(as_text=True))
        hops = {hop["peer_id"] for hop in done.get_json()["petals"]["route"]}
        assert hops and (not choice.get("only") or hops <= set(choice["only"])) and not hops & set(choice.get("ignore", ()))
    rows.flush()
    stored = [r for r in store.requests_since(started - 1, model=TINY_DHT_PREFIX) if r.outcome == OK]
    assert len(stored) == len(asked)
    for record, choice in zip(stored, asked):  # the stored rows say the same of every route
        peers = {peer for peer, _, _ in record.route}
        assert not choice.get("only") or peers <= set(choice["only"]), (choice, record.route)
        assert not peers & set(choice.get("ignore", ())), (choice, record.route)
        assert {(s, e) for _, s, e in record.route} in ({(0, 8)}, {(0, 4), (4, 8)})


def test_a_choice_nobody_meets_is_a_422_naming_it_and_what_the_swarm_offers(chat, swarm):
    engine, store, rows, app = chat
    first = swarm.peer_id("first-half")
    gap = completion(app, {"only": [first]})
    assert gap.status_code == 422, gap.get_data(as_text=True)
    error = gap.get_json()["error"]
    assert error["param"] == "petals.only" and "blocks 4:8" in error["message"] and "serves them through" in error["message"]
    fast = completion(app, {"min_tokens_per_s": 100000})
    assert fast.status_code == 422 and fast.get_json()["error"]["param"] == "petals.min_tokens_per_s"
    assert "expected at" in fast.get_json()["error"]["message"]
    unverified = completion(app, {"verified_only": True})  # nobody's correctness probes known to this chat
    assert unverified.status_code == 422 and unverified.get_json()["error"]["param"] == "petals.verified_only"
    for bad, field in (({"sort": "fastest"}, "petals.sort"), ({"only": ["x"]}, "petals.only"),
                       ({"max_time_to_first_token": -1}, "petals.max_time_to_first_token"), ("all", "petals")):
        refused = completion(app, bad)
        assert refused.status_code == 400 and refused.get_json()["error"]["param"] == field, refused.get_json()
    estimate = app.test_client().post("/v1/estimate", json={"model": TINY_DHT_PREFIX, "prompt": "Hi", "max_tokens": 4,
                                                            "petals": {"only": [first]}}).get_json()
    assert estimate["petals"]["route_choice"]["meets"] is False
    assert estimate["petals"]["route_choice"]["param"] == "petals.only"


def test_a_broken_model_gives_way_to_the_next_of_models(chat):
    engine, store, rows, app = chat
    client = app.test_client()
    alone = client.post("/v1/completions", json={"model": "absent-model", "prompt": "Hi", "max_tokens": 3})
    assert alone.status_code == 503
    started = time.perf_counter()
    done = client.post("/v1/completions", json={"model": "absent-model", "models": [TINY_DHT_PREFIX],
                                                "prompt": "Hi", "max_tokens": 3})
    assert done.status_code == 200, done.get_data(as_text=True)
    body = done.get_json()
    assert body["model"] == TINY_DHT_PREFIX and body["petals"]["fallbacks"][0]["model"] == "absent-model"
    assert body["petals"]["fallbacks"][0]["status"] == 503
    assert time.perf_counter() - started < 30
    unknown = client.post("/v1/completions", json={"model": "absent-model", "models": ["nope"], "prompt": "Hi"})
    assert unknown.status_code == 400 and unknown.get_json()["error"]["param"] == "models[0]"


def test_directed_requests_are_bounded_per_server_and_load_spreads_routes(chat, swarm):
    engine, store, rows, app = chat
    full, first, second = (swarm.peer_id(n) for n in ("full", "first-half", "second-half"))
    limit = engine.server_load.directed_limit
    engine.server_load.enter([full] * limit, directed=True)  # as many directed requests in flight through it
    try:
        busy = completion(app, {"only": [full]})
        assert busy.status_code == 429 and "share" in busy.get_json()["error"]["message"]
        assert completion(app, {"ignore": [first]}).status_code == 200  # undirected requests still go
    finally:
        engine.server_load.leave([full] * limit, directed=True)
    params = GenerationParams(max_new_tokens=3)
    engine.server_load.enter([first, second] * 50)  # the halves busy: the route goes through full
    try:
        with engine.answer(TINY_DHT_PREFIX, [1, 2, 3], params) as answer:
            route = list(answer)[-1].route
        assert [hop.peer_id for hop in route] == [full], route
    finally:
        engine.server_load.leave([first, second] * 50)
    engine.server_load.enter([full] * 50)  # full busy: the halves
    try:
        with engine.answer(TINY_DHT_PREFIX, [1, 2, 3], params) as answer:
            route = list(answer)[-1].route
        assert [hop.peer_id for hop in route] == [first, second], route
    finally:
        engine.server_load.leave([full] * 50)
    assert engine.server_load.in_flight() == {}  # every session counted itself out


def test_the_operator_s_block_bounds_every_choice(swarm, tiny_model):
    full = swarm.peer_id("full")
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], slots=1,
                        routing=RoutingSettings(blocked=(full,)))
    try:
        from chat.errors import RouteUnmet

        with pytest.raises(RouteUnmet) as e:
            engine.answer(TINY_DHT_PREFIX, [1, 2, 3], GenerationParams(max_new_tokens=2),
                          choice=RouteChoice(only=(full,)))
        assert e.value.param == "petals.only"
    finally:
        engine.close()


# ---- the longest session each server accepts -------------------------------------------------------


def test_sessions_longer_than_a_server_accepts_go_to_others_then_are_refused_naming_the_limit(make_swarm, tiny_model):
    from monitor.harness.local_swarm import ServerSpec
    from monitor.harness.tiny_model import TINY_NUM_BLOCKS

    swarm = make_swarm([ServerSpec("short", 0, TINY_NUM_BLOCKS, throughput=1000.0, inference_max_length=48),
                        ServerSpec("long", 0, TINY_NUM_BLOCKS, throughput=10.0)])
    short, long = swarm.peer_id("short"), swarm.peer_id("long")
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], slots=2)
    try:
        from chat.errors import SessionTooLong

        prompt = list(range(1, 31))
        with pytest.raises(SessionTooLong) as refused:  # only the short one: its refusal, then nobody left
            with engine.answer(TINY_DHT_PREFIX, prompt, GenerationParams(max_new_tokens=50),
                               choice=RouteChoice(only=(short,))) as answer:
                list(answer)
        assert refused.value.param == "max_tokens" and "at most 48 tokens" in str(refused.value)
        assert engine.server_limits.known() == {short: 48}  # learned from its refusal, not banned as failing
        manager = engine.sequence_manager(TINY_DHT_PREFIX)
        assert next(s.peer_id for s in manager.state.sequence_info.spans_by_priority
                    if s.peer_id.to_base58() == short) not in manager.state.banned_peers
        for _ in range(3):  # long sessions now go to the server that takes them, at once
            with engine.answer(TINY_DHT_PREFIX, prompt, GenerationParams(max_new_tokens=50)) as answer:
                finished = list(answer)[-1]
            assert finished.completion_tokens == 50 and [hop.peer_id for hop in finished.route] == [long]
        with engine.answer(TINY_DHT_PREFIX, prompt[:10], GenerationParams(max_new_tokens=8),
                           choice=RouteChoice(only=(short,))) as answer:
            assert [hop.peer_id for hop in list(answer)[-1].route] == [short]  # short sessions still go there
        swarm.stop("long")
        assert wait_until(lambda: long not in {s.peer_id.to_base58() for s in manager.state.sequence_info.spans_by_priority}
                          if not manager.missing_blocks(refresh=True) else False, 60)
        started = time.perf_counter()
        with pytest.raises(SessionTooLong) as refused:
            engine.answer(TINY_DHT_PREFIX, prompt, GenerationParams(max_new_tokens=50))
        assert time.perf_counter() - started < 1  # refused before any slot, from what was learned
        assert refused.value.param == "max_tokens" and refused.value.longest == 48
        assert "at most 48 tokens" in str(refused.value) and "at most 18 new tokens" in str(refused.value)
    finally:
        engine.close()


def test_a_route_counts_in_the_load_from_the_moment_it_is_chosen(chat, monkeypatch):
    """Requests that arrive together each see the routes the others chose: a route counts while its
    sessions are still opening (servers' handshakes take a while under load), not only once open."""
    from chat.sequence import TimedInferenceSession

    engine = chat[0]
    seen = []
    opening = TimedInferenceSession._enter_server_sessions

    def observed(self, chosen_spans):
        seen.append(engine.server_load.in_flight())  # as another request choosing now would see it
        return opening(self, chosen_spans)

    monkeypatch.setattr(TimedInferenceSession, "_enter_server_sessions", observed)
    with engine.answer(TINY_DHT_PREFIX, [1, 2, 3], GenerationParams(max_new_tokens=3)) as answer:
        route = list(answer)[-1].route
    assert seen and seen[0] == {hop.peer_id: 1 for hop in route}, (seen, route)
    assert engine.server_load.in_flight() == {}  # and out again when it closes
