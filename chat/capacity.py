"""What the chat's users share, bounded and shared fairly: generation slots and open sessions.

Two scarce things, bounded apart, because they cost different things:

- a **generation slot** is one answer being computed: a petals inference session stepping through
  the swarm, and this process running the model's head. It is held only while that work runs — an
  HTTP answer from its first step to its last token, one turn of a WebSocket session — never while
  a person reads or types. ``Slots`` hands out ``slots`` of them; past that, requests wait in a
  bounded queue and are served **per client in turn** (each client's own requests in order, the
  clients round robin), so one client with many requests does not push everyone else back. One
  client holds at most ``slots_share`` of the slots and of the queue. A turn of a kept-open session
  waits in turn too, but outside the queue's bound (open sessions are bounded themselves, and its
  connection already holds a thread), so a person mid-conversation is not refused for a full queue. A request that finds the
  queue full, or waits longer than ``queue_timeout``, is refused with a ``Retry-After`` estimated
  from how long slots were recently held and how many requests wait ahead.
- an **open session** is a petals inference session kept between turns (chat.petals.dev's
  WebSocket: one per browser tab), holding attention caches on its servers but no slot while idle.
  ``OpenSessions`` keeps at most ``open_sessions`` of them, ``sessions_per_client`` per client; when
  room is needed the least recently used idle one is expired (its owner is told "Session … expired",
  on which chat.petals.dev's page opens a new one by itself), and only when none is idle is the
  newcomer refused.

Pure: threads and clocks only (no petals, no torch, no Flask), so the rules are specified without a
swarm. Counters and the wait histogram are what /metrics shows (``chat.metrics``).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from chat.errors import Busy, SessionExpired

# seconds a request waited for its slot: the histogram's upper bounds (and +Inf)
RECENT_HOLDS = 64  # slot hold times the Retry-After estimate is taken from
WAIT_TICK = 1.0  # seconds between two looks at a waiting request's place (``acquire``'s ``on_wait``)
MAX_RETRY_AFTER = 600


@dataclass(frozen=True)
class Capacity:
    """The bounds (``monitor.settings``: chat_slots, chat_queue_size, chat_queue_timeout,
    max_slots_share, max_open_sessions, max_sessions_per_client)."""

    slots: int = 4
    queue_size: int = 32
    queue_timeout: float = 60.0
    slots_share: float = 0.5  # of the slots (and of the queue) one client may hold, at least one
    open_sessions: int = 32
    sessions_per_client: int = 4
    retry_after: int = 5  # seconds to suggest before any slot was ever held

    @classmethod
    def from_settings(cls, settings: Any) -> "Capacity":
        return cls(slots=settings.chat_slots, queue_size=settings.chat_queue_size,
                   queue_timeout=settings.chat_queue_timeout, slots_share=settings.max_slots_share,
                   open_sessions=settings.max_open_sessions, sessions_per_client=settings.max_sessions_per_client)

    @property
    def slots_per_client(self) -> int:
        return max(1, math.floor(self.slots * self.slots_share + 1e-9))

    @property
    def waiting_per_client(self) -> int:
        return max(1, math.ceil(self.queue_size * self.slots_share - 1e-9)) if self.queue_size else 0


@dataclass(frozen=True)
class SlotsLoad:
    limit: int
    busy: int
    waiting: int
    waiting_clients: int
    retry_after: int  # what a refused request would be told now
    refused: dict  # reason -> count


class _Waiter:
    __slots__ = ("client", "asked", "event", "slot", "queued")

    def __init__(self, client: str, asked: float, queued: bool):
        self.client, self.asked, self.queued = client, asked, queued
        self.event = threading.Event()
        self.slot: Optional[Slot] = None


class Slot:
    """One generation slot, held by ``client`` until ``release`` (idempotent), which ``InSlot`` calls."""

    def __init__(self, slots: "Slots", client: str, granted: float, waited: float):
        self._slots, self.client, self.granted, self.waited = slots, client, granted, waited
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots._release(self)


class InSlot:
    """What is computed in ``slot`` (an iterator), and the one place a slot goes back: when the
    iterator ends or fails, or when it is closed, whether it was started or not. ``slot`` None:
    computed in no slot (the monitor's own check)."""

    def __init__(self, slot: Optional[Slot], events: Iterator):
        self.slot, self._events = slot, events

    def __iter__(self) -> "InSlot":
        return self

    def __next__(self):
        try:
            return next(self._events)
        except BaseException:  # the end (StopIteration) or a failure
            self.close()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._events, "close", None)
            if close is not None:
                close()
        finally:
            if self.slot is not None:
                self.slot.release()


def client_key(client: str) -> str:
    """A client as other chat workers see it (``chat.shared_load``): a short hash, never its address."""
    return hashlib.blake2b(client.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class OthersSlots:
    """The other chat workers' generation slots, as their newest published records say: how many
    they have, and how many each client holds there (by ``client_key``)."""

    slots: int = 0
    held: Any = field(default_factory=dict)  # client key -> slots held


NO_OTHER_SLOTS = OthersSlots()


class Slots:
    """``capacity.slots`` generation slots, shared per client in turn (see the module's docstring).
    With several chat workers (``others``: what the other workers publish, ``chat.shared_load``),
    a client's share is of every worker's slots, and the slots it holds anywhere count against it."""

    def __init__(self, capacity: Capacity, clock: Callable[[], float] = time.monotonic,
                 observe_wait: Optional[Callable[[float], object]] = None):
        """``observe_wait``: told every granted slot's wait in seconds (/metrics' histogram)."""
        self.capacity = capacity
        self._clock = clock
        self._observe_wait = observe_wait
        self._lock = threading.Lock()
        self._held: set = set()  # the slots held now: by whom, and since when (when each likely frees)
        self._queues: "OrderedDict[str, deque[_Waiter]]" = OrderedDict()  # in turn order
        self._holds: deque = deque(maxlen=RECENT_HOLDS)
        self._refused: Counter = Counter()
        self.others: Callable[[], OthersSlots] = lambda: NO_OTHER_SLOTS
        # several workers: (client, its share over every worker) -> may it take one more slot (and it
        # is counted taken); ``release``: one given back. Exact where ``others`` lags (``chat.shared_load``)
        self.claim: Optional[Callable[[str, int], bool]] = None
        self.unclaim: Optional[Callable[[str], None]] = None

    def own(self) -> dict:
        """This worker's slots and each client's held ones (by ``client_key``), as it publishes them."""
        with self._lock:
            held = Counter(client_key(slot.client) for slot in self._held if slot.client is not None)
            return {"slots": self.capacity.slots, "clients": dict(held)}

    # -- taking and giving back -------------------------------------------------------------------
    def acquire(self, client: Optional[str], timeout: Optional[float] = None, *, queued: bool = True,
                on_wait: Optional[Callable[[int, float], object]] = None) -> Slot:
        """A slot for ``client`` (None: this process itself, e.g. a benchmark or a spec, which no
        share applies to): at once if one is free for it, else after waiting its turn (at
        most ``timeout``, by default the capacity's queue_timeout). Raises Busy, with a realistic
        Retry-After, when the queue (or the client's share of it) is full or the wait too long.
        ``queued`` False: a turn of a kept-open session, which waits in turn like any request but
        takes no place in the bounded queue (its connection and thread exist anyway, and open
        sessions are bounded on their own); it is refused only when it waited too long. ``on_wait``:
        told ``(position, expected wait)`` when the request joins the queue and whenever either
        changes while it waits (checked every ``WAIT_TICK`` seconds), e.g. to tell its client."""
        timeout = self.capacity.queue_timeout if timeout is None else timeout
        with self._lock:
            now = self._clock()
            if self._free_for(client) and client not in self._queues:
                slot = self._grant(client, now, now)
                if slot is not None:
                    return slot
            waiting = self._waiting()
            if queued:
                in_queue = self._waiting(queued_only=True)
                if in_queue >= self.capacity.queue_size:
                    raise self._refuse("queue_full", f"all {self.capacity.slots} generation slots are busy and "
                                                     f"{waiting} requests are waiting", ahead=waiting)
                mine = sum(1 for w in self._queues.get(client, ()) if w.queued)
                if client is not None and mine >= self.capacity.waiting_per_client:
                    raise self._refuse("client_share", f"you already have {mine} requests waiting for a "
                                                       f"generation slot (at most {self.capacity.waiting_per_client} "
                                                       f"per client)", ahead=waiting)
            waiter = _Waiter(client, now, queued)
            self._queues.setdefault(client, deque()).append(waiter)
        if not self._wait(waiter, timeout, on_wait):
            with self._lock:
                if waiter.slot is None:  # not granted meanwhile: leave the queue
                    queue = self._queues.get(client)
                    if queue is not None and waiter in queue:
                        queue.remove(waiter)
                        if not queue:
                            del self._queues[client]
                    raise self._refuse("timeout", f"no generation slot became free within {timeout:.0f} s "
                                                  f"(all {self.capacity.slots} busy, {self._waiting()} requests "
                                                  f"waiting)", ahead=self._waiting())
        return waiter.slot

    def _wait(self, waiter: _Waiter, timeout: float, on_wait: Optional[Callable[[int, float], object]]) -> bool:
        """Wait for the waiter's slot (False: not granted within ``timeout``), telling ``on_wait``."""
        if on_wait is None:
            return waiter.event.wait(timeout)
        deadline, told = time.monotonic() + timeout, None  # (real time: what Event.wait waits)
        while True:
            with self._lock:
                now_told = None if waiter.slot is not None else self._place(waiter)
            if now_told is not None and now_told != told:
                told = now_told
                try:
                    on_wait(*now_told)
                except Exception:  # noqa: BLE001 - telling the client must not lose its place
                    pass
            left = deadline - time.monotonic()
            if waiter.event.wait(max(0.0, min(WAIT_TICK, left))):
                return True
            if left <= WAIT_TICK:
                return waiter.event.is_set()

    def _place(self, waiter: _Waiter) -> Optional[tuple[int, float]]:
        """(position in the dispatch order, 1 = next; expected seconds until its slot), lock held:
        the clients take turns, each its oldest request first (``_dispatch``)."""
        order = list(self._queues)
        if waiter.client not in order or waiter not in self._queues[waiter.client]:
            return None
        mine, index = order.index(waiter.client), self._queues[waiter.client].index(waiter)
        ahead = sum(min(len(self._queues[c]), index + (1 if i < mine else 0)) for i, c in enumerate(order) if i != mine)
        position = ahead + index + 1
        return position, round(self._until(position), 1)

    def take(self, client: Optional[str], wanted: int = 1, *, timeout: Optional[float] = None,
             queued: bool = True, on_wait: Optional[Callable[[int, float], object]] = None) -> list[Slot]:
        """The slots a request computes in: the first waits its turn (``acquire``), up to
        ``wanted - 1`` more only when they are free now. Each goes back through ``InSlot``."""
        slots = [self.acquire(client, timeout, queued=queued, on_wait=on_wait)]
        while len(slots) < wanted:
            extra = self.try_acquire(client)
            if extra is None:
                break
            slots.append(extra)
        return slots

    def try_acquire(self, client: Optional[str]) -> Optional[Slot]:
        """A slot that is free for ``client`` now and that nobody waits for, else None (never waits)."""
        with self._lock:
            now = self._clock()
            if self._free_for(client) and not self._queues:
                return self._grant(client, now, now)
            return None

    def reconsider(self) -> None:
        """The other workers' holds changed (``others``): a client waiting only for its share over
        every worker may take a free slot here now."""
        with self._lock:
            self._dispatch(self._clock())

    def _release(self, slot: Slot) -> None:
        with self._lock:
            now = self._clock()
            self._held.discard(slot)
            self._holds.append(now - slot.granted)
            if slot.client is not None and self.unclaim is not None:
                self.unclaim(slot.client)
            self._dispatch(now)

    # -- the rules (called with the lock held) --------------------------------------------------------
    def _total_busy(self) -> int:
        return len(self._held)

    def _held_by(self, client: Optional[str]) -> int:
        """The slots ``client`` holds here and (its share being over every worker) elsewhere."""
        here = sum(1 for slot in self._held if slot.client == client)
        return here if client is None else here + int(self.others().held.get(client_key(client), 0))

    def _waiting(self, *, queued_only: bool = False) -> int:
        return sum(sum(1 for w in q if w.queued or not queued_only) for q in self._queues.values())

    def _cap(self, client: Optional[str]) -> int:
        if client is None:
            return self.capacity.slots
        others = self.others().slots
        if not others:
            return self.capacity.slots_per_client
        return max(1, math.floor((self.capacity.slots + others) * self.capacity.slots_share + 1e-9))

    def _free_for(self, client: Optional[str]) -> bool:
        return self._total_busy() < self.capacity.slots and self._held_by(client) < self._cap(client)

    def _grant(self, client: Optional[str], asked: float, now: float) -> Optional[Slot]:
        """The slot, or None when another worker's holds take the client's share over every worker
        (``claim``: the shared ledger's atomic count; without one, the local rules decide alone)."""
        if client is not None and self.claim is not None and not self.claim(client, self._cap(client)):
            return None
        if self._observe_wait is not None:
            self._observe_wait(now - asked)
        slot = Slot(self, client, now, now - asked)
        self._held.add(slot)
        return slot

    def _dispatch(self, now: float) -> None:
        """Free slots to waiting clients in turn: the first client in turn order that may take one
        gets it for its oldest request, then goes to the back of the turn order (a client whose
        share over every worker is taken waits for the next look: ``reconsider``)."""
        refused: set = set()
        while self._total_busy() < self.capacity.slots:
            turn = [c for c in self._queues if c not in refused and self._held_by(c) < self._cap(c)]
            if not turn:
                return
            client = turn[0]
            queue = self._queues[client]
            slot = self._grant(client, queue[0].asked, now)
            if slot is None:
                refused.add(client)
                continue
            waiter = queue.popleft()
            if queue:
                self._queues.move_to_end(client)
            else:
                del self._queues[client]
            waiter.slot = slot
            waiter.event.set()

    def _refuse(self, reason: str, what: str, *, ahead: int) -> Busy:
        self._refused[reason] += 1
        seconds = self._estimate(ahead)
        return Busy(f"{what}; retry in {seconds} s", seconds)

    def _until(self, position: int) -> float:
        """Seconds until the request at ``position`` in line (1 = next) gets a slot. Each slot is
        expected to free ``hold`` after it was granted (the median of recent hold times; now, for a
        holder past it or a slot free), and again every ``hold`` after that: the request at
        ``position`` takes the ``position``-th of those times. Lock held; the expectation behind the
        queue's places and the forecasts (Retry-After: ``_estimate``)."""
        hold = statistics.median(self._holds) if self._holds else float(self.capacity.retry_after)
        now, count = self._clock(), max(1, self.capacity.slots)
        frees = sorted(max(0.0, slot.granted + hold - now) for slot in self._held)[:count]
        frees += [0.0] * (count - len(frees))
        rounds, index = divmod(max(1, position) - 1, count)
        return min(float(MAX_RETRY_AFTER), frees[index] + rounds * hold)

    def _estimate(self, ahead: int) -> int:
        """Retry-After for a request behind ``ahead`` others: whole seconds after which a slot is
        likely free — a full hold per round of ``slots`` ahead of it, not ``_until``'s expectation:
        a client told to retry sooner would mostly be refused again."""
        hold = statistics.median(self._holds) if self._holds else float(self.capacity.retry_after)
        rounds = ahead // max(1, self.capacity.slots) + 1
        return int(min(MAX_RETRY_AFTER, max(1, math.ceil(rounds * hold))))

    # -- what /metrics shows ----------------------------------------------------------------------
    def load(self) -> SlotsLoad:
        with self._lock:
            waiting = self._waiting()
            return SlotsLoad(limit=self.capacity.slots, busy=self._total_busy(), waiting=waiting,
                             waiting_clients=len(self._queues), retry_after=self._estimate(waiting),
                             refused=dict(self._refused))

    def estimate(self) -> int:
        """Seconds a request arriving now would likely wait for its slot (what Retry-After says)."""
        with self._lock:
            return self._estimate(self._waiting())

    def expected_wait(self) -> float:
        """Seconds a request arriving now would wait for its slot: none while a slot is free and
        nobody waits, else ``_until`` its place (a forecast's, not Retry-After's whole seconds)."""
        with self._lock:
            ahead = self._waiting()
            if not ahead and self._total_busy() < self.capacity.slots:
                return 0.0
            return self._until(ahead + 1)

    def held_by(self, client: Optional[str]) -> int:
        with self._lock:
            return self._held_by(client)


# ---- open sessions ---------------------------------------------------------------------------------


IDLE, WAITING, GENERATING = "idle", "waiting", "generating"


@dataclass
class _Open:
    member: Any  # has .label and .expire(detail)
    client: Optional[str]
    state: str = IDLE
    last_used: float = 0.0
    kept: bool = False  # kept after an answer (``chat.kept``): let go first


@dataclass(frozen=True)
class SessionsLoad:
    limit: int
    per_client: int
    states: dict  # idle / waiting / generating -> open sessions
    expired: dict  # reason -> sessions the chat ended (evicted, idle, lifetime)
    refused: int  # opens refused: no idle session to make room with
    released: int = 0  # idle sessions that let go of their servers' caches for another session
    kept: int = 0  # of the open sessions, those kept after an answer (``chat.kept``; idle)


class OpenSessions:
    """Kept-open sessions, at most ``capacity.open_sessions`` (``sessions_per_client`` per client).

    A member is anything with a ``label`` and an ``expire(detail)`` method (``chat.session.ChatSession``);
    ``expire`` is called outside the lock, after the member left the registry."""

    def __init__(self, capacity: Capacity, clock: Callable[[], float] = time.monotonic,
                 observe_wait: Optional[Callable[[float], object]] = None):
        """``observe_wait``: told every granted slot's wait in seconds (/metrics' histogram)."""
        self.capacity = capacity
        self._clock = clock
        self._observe_wait = observe_wait
        self._lock = threading.Lock()
        self._open: "OrderedDict[int, _Open]" = OrderedDict()  # id(member) -> entry, least recently used first
        self._expired: Counter = Counter()
        self._refused = self._released = 0
        self._retry_after: Callable[[], int] = lambda: capacity.retry_after
        self._stopping: Optional[str] = None  # why every session goes as it turns idle (``stop``)

    def estimate_with(self, retry_after: Callable[[], int]) -> None:
        """Where Retry-After comes from when no session can be made room for (the slots' estimate)."""
        self._retry_after = retry_after

    def admit(self, member: Any, client: Optional[str], *, kept: bool = False) -> bool:
        """Register ``member`` for ``client`` (None: this process itself, no per-client bound), expiring the
        least recently used idle session of the client (at its own bound) or of anyone (at the total
        bound) — kept sessions (``chat.kept``) first. Raises Busy if none is idle. A ``kept`` member
        makes room only with other kept sessions: without one it is not admitted (False), and never
        refused with an error (its answer is done)."""
        victims = []
        with self._lock:
            now = self._clock()
            mine = [e for e in self._open.values() if e.client == client]
            if client is not None and len(mine) >= self.capacity.sessions_per_client:
                victim = self._victim(mine, kept_only=kept)
                if victim is None:
                    if kept:
                        return False
                    raise self._refuse(f"you have {len(mine)} sessions open and none is idle (at most "
                                       f"{self.capacity.sessions_per_client} per client); close one or retry")
                victims.append(self._evict(victim, now, f"{self.capacity.sessions_per_client} sessions per client"))
            if len(self._open) >= self.capacity.open_sessions:  # (never after the client's own made room)
                victim = self._victim(list(self._open.values()), kept_only=kept)
                if victim is None:
                    if kept:
                        for entry, detail in victims:
                            entry.member.expire(detail)
                        return False
                    raise self._refuse(f"all {self.capacity.open_sessions} chat sessions are answering or waiting "
                                       f"for an answer, none is idle")
                victims.append(self._evict(victim, now, f"{self.capacity.open_sessions} open sessions"))
            self._open[id(member)] = _Open(member, client, IDLE, now, kept)
        for entry, detail in victims:
            entry.member.expire(detail)
        return True

    @staticmethod
    def _victim(entries: list, *, kept_only: bool) -> Optional[_Open]:
        """The idle session to let go first: the least recently used kept one, else (unless
        ``kept_only``) the least recently used idle one."""
        idle = [e for e in entries if e.state == IDLE]
        return next((e for e in idle if e.kept), None if kept_only else next(iter(idle), None))

    def _evict(self, entry: _Open, now: float, bound: str) -> tuple[_Open, str]:
        del self._open[id(entry.member)]
        self._expired["evicted"] += 1
        return entry, (f"it was idle for {now - entry.last_used:.0f} s and was closed to make room for another "
                       f"session (at most {bound}); open a new session to go on")

    def _refuse(self, what: str) -> Busy:
        self._refused += 1
        seconds = self._retry_after()
        return Busy(f"{what}; retry in {seconds} s", seconds)

    def set_state(self, member: Any, state: str) -> None:
        """``member`` is now idle, waiting for a slot, or generating. Raises SessionExpired if it was
        expired (a turn arriving just after its session was made room with)."""
        with self._lock:
            entry = self._open.get(id(member))
            if entry is None:
                raise SessionExpired(member.label, getattr(member, "expired_detail", None) or "it is closed")
            entry.state = state
            stopping = self._stopping if state == IDLE else None
            if stopping is not None:  # its turn ended while this worker stops: it goes now
                del self._open[id(member)]
                self._expired["stopping"] += 1
            elif state == IDLE:
                entry.last_used = self._clock()
                self._open.move_to_end(id(member))
        if stopping is not None:
            member.expire(stopping)

    def idle_holding(self, peer: str, needed: int) -> list:
        """Idle sessions holding cache room on ``peer`` (``member.holds(peer)``), kept ones first, then
        the least recently used, as many as free twice ``needed`` tokens of it (each holds its
        ``max_length``): what lets go of its cache (``member.release_cache()``) when ``peer`` refused
        a session of ``needed`` tokens for want of room. Counted as released."""
        found, freed = [], 0
        with self._lock:
            idle = [e for e in self._open.values() if e.state == IDLE]
            for entry in sorted(idle, key=lambda e: not e.kept):
                if freed >= 2 * max(1, needed):
                    break
                if entry.member.holds(peer):
                    found.append(entry.member)
                    freed += entry.member.max_length
            self._released += len(found)
        return found

    def stop(self, detail: str) -> int:
        """This worker is stopping (``ChatEngine.drain``): every idle session is expired now with
        ``detail`` (its owner is told "Session … expired", on which chat.petals.dev's page opens a
        new one, on another worker) and every other as soon as its turn ends; how many now."""
        with self._lock:
            self._stopping = detail
            idle = [e for e in self._open.values() if e.state == IDLE]
            for entry in idle:
                del self._open[id(entry.member)]
                self._expired["stopping"] += 1
        for entry in idle:
            entry.member.expire(detail)
        return len(idle)

    def remove(self, member: Any, reason: Optional[str] = None) -> None:
        """``member`` closed (``reason``: why the chat ended it: "idle", "lifetime"; None: its owner did)."""
        with self._lock:
            if self._open.pop(id(member), None) is not None and reason:
                self._expired[reason] += 1

    def load(self) -> SessionsLoad:
        with self._lock:
            states = Counter(e.state for e in self._open.values())
            return SessionsLoad(limit=self.capacity.open_sessions, per_client=self.capacity.sessions_per_client,
                                states={s: states.get(s, 0) for s in (IDLE, WAITING, GENERATING)},
                                kept=sum(1 for e in self._open.values() if e.kept),
                                expired={k: v for k, v in self._expired.items() if v}, refused=self._refused,
                                released=self._released)
