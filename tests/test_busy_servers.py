"""Spec (pure): a server whose attention cache is full is busy, not failing (``monitor.core.common.
cache_full``: for the chat's routing, ``chat.server_load``, and for the probes, ``monitor.swarm.speed``),
and the chat's idle kept-open sessions on it are what let go of their caches first
(``chat.capacity.OpenSessions.idle_holding``). On a real swarm: tests/test_cache_room.py."""

from __future__ import annotations

import pytest

from chat.capacity import GENERATING, IDLE, Capacity, OpenSessions
from chat.server_load import FULL_COOL, FULL_FACTOR, ServerLoad, refused_length
from monitor.core.snapshot import session_room
from monitor.core.common import cache_full


# petals 2.2's words (server/memory_cache.py), as its client raises them
@pytest.mark.parametrize("message", [
    "rpc_inference failed: AllocationFailed('Could not allocate 24576 bytes immediately: out of memory')",
    "Could not allocate 122880 (timeout=30.0)",
    "Could not allocate 61440 within 30.0 seconds",
    "Server's attention cache is full, failed to allocate 61440 bytes in 30.0 seconds",
])
def test_a_refusal_for_want_of_cache_room_is_busy(message):
    assert cache_full(RuntimeError(message))


@pytest.mark.parametrize("message", [
    "Could not allocate 999999999 bytes, max cache size = 24576 bytes",  # never fits that server
    "rpc_inference failed: ValueError('Cannot allocate KV cache for 80 tokens, max = 48')",  # too long
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "Broken input cache",
])
def test_other_failures_are_not_busy(message):
    assert not cache_full(RuntimeError(message))


def test_a_full_server_costs_more_for_a_while_then_as_before():
    now = [100.0]
    load = ServerLoad(clock=lambda: now[0])
    announced = {"a": None, "b": None}
    assert load.factors(announced, 512) == {"a": 1.0, "b": 1.0}
    load.full("a")
    assert load.factors(announced, 512) == {"a": FULL_FACTOR, "b": 1.0}
    load.enter(["a"])
    assert load.factors(announced, 512)["a"] == 2.0 * FULL_FACTOR  # in flight and full: both count
    now[0] += FULL_COOL
    assert load.factors(announced, 512) == {"a": 2.0, "b": 1.0}


def test_a_server_s_session_room_is_what_petals_own_client_would_let_a_session_ask_of_it():
    """``cache_tokens_left`` is one block's keys' worth of free cache: a session through n blocks
    needs 2·n times its tokens — judged here exactly as petals' client judges a span
    (``RemoteSequenceManager._has_cache_for``, the reference), not by the announced figure itself."""
    from hivemind import PeerID
    from petals.client.routing.sequence_manager import RemoteSequenceManager
    from petals.data_structures import RemoteSpanInfo, ServerInfo, ServerState

    for left, blocks in ((16384, 8), (32768, 4), (16384, 80), (5, 3), (0, 1)):
        info = ServerInfo(state=ServerState.ONLINE, throughput=1.0, cache_tokens_left=left)
        span = RemoteSpanInfo(peer_id=PeerID(b"peer"), start=0, end=blocks, server_info=info)
        room = session_room(left, blocks)
        for tokens in (1, room, room + 1, left):
            if tokens >= 1:
                assert (tokens <= room) == RemoteSequenceManager._has_cache_for(span, tokens), (left, blocks, tokens)
    assert session_room(None, 8) is None and session_room(-1, 8) is None
    assert session_room(16384, 8) == 1024  # the tiny swarm's "full" server: not 16,384 tokens of a session


class Member:
    def __init__(self, label: str, peers: tuple[str, ...], max_length: int = 512):
        self.label, self.peers, self.max_length = label, peers, max_length

    def holds(self, peer: str) -> bool:
        return peer in self.peers

    def expire(self, detail: str) -> None:
        pass


def test_idle_sessions_on_the_full_server_are_released_least_recently_used_first_as_many_as_needed():
    now = [0.0]
    sessions = OpenSessions(Capacity(slots=4, open_sessions=16), clock=lambda: now[0])
    members = {name: Member(name, peers) for name, peers in
               [("old", ("a",)), ("busy", ("a",)), ("elsewhere", ("b",)), ("mid", ("a", "b")), ("new", ("a",))]}
    for name, member in members.items():
        sessions.admit(member, client=name)
        now[0] += 1
        sessions.set_state(member, IDLE)  # used in this order: old first
    sessions.set_state(members["busy"], GENERATING)
    # a session of 512 tokens was refused on "a": idle holders of "a", oldest first, 2 × 512 tokens' worth
    assert [m.label for m in sessions.idle_holding("a", 512)] == ["old", "mid"]
    assert [m.label for m in sessions.idle_holding("a", 2048)] == ["old", "mid", "new"]  # all there are
    assert sessions.idle_holding("c", 512) == []
    assert sessions.load().released == 5


def test_no_refusal_is_mistaken_for_a_length_limit():
    assert refused_length(RuntimeError("Could not allocate 24576 bytes immediately: out of memory")) is None


def test_a_probe_the_server_had_no_cache_room_for_is_busy_and_names_no_server_failing():
    from hivemind.p2p import P2PHandlerError

    from monitor.core.probes import BUSY, SERVER_ERROR, ServerProbe, failing_servers
    from monitor.swarm.speed import failure_kind

    handler = "Failed to call handler `TransformerConnectionHandler.rpc_inference` at QmPeer: "
    full = P2PHandlerError(handler + "Could not allocate 24576 bytes immediately: out of memory")
    assert failure_kind(full) == (BUSY, "Could not allocate 24576 bytes immediately: out of memory")
    assert failure_kind(P2PHandlerError(handler + "CUDA error: out of memory"))[0] == SERVER_ERROR

    def probe(at: float, kind: str) -> ServerProbe:
        return ServerProbe("QmPeer", "m", 0, 4, at=at, ok=False, error="…", error_kind=kind)

    assert failing_servers([probe(10, BUSY), probe(20, BUSY)], now=30, max_age=60) == {}
    assert failing_servers([probe(10, SERVER_ERROR), probe(20, BUSY)], now=30, max_age=60) == {}
    assert failing_servers([probe(10, SERVER_ERROR), probe(20, SERVER_ERROR)], now=30, max_age=60) == {"QmPeer": "…"}


def test_a_server_refusing_every_probe_as_full_while_announcing_room_is_failing_and_a_busy_one_never():
    from monitor.core.probes import (BUSY, PROBE_TOKENS, REFUSING_CONFIRMATIONS, ServerProbe, failing_servers,
                                     refused_with_room)

    # petals announces its free cache over one block's keys: a session of T tokens over the probe's 4
    # blocks takes 2 × 4 × T of them (what the session of another client left: 8 tokens, 64 of them)
    def room(tokens: int) -> int:
        return 2 * 4 * tokens

    def probe(at: float, room, ok: bool = False) -> ServerProbe:
        return ServerProbe("QmPeer", "m", 0, 4, at=at, ok=ok, room=room,
                           error=None if ok else "Could not allocate 24576 bytes immediately: out of memory",
                           error_kind=None if ok else BUSY)

    refusals = [probe(10 * i, room(1024)) for i in range(1, REFUSING_CONFIRMATIONS + 1)]
    assert all(refused_with_room(p) for p in refusals)
    assert failing_servers(refusals, now=60, max_age=120) == {"QmPeer": (
        "refuses every session as cache full while announcing room for 1024 tokens "
        "(Could not allocate 24576 bytes immediately: out of memory)")}
    # one refusal fewer, one served session among them, or no room announced (or room too small,
    # or not known): busy, never failing
    assert failing_servers(refusals[1:], now=60, max_age=120) == {}
    assert failing_servers([*refusals[:-1], probe(40, room(1024), ok=True)], now=60, max_age=120) == {}
    assert failing_servers([*refusals[:-1], probe(40, 0)], now=60, max_age=120) == {}
    assert failing_servers([*refusals[:-1], probe(40, room(PROBE_TOKENS) - 1)], now=60, max_age=120) == {}
    assert failing_servers([*refusals[:-1], probe(40, PROBE_TOKENS)], now=60, max_age=120) == {}  # (one block's)
    assert failing_servers([*refusals[:-1], probe(40, None)], now=60, max_age=120) == {}
    assert failing_servers(refusals, now=600, max_age=120) == {}  # older than the window: nothing
