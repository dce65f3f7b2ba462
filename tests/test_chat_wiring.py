"""Specs of the chat as the service wires it to the monitor's store: what an operator sets on a
peer's page, what the poller last saw of a model, and the chat's queue — through the real store,
the real web app and the session swarm (no hand-written weights or checks)."""

from __future__ import annotations

import threading
import time

import pytest

from chat.engine import Busy, ChatEngine, Finished, GenerationParams
from chat.feedback import StoreWeights, store_assessment_check, store_outcome_sink
from chat.http import create_blueprint
from chat.policy import EXPLORE_EVERY, RoutingSettings
from monitor.settings import ModelConfig, Settings
from monitor.swarm.routing import diagnose
from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow, Snapshot
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.store import Store
from monitor.web import create_app

TINY = ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS, official=True)


@pytest.fixture(scope="module")
def wired(swarm, tiny_model, tmp_path_factory):
    """(app, store, weights, engine) as monitor.app.service wires them, one chat at a time, one waiting."""
    data_dir = tmp_path_factory.mktemp("wired")
    store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
    store.migrate()
    weights = StoreWeights(store, period=3600).start()  # refreshed by hand below, as after an outcome
    engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        score_source=weights, outcome_sink=store_outcome_sink(store, weights),
                        assessment_check=store_assessment_check(store), routing=RoutingSettings(mode="health"),
                        slots=1, queue_size=1, queue_timeout=60, retry_after=3)
    settings = Settings(data_dir=data_dir, chat_rate_limit="1000 per minute")
    app = create_app(settings, store, chat_blueprints=[create_blueprint(engine)])
    yield app, store, weights, engine
    engine.close()
    weights.close()
    store.close()


def operator(app) -> dict:
    """What a script sends as the operator: the token the app created in its data directory."""
    settings = app.extensions["swarm_monitor"].settings
    return {"Authorization": f"Bearer {(settings.data_dir / 'admin_token').read_text().strip()}"}


def routes(swarm, manager, tries: int = 2 * EXPLORE_EVERY) -> set[tuple]:
    """Every distinct route the chat's sequence manager chose over ``tries`` routes of each kind:
    inference (min_latency: what a chat session asks for) and forward passes (max_throughput), by
    server name. Health routing explores one route in EXPLORE_EVERY and picks forward routes at
    random, so one route proves little: 2 × EXPLORE_EVERY of each cover an exploring one."""
    names = {swarm.peer_id(n): n for n in ("first-half", "second-half", "full")}
    chosen = set()
    for mode in ("min_latency", "max_throughput"):
        for _ in range(tries):
            chosen.add(tuple((names[s.peer_id.to_base58()], s.start, s.end)
                             for s in manager.make_sequence(0, TINY_NUM_BLOCKS, mode=mode)))
    return chosen


def routed_over(swarm, manager) -> set[str]:
    """The servers the manager's view of the swarm keeps as candidates for any route."""
    names = {swarm.peer_id(n): n for n in ("first-half", "second-half", "full")}
    with manager.lock_changes:
        return {names[span.peer_id.to_base58()] for span in manager.state.sequence_info.spans_by_priority}


def test_pins_and_blocks_set_on_a_peers_page_reach_the_chats_routes_through_the_store(wired, swarm):
    """The operator's form posts to /peers/<id>/policy; the store keeps the policy; the chat's
    weights (StoreWeights, refreshed from the store) carry it; the sequence manager applies it at
    its next refresh of the swarm. Refreshes are triggered here instead of waited for."""
    app, store, weights, engine = wired
    client = app.test_client()
    full, first, second = (swarm.peer_id(n) for n in ("full", "first-half", "second-half"))
    halves = (("first-half", 0, 4), ("second-half", 4, 8))
    manager = engine.sequence_manager(TINY_DHT_PREFIX)

    def set_policy(peer: str, policy: str) -> None:
        response = client.post(f"/peers/{peer}/policy", data={"policy": policy}, headers=operator(app))
        assert response.status_code == 303, response.get_data(as_text=True)

    def chat_sees_the_store() -> None:  # as StoreWeights' thread and petals' update_period would
        weights.refresh()
        # a refresh of the swarm view that begins after this call reads the weights (one in flight
        # may have begun before the policy changed: missing_blocks waits for the next)
        assert manager.missing_blocks(refresh=True) == []

    try:
        chat_sees_the_store()
        assert routed_over(swarm, manager) == {"first-half", "second-half", "full"}

        # a visitor without the operator's token changes nothing
        assert client.post(f"/peers/{full}/policy", data={"policy": "blocked"}).status_code in (401, 403)
        assert store.peer_policies() == {}

        set_policy(full, "blocked")
        assert store.peer_policies() == {full: "blocked"}
        chat_sees_the_store()
        assert weights()[full].policy == "blocked"
        assert routed_over(swarm, manager) == {"first-half", "second-half"}
        assert routes(swarm, manager) == {halves}  # never through full, in either kind of route
        assert engine.admission.status(TINY_DHT_PREFIX).served  # the halves still serve every block

        set_policy(full, "pinned")  # replaces the block: only full now
        chat_sees_the_store()
        assert store.peer_policies() == {full: "pinned"} and weights()[full].policy == "pinned"
        assert routes(swarm, manager) == {(("full", 0, 8),)}

        set_policy(full, "")
        set_policy(first, "pinned")
        set_policy(second, "pinned")
        chat_sees_the_store()
        assert store.peer_policies() == {first: "pinned", second: "pinned"}
        assert routes(swarm, manager) == {halves}  # pinned beats petals' one-hop preference for full

        set_policy(first, "")
        set_policy(second, "")
        chat_sees_the_store()
        assert store.peer_policies() == {} and all(w.policy is None for w in weights().values())
        assert routed_over(swarm, manager) == {"first-half", "second-half", "full"}
    finally:  # the other specs of this module route over the whole swarm
        for peer in (full, first, second):
            store.set_peer_policy(peer, None)
        weights.refresh()  # (no assertion here: it would hide the failure that got us here)
        manager.missing_blocks(refresh=True)


def test_a_model_the_poller_stored_as_broken_is_refused_before_generation(wired, swarm):
    app, store, _, _ = wired
    half = ServerRow(swarm.peer_id("first-half"), TINY_DHT_PREFIX, 0, TINY_NUM_BLOCKS // 2, ONLINE, throughput=50.0)
    snapshot = Snapshot(taken_at=time.time(), duration=0.1, models=(TINY,), servers=(half,))
    health = diagnose(TINY, [half], {})
    assert health.state == "broken"
    outcomes_before = len(store.recent_chat_outcomes(0))
    try:
        store.record_poll(snapshot, [health])
        response = app.test_client().post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "Hi",
                                                                   "max_tokens": 2})
        assert response.status_code == 503
        assert "4:8" in response.get_json()["error"]["message"]  # names the missing blocks
        assert len(store.recent_chat_outcomes(0)) == outcomes_before  # no generation was attempted
    finally:  # the model is served again for the other specs
        full = ServerRow(swarm.peer_id("full"), TINY_DHT_PREFIX, 0, TINY_NUM_BLOCKS, ONLINE, throughput=100.0)
        healthy = Snapshot(taken_at=time.time(), duration=0.1, models=(TINY,), servers=(half, full))
        store.record_poll(healthy, [diagnose(TINY, [half, full], {})])


def test_a_request_waits_in_the_chat_queue_and_the_one_past_it_gets_429(wired):
    app, _, _, engine = wired
    ids = engine.encode(TINY_DHT_PREFIX, "Hello")
    running = engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2))  # holds the one place
    waited: list = []

    def queued():
        with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2)) as answer:
            waited.append([e for e in answer if isinstance(e, Finished)])

    waiter = threading.Thread(target=queued)
    try:
        waiter.start()
        deadline = time.monotonic() + 10
        while engine.load().slots.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.load().slots.waiting == 1
        with pytest.raises(Busy):
            engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2))
        response = app.test_client().post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "Hi"})
        assert response.status_code == 429 and int(response.headers["Retry-After"]) > 0
    finally:
        with running:
            list(running)
        waiter.join(60)
    assert waited and waited[0], "the queued request was answered once the place was free"
