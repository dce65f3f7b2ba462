"""Which poller leads: the lease the pollers of one database compete for, as pure functions.

Any number of ``swarm-monitor poll`` processes may run against one PostgreSQL database; exactly
one of them, the **leader**, scrapes, probes, runs the generation checks, scores, rolls up and
sends notices. The others, **standbys**, keep their DHT client warm and wait. Who leads is a
lease in the database (``store/leases.py``): one row with the holder, an **epoch** (the term's
number, one more at each change of holder) and a deadline in the database's clock, so pollers
on machines whose clocks disagree still agree on it. The leader renews it every quarter of its
length; a standby that finds it expired (the leader was killed, frozen, or lost the database)
takes it with the next epoch. Every write of a poller checks, inside its own transaction, that
it still holds the lease at its epoch (the fence): a leader that wakes from a freeze after a
standby took over writes nothing, and steps down at its next renewal.

SQLite works the same within one file (one machine), but a frozen writer holds the file's lock:
high availability needs PostgreSQL.

No I/O here: the decisions and the words for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from monitor.core import alert_rules
from monitor.core.common import short_error
from monitor.core.timefmt import ago, utc

LEASE_NAME = "poller"  # the one lease: who polls this database
MIN_LEASE_SECONDS = 2.0
RENEWALS_PER_LEASE = 4  # the leader renews, and standbys look, this often per lease length
STANDBY_SEEN_LEASES = 3  # a standby counts as seen recently within this many lease lengths

TAKE, RENEW, WAIT = "take", "renew", "wait"  # what a claim does
FIRST, EXPIRED, RELEASED = "first", "expired", "released"  # why a term began
LEADER, STANDBY = "leader", "standby"  # a poller's role

TAKEOVER_RULE = "poller-takeover"  # the notice's rule name (configure webhooks for it like a rule's)
TAKEOVER_KIND = "poller_takeover"
TAKEOVER_EVENT = "takeover"


@dataclass(frozen=True)
class PollerId:
    """One poller process: ``holder`` is unique per process start (host, pid and a random token)."""

    holder: str
    host: str
    pid: int
    started_at: float

    @property
    def label(self) -> str:
        return poller_label(self.host, self.pid)


@dataclass(frozen=True)
class Lease:
    """The lease as the database holds it (times in the database's clock)."""

    holder: str
    host: str
    pid: int
    started_at: float  # the holder process's start
    epoch: int
    since: float  # when this term began
    deadline: float  # valid until then, unless renewed
    renewed_at: float
    released: bool = False  # its holder stopped and gave it up

    def valid(self, now: float) -> bool:
        return not self.released and self.deadline > now

    @property
    def label(self) -> str:
        return poller_label(self.host, self.pid)


@dataclass(frozen=True)
class Term:
    """One leadership term: who took the lease at which epoch, and from whom (a take-over event)."""

    epoch: int
    holder: str
    host: str
    pid: int
    started_at: float
    since: float
    reason: str  # first | expired | released
    previous_holder: Optional[str] = None
    previous_host: Optional[str] = None
    previous_pid: Optional[int] = None
    previous_deadline: Optional[float] = None  # when the previous leader's lease ran out

    @property
    def label(self) -> str:
        return poller_label(self.host, self.pid)

    @property
    def previous_label(self) -> Optional[str]:
        return None if self.previous_host is None else poller_label(self.previous_host, self.previous_pid)

    @property
    def is_takeover(self) -> bool:
        """A standby replaced a leader it lost (not the first term, not a clean hand-over)."""
        return self.reason == EXPIRED and self.previous_holder is not None

    def summary(self) -> str:
        """One line for people: what happened at this term's start."""
        me = f"poller {self.label}"
        if self.previous_holder is None:
            return f"{me} leads (the first poller of this database)"
        if self.reason == RELEASED:
            return f"{me} took over from poller {self.previous_label}, which stopped and handed over"
        ran_out = f" at {utc(self.previous_deadline)}" if self.previous_deadline is not None else ""
        return (f"{me} took over from poller {self.previous_label}, whose lease ran out{ran_out} "
                f"(killed, frozen, or cut off from the database)")


@dataclass(frozen=True)
class Member:
    """A poller as it last reported itself (every poller does, each renewal period)."""

    holder: str
    host: str
    pid: int
    started_at: float
    seen_at: float
    role: str  # leader | standby
    last_poll_at: Optional[float] = None  # its latest successful poll (leaders only)
    problem: Optional[str] = None  # what it cannot reach (the DHT, a bootstrap peer), for people

    @property
    def label(self) -> str:
        return poller_label(self.host, self.pid)


@dataclass(frozen=True)
class Grant:
    """What one claim came to: the lease after it (None: no lease yet and none taken), whether
    this poller holds it, and the term it began if it took it."""

    lease: Optional[Lease]
    held: bool
    now: float  # the database's clock at the claim
    term: Optional[Term] = None

    @property
    def remaining(self) -> float:
        """Seconds the lease holds from the claim on (0 when not held)."""
        return max(0.0, self.lease.deadline - self.now) if self.held and self.lease else 0.0


@dataclass(frozen=True)
class PollerStatus:
    """Who polls the database, for the pages, the API and /metrics."""

    now: float
    lease_seconds: Optional[float]  # the leader's lease length (None: no lease yet)
    lease: Optional[Lease]
    members: tuple[Member, ...] = ()
    terms: tuple[Term, ...] = ()  # recent terms, newest first

    @property
    def leader(self) -> Optional[Lease]:
        """The lease while it is valid: the poller that leads now."""
        return self.lease if self.lease is not None and self.lease.valid(self.now) else None

    @property
    def holder_member(self) -> Optional[Member]:
        """The report of the lease's holder (leading now or not): its latest poll, its problem."""
        lease = self.lease
        return next((m for m in self.members if lease is not None and m.holder == lease.holder), None)

    @property
    def leader_member(self) -> Optional[Member]:
        return self.holder_member if self.leader is not None else None

    def standbys(self) -> tuple[Member, ...]:
        """Pollers other than the leader seen recently, most recently seen first."""
        window = standby_window(self.lease_seconds)
        leader = self.leader.holder if self.leader is not None else None
        return tuple(sorted((m for m in self.members if m.holder != leader and self.now - m.seen_at <= window),
                            key=lambda m: -m.seen_at))

    @property
    def takeovers(self) -> tuple[Term, ...]:
        return tuple(t for t in self.terms if t.previous_holder is not None)

    def summary(self) -> str:
        """One line: "poller host (pid 1) leads since …, 1 standby" / "no poller leads: …"."""
        leader = self.leader
        standbys = len(self.standbys())
        spare = f"{standbys} standby" + ("s" if standbys != 1 else "") + " seen recently"
        if leader is None:
            if self.lease is None:
                return "no poller has run against this database yet"
            return f"no poller leads: the lease of poller {self.lease.label} ran out {ago(self.lease.deadline, self.now)}; {spare}"
        return f"poller {leader.label} leads since {utc(leader.since)}; {spare}"


# ---- decisions -----------------------------------------------------------------------------------


def default_lease_seconds(scrape_period: float) -> float:
    """The lease's length unless configured: half a scrape period (at least ``MIN_LEASE_SECONDS``),
    so a standby takes over (``takeover_within``) well within one scrape period."""
    return max(MIN_LEASE_SECONDS, scrape_period / 2)


def renew_every(lease_seconds: float) -> float:
    """How often the leader renews its lease and standbys look at it."""
    return lease_seconds / RENEWALS_PER_LEASE


def takeover_within(lease_seconds: float) -> float:
    """The bound on a take-over after the leader's loss (1.5 lease lengths): its lease runs out at
    most a lease length after its last renewal, a standby looks once per renewal period, and a
    leader frozen in the middle of a write holds the take-over up at most one more (the database
    ends a write transaction idle that long: ``write_idle_limit``)."""
    return lease_seconds + 2 * renew_every(lease_seconds)


def write_idle_limit(lease_seconds: float) -> float:
    """Seconds a poller's write transaction may sit idle before the database ends it."""
    return max(1.0, renew_every(lease_seconds))


def standby_window(lease_seconds: Optional[float]) -> float:
    return STANDBY_SEEN_LEASES * (lease_seconds or MIN_LEASE_SECONDS)


def claim(current: Optional[Lease], me: PollerId, now: float) -> str:
    """What a claim by ``me`` at ``now`` does: renew its own lease (also one that ran out while
    nobody took it: nobody wrote meanwhile, the fence saw to that), take one that is missing,
    expired or released, or wait for a valid one of another poller."""
    if current is None:
        return TAKE
    if current.holder == me.holder:
        return RENEW
    return WAIT if current.valid(now) else TAKE


def next_term(current: Optional[Lease], me: PollerId, now: float) -> Term:
    """The term ``me`` begins by taking the lease from ``current`` at ``now``."""
    if current is None:
        return Term(epoch=1, holder=me.holder, host=me.host, pid=me.pid, started_at=me.started_at, since=now,
                    reason=FIRST)
    return Term(epoch=current.epoch + 1, holder=me.holder, host=me.host, pid=me.pid, started_at=me.started_at,
                since=now, reason=RELEASED if current.released else EXPIRED, previous_holder=current.holder,
                previous_host=current.host, previous_pid=current.pid,
                previous_deadline=None if current.released else current.deadline)


def takeover_notice(term: Term) -> Optional[alert_rules.Notice]:
    """The notice a take-over sends (naming the leader it replaced); None for a first term or a
    clean hand-over (a poller stopped on purpose pages nobody)."""
    if not term.is_takeover:
        return None
    return alert_rules.Notice(
        rule=TAKEOVER_RULE, kind=TAKEOVER_KIND, subject=LEASE_NAME, label="the monitor's poller",
        event=TAKEOVER_EVENT, state="taken-over", severity=alert_rules.WARNING,
        summary=short_error(term.summary(), alert_rules.SUMMARY_CHARS), at=term.since,
        since=term.previous_deadline if term.previous_deadline is not None else term.since,
        details=(f"epoch {term.epoch}", f"the new leader started at {utc(term.started_at)}"),
    )


def poller_label(host: Optional[str], pid: Optional[int]) -> str:
    return f"{host or '?'} (pid {pid})" if pid is not None else (host or "?")


def bound_problem(text: Optional[str], limit: int = 300) -> Optional[str]:
    """What a poller cannot reach, as stored: one line, at most ``limit`` characters."""
    return None if not text else short_error(text, limit)
