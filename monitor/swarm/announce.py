"""Validation of what peers announce in the DHT: untrusted input, made into values we can store.

Everything in the DHT is written by peers we do not control, and petals' own parsing
(``ServerInfo.from_tuple``, ``ModelInfo.from_dict``) accepts values that no store, JSON document or
Prometheus sample can hold: a throughput of 1e308 (a block's total overflows to infinity), a
``cache_tokens_left`` of 2**64 (msgpack carries it; SQLite and PostgreSQL integers stop at 2**63),
an RTT of NaN. The functions here are pure: they turn one raw record into plain, bounded data or
raise ``InvalidRecord``, so a malformed record is dropped and counted on its own and never poisons
a poll. The rules, per field:

- strings: control and format characters removed, cut to ``MAX_TEXT_CHARS``; longer than
  ``MAX_RAW_TEXT_CHARS`` raw: the record is dropped;
- ``state``: one of petals' ``ServerState`` values, else dropped;
- speeds (``throughput``, ``*_rps``): NaN or infinite: dropped; above ``MAX_RPS``: clamped;
- ``cache_tokens_left``: above ``MAX_CACHE_TOKENS``: clamped;
- ``next_pings``: infinite means "unreachable" (petals' own marker, kept); NaN or negative: the
  entry is dropped; above ``MAX_RTT``: clamped;
- spans: must lie within the model's blocks, else dropped.

Every clamp is counted in ``ParsedServer.clamped`` so that the poll can say how many values it
had to bound.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Optional

from monitor import compat  # noqa: F401  (before petals)
from petals.data_structures import UID_DELIMITER, ServerInfo, ServerState  # noqa: E402
from petals.data_structures import ModelInfo as PetalsModelInfo  # noqa: E402

MAX_TEXT_CHARS = 200  # announced strings are cut to this after control characters are removed
MAX_RAW_TEXT_CHARS = 4096  # a longer announced string is not a name but an attack: drop the record
MAX_NUM_BLOCKS = 1024  # the largest petals model has ~130 blocks; more is a bogus announcement
MAX_ADAPTERS = 64
MAX_NEXT_PINGS = 256
MAX_EXTRA_FIELDS = 64
MAX_PEER_ID_CHARS = 128
# Numeric bounds. Far above anything real (a fast GPU serves a block at ~1e4 tokens/s), far below
# what overflows: 1024 servers × MAX_RPS summed stays a finite float, 1024 × MAX_CACHE_TOKENS
# stays within a signed 64-bit integer and within JavaScript's exact integers (2**53).
MAX_RPS = 1e9
MAX_CACHE_TOKENS = 2**40
MAX_RTT = 3600.0  # seconds

_CONTROL_CATEGORIES = {"Cc", "Cf", "Cs", "Co"}  # controls, format (bidi, zero-width), surrogates, private
_STRING_FIELDS = ("public_name", "version", "torch_dtype", "quant_type")
_STATES = {s.value for s in ServerState}


class InvalidRecord(ValueError):
    """One announced record is malformed; it is dropped and counted, the poll goes on."""


@dataclass
class ParsedServer:
    """One server's announcement, every field bounded (see the module docstring)."""

    peer_id: str
    state: int
    throughput: float
    start_block: Optional[int]
    end_block: Optional[int]
    public_name: Optional[str] = None
    version: Optional[str] = None
    torch_dtype: Optional[str] = None
    quant_type: Optional[str] = None
    network_rps: Optional[float] = None
    forward_rps: Optional[float] = None
    inference_rps: Optional[float] = None
    adapters: tuple[str, ...] = ()
    using_relay: Optional[bool] = None
    cache_tokens_left: Optional[int] = None
    next_pings: dict[str, float] = field(default_factory=dict)
    clamped: int = 0  # values that were out of range and bounded

    def covers(self, block: int) -> bool:
        """A record found under a block its own announced span does not contain is inconsistent."""
        return (self.start_block is None or self.start_block <= block) and (
            self.end_block is None or block < self.end_block)


def clean_text(value: Any, *, limit: int = MAX_TEXT_CHARS) -> Optional[str]:
    """An announced string as safe data: control/format characters removed, at most `limit` chars.

    None stays None; a non-string or a string longer than MAX_RAW_TEXT_CHARS is invalid.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecord(f"expected a string, got {type(value).__name__}")
    if len(value) > MAX_RAW_TEXT_CHARS:
        raise InvalidRecord(f"string of {len(value)} characters (limit {MAX_RAW_TEXT_CHARS})")
    kept = "".join(ch for ch in value if unicodedata.category(ch) not in _CONTROL_CATEGORIES)
    return kept[:limit]


def parse_peer_id(value: Any) -> str:
    """A peer id as its canonical base58 string, or InvalidRecord."""
    from hivemind.p2p import PeerID

    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise InvalidRecord(f"peer id must be a short string, got {type(value).__name__}")
    try:
        canonical = PeerID.from_base58(value).to_base58()
    except Exception as e:  # noqa: BLE001 - any decoding failure means "not a peer id"
        raise InvalidRecord(f"not a base58 peer id: {e!r}"[:MAX_TEXT_CHARS]) from None
    if canonical != value:
        raise InvalidRecord("peer id is not in canonical base58 form")
    return canonical


def parse_dht_prefix(value: Any) -> str:
    """A model's dht_prefix as announced under `_petals.models`; it becomes part of DHT keys, so it
    is rejected (not cleaned) if it has a delimiter, whitespace or control characters."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT_CHARS:
        raise InvalidRecord(f"dht_prefix must be a string of 1..{MAX_TEXT_CHARS} characters")
    if UID_DELIMITER in value or any(ch.isspace() or unicodedata.category(ch)[0] == "C" for ch in value):
        raise InvalidRecord(f"dht_prefix {value[:40]!r} contains '.', whitespace or control characters")
    return value


def parse_model_entry(dht_prefix: Any, raw: Any) -> tuple[str, int, Optional[str]]:
    """One entry of `_petals.models` -> (dht_prefix, num_blocks, repository)."""
    prefix = parse_dht_prefix(dht_prefix)
    if not isinstance(raw, dict) or len(raw) > MAX_EXTRA_FIELDS or not all(isinstance(k, str) for k in raw):
        raise InvalidRecord(f"model {prefix}: entry must be a small dict with string keys")
    try:
        info = PetalsModelInfo.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - pydantic/TypeError: the peer sent garbage
        raise InvalidRecord(f"model {prefix}: {e}"[:MAX_TEXT_CHARS]) from None
    if not 0 < info.num_blocks <= MAX_NUM_BLOCKS:
        raise InvalidRecord(f"model {prefix}: num_blocks={info.num_blocks} is not within 1..{MAX_NUM_BLOCKS}")
    return prefix, info.num_blocks, clean_text(info.repository)


class _Bounds:
    """Counts the clamps of one record while its fields are bounded."""

    def __init__(self) -> None:
        self.clamped = 0

    def rps(self, name: str, value: Any) -> Optional[float]:
        if value is None:
            return None
        return self.number(name, value)

    def number(self, name: str, value: Any) -> float:
        """A required rate: a finite, non-negative number, capped."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRecord(f"{name} must be a number, got {type(value).__name__}")
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise InvalidRecord(f"{name} must be a finite, non-negative number, got {value!r}"[:MAX_TEXT_CHARS])
        return float(self._cap(value, MAX_RPS))  # an int too large for a float is capped first

    def tokens(self, value: Any) -> Optional[int]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRecord(f"cache_tokens_left must be a non-negative integer, got {type(value).__name__}")
        return int(self._cap(value, MAX_CACHE_TOKENS))

    def rtt(self, value: Any) -> Optional[float]:
        """An announced RTT: inf (unreachable) kept; NaN, negative or not a number: None (skip)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
            return None  # not a number, NaN or negative
        return math.inf if value == math.inf else float(self._cap(value, MAX_RTT))

    def _cap(self, value, limit):
        if value > limit:
            self.clamped += 1
            return limit
        return value


def parse_server_record(raw: Any, *, num_blocks: int, peer_id: str) -> ParsedServer:
    """One server's announcement (petals ``ServerInfo.to_tuple()``) -> a ``ParsedServer``.

    Unknown extra fields are ignored, as petals does, so newer servers still parse.
    """
    if not isinstance(raw, (tuple, list)) or not 2 <= len(raw) <= 8:
        raise InvalidRecord(f"expected (state, throughput, extra), got {type(raw).__name__}")
    state, throughput = raw[0], raw[1]
    extra = raw[2] if len(raw) > 2 else {}
    if type(state) is not int or state not in _STATES:
        raise InvalidRecord(f"state must be one of {sorted(_STATES)}, got {state!r}"[:MAX_TEXT_CHARS])
    if not isinstance(extra, dict) or len(extra) > MAX_EXTRA_FIELDS or not all(isinstance(k, str) for k in extra):
        raise InvalidRecord("extra info must be a small dict with string keys")
    for name in _STRING_FIELDS:  # petals would coerce bytes to str; a peer sending bytes is broken
        if extra.get(name) is not None and not isinstance(extra[name], str):
            raise InvalidRecord(f"{name} must be a string, got {type(extra[name]).__name__}")
    if extra.get("using_relay") is not None and not isinstance(extra["using_relay"], bool):
        raise InvalidRecord(f"using_relay must be a bool, got {type(extra['using_relay']).__name__}")
    adapters = extra.get("adapters", ())
    if not isinstance(adapters, (list, tuple)) or len(adapters) > MAX_ADAPTERS:
        raise InvalidRecord(f"adapters must be a list of at most {MAX_ADAPTERS} names")
    pings = extra.get("next_pings")
    if pings is not None and (not isinstance(pings, dict) or len(pings) > MAX_NEXT_PINGS):
        raise InvalidRecord(f"next_pings must be a dict of at most {MAX_NEXT_PINGS} entries")
    for name in ("start_block", "end_block"):
        value = extra.get(name)
        if value is not None and (type(value) is not int or not 0 <= value <= num_blocks):
            raise InvalidRecord(f"{name} must be a block index within the model's {num_blocks} blocks")

    # Bound the numbers first: petals' pydantic model accepts what we cannot store.
    bounds = _Bounds()
    numbers = {name: bounds.rps(name, extra.get(name)) for name in ("network_rps", "forward_rps", "inference_rps")}
    throughput = bounds.number("throughput", throughput)
    cache_tokens = bounds.tokens(extra.get("cache_tokens_left"))
    next_pings = {}
    for peer, rtt in (pings or {}).items():
        rtt = bounds.rtt(rtt)
        if rtt is not None:
            next_pings[parse_peer_id(peer)] = rtt
    checked = {**extra, **numbers, "cache_tokens_left": cache_tokens, "next_pings": None}
    try:
        info = ServerInfo.from_tuple((state, throughput, checked))
    except Exception as e:  # noqa: BLE001 - pydantic ValidationError, TypeError, ValueError
        raise InvalidRecord(" ".join(str(e).split())[:MAX_TEXT_CHARS]) from None

    start, end = info.start_block, info.end_block
    if start is not None and end is not None and not start < end:
        raise InvalidRecord(f"span {start}:{end} is empty")
    if start is not None and start >= num_blocks:
        raise InvalidRecord(f"span {start}:{end} leaves the model's {num_blocks} blocks")

    return ParsedServer(
        peer_id=peer_id,
        state=info.state.value,
        throughput=throughput,
        start_block=start,
        end_block=end,
        public_name=clean_text(info.public_name),
        version=clean_text(info.version),
        torch_dtype=clean_text(info.torch_dtype),
        quant_type=clean_text(info.quant_type),
        network_rps=numbers["network_rps"],
        forward_rps=numbers["forward_rps"],
        inference_rps=numbers["inference_rps"],
        adapters=tuple(name for name in map(clean_text, info.adapters) if name is not None),
        using_relay=info.using_relay,
        cache_tokens_left=cache_tokens,
        next_pings=next_pings,
        clamped=bounds.clamped,
    )
