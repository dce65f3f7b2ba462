"""Requests that a poller job run soon, in SQL (``JobRequestRow``): how a job, a chat worker in
another process or a standby asks the leader for a scrape or a check of one server, without a
callback into its objects. Every function takes a connection inside a transaction the caller opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.store.schema import JobRequestRow

MAX_JOB_CHARS, MAX_TARGET_CHARS = 32, 128  # the columns' sizes
DONE_KEPT = 86400.0  # seconds a done request is kept (what was asked, and when it was carried out)


@dataclass(frozen=True)
class JobRequest:
    id: int
    job: str
    target: Optional[str]
    at: float
    by: str
    why: Optional[str]


def request(conn: Connection, job: str, target: Optional[str], *, at: float, by: str, why: Optional[str],
            min_interval: float) -> Optional[int]:
    """A new request, unless one for the same job and target was made within ``min_interval`` (pending
    or done: whatever the traffic, a job runs for a target at most once per interval); its id, or None."""
    if not job or len(job) > MAX_JOB_CHARS or (target is not None and not 0 < len(target) <= MAX_TARGET_CHARS):
        raise ValueError(f"a job request needs a job name of at most {MAX_JOB_CHARS} characters and a target "
                         f"of at most {MAX_TARGET_CHARS} (a peer id), got {job[:40]!r}, {(target or '')[:40]!r}")
    t = JobRequestRow.__table__
    target_is = t.c.target.is_(None) if target is None else t.c.target == target
    recent = conn.execute(sa.select(t.c.id).where(t.c.job == job, target_is, t.c.at > at - min_interval)
                          .limit(1)).first()
    if recent is not None:
        return None
    return conn.execute(sa.insert(t).values(job=job, target=target, at=at, by=by[:64],
                                            why=None if why is None else why[:300]).returning(t.c.id)).scalar_one()


def pending(conn: Connection, *, limit: int) -> list[JobRequest]:
    """The oldest ``limit`` requests not carried out yet."""
    t = JobRequestRow.__table__
    rows = conn.execute(sa.select(t.c.id, t.c.job, t.c.target, t.c.at, t.c.by, t.c.why)
                        .where(t.c.done_at.is_(None)).order_by(t.c.at, t.c.id).limit(limit)).all()
    return [JobRequest(*row) for row in rows]


def finish(conn: Connection, ids: Sequence[int], *, at: float) -> None:
    if ids:
        t = JobRequestRow.__table__
        conn.execute(sa.update(t).where(t.c.id.in_(list(ids))).values(done_at=at))


def prune(conn: Connection, before: float) -> int:
    """Requests made before ``before`` (done or given up: a request older than that is stale)."""
    t = JobRequestRow.__table__
    return conn.execute(sa.delete(t).where(t.c.at < before)).rowcount
