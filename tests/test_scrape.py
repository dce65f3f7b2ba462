"""Specs of the scrape: what servers announce in the DHT becomes one Snapshot of plain rows.

Peers control what they announce: malformed records are dropped one at a time and counted, and
strings are kept as length-limited data without control characters.
"""

from __future__ import annotations

import math
import os

import petals
import pytest
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.core.snapshot import ModelInfo
from monitor.swarm import scrape
from monitor.swarm.announce import (
    MAX_RAW_TEXT_CHARS,
    MAX_TEXT_CHARS,
    InvalidRecord,
    clean_text,
    parse_model_entry,
    parse_server_record,
)
from monitor.swarm.announce import MAX_CACHE_TOKENS, MAX_RPS, MAX_RTT
from monitor.swarm.scrape import MAX_SERVERS_PER_BLOCK, MAX_SERVERS_PER_MODEL, MODEL_INDEX_KEY
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from petals.data_structures import ServerInfo, ServerState
from support import STEADY_UPDATE_PERIOD

TINY = ModelInfo(TINY_DHT_PREFIX, TINY_NUM_BLOCKS, official=True)
HALF = TINY_NUM_BLOCKS // 2


def random_peer_id() -> str:
    """A well-formed peer id (sha2-256 multihash) that no process owns."""
    return PeerID(b"\x12\x20" + os.urandom(32)).to_base58()


PEER = "QmNjDTuCnSD1KaBrqJXc4JxyC2HmnDaSdXDJx1dcnRLtsE"


def announcement(state=ServerState.ONLINE, throughput=10.0, **extra) -> tuple:
    """What a petals server stores under each of its block uids."""
    return ServerInfo(state=state, throughput=throughput, **extra).to_tuple()


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
        "not-a-peer-id": announcement(),
        12345: announcement(),
    }
    for subkey, value in malformed.items():
        store(dht, block, subkey, value)
    odd_but_valid = random_peer_id()
    store(dht, block, odd_but_valid, announcement(
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
              announcement(throughput=7.0, start_block=0, end_block=4, public_name="stranger"))

    snapshot = scrape(dht, [TINY])

    discovered = {m.dht_prefix: m for m in snapshot.models}["discovered-llama"]
    assert discovered == ModelInfo("discovered-llama", 4, repository="https://huggingface.co/someone/discovered-llama",
                                   name="someone/discovered-llama", official=False)
    [row] = snapshot.rows_for("discovered-llama")
    assert (row.peer_id, row.start, row.end, row.state, row.throughput, row.public_name) == (
        server, 0, 4, "ONLINE", 7.0, "stranger")
    assert "discovered-llama" not in {m.dht_prefix for m in scrape(dht, [TINY], discover=False).models}


# ---- the validation functions themselves -------------------------------------------------------


def test_a_petals_announcement_parses_to_clean_plain_fields():
    record = parse_server_record(
        announcement(throughput=3.5, start_block=1, end_block=5, public_name="a\tb", adapters=("lora",),
                     next_pings={random_peer_id(): math.inf}, cache_tokens_left=10, using_relay=True),
        num_blocks=8, peer_id=PEER,
    )
    assert (record.state, record.throughput, record.start_block, record.end_block) == (2, 3.5, 1, 5)
    assert record.public_name == "ab" and record.adapters == ("lora",) and record.using_relay is True
    assert list(record.next_pings.values()) == [math.inf]  # petals' own mark for an unreachable next server
    assert record.clamped == 0


def test_numbers_beyond_what_a_store_can_hold_are_clamped_and_counted():
    """petals' own model accepts all of these, and msgpack carries them."""
    fast, nan_ping, slow = random_peer_id(), random_peer_id(), random_peer_id()
    record = parse_server_record(
        (2, 1e308, {"inference_rps": 1e300, "forward_rps": 2**70, "network_rps": MAX_RPS * 2,
                    "cache_tokens_left": 2**64 - 1, "next_pings": {fast: 1e300, nan_ping: math.nan, slow: 0.25}}),
        num_blocks=8, peer_id=PEER,
    )
    assert (record.throughput, record.inference_rps, record.forward_rps, record.network_rps) == (MAX_RPS,) * 4
    assert record.cache_tokens_left == MAX_CACHE_TOKENS
    assert record.next_pings == {fast: MAX_RTT, slow: 0.25}  # a NaN RTT says nothing: that entry is left out
    assert record.clamped == 6
    # Sums over a block's servers stay finite and within a signed 64-bit integer.
    assert math.isfinite(MAX_RPS * MAX_SERVERS_PER_BLOCK * 4) and MAX_CACHE_TOKENS * MAX_SERVERS_PER_MODEL < 2**53


@pytest.mark.parametrize("raw", [
    None, 5, "text", b"bytes", (), (2,), (2, 1.0, "extra"), (2, 1.0, {1: "non-string key"}),
    (2.0, 1.0, {}), (-1, 1.0, {}), (2, "1.0", {}), (2, False, {}), (2, math.nan, {}),
    (2, 1.0, {"start_block": 8, "end_block": 9}), (2, 1.0, {"end_block": 9}), (2, 1.0, {"start_block": -1}),
    (2, 1.0, {"adapters": "not-a-list"}), (2, 1.0, {"adapters": ["a"] * 1000}),
    (2, 1.0, {"version": b"bytes"}), (2, 1.0, {"next_pings": {"not-a-peer": 0.1}}),
    (2, 1.0, {"network_rps": -1.0}), (2, 1.0, {"inference_rps": math.nan}), (2, 1.0, {"forward_rps": math.inf}),
    (2, 1e400, {}), (2, 1.0, {"cache_tokens_left": -1}), (2, 1.0, {"cache_tokens_left": 1.5}),
    (2, 1.0, {"start_block": True}), (2, 1.0, {"start_block": 2**70, "end_block": 2**71}),
])
def test_malformed_announcements_are_rejected(raw):
    with pytest.raises(InvalidRecord):
        parse_server_record(raw, num_blocks=8, peer_id=PEER)


@pytest.mark.parametrize("prefix, raw", [
    ("ok", {"num_blocks": 0}), ("ok", {"num_blocks": True}), ("ok", {"num_blocks": 2000}), ("ok", []),
    ("ok", {"num_blocks": 4, "repository": 5}), ("a.b", {"num_blocks": 4}), ("a b", {"num_blocks": 4}),
    ("", {"num_blocks": 4}), (42, {"num_blocks": 4}), ("x" * 300, {"num_blocks": 4}),
])
def test_malformed_model_index_entries_are_rejected(prefix, raw):
    with pytest.raises(InvalidRecord):
        parse_model_entry(prefix, raw)


def test_announced_strings_are_kept_as_short_data_without_control_characters():
    assert clean_text("<b>bold</b>\x00\x1b\u200b\u202e") == "<b>bold</b>"
    assert clean_text("é" * 1000) == "é" * MAX_TEXT_CHARS
    assert clean_text(None) is None
    with pytest.raises(InvalidRecord):
        clean_text("x" * (MAX_RAW_TEXT_CHARS + 1))
