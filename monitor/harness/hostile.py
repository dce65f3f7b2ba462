"""A hostile peer, for the demo's chaos controls and the tests: it writes announcements at the edges
of what the DHT carries straight into a running swarm's DHT, as any peer could.

Petals' own parsing (``ServerInfo.from_tuple``) accepts most of these; a monitor that stored them as
they are would fail to store every later poll for as long as they stay in the DHT (a
``cache_tokens_left`` of 2**64 - 1 is beyond every SQL integer). The monitor must bound or drop each
one, count it, and keep polling, with the honest servers shown as before.
"""

from __future__ import annotations

import math
import random
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Optional

from monitor import compat  # noqa: F401  (must precede petals)

HOSTILE_EXPIRATION = 600.0  # seconds the records stay in the DHT (announce again to keep them)
STORE_ATTEMPTS = 5  # a store is sent again if no DHT node acknowledged it in time
STORE_BACKOFF = 0.5  # seconds times the attempts so far: a loaded machine's nodes catch up meanwhile
LARGEST_UINT = 2**64 - 1  # the largest integer msgpack (the DHT's wire format) carries
LARGEST_FLOAT = sys.float_info.max
ONLINE = 2  # petals' ServerState.ONLINE


@dataclass(frozen=True)
class HostileRecord:
    """One announcement of a made-up peer, stored under every block of ``[start, end)``."""

    peer_id: str
    start: int
    end: int
    value: Any  # what is stored under each block uid: petals' (state, throughput, extra), or garbage
    what: str  # what is hostile about it
    storable: bool  # whether a monitor can keep it (bounded) rather than drop it as malformed


def hostile_records(num_blocks: int, rng: Optional[random.Random] = None) -> list[HostileRecord]:
    """The hostile announcements for a model of ``num_blocks`` blocks, under fresh random peer ids."""
    rng = rng or random.Random()
    everything = {"start_block": 0, "end_block": num_blocks}
    records = [
        ("integers at the edge of the wire format", 1.0,
         {**everything, "cache_tokens_left": LARGEST_UINT, "public_name": "hostile-ints"}, True),
        ("floats at the edge of the wire format", LARGEST_FLOAT,
         {**everything, "inference_rps": LARGEST_FLOAT, "forward_rps": LARGEST_FLOAT,
          "network_rps": LARGEST_FLOAT, "public_name": "hostile-floats"}, True),
        ("RTTs that are not numbers, negative, or huge", 1.0,
         {**everything, "public_name": "hostile-pings",
          "next_pings": {_peer_id(rng): math.nan, _peer_id(rng): -1.0, _peer_id(rng): LARGEST_FLOAT,
                         _peer_id(rng): math.inf}}, True),
        ("text with control and bidi characters, far too long", 1.0,
         {**everything, "public_name": "evil\x1b[31m\u202e\u200bname\n" + "x" * 1000,
          "version": "9" * 3000, "torch_dtype": "\x00", "adapters": ["\u202e" * 300]}, True),
        ("a throughput that is not a number", math.nan, dict(everything), False),
        ("an infinite speed", 1.0, {**everything, "inference_rps": math.inf}, False),
        ("a negative cache", 1.0, {**everything, "cache_tokens_left": -1}, False),
        ("a span beyond the model", 1.0, {"start_block": 0, "end_block": num_blocks + 10**6}, False),
    ]
    result = [HostileRecord(_peer_id(rng), 0, num_blocks, (ONLINE, throughput, extra), what, storable)
              for what, throughput, extra, storable in records]
    result.append(HostileRecord(_peer_id(rng), 0, num_blocks, "garbage", "not a record at all", False))
    return result


def announce_hostile(dht, dht_prefix: str, num_blocks: int, *, rng: Optional[random.Random] = None,
                     expiration: float = HOSTILE_EXPIRATION, timeout: float = 30.0) -> list[HostileRecord]:
    """Store ``hostile_records`` under every block of the model in ``dht`` (a hivemind DHT client of
    the swarm, e.g. ``LocalSwarm.dht``) for ``expiration`` seconds; returns what was announced.
    Raises RuntimeError if the DHT refuses one ``STORE_ATTEMPTS`` times."""
    from hivemind.utils import get_dht_time

    records = hostile_records(num_blocks, rng)
    until = get_dht_time() + expiration
    refused = [(record, block) for record in records for block in range(record.start, record.end)]
    for attempt in range(STORE_ATTEMPTS):  # a store no node acknowledged in time (a loaded machine) is sent again
        if attempt:
            time.sleep(STORE_BACKOFF * attempt)
        pending: list[tuple[HostileRecord, int, Future]] = []
        for record, block in refused:  # one small call each (hivemind pickles arguments)
            future = dht.store(f"{dht_prefix}.{block}", record.value, until, subkey=record.peer_id, return_future=True)
            pending.append((record, block, future))
        refused = [(record, block) for record, block, future in pending if not future.result(timeout)]
        if not refused:
            break
    if refused:
        record, block = refused[0]
        raise RuntimeError(f"the DHT refused {len(refused)} hostile announcements, e.g. {record.what!r} "
                           f"on block {block}")
    return records


def _peer_id(rng: random.Random) -> str:
    """A well-formed peer id (a sha2-256 multihash) that no process owns."""
    from hivemind.p2p import PeerID

    return PeerID(b"\x12\x20" + rng.randbytes(32)).to_base58()
