"""The pollers' lease in SQL: claims (renew, or take with the next epoch, its term and its
notice), the fence every write of a poller passes, the pollers' reports, and what the pages read.

The decisions are ``core/leadership.py``'s; this module makes them hold under concurrency:

- every time is the database's clock (``clock_now``), so pollers whose clocks disagree agree on
  the deadline;
- a **claim** runs in one write transaction. Renewing updates only the deadline; taking first
  locks the lease row ``FOR UPDATE`` on PostgreSQL, which waits for every write transaction of the
  old leader still open (they hold it ``FOR KEY SHARE``, see the fence), then decides again on
  what it reads under the lock. On SQLite the write transaction itself is exclusive;
- the **fence** (``install_fence``) runs at the start of every write transaction of a poller's
  store: it reads the lease (PostgreSQL: ``FOR KEY SHARE``, which a renewal does not wait for but a
  take-over does) and refuses the transaction with ``NotLeader`` unless this poller holds the
  lease, at its epoch, before its deadline. A frozen leader that wakes after a take-over writes
  nothing. On PostgreSQL the transaction also gets an ``idle_in_transaction_session_timeout``:
  a leader frozen in the middle of a write has its transaction ended by the server, so its lock
  does not hold up the take-over.

Every function takes a connection inside a transaction (``Database.read`` / ``write``); the
claims and reports go through a store without the fence (the lease is how a standby gets in).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from monitor.core import leadership as core
from monitor.core.alert_rules import Evaluation, Notice
from monitor.store import alert_log
from monitor.store.engine import StoreError, insert
from monitor.store.schema import PollerLeaseRow, PollerMemberRow, PollerTermRow

log = logging.getLogger(__name__)

MEMBERS_LIMIT = 50  # pollers the pages list
TERMS_LIMIT = 20  # terms (take-overs) the pages list

Token = tuple[str, int]  # (holder, epoch) this process believes it leads with


class NotLeader(StoreError):
    """A write of a poller that does not hold the lease (any more): nothing was written."""


# ---- the clock -----------------------------------------------------------------------------------


def clock_now(conn: Connection) -> float:
    """The database's clock, in unix seconds (the statement's own time, not the transaction's)."""
    if conn.dialect.name == "postgresql":
        return float(conn.exec_driver_sql("SELECT extract(epoch from clock_timestamp())").scalar())
    return float(conn.exec_driver_sql("SELECT (julianday('now') - 2440587.5) * 86400.0").scalar())


# ---- rows <-> core -------------------------------------------------------------------------------


def _lease(row) -> core.Lease:
    return core.Lease(holder=row.holder, host=row.host, pid=row.pid, started_at=row.started_at, epoch=row.epoch,
                      since=row.since, deadline=row.deadline, renewed_at=row.renewed_at, released=bool(row.released))


def _term(row) -> core.Term:
    return core.Term(epoch=row.epoch, holder=row.holder, host=row.host, pid=row.pid, started_at=row.started_at,
                     since=row.since, reason=row.reason, previous_holder=row.previous_holder,
                     previous_host=row.previous_host, previous_pid=row.previous_pid,
                     previous_deadline=row.previous_deadline)


def _member(row) -> core.Member:
    return core.Member(holder=row.holder, host=row.host, pid=row.pid, started_at=row.started_at, seen_at=row.seen_at,
                       role=row.role, last_poll_at=row.last_poll_at, problem=row.problem)


def read_lease(conn: Connection, name: str, *, lock: Optional[str] = None) -> Optional[core.Lease]:
    """The lease, or None; ``lock``: "update" or "key share" (PostgreSQL row locks; SQLite's write
    transaction is exclusive anyway)."""
    t = PollerLeaseRow.__table__
    query = sa.select(t).where(t.c.name == name)
    if lock == "update":
        query = query.with_for_update()
    elif lock == "key share":
        query = query.with_for_update(read=True, key_share=True)
    row = conn.execute(query).first()
    return None if row is None else _lease(row)


# ---- claims --------------------------------------------------------------------------------------


def claim(conn: Connection, name: str, me: core.PollerId, lease_seconds: float, *,
          notify: Optional[Callable[[Notice], Iterable[str]]] = None) -> core.Grant:
    """Renew ``me``'s lease, or take it if it is missing, expired or released (with its term, and
    the take-over's notice with one delivery per webhook ``notify`` names), or leave another's
    valid one alone. Inside a write transaction."""
    now = clock_now(conn)
    current = read_lease(conn, name)
    decision = core.claim(current, me, now)
    if decision == core.RENEW:
        if _renew(conn, name, me, current.epoch, now, lease_seconds):
            return core.Grant(read_lease(conn, name), True, now)
        current = read_lease(conn, name)  # taken meanwhile
        decision = core.claim(current, me, now)
    if decision == core.WAIT:
        return core.Grant(current, False, now)
    # take it: wait for the old leader's open writes (they hold the row FOR KEY SHARE), then decide again
    current = read_lease(conn, name, lock="update")
    now = clock_now(conn)
    if core.claim(current, me, now) != core.TAKE:
        return core.Grant(current, current is not None and current.holder == me.holder, now)
    term = core.next_term(current, me, now)
    if not _take(conn, name, term, current, now, lease_seconds):
        return core.Grant(read_lease(conn, name), False, now)  # another poller took it first
    terms = PollerTermRow.__table__
    conn.execute(sa.insert(terms).values(
        name=name, epoch=term.epoch, holder=term.holder, host=term.host, pid=term.pid, started_at=term.started_at,
        since=term.since, reason=term.reason, previous_holder=term.previous_holder, previous_host=term.previous_host,
        previous_pid=term.previous_pid, previous_deadline=term.previous_deadline))
    notice = core.takeover_notice(term)
    if notice is not None and notify is not None:
        # in the same transaction as the term: the take-over is announced once, or not taken
        alert_log.record_evaluation(conn, Evaluation(alerts={}, notices=(notice,)), notify, now)
    return core.Grant(read_lease(conn, name), True, now, term)


def _renew(conn: Connection, name: str, me: core.PollerId, epoch: int, now: float, lease_seconds: float) -> bool:
    t = PollerLeaseRow.__table__
    done = conn.execute(sa.update(t).where(t.c.name == name, t.c.holder == me.holder, t.c.epoch == epoch).values(
        deadline=now + lease_seconds, renewed_at=now, released=False))
    return done.rowcount == 1


def _take(conn: Connection, name: str, term: core.Term, current: Optional[core.Lease], now: float,
          lease_seconds: float) -> bool:
    t = PollerLeaseRow.__table__
    values = dict(holder=term.holder, host=term.host, pid=term.pid, started_at=term.started_at, epoch=term.epoch,
                  since=now, deadline=now + lease_seconds, renewed_at=now, released=False)
    if current is None:  # (RETURNING: psycopg counts no rows for INSERT ... ON CONFLICT)
        first = insert(conn, t).values(name=name, **values).on_conflict_do_nothing(index_elements=["name"])
        return conn.execute(first.returning(t.c.name)).first() is not None
    done = conn.execute(sa.update(t).where(t.c.name == name, t.c.epoch == current.epoch).values(**values))
    return done.rowcount == 1


def release(conn: Connection, name: str, holder: str, epoch: int) -> bool:
    """``holder`` stops: its lease ends now (a standby takes it at its next look, without a
    take-over notice). False if it did not hold it; a term released already stays as it was."""
    t = PollerLeaseRow.__table__
    now = clock_now(conn)
    mine = sa.and_(t.c.name == name, t.c.holder == holder, t.c.epoch == epoch)
    if conn.execute(sa.update(t).where(mine, t.c.released.is_(False)).values(deadline=now, released=True)).rowcount:
        return True
    return conn.execute(sa.select(t.c.name).where(mine)).first() is not None


# ---- the fence -----------------------------------------------------------------------------------


def fence_problem(conn: Connection, name: str, token: Optional[Token]) -> Optional[str]:
    """Why a write with ``token`` must not happen now (None: it may), read inside its transaction."""
    if token is None:
        return "this poller does not lead (it is a standby)"
    holder, epoch = token
    lease = read_lease(conn, name, lock="key share")
    now = clock_now(conn)
    if lease is None:
        return "no poller holds the lease"
    if lease.holder != holder or lease.epoch != epoch:
        return f"poller {lease.label} leads now (epoch {lease.epoch}; this poller led epoch {epoch})"
    if not lease.valid(now):
        return "this poller's lease ran out before it was renewed"
    return None


def install_fence(engine: Engine, name: str, token: Callable[[], Optional[Token]], *, idle_limit: float) -> None:
    """Make every write transaction on ``engine`` (``Database.write``) pass the fence first: it
    raises ``NotLeader`` and writes nothing unless ``token()`` holds the lease. ``idle_limit``:
    seconds a write transaction may sit idle on PostgreSQL before the server ends it."""
    @event.listens_for(engine, "begin")
    def _fence(conn: Connection) -> None:
        if not conn.get_execution_options().get("store_write"):
            return
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {max(1000, int(idle_limit * 1000))}")
        problem = fence_problem(conn, name, token())
        if problem is not None:
            raise NotLeader(f"not written: {problem}")


# ---- reports and reads ---------------------------------------------------------------------------


def report(conn: Connection, me: core.PollerId, role: str, *, problem: Optional[str] = None,
           last_poll_at: Optional[float] = None, now: Optional[float] = None) -> None:
    """``me`` as it is now: its role, what it cannot reach, its latest successful poll."""
    t = PollerMemberRow.__table__
    now = clock_now(conn) if now is None else now
    values = dict(host=me.host[:200], pid=me.pid, started_at=me.started_at, seen_at=now, role=role,
                  problem=core.bound_problem(problem))
    if last_poll_at is not None:
        values["last_poll_at"] = last_poll_at
    statement = insert(conn, t).values(holder=me.holder, **values)
    conn.execute(statement.on_conflict_do_update(index_elements=["holder"], set_=values))


def status(conn: Connection, name: str, *, members_since: float, terms_limit: int = TERMS_LIMIT) -> core.PollerStatus:
    """The lease, the pollers seen since ``members_since`` (most recent first) and the latest terms."""
    m, terms = PollerMemberRow.__table__, PollerTermRow.__table__
    lease = read_lease(conn, name)
    members = conn.execute(sa.select(m).where(m.c.seen_at >= members_since)
                           .order_by(m.c.seen_at.desc()).limit(MEMBERS_LIMIT)).all()
    recent = conn.execute(sa.select(terms).where(terms.c.name == name)
                          .order_by(terms.c.epoch.desc()).limit(terms_limit)).all()
    return core.PollerStatus(now=clock_now(conn), lease_seconds=(lease.deadline - lease.renewed_at) if lease else None,
                             lease=lease, members=tuple(_member(r) for r in members),
                             terms=tuple(_term(r) for r in recent))


def takeovers_since(conn: Connection, name: str, since: float) -> int:
    """Terms since ``since`` that replaced another poller (first terms not counted)."""
    t = PollerTermRow.__table__
    return int(conn.execute(sa.select(sa.func.count()).where(
        t.c.name == name, t.c.since >= since, t.c.previous_holder.is_not(None))).scalar())


def prune(conn: Connection, before: float) -> dict[str, int]:
    """Forget pollers not seen since ``before`` and terms begun before it (the latest term stays)."""
    m, t = PollerMemberRow.__table__, PollerTermRow.__table__
    members = conn.execute(sa.delete(m).where(m.c.seen_at < before)).rowcount
    newest = sa.select(sa.func.max(t.c.epoch)).scalar_subquery()
    terms = conn.execute(sa.delete(t).where(t.c.since < before, t.c.epoch < newest)).rowcount
    return {"poller_members": members, "poller_terms": terms}
