"""Specs of the validation of what peers announce (``monitor.swarm.announce``): a petals server's
record parses to clean plain fields, numbers beyond what a store holds are clamped and counted,
malformed records and model index entries are refused, strings are kept as short data without
control characters. The same records through a real DHT: ``test_scrape.py``.
"""

from __future__ import annotations

import math

import pytest

from monitor.swarm.announce import (
    MAX_RAW_TEXT_CHARS,
    MAX_TEXT_CHARS,
    InvalidRecord,
    clean_text,
    parse_model_entry,
    parse_server_record,
)
from monitor.swarm.announce import MAX_CACHE_TOKENS, MAX_RPS, MAX_RTT
from monitor.swarm.scrape import MAX_SERVERS_PER_BLOCK, MAX_SERVERS_PER_MODEL
from support import petals_announcement, random_peer_id

PEER = "QmNjDTuCnSD1KaBrqJXc4JxyC2HmnDaSdXDJx1dcnRLtsE"


def test_a_petals_announcement_parses_to_clean_plain_fields():
    record = parse_server_record(
        petals_announcement(throughput=3.5, start_block=1, end_block=5, public_name="a\tb", adapters=("lora",),
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
