"""Plain data from the DHT edge: what the scrape read (``Snapshot``, its ``ServerRow``s), what the
reachability checks found (``ReachabilityResult``), and the per-peer history the scores read (no I/O,
no SQL).

A snapshot is an input, not a verdict: ``monitor.core.assess`` combines it with the reachability
checks, compute checks, probes and generation checks into each model's assessment, and the poller
stores the poll and its assessment together; nothing downstream analyses a snapshot again.

Peers control everything they announce; by the time data is in these classes it has been
validated and length-limited (see ``monitor/swarm/``), so everything downstream can trust the types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

def session_room(cache_tokens_left: Optional[int], blocks: int) -> Optional[int]:
    """How many tokens of one session a server has attention-cache room for, through ``blocks`` of
    its blocks (None: it announces nothing). Petals announces ``cache_tokens_left`` as its free
    cache over one block's keys (``bytes_left`` / one token's keys of one block), and a session
    keeps the keys and the values of every block it runs there: petals' own client asks for
    ``2 × blocks × tokens`` of it (``RemoteSequenceManager._has_cache_for``)."""
    if not isinstance(cache_tokens_left, int) or isinstance(cache_tokens_left, bool) or cache_tokens_left < 0:
        return None
    return cache_tokens_left // (2 * max(1, blocks))


# Server states as petals' ServerState names them, worst first.
OFFLINE, JOINING, ONLINE = "OFFLINE", "JOINING", "ONLINE"
STATES = (OFFLINE, JOINING, ONLINE)


@dataclass(frozen=True)
class ModelInfo:
    """A model the monitor watches: configured, or announced under the DHT key ``_petals.models``."""

    dht_prefix: str
    num_blocks: int
    repository: Optional[str] = None
    name: Optional[str] = None  # human name, e.g. "SmolLM2-135M-Instruct"
    official: bool = False  # configured by the operator (vs discovered)


@dataclass(frozen=True)
class ServerRow:
    """One server's announcement for one model's span of blocks [start, end)."""

    peer_id: str
    model: str  # the model's dht_prefix
    start: int
    end: int
    state: str  # one of STATES
    throughput: Optional[float] = None
    inference_rps: Optional[float] = None
    forward_rps: Optional[float] = None
    network_rps: Optional[float] = None
    cache_tokens_left: Optional[int] = None
    version: Optional[str] = None
    torch_dtype: Optional[str] = None
    quant_type: Optional[str] = None
    using_relay: Optional[bool] = None
    public_name: Optional[str] = None
    adapters: tuple[str, ...] = ()
    next_pings: dict[str, float] = field(default_factory=dict)  # peer id -> RTT seconds

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Snapshot:
    """What one scrape saw: every watched model and every server row, at one time."""

    taken_at: float  # unix seconds
    duration: float  # seconds the scrape took
    models: tuple[ModelInfo, ...]
    servers: tuple[ServerRow, ...]
    invalid_records: int = 0  # announcements dropped as malformed, per (block, peer) entry
    errors: tuple[str, ...] = ()
    clamped_values: int = 0  # announced numbers beyond what we store, bounded (swarm/announce.py)

    def rows_for(self, model: str) -> list[ServerRow]:
        return [row for row in self.servers if row.model == model]


@dataclass(frozen=True)
class ReachabilityResult:
    """One reachability check of one peer (a server's rpc_info, or a bootstrap peer's connect)."""

    peer_id: str
    kind: str  # "server" or "bootstrap"
    ok: bool
    rtt: Optional[float] = None  # seconds, when ok
    error: Optional[str] = None  # short, when not ok
    joining: bool = False  # "protocol not supported": still loading, not unreachable
    address: Optional[str] = None  # bootstrap multiaddr
    at: Optional[float] = field(default=None, compare=False)  # when it was checked (read back by the store)


def to_confirm(batch: "ReachabilityBatch") -> list[str]:
    """The servers a round found unreachable (not joining): each is checked once more before the
    failure is stored (``confirmed``) — one dial that failed names nobody (a server that just
    restarted on a new port, dialled at its old address: bench_churn --honest)."""
    return [r.peer_id for r in batch.results if r.kind == "server" and unreachable(r)]


def confirmed(batch: "ReachabilityBatch", again: "ReachabilityBatch") -> "ReachabilityBatch":
    """``batch`` with each server checked again (``again``) as that second check found it."""
    second = {r.peer_id: r for r in again.results}
    return ReachabilityBatch(taken_at=batch.taken_at, duration=batch.duration + again.duration,
                             results=tuple(second.get(r.peer_id, r) if r.kind == "server" else r
                                           for r in batch.results))


def unreachable(check: Optional[ReachabilityResult]) -> bool:
    """A failed reachability check means unreachable, unless the peer answered that it is still
    loading (JOINING: up, without petals' handler yet)."""
    return check is not None and not check.ok and not check.joining


@dataclass(frozen=True)
class ReachabilityBatch:
    taken_at: float
    duration: float
    results: tuple[ReachabilityResult, ...]


# ---- history, as the store hands it to the scores (plain rows, oldest first) -----------------


@dataclass(frozen=True)
class Observation:
    """One poll's view of one server for one model (or its absence: state OFFLINE, seen=False)."""

    at: float
    model: str
    state: str
    start: Optional[int] = None
    end: Optional[int] = None
    throughput: Optional[float] = None
    inference_rps: Optional[float] = None
    seen: bool = True  # False: the poll ran but this peer was not announced
    samples: int = 1  # polls this row stands for: 1 per poll; many for an hourly rollup row (at = hour)


@dataclass(frozen=True)
class ChatOutcome:
    """One chat request's outcome on one peer's span, written by the chat."""

    at: float
    peer_id: str
    model: str
    start: int
    end: int
    ok: bool
    seconds_per_token: Optional[float] = None  # for the whole span, per generated token
    error: Optional[str] = None

    @property
    def seconds_per_token_per_block(self) -> Optional[float]:
        if self.seconds_per_token is None or self.end <= self.start:
            return None
        return self.seconds_per_token / (self.end - self.start)


@dataclass(frozen=True)
class PeerHistory:
    """Everything the score needs about one peer over a window."""

    peer_id: str
    observations: tuple[Observation, ...] = ()
    reachability: tuple[tuple[float, ReachabilityResult], ...] = ()  # (at, result) of its reachability checks
    outcomes: tuple[ChatOutcome, ...] = ()
    first_seen: Optional[float] = None
