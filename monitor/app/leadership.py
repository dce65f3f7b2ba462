"""This poller's place among the pollers of its database: leader while it holds the lease.

The lease and its rules are ``core/leadership.py``'s, its SQL ``store/leases.py``'s; this is the
thread that keeps it. Every renewal period (a quarter of the lease) it claims the lease — the
leader renews it, a standby takes it when it has run out — and reports this poller (its role,
what it cannot reach, its latest poll). ``held()`` says, by this machine's monotonic clock and
conservatively (counted from before the claim was sent), whether the lease still holds; the
poller's jobs start only while it does, and every one of their writes is fenced in the database
as well (``Store.fenced``): a leader frozen past its lease (SIGSTOP, a stalled VM) that wakes
finds ``held()`` false, and whatever it was writing is refused, so it steps down without writing.

Becoming leader and standing down call the poller back (``on_lead``, ``on_standby``) on a thread
of their own, in order, so a slow start or stop of the poller's jobs never delays a renewal.
A claim that fails (the database is away) leaves the lease to run out: a standby that can reach
the database takes over; this poller leads again only by claiming it again.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
from typing import Callable, Optional

from monitor.core import leadership as core
from monitor.core.common import short_error
from monitor.store import StoreError

log = logging.getLogger(__name__)


def this_poller() -> core.PollerId:
    """This process as a poller: its host name, pid, start time and a token (pids repeat)."""
    host = socket.gethostname() or "localhost"
    pid = os.getpid()
    return core.PollerId(holder=f"{host[:150]}:{pid}:{secrets.token_hex(6)}", host=host, pid=pid,
                         started_at=time.time())


class Leadership:
    """Keeps (or waits for) the pollers' lease on ``store`` (a store without the fence)."""

    def __init__(self, store, lease_seconds: float, *, me: Optional[core.PollerId] = None,
                 notify: Optional[Callable] = None, on_lead: Optional[Callable[[Optional[core.Term]], None]] = None,
                 on_standby: Optional[Callable[[str], None]] = None):
        """``notify(notice)``: the webhooks a take-over's notice goes to (None: no notice)."""
        self.store = store
        self.lease_seconds = lease_seconds
        self.interval = core.renew_every(lease_seconds)
        self.me = me or this_poller()
        self.notify = notify
        self.on_lead, self.on_standby = on_lead, on_standby
        self.problem: Optional[str] = None  # what this poller cannot reach (the DHT, the bootstrap peers)
        self.last_poll_at: Optional[float] = None  # its latest stored poll
        self.lease: Optional[core.Lease] = None  # the lease as last read
        self.db_problem: Optional[str] = None  # the last claim failed: why
        self.claims = 0  # claims sent (the standby's cost: one write transaction each)
        self._epoch: Optional[int] = None  # the epoch it holds, while it believes it does
        self._held_until = 0.0  # time.monotonic() until which the lease holds
        self._leading = False  # what the poller was last told
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._transitions: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._worker: Optional[threading.Thread] = None

    # ---- what the jobs ask -----------------------------------------------------------------------
    def held(self) -> bool:
        """This poller holds the lease now (by its own clock, conservatively)."""
        return self._epoch is not None and time.monotonic() < self._held_until

    def token(self) -> Optional[tuple[str, int]]:
        """(holder, epoch) while the lease holds, else None: what the fence checks every write against."""
        epoch = self._epoch
        return (self.me.holder, epoch) if epoch is not None and self.held() else None

    @property
    def epoch(self) -> Optional[int]:
        return self._epoch

    def describe(self) -> str:
        """One line for the log: whether this poller leads, else who does."""
        if self.held():
            return f"this poller ({self.me.label}) leads, epoch {self._epoch}"
        lease = self.lease
        if lease is not None and lease.holder != self.me.holder:
            return f"standing by: poller {lease.label} leads (epoch {lease.epoch})"
        return "standing by"

    # ---- the claim -------------------------------------------------------------------------------
    def claim(self) -> Optional[core.Grant]:
        """One claim (renew, take or wait), and what follows from it; None if the database failed."""
        sent = time.monotonic()
        self.claims += 1
        try:
            grant = self.store.claim_poller_lease(self.me, self.lease_seconds, role_problem=self.problem,
                                                  last_poll_at=self.last_poll_at, notify=self.notify)
        except StoreError as e:
            if self.db_problem is None:
                log.warning("cannot claim the pollers' lease, the database failed: %s (%s)", short_error(e, 300),
                            "this poller stops leading when its lease runs out" if self.held() else "standing by")
            self.db_problem = short_error(e, 300)
            self._follow()
            return None
        if self.db_problem is not None:
            log.info("the database answers again: %s", "renewed the lease" if grant.held else "claimed the lease")
            self.db_problem = None
        self.lease = grant.lease
        with self._lock:
            if grant.held and grant.lease is not None:
                self._epoch = grant.lease.epoch
                self._held_until = sent + grant.remaining
            elif not grant.held:
                self._epoch, self._held_until = None, 0.0
        self._follow(grant.term)
        return grant

    def _follow(self, term: Optional[core.Term] = None) -> None:
        """Tell the poller when it became leader or stopped being one."""
        leading = self.held()
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            how = term.summary() if term is not None else f"renewed its lease (epoch {self._epoch})"
            log.info("this poller leads now: %s", how)
            lead = self.on_lead
            if lead is not None:
                self._transitions.put(lambda: lead(term))
        else:
            why = self._why_not()
            log.warning("this poller stops leading: %s; standing by", why)
            stand_by = self.on_standby
            if stand_by is not None:
                self._transitions.put(lambda: stand_by(why))

    def _why_not(self) -> str:
        lease = self.lease
        if self.db_problem is not None:
            return f"its lease ran out while the database failed ({self.db_problem})"
        if lease is not None and lease.holder != self.me.holder:
            return f"poller {lease.label} took the lease (epoch {lease.epoch})"
        return "its lease ran out before it was renewed"

    # ---- the thread ------------------------------------------------------------------------------
    def start(self) -> "Leadership":
        """Claim now (so a lone poller polls at once), then every renewal period on a thread."""
        self._worker = threading.Thread(target=self._run_transitions, name="leadership-change", daemon=True)
        self._worker.start()
        self.claim()
        self._thread = threading.Thread(target=self._loop, name="leadership", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            # a standby looks a little off the beat, so that several do not claim at the same instant
            pause = self.interval if self.held() else self.interval * random.uniform(0.8, 1.0)
            if self.held():  # renew in time even if the last claim was slow
                pause = min(pause, max(0.0, self._held_until - time.monotonic() - self.interval))
            if self._stop.wait(pause):
                break
            self._follow()  # a lease that ran out while the claim below hangs still ends the leadership
            self.claim()

    def _run_transitions(self) -> None:
        while True:
            change = self._transitions.get()
            if change is None:
                return
            try:
                change()
            except Exception:  # noqa: BLE001 - the next change must still run
                log.exception("starting or stopping the poller's jobs failed")

    def stop(self) -> None:
        """Stop claiming (and calling the poller back); the lease holds until ``release`` or its
        deadline, so the jobs under way may still write."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self._worker is not None:
            self._transitions.put(None)
            self._worker.join(120)
            self._worker = None

    def release(self) -> None:
        """Hand the lease over, if this poller holds it: a standby takes it at its next look,
        without a take-over notice (a poller stopped on purpose pages nobody)."""
        epoch, held = self._epoch, self.held()
        with self._lock:
            self._epoch, self._held_until = None, 0.0
        if not held or epoch is None:
            return
        try:
            if self.store.release_poller_lease(self.me.holder, epoch):
                log.info("handed the pollers' lease over (epoch %d)", epoch)
        except StoreError as e:
            log.warning("could not hand the pollers' lease over (a standby takes it when it runs out): %s",
                        short_error(e, 300))


def for_settings(store, settings) -> Leadership:
    """This process's leadership on ``store`` as the settings have it: the lease's length, and the
    webhooks a take-over's notice goes to (as for an alert rule named ``poller-takeover``)."""
    alerts = settings.alerts
    notify = None
    if alerts.enabled:
        def notify(notice):
            return [hook.name for hook in alerts.webhooks_for(notice.rule)]
    return Leadership(store, settings.resolved_leader_lease_seconds, notify=notify)
