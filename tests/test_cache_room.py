"""Spec: a server with no attention-cache room for a session now is busy, not failing — on a real
swarm whose one server holds one 512-token session at a time (``attn_cache_tokens`` 520).

- the chat's own idle kept-open sessions let go of their caches for a new one, and answer their
  next turn by replaying their text, token for token what a fresh session of the whole text gives;
- a session another client holds is waited for (the server queues the allocation, ``cache_wait``);
- no room within ``cache_wait``: a 429 (``ServersFull``) with Retry-After, and the generation check
  says nothing rather than calling the model broken;
- in none of these is the server banned, or a step outcome recorded as failed.
"""

from __future__ import annotations

import threading
import time

import pytest

from chat.decoding import Finished, GenerationParams
from chat.engine import ChatEngine
from chat.errors import ServersFull
from monitor.app.generation_check import GenerationChecker
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.settings import ModelConfig, Settings

GREEDY = GenerationParams(max_new_tokens=8)
CACHE_WAIT = 4.0


@pytest.fixture(scope="module")
def small(tiny_model):
    swarm = LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=5)
    try:
        yield swarm.start([ServerSpec("small", 0, TINY_NUM_BLOCKS, attn_cache_tokens=520)])
    finally:
        swarm.close()


@pytest.fixture
def engines(small, tiny_model):
    made = []

    def make() -> tuple[ChatEngine, list]:
        outcomes: list = []
        engine = ChatEngine(small.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], slots=4,
                            outcome_sink=outcomes.append, cache_wait=CACHE_WAIT)
        made.append(engine)
        return engine, outcomes

    yield make
    for engine in made:
        engine.close()


def turn(session, input_ids) -> Finished:
    return [e for e in session.generate(input_ids, GREEDY) if isinstance(e, Finished)][-1]


def not_failing(engine, outcomes) -> None:
    assert outcomes and all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    manager = engine.sequence_manager(TINY_DHT_PREFIX)
    assert all(span.peer_id not in manager.state.banned_peers for span in manager.state.sequence_info.spans_by_priority)


def test_idle_sessions_let_go_of_their_caches_and_replay_their_text_at_the_next_turn(engines, small):
    engine, outcomes = engines()
    peer = small.peer_id("small")
    encode = lambda text: engine.encode(TINY_DHT_PREFIX, text)  # noqa: E731
    a = engine.open_session(TINY_DHT_PREFIX, 512, client="a")
    b = engine.open_session(TINY_DHT_PREFIX, 512, client="b")
    first = turn(a, encode("The first person asks"))
    assert a.holds(peer) and first.completion_tokens == 8
    history = list(encode("The first person asks")) + list(first.token_ids)

    other = turn(b, encode("Another person asks something else"))  # a holds the only room: a lets go
    assert other.completion_tokens == 8 and b.holds(peer) and not a.holds(peer)
    assert engine.load().sessions.released == 1

    follow_up = encode(" and then")
    again = turn(a, follow_up)  # b idle now: b lets go, a replays its text into a fresh session
    assert again.completion_tokens == 8 and a.holds(peer) and not b.holds(peer)
    assert a.used == len(history) + len(follow_up) + 8
    # the replayed session continues exactly as one that saw the whole text at once
    with engine.answer(TINY_DHT_PREFIX, history + list(follow_up), GREEDY) as answer:
        fresh = [e for e in answer if isinstance(e, Finished)][-1]
    assert fresh.token_ids == again.token_ids
    assert engine.load().sessions.released == 3 and not a.holds(peer)  # a let go for that one too
    not_failing(engine, outcomes)
    a.close()
    b.close()


def test_a_session_another_client_holds_is_waited_for_then_a_429_when_none_makes_room(engines, small, tiny_model):
    engine, outcomes = engines()
    outsider, _ = engines()  # another chat process, or anyone's petals client: not ours to release
    held = outsider.open_session(TINY_DHT_PREFIX, 512, client="outsider")  # (all but 8 tokens of the room)
    turn(held, outsider.encode(TINY_DHT_PREFIX, "I keep my session open"))
    mine = engine.open_session(TINY_DHT_PREFIX, 512, client="me")
    started = time.perf_counter()
    threading.Timer(2.0, held.close).start()  # ... for two seconds
    finished = turn(mine, engine.encode(TINY_DHT_PREFIX, "Hello"))
    waited = time.perf_counter() - started
    assert finished.completion_tokens == 8 and 2.0 <= waited < 2.0 + CACHE_WAIT
    assert finished.time_to_first_token >= 1.9
    mine.close()

    held = outsider.open_session(TINY_DHT_PREFIX, 512, client="outsider")
    turn(held, outsider.encode(TINY_DHT_PREFIX, "I keep my session open for good"))
    mine = engine.open_session(TINY_DHT_PREFIX, 512, client="me")
    started = time.perf_counter()
    with pytest.raises(ServersFull) as busy:
        turn(mine, engine.encode(TINY_DHT_PREFIX, "Hello"))
    assert time.perf_counter() - started >= CACHE_WAIT
    assert busy.value.status == 429 and busy.value.retry_after > 0
    assert "attention caches" in str(busy.value) and f"within {CACHE_WAIT:.0f} s" in str(busy.value)

    settings = Settings(models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        generation_check_tokens=4)
    checker = GenerationChecker(settings, store=None, engine=lambda: engine)
    assert checker.check(engine, settings.models[0]) is None  # busy says nothing of whether it generates
    not_failing(engine, outcomes)
    held.close()
    assert turn(mine, engine.encode(TINY_DHT_PREFIX, "Hello")).completion_tokens == 8
    mine.close()


def test_a_server_busy_with_a_real_session_is_never_failing_and_one_refusing_with_room_is(engines, small, tiny_model,
                                                                                         tmp_path):
    """The probes of a server whose cache another client's session holds are refused "cache full"
    while it announces no room: busy, never failing, however many. The same server refusing every
    session while its cache is empty (announcing all of it): failing, named with that reason."""
    from monitor.core.probes import BUSY, PROBE_TOKENS, REFUSING_CONFIRMATIONS, room_tokens
    from support import polled_prober, sqlite_store

    settings = Settings(data_dir=tmp_path, initial_peers=small.initial_peers, speed_probe_period=1.0,
                        speed_probe_max_share=0.5, speed_probe_timeout=5, correctness_checks=False,
                        models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS)])
    store = sqlite_store(tmp_path)
    outsider, _ = engines()
    held = outsider.open_session(TINY_DHT_PREFIX, 512, client="outsider")  # all but 8 tokens of the room
    poller, prober = polled_prober(settings, store, small.dht)
    peer = small.peer_id("small")

    def rounds(count: int) -> list:
        probes = []
        while len(probes) < count:
            prober.next_due.clear()  # every server due now
            probes += [p for p in prober.run_once() if p.peer_id == peer]
        return probes

    def cause() -> str:
        return store.latest_assessments()[TINY_DHT_PREFIX].servers[peer].cause

    try:
        turn(held, outsider.encode(TINY_DHT_PREFIX, "I keep my session open"))
        time.sleep(6)  # its next announcement (every 5 s) says how little room is left
        assert poller.poll_once() is not None
        busy = rounds(REFUSING_CONFIRMATIONS + 1)
        assert all(p.error_kind == BUSY and room_tokens(p) is not None and room_tokens(p) < PROBE_TOKENS
                   for p in busy), busy  # (8 tokens left: announced as 8 × 2 × its 8 blocks)
        assert cause() != "failing"
        held.close()

        small.refuse("small")  # now its cache is empty, announced so, and every session is refused
        time.sleep(6)
        assert poller.poll_once() is not None
        refused = rounds(REFUSING_CONFIRMATIONS)
        assert all(p.error_kind == BUSY and room_tokens(p) >= 512 for p in refused), refused
        server = store.latest_assessments()[TINY_DHT_PREFIX].servers[peer]
        assert server.cause == "failing" and "refuses every session as cache full" in server.failing, server
    finally:
        small.unrefuse("small")
        held.close()
        prober.close()
        store.close()
