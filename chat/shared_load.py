"""What several chat workers share, through Redis (the ``chat_shared`` setting): the server-load
ledger and each client's share of the generation slots.

Each worker routes by what every worker puts on each server (``chat.server_load.ServerLoad``): its
own requests in flight, counted at once, and the others' as their newest published records say. A
client's share of the slots (``chat.capacity.Slots``: ``max_slots_share``) is of every worker's
slots, and what it holds on any worker counts against it (by a hash of the client, never its
address): each slot is claimed atomically in Redis before it is granted (``CLAIM``, a Lua script
over the live workers' holds: a burst through two workers at once cannot exceed the share), and a
client waiting only for that share is reconsidered at each beat.
A worker publishes its own load every ``PERIOD`` (1 s) as one Redis key of its own, written with a
lease (``LEASE``, 8 s: ``SET … PX``) — so a worker that dies stops counting within 10 s (its lease
and a reader's beat),
with nobody to clean up after it — and reads the others' keys in the same beat. Both happen on a
thread of their own: route choice reads the last view in memory and never waits on the network.

How stale the others' load may be: one period plus the time of one round trip to Redis, as each
record says when it was written (``staleness``: its age when read; /metrics and the benchmark
show it). A record older than the lease is dropped, whatever Redis says; a Redis that cannot be
reached leaves each worker with its own load (logged once), as a single worker runs, until it is
back.

Why Redis and not PostgreSQL: the limits library Flask-Limiter uses keeps its counters in Redis
(``rate_limit_storage``; there is no PostgreSQL backend), and key expiry is the lease itself.

A record is untrusted input (any process with the URL may write one): each is parsed at this edge,
bounded (``MAX_PEERS`` servers, ``MAX_WORKERS`` workers), and one bad record costs only itself.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from chat.capacity import OthersSlots, Slots, client_key
from chat.server_load import OthersLoad, ServerLoad

log = logging.getLogger(__name__)

PERIOD = 1.0  # seconds between a worker's publications (and its reads of the others')
LEASE = 8.0  # seconds a published record counts without being written again (a dead worker: gone within 10 s)
PREFIX = "swarm-monitor:chat-load:"  # + a worker: its record, under its lease
WORKERS_KEY = "swarm-monitor:chat-workers"  # the workers by when their lease ends (a sorted set)
SHARE_PREFIX = "swarm-monitor:chat-share:"  # + a client's key: slots it holds, per worker (a hash)
CLAIM_TIMEOUT = 0.25  # seconds a slot's claim may wait on Redis (it holds the slots' lock), then local rules
# One slot more for a client, atomically over every worker: its holds on the live workers (the roll)
# and this one, at most its share; else nothing changes. A dead worker's holds count for nothing.
CLAIM = """
local total = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf')) do
  if w ~= ARGV[1] then
    local held = tonumber(redis.call('HGET', KEYS[1], w) or '0') or 0
    if held > 0 then total = total + held end
  end
end
if total > tonumber(ARGV[3]) then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  return 0
end
redis.call('EXPIRE', KEYS[1], 86400)
return 1
"""
MAX_WORKERS = 64  # other workers' records read at most
MAX_PEERS = 10_000  # servers in one record, at most
MAX_COUNT = 100_000  # requests one record may say one server runs (or slots it has, one client holds)
MAX_CLIENTS = 10_000  # clients in one record, at most


def worker_id() -> str:
    """A name for this worker, unique among its peers: host, process, and a random part."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


def record(worker: str, own: Mapping[str, Any], at: float) -> str:
    """A worker's load as it publishes it (``ServerLoad.own``)."""
    return json.dumps({"v": 1, "worker": worker, "at": round(at, 3), **own}, separators=(",", ":"))


@dataclass(frozen=True)
class Parsed:
    worker: str
    at: float
    in_flight: dict[str, int]
    directed: dict[str, int]
    full_ago: dict[str, float]
    slots: int = 0
    clients: dict[str, int] = field(default_factory=dict)  # client key -> slots held


def _count(n: object) -> Optional[int]:
    return max(0, min(MAX_COUNT, n)) if isinstance(n, int) and not isinstance(n, bool) else None


def _counts(value: object, most: int = MAX_PEERS) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key, n in list(value.items())[:most]:
        if isinstance(key, str) and 0 < len(key) <= 128 and _count(n) is not None:
            out[key] = _count(n)
    return out


def parse(raw: object) -> Optional[Parsed]:
    """One published record, or None when it is out of shape (untrusted: never an exception)."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != 1:
        return None
    worker, at = data.get("worker"), data.get("at")
    if not isinstance(worker, str) or not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    full = data.get("full_ago")
    full_ago = {peer: float(ago) for peer, ago in (list(full.items())[:MAX_PEERS] if isinstance(full, dict) else ())
                if isinstance(peer, str) and 0 < len(peer) <= 128 and isinstance(ago, (int, float))
                and not isinstance(ago, bool) and 0 <= ago < LEASE * 10}
    return Parsed(worker[:120], float(at), _counts(data.get("in_flight")), _counts(data.get("directed")), full_ago,
                  _count(data.get("slots")) or 0, _counts(data.get("clients"), MAX_CLIENTS))


@dataclass(frozen=True)
class Others:
    """What the other workers publish, merged: their load on each server, their slots, and ages."""

    load: OthersLoad
    slots: OthersSlots
    ages: list[float]


def merge(records: Iterable[Parsed], *, me: str, now: float, read_at: float, lease: float = LEASE) -> Others:
    """The other workers' load and slots from their records (``now``: wall time of the read;
    ``read_at``: the same moment on the ServerLoad's clock), with each counted record's age (its
    staleness). Records older than the lease, and this worker's own, do not count."""
    in_flight: Counter = Counter()
    directed: Counter = Counter()
    clients: Counter = Counter()
    full_ago: dict[str, float] = {}
    ages, slots = [], 0
    for found in records:
        age = now - found.at
        if found.worker == me or not -lease < age < lease:
            continue
        ages.append(max(0.0, age))
        in_flight.update(found.in_flight)
        directed.update(found.directed)
        clients.update(found.clients)
        slots += found.slots
        for peer, ago in found.full_ago.items():
            since = ago + max(0.0, age)
            full_ago[peer] = min(since, full_ago.get(peer, since))
    return Others(OthersLoad(dict(in_flight), dict(directed), full_ago, read_at), OthersSlots(slots, dict(clients)),
                  ages)


class SharedLedger:
    """Publishes this worker's own load (``load``) and slots (``slots``, when given) and reads the
    other workers' every ``period`` on a thread (``start``/``close``); ``load.others`` and
    ``slots.others`` then answer from the newest read."""

    def __init__(self, url: str, load: ServerLoad, slots: Optional[Slots] = None, *, worker: Optional[str] = None,
                 period: float = PERIOD, lease: float = LEASE, clock: Callable[[], float] = time.time):
        import redis

        self.worker = worker or worker_id()
        self.period, self.lease = period, lease
        self._redis = redis.Redis.from_url(url, socket_timeout=max(0.5, period), socket_connect_timeout=max(0.5, period))
        self._load, self._slots, self._clock = load, slots, clock
        self._view = Others(OthersLoad(), OthersSlots(), [])
        self.staleness: list[float] = []  # the counted records' ages at the newest read (seconds)
        self.workers = 0  # other workers counted at the newest read
        self.failed: Optional[str] = None  # why the newest beat failed, if it did
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        load.others = lambda: self._view.load
        # the slots' claims: exact, atomic in Redis (a Lua script), on a connection of their own with
        # a short timeout (they run under the slots' lock); unreachable, the local rules decide
        self._claims = redis.Redis.from_url(url, socket_timeout=CLAIM_TIMEOUT, socket_connect_timeout=CLAIM_TIMEOUT)
        self._claim = self._claims.register_script(CLAIM)
        self._unclaimed: Counter = Counter()  # gives back that did not reach Redis: retried each beat
        self._claim_failed = False
        if slots is not None:
            slots.others = lambda: self._view.slots
            slots.claim, slots.unclaim = self.claim, self.unclaim

    def claim(self, client: str, cap: int) -> bool:
        """May ``client`` take one slot more, its share over every worker being ``cap``? (Counted taken if so.)"""
        try:
            granted = bool(self._claim(keys=[SHARE_PREFIX + client_key(client), WORKERS_KEY],
                                       args=[self.worker, self._clock(), cap]))
            self._claim_failed = False
            return granted
        except Exception as e:  # noqa: BLE001 - Redis away: this worker's own rules decide
            if not self._claim_failed:
                log.warning("a slot's share over every chat worker not checked (this worker's own rules decide "
                            "until Redis answers): %s", str(e)[:300])
            self._claim_failed = True
            return True

    def unclaim(self, client: str) -> None:
        """One of ``client``'s slots given back (kept for the next beat if Redis does not take it now)."""
        self._unclaimed[client_key(client)] += 1
        self._give_back()

    def _give_back(self) -> None:
        for key, n in list(self._unclaimed.items()):
            try:
                left = self._claims.hincrby(SHARE_PREFIX + key, self.worker, -n)
                if left <= 0:
                    self._claims.hdel(SHARE_PREFIX + key, self.worker)
            except Exception:  # noqa: BLE001 - retried at the next beat
                return
            self._unclaimed[key] -= n
            if self._unclaimed[key] <= 0:
                del self._unclaimed[key]

    def start(self) -> "SharedLedger":
        self._thread = threading.Thread(target=self._run, name="chat-shared-load", daemon=True)
        self._thread.start()
        return self

    def beat(self) -> None:
        """One publication and one read (the thread's step; a spec may call it)."""
        now = self._clock()
        own = {**self._load.own(), **(self._slots.own() if self._slots is not None else {})}
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(PREFIX + self.worker, record(self.worker, own, now), px=int(self.lease * 1000))
        pipe.zadd(WORKERS_KEY, {self.worker: now + self.lease})  # (the roll of workers: a read costs O(workers),
        pipe.zremrangebyscore(WORKERS_KEY, "-inf", now)  # never a scan of a Redis the rate limits share)
        pipe.zrangebyscore(WORKERS_KEY, now, "+inf", start=0, num=MAX_WORKERS + 1)
        names = [n.decode() if isinstance(n, bytes) else n for n in pipe.execute()[-1]]
        keys = [PREFIX + name for name in names if name != self.worker][:MAX_WORKERS]
        raws = self._redis.mget(keys) if keys else []
        view = merge(filter(None, (parse(raw) for raw in raws if raw is not None)), me=self.worker,
                     now=self._clock(), read_at=self._load.now(), lease=self.lease)
        changed = view.slots != self._view.slots
        self._view, self.staleness, self.workers = view, view.ages, len(view.ages)
        if self._unclaimed:
            self._give_back()
        if self._slots is not None and (changed or self._slots.load().waiting):
            self._slots.reconsider()  # a client waiting for its share over every worker may go on

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.beat()
                if self.failed is not None:
                    log.info("chat workers' shared load: Redis answers again")
                self.failed = None
            except Exception as e:  # noqa: BLE001 - Redis down or slow: this worker goes on with its own load
                if self.failed is None:
                    log.warning("chat workers' shared load not published or read (each worker counts its own "
                                "until it is): %s", str(e)[:300])
                self.failed = str(e)[:300]
                if self._view.load.read_at and self._load.now() - self._view.load.read_at > self.lease:
                    self._view = Others(OthersLoad(), OthersSlots(), [])  # what it last read outlived its leases
                    self.workers, self.staleness = 0, []
                    if self._slots is not None:
                        self._slots.reconsider()
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def close(self) -> None:
        """Stop publishing and withdraw this worker's record (a worker that dies without it is
        dropped by the lease)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.period * 3 + 1)
        try:
            self._redis.delete(PREFIX + self.worker)
            self._redis.zrem(WORKERS_KEY, self.worker)
        except Exception:  # noqa: BLE001 - its lease ends it anyway
            pass
        self._redis.close()
        self._claims.close()
        self._load.others = lambda: OthersLoad()
        if self._slots is not None:
            self._slots.others = lambda: OthersSlots()
            self._slots.claim = self._slots.unclaim = None
