"""Specs of the scrape: what servers announce in the DHT becomes one Snapshot of plain rows.

Peers control what they announce: malformed records are dropped one at a time and counted, and
strings are kept as length-limited data without control characters (the validation functions
themselves, without a DHT: ``test_announce.py``).
"""

from __future__ import annotations

import math

import petals
import pytest
from hivemind.utils import get_dht_time

from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.core.snapshot import ModelInfo
from monitor.swarm import scrape
from monitor.swarm.announce import MAX_RAW_TEXT_CHARS, MAX_TEXT_CHARS
from monitor.swarm.scrape import MODEL_INDEX_KEY
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import STEADY_UPDATE_PERIOD, petals_announcement, random_peer_id

TINY = ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS, official=True)
HALF = TINY_NUM_BLOCKS // 2


# ---- the session swarm, as petals servers announce it -----------------------------------------


def test_scrape_of_the_session_swarm_reports_every_server_span_state_and_throughput(swarm):
    snapshot = scrape(swarm.dht, [TINY])

    assert snapshot.duration > 0
    assert snapshot.errors == ()
    assert snapshot.invalid_records == 0
    tiny = [m for m in snapshot.models if m.dht_prefix == TINY_DHT_PREFIX]
    assert tiny == [TINY]

    rows = {row.peer_id: row for row in snapshot.rows_for(TINY_DHT_PREFIX)}
    expected = {
        swarm.peer_id("first-half"): (0, HALF, 50.0, "first-half"),
        swarm.peer_id("second-half"): (HALF, TINY_NUM_BLOCKS, 50.0, "second-half"),
        swarm.peer_id("full"): (0, TINY_NUM_BLOCKS, 100.0, "full"),
    }
    assert {peer: (r.start, r.end, r.throughput, r.public_name) for peer, r in rows.items()} == expected
    for row in rows.values():
        assert row.state == "ONLINE"
        assert row.version == petals.__version__
        assert row.torch_dtype == "float32" and row.using_relay is False
        assert row.cache_tokens_left > 0
        assert set(row.next_pings) <= set(expected) - {row.peer_id}
        assert all(rtt >= 0 for rtt in row.next_pings.values())


def test_small_batches_read_the_same_spans_as_one_big_batch(swarm):
    def spans(snapshot):
        return sorted((r.peer_id, r.start, r.end, r.state, r.throughput) for r in snapshot.servers)

    one_batch = scrape(swarm.dht, [TINY], discover=False, batch_blocks=256)
    batches_of_three = scrape(swarm.dht, [TINY], discover=False, batch_blocks=3)  # spans cross batches
    assert len(spans(one_batch)) == 3
    assert spans(batches_of_three) == spans(one_batch)


def test_a_model_configured_without_num_blocks_takes_it_from_the_model_index(swarm):
    unknown = ModelInfo("nobody-serves-this", 0, official=True)
    snapshot = scrape(swarm.dht, [ModelInfo(TINY_DHT_PREFIX, 0, official=True), unknown], discover=False)

    assert [(m.dht_prefix, m.num_blocks, m.official) for m in snapshot.models] == [(TINY_DHT_PREFIX, 8, True)]
    assert len(snapshot.rows_for(TINY_DHT_PREFIX)) == 3
    [error] = snapshot.errors
    assert "nobody-serves-this" in error and "num_blocks" in error


# ---- hostile input, straight into the real DHT of a private swarm ------------------------------


@pytest.fixture(scope="module")
def scratch_swarm(tiny_model):
    """A private swarm this module may write garbage into (the session swarm stays clean)."""
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as s:
        s.start([ServerSpec("honest", 0, TINY_NUM_BLOCKS, throughput=42.0, public_name="honest")])
        yield s


def store(dht, key: str, subkey, value) -> None:
    assert dht.store(key, value, get_dht_time() + 300, subkey=subkey), f"the DHT refused {key}/{subkey}"


def test_malformed_announcements_are_dropped_one_by_one_and_counted(scratch_swarm):
    dht = scratch_swarm.dht
    block = f"{TINY_DHT_PREFIX}.2"
    malformed = {
        random_peer_id(): (2, math.nan, {}),  # NaN throughput
        random_peer_id(): (2, -5.0, {}),  # negative throughput
        random_peer_id(): (2, math.inf, {}),  # infinite throughput
        random_peer_id(): (2, 5.0, {"start_block": 6, "end_block": 2}),  # start > end
        random_peer_id(): (2, 5.0, {"start_block": 0, "end_block": 99}),  # beyond the model's 8 blocks
        random_peer_id(): (2, 5.0, {"start_block": 4, "end_block": 8}),  # block 2 is not in its own span
        random_peer_id(): (2, 5.0, {"public_name": "x" * (MAX_RAW_TEXT_CHARS + 1)}),  # huge string
        random_peer_id(): (2, 5.0, {"public_name": 12345}),  # wrong type
        random_peer_id(): (True, 5.0, {}),  # bool is not a state
        random_peer_id(): (7, 5.0, {}),  # no such state
        random_peer_id(): (2, 5.0, {"using_relay": "yes"}),
        random_peer_id(): (2, 5.0, {"next_pings": {"not-a-peer": 0.1}}),
        random_peer_id(): (2, 5.0, {"cache_tokens_left": -1}),
        random_peer_id(): "garbage",
        random_peer_id(): [2],
        "not-a-peer-id": petals_announcement(),
        12345: petals_announcement(),
    }
    for subkey, value in malformed.items():
        store(dht, block, subkey, value)
    odd_but_valid = random_peer_id()
    store(dht, block, odd_but_valid, petals_announcement(
        start_block=2, end_block=3, public_name="evil\x1b[31m\u202ename\n",
        version="v" * 500, future_field={"from": "a newer petals"},
    ))
    malformed_models = {
        "has.delimiter": {"num_blocks": 4},
        "huge-model": {"num_blocks": 10**9},
        "negative-model": {"num_blocks": -1},
        "string-model": "garbage",
        "float-model": {"num_blocks": 4.0},
    }
    for subkey, value in malformed_models.items():
        store(dht, MODEL_INDEX_KEY, subkey, value)

    snapshot = scrape(dht, [TINY])

    assert snapshot.invalid_records == len(malformed) + len(malformed_models)
    rows = {row.peer_id: row for row in snapshot.rows_for(TINY_DHT_PREFIX)}
    honest = rows[scratch_swarm.peer_id("honest")]
    assert (honest.start, honest.end, honest.state, honest.throughput) == (0, TINY_NUM_BLOCKS, "ONLINE", 42.0)
    assert set(rows) == {scratch_swarm.peer_id("honest"), odd_but_valid}
    odd = rows[odd_but_valid]
    assert (odd.start, odd.end) == (2, 3)
    assert odd.public_name == "evil[31mname"
    assert odd.version == "v" * MAX_TEXT_CHARS
    assert TINY_DHT_PREFIX in {m.dht_prefix for m in snapshot.models}
    assert {m.dht_prefix for m in snapshot.models}.isdisjoint(malformed_models)


def test_a_model_announced_under_the_model_index_is_discovered_and_scraped(scratch_swarm):
    dht = scratch_swarm.dht
    store(dht, MODEL_INDEX_KEY, "discovered-llama",
          {"num_blocks": 4, "repository": "https://huggingface.co/someone/discovered-llama"})
    server = random_peer_id()
    for block in range(4):
        store(dht, f"discovered-llama.{block}", server,
              petals_announcement(throughput=7.0, start_block=0, end_block=4, public_name="stranger"))

    snapshot = scrape(dht, [TINY])

    discovered = {m.dht_prefix: m for m in snapshot.models}["discovered-llama"]
    assert discovered == ModelInfo("discovered-llama", 4, repository="https://huggingface.co/someone/discovered-llama",
                                   name="someone/discovered-llama", official=False)
    [row] = snapshot.rows_for("discovered-llama")
    assert (row.peer_id, row.start, row.end, row.state, row.throughput, row.public_name) == (
        server, 0, 4, "ONLINE", 7.0, "stranger")
    assert "discovered-llama" not in {m.dht_prefix for m in scrape(dht, [TINY], discover=False).models}
