"""Spec: several chat workers share what they put on each server (``chat/shared_load.py``) through a
real Redis server on 127.0.0.1 — one worker's requests in flight, directed requests and full-cache
cool-downs price the other's routes within a period or two; a worker that dies stops counting when
its lease ends, with nobody cleaning up; a record out of shape costs only itself; and the chat's
rate limits, counted in the same Redis, hold for a client over every worker.

The ledgers here beat every 0.2 s with a lease of 2 s (the defaults: 1 s and 10 s), to keep the
spec short; the same code runs at the defaults."""

from __future__ import annotations

import json
import time

import pytest

from chat.server_load import FULL_FACTOR, LOAD_WEIGHT, ServerLoad
from chat.shared_load import LEASE, MAX_PEERS, PREFIX, WORKERS_KEY, SharedLedger, merge, parse, record
from support import wait_until

PERIOD, SHORT_LEASE = 0.2, 2.0
ROOMS = {"peer-a": None, "peer-b": None}


def ledger(url: str, name: str) -> tuple[ServerLoad, SharedLedger]:
    load = ServerLoad(directed_limit=1)
    return load, SharedLedger(url, load, worker=name, period=PERIOD, lease=SHORT_LEASE).start()


def test_one_worker_s_load_prices_the_other_s_routes_and_a_dead_worker_stops_counting_at_its_lease(redis_url):
    one, first = ledger(redis_url, "worker-1")
    two, second = ledger(redis_url, "worker-2")
    try:
        assert two.factors(ROOMS, 100) == {"peer-a": 1.0, "peer-b": 1.0}
        one.enter(["peer-a"], directed=True)  # a directed request through peer-a, on worker 1
        assert wait_until(lambda: two.factors(ROOMS, 100)["peer-a"] == 1.0 + LOAD_WEIGHT, 3, step=0.05)
        assert two.in_flight() == {"peer-a": 1} and two.directed_full(["peer-a"])  # its share, over both workers
        assert one.factors(ROOMS, 100)["peer-a"] == 1.0 + LOAD_WEIGHT  # (its own, counted once)
        one.full("peer-b")  # peer-b refused worker 1 a session for want of cache room
        assert wait_until(lambda: two.factors(ROOMS, 100)["peer-b"] == FULL_FACTOR, 3, step=0.05)
        assert second.workers == 1 and max(second.staleness) < PERIOD * 3  # how stale the view is: ~a period
        one.leave(["peer-a"], directed=True)
        assert wait_until(lambda: two.in_flight() == {}, 3, step=0.05)

        one.enter(["peer-a"])
        assert wait_until(lambda: two.in_flight() == {"peer-a": 1}, 3, step=0.05)
        first._stop.set()  # worker 1 dies: it neither publishes again nor withdraws its record
        first._thread.join(3)
        died = time.monotonic()
        assert wait_until(lambda: two.in_flight() == {}, SHORT_LEASE + 2, step=0.05)
        assert time.monotonic() - died <= SHORT_LEASE + PERIOD * 3  # within its lease (and a beat)
        assert second.workers == 0
    finally:
        first.close()
        second.close()


def test_a_record_out_of_shape_costs_only_itself(redis_url):
    import redis

    load, mine = ledger(redis_url, "worker-3")
    raw = redis.Redis.from_url(redis_url)
    try:
        now = time.time()
        raw.set(PREFIX + "junk", b"\xff not json", px=5000)
        raw.set(PREFIX + "wrong", json.dumps({"v": 1, "worker": 7, "at": "now"}), px=5000)
        raw.set(PREFIX + "huge", json.dumps({"v": 1, "worker": "huge", "at": now + 1,
                                             "in_flight": {f"p{i}": 1 for i in range(MAX_PEERS + 50)} | {"bad": -5,
                                                                                                         "x" * 200: 3}}),
                px=5000)
        raw.set(PREFIX + "fine", record("fine", {"in_flight": {"peer-b": 2}}, now + 1), px=5000)
        raw.zadd(WORKERS_KEY, {name: now + 5 for name in ("junk", "wrong", "huge", "fine", "gone-already")})
        assert wait_until(lambda: load.in_flight().get("peer-b") == 2, 3, step=0.05)
        seen = load.in_flight()
        assert len(seen) <= MAX_PEERS + 1 and "x" * 200 not in seen and seen.get("bad", 0) == 0
        assert mine.workers == 2  # "fine" and "huge" (bounded); the two out of shape count for nothing
    finally:
        mine.close()
        raw.delete(PREFIX + "junk", PREFIX + "wrong", PREFIX + "huge", PREFIX + "fine")
        raw.zrem(WORKERS_KEY, "junk", "wrong", "huge", "fine", "gone-already")
        raw.close()


def test_merging_ignores_a_worker_s_own_record_and_records_past_their_lease():
    now = 1000.0
    records = [parse(record(name, {"in_flight": {"s": n}, "full_ago": {"f": 1.0}}, at))
               for name, n, at in (("me", 5, now), ("other", 2, now - 0.5), ("old", 9, now - LEASE - 1))]
    view = merge(records, me="me", now=now, read_at=50.0)
    assert view.load.in_flight == {"s": 2} and view.ages == [0.5]
    assert view.load.full_ago == {"f": pytest.approx(1.5)}  # refused 1 s before a record 0.5 s old
    assert parse("[]") is None and parse(json.dumps({"v": 2, "worker": "w", "at": 1})) is None


def test_a_client_holding_its_share_through_one_worker_waits_on_the_other_until_it_gives_one_back(redis_url):
    """Two workers of 2 slots each, a share of half: 2 of the 4 slots over both. A client holding 2
    through worker 1 is not granted a third through worker 2 (it waits its turn, as on one worker),
    while another client is; once it gives one back on worker 1, worker 2 grants its waiting request
    at its next read, without any release there."""
    import threading

    from chat.capacity import Capacity, Slots, client_key
    from chat.errors import Busy

    capacity = Capacity(slots=2, queue_size=4, queue_timeout=5, slots_share=0.5)
    slots_1, slots_2 = Slots(capacity), Slots(capacity)
    first = SharedLedger(redis_url, ServerLoad(), slots_1, worker="worker-6", period=PERIOD, lease=SHORT_LEASE).start()
    second = SharedLedger(redis_url, ServerLoad(), slots_2, worker="worker-7", period=PERIOD, lease=SHORT_LEASE).start()
    try:
        held = [slots_1.acquire("10.8.0.1"), slots_1.acquire("10.8.0.1")]  # 2 of 4: its share over both
        assert wait_until(lambda: slots_2.others().held.get(client_key("10.8.0.1")) == 2, 3, step=0.05)
        assert slots_2.others().slots == 2 and "10.8.0.1" not in json.dumps(slots_2.others().held)  # (a hash)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(slots_2.acquire("10.8.0.1", timeout=4)))
        waiting.start()
        time.sleep(PERIOD * 3)
        assert got == [] and slots_2.load().waiting == 1  # over its share: it waits, though worker 2 is idle
        other = slots_2.acquire("10.8.0.2", timeout=0.5)  # another client is served at once
        held[0].release()  # worker 1 gives one back: worker 2's next read lets the waiting request in
        waiting.join(3)
        assert len(got) == 1 and slots_2.load().busy == 2
        with pytest.raises(Busy):  # and worker 2 is full now: nobody else gets a slot there
            slots_2.acquire("10.8.0.3", timeout=0.3)
        for slot in (held[1], other, got[0]):
            slot.release()
    finally:
        first.close()
        second.close()


def test_a_burst_through_two_workers_at_once_never_takes_more_than_the_share(redis_url):
    """Before either worker has read the other's holds, 12 requests of one client at once, 6 through
    each (4 slots each, a share of half: 4 of 8): each slot is claimed atomically in Redis, so the
    client holds at most 4 over both, and another client still gets a slot."""
    import threading

    from chat.capacity import Capacity, Slots
    from chat.errors import Busy

    capacity = Capacity(slots=4, queue_size=16, queue_timeout=1, slots_share=0.5)
    pair = [Slots(capacity), Slots(capacity)]
    ledgers = [SharedLedger(redis_url, ServerLoad(), slots, worker=f"burst-{i}", period=PERIOD, lease=SHORT_LEASE)
               for i, slots in enumerate(pair)]
    for ledger_ in ledgers + ledgers[:1]:
        ledger_.beat()  # (both on the roll, each knowing the other's slots; no holds yet)
    got, refused = [], []
    lock = threading.Lock()

    def ask(slots):
        try:
            slot = slots.try_acquire("10.6.0.1")
        except Busy:
            slot = None
        with lock:
            (got if slot is not None else refused).append(slot)

    threads = [threading.Thread(target=ask, args=(pair[i % 2],)) for i in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and len(refused) == 8  # its share over both, exactly
        assert pair[0].try_acquire("10.6.0.2") is not None or pair[1].try_acquire("10.6.0.2") is not None
        got[0].release()  # one given back: one more for it, wherever
        assert pair[0].try_acquire("10.6.0.1") is not None or pair[1].try_acquire("10.6.0.1") is not None
    finally:
        for ledger_ in ledgers:
            ledger_.close()


def test_rate_limits_are_counted_over_every_worker_in_the_shared_redis(redis_url, tmp_path):
    """Two chat workers' apps with ``chat_shared`` set: a client that used its limit through one is
    refused through the other, with Retry-After from the limit (not the chat's own estimates)."""
    from chat.engine import ChatEngine
    from chat.http import create_blueprint
    from monitor.web import create_app
    from support import sqlite_store, web_settings

    engines, stores, clients = [], [], []
    try:
        for name in ("a", "b"):
            settings = web_settings(data_dir=tmp_path / name, chat_shared=redis_url, chat_rate_limit="2 per minute")
            assert settings.resolved_rate_limit_storage == redis_url
            engines.append(ChatEngine(None, []))
            stores.append(sqlite_store(tmp_path / name))
            client = create_app(settings, stores[-1], chat_blueprints=[create_blueprint(engines[-1])]).test_client()
            client.environ_base["REMOTE_ADDR"] = "10.9.0.1"
            clients.append(client)
        body = {"model": "none-here", "prompt": "hi"}
        assert [clients[0].post("/v1/completions", json=body).status_code for _ in range(2)] == [404, 404]
        refused = clients[1].post("/v1/completions", json=body)
        assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.get_json()["error"]["type"] == "rate_limit_exceeded"
    finally:
        for engine in engines:
            engine.close()
        for store in stores:
            store.close()


def test_a_chat_engine_with_chat_shared_publishes_its_load_and_says_how_fresh_the_others_are(redis_url):
    """The engine as ``serve`` makes it (``shared=``): its ledger runs from the start, /metrics says
    how many other workers it counts and how old their records were, and closing withdraws it."""
    from prometheus_client import CollectorRegistry, generate_latest

    from chat.engine import ChatEngine
    from chat.metrics import ChatCollector

    other_load, other = ledger(redis_url, "worker-5")
    engine = ChatEngine(None, [], shared=redis_url)
    try:
        other_load.enter(["peer-a"])
        assert wait_until(lambda: engine.server_load.in_flight() == {"peer-a": 1}, 5, step=0.1)
        registry = CollectorRegistry()
        registry.register(ChatCollector(engine))
        text = generate_latest(registry).decode()
        assert "swarm_monitor_chat_shared_workers 1.0" in text and "swarm_monitor_chat_shared_load_up 1.0" in text
        age = float(text.split("\nswarm_monitor_chat_shared_load_age_seconds ")[1].split()[0])
        assert 0.0 <= age < 2.5  # the other's record, read within its period (0.2 s) of being written, + a beat
        assert wait_until(lambda: other.workers == 1, 5, step=0.1)  # and the other counts this engine
        engine.close()  # withdraws its record at once: not counted until its lease ends
        assert wait_until(lambda: other.workers == 0, 1.0, step=0.05)
    finally:
        engine.close()
        other.close()
