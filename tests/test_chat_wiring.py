"""Specs of the chat as the service wires it to the monitor's store: what an operator sets on a
peer's page, what the poller last saw of a model, and the chat's queue — through the real store,
the real web app and the session swarm (no hand-written weights or checks)."""

from __future__ import annotations

import threading
import time

import pytest

from chat.engine import Busy, ChatEngine, Finished, GenerationParams
from chat.feedback import StoreWeights, store_coverage_check, store_outcome_sink
from chat.http import create_blueprint
from chat.policy import RoutingSettings
from monitor.app.settings import ModelConfig, Settings
from monitor.core.coverage import diagnose
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
                        coverage_check=store_coverage_check(store), routing=RoutingSettings(mode="health"),
                        max_sessions=1, queue_size=1, queue_timeout=60, retry_after=3)
    settings = Settings(data_dir=data_dir, chat_rate_limit="1000 per minute")
    app = create_app(settings, store, chat_blueprints=[create_blueprint(engine)])
    yield app, store, weights, engine
    engine.close()
    weights.close()
    store.close()


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
        while engine._gate.waiting < 1 and time.monotonic() < deadline:  # (the gate's own counter)
            time.sleep(0.05)
        assert engine._gate.waiting == 1
        with pytest.raises(Busy):
            engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=2))
        response = app.test_client().post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "Hi"})
        assert response.status_code == 429 and int(response.headers["Retry-After"]) > 0
    finally:
        with running:
            list(running)
        waiter.join(60)
    assert waited and waited[0], "the queued request was answered once the place was free"
