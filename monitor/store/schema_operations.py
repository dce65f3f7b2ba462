"""The operators' tables of the schema (``schema.py`` re-exports them): silences and maintenance
windows, the pollers' lease, incident notes, and the requests that a poller job run soon."""

from __future__ import annotations

from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from monitor.store.schema_types import BigId, _json_field


class JobRequestRow(SQLModel, table=True):
    """A request that a poller job run soon (``monitor/app/job_table.py``): "scrape now" (the demo's
    chaos controls), "check this server now" (a target peer). Written by any process (a chat
    worker, a standby, the web), read and marked done by the leader's ``requests`` job; at most one
    per job and target per ``min_interval`` (``Store.request_job``)."""

    __tablename__ = "job_requests"
    __table_args__ = (sa.Index(None, "done_at", "at"), sa.Index(None, "job", "target", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    job: str = Field(max_length=32)
    target: Optional[str] = Field(default=None, max_length=128)  # a peer id, or None: the whole job
    at: float  # when it was asked for
    by: str = Field(max_length=64)  # who asked: "chat", "demo", "generation-check", …
    why: Optional[str] = Field(default=None, max_length=300)
    done_at: Optional[float] = None  # NULL: pending


# ---- silences and maintenance windows (revision 0013): what holds alerts back, and who said so --


class SilenceRow(SQLModel, table=True):
    """An operator's silence (``core/muting.py``'s ``Silence``): matchers, from when to when, why."""

    __tablename__ = "silences"
    __table_args__ = (sa.Index(None, "ends_at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    matchers: Any = _json_field()  # [[name, op, value], ...]
    starts_at: float
    ends_at: float  # set to the moment an operator ends it early
    comment: str = Field(max_length=500)
    created_by: str = Field(max_length=100)
    created_at: float
    ended_at: Optional[float] = None
    ended_by: Optional[str] = Field(default=None, max_length=100)


class MaintenanceWindowRow(SQLModel, table=True):
    """A maintenance window (``core/maintenance.py``): one-off, or recurring by weekdays and a
    time of day or by cron, in a time zone."""

    __tablename__ = "maintenance_windows"
    __table_args__ = (sa.Index(None, "ends_at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    scope: str = Field(max_length=16)  # global | model | peer
    target: Optional[str] = Field(default=None, max_length=256)
    starts_at: float
    ends_at: Optional[float] = None  # NULL: a recurring window for ever
    reason: str = Field(max_length=500)
    duration: Optional[float] = None  # recurring: seconds each occurrence lasts
    timezone: Optional[str] = Field(default=None, max_length=64)
    weekdays: Any = _json_field()  # [0 = Monday, ...]
    at_time: Optional[str] = Field(default=None, max_length=5)  # "HH:MM"
    cron: Optional[str] = Field(default=None, max_length=100)
    created_by: str = Field(max_length=100)
    created_at: float
    ended_at: Optional[float] = None
    ended_by: Optional[str] = Field(default=None, max_length=100)


class MuteChangeRow(SQLModel, table=True):
    """Every change to a silence or maintenance window: who, when, how they proved it, and why."""

    __tablename__ = "mute_changes"
    __table_args__ = (sa.Index(None, "kind", "item_id"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    kind: str = Field(max_length=16)  # silence | maintenance
    item_id: int
    action: str = Field(max_length=16)  # created | ended
    by: str = Field(max_length=100)  # the name the operator gave
    via: str = Field(max_length=32)  # api token | browser session
    why: str = Field(max_length=500)


# ---- pollers (revision 0012): which poller leads, who stands by, and every take-over ------------


class PollerLeaseRow(SQLModel, table=True):
    """The lease the pollers of this database compete for (``core/leadership.py``), one row per
    lease name: its holder, epoch (one more per change of holder) and deadline, in the database's
    clock. Every write of a poller checks it inside its own transaction (``store/leases.py``)."""

    __tablename__ = "poller_leases"
    name: str = Field(primary_key=True, max_length=32)
    holder: str = Field(max_length=200)
    host: str = Field(max_length=200)
    pid: int
    started_at: float  # the holder process's start
    epoch: int
    since: float  # the term's start
    deadline: float
    renewed_at: float
    released: bool = False  # its holder stopped and handed it over


class PollerMemberRow(SQLModel, table=True):
    """Every poller as it last reported itself (leader or standby, each renewal period): the
    overview's standbys, and what a poller cannot reach."""

    __tablename__ = "poller_members"
    __table_args__ = (sa.Index(None, "seen_at"),)
    holder: str = Field(primary_key=True, max_length=200)
    host: str = Field(max_length=200)
    pid: int
    started_at: float
    seen_at: float
    role: str = Field(max_length=16)  # leader | standby
    last_poll_at: Optional[float] = None  # its latest successful poll, while it led
    problem: Optional[str] = Field(default=None, max_length=300)  # the DHT or bootstrap peers it cannot reach


class ChatWorkerRow(SQLModel, table=True):
    """Every chat worker as it last reported itself (``store/chat_workers.py``, every
    ``chat.feedback.WORKER_BEAT`` seconds, revision 0029): the overview's chat workers panel —
    alive, its slots, queue, open sessions, the servers its requests use, whether it drains."""

    __tablename__ = "chat_workers"
    __table_args__ = (sa.Index(None, "beat_at"),)
    worker: str = Field(primary_key=True, max_length=120)  # host-pid-random (chat.shared_load.worker_id)
    tag: Optional[str] = Field(default=None, max_length=32)  # its chat_worker setting
    host: str = Field(max_length=200)
    pid: int
    started_at: float
    beat_at: float
    slots: int = 0
    busy: int = 0
    waiting: int = 0
    sessions_open: int = 0
    servers_used: int = 0  # servers its requests in flight go through now
    draining: bool = False
    stopped: bool = False  # it said so as it closed


class PollerTermRow(SQLModel, table=True):
    """One row per leadership term: who took the lease at which epoch, from whom and why (the
    take-over events of the history)."""

    __tablename__ = "poller_terms"
    __table_args__ = (sa.Index(None, "since"),)
    name: str = Field(primary_key=True, max_length=32)
    epoch: int = Field(primary_key=True)
    holder: str = Field(max_length=200)
    host: str = Field(max_length=200)
    pid: int
    started_at: float
    since: float
    reason: str = Field(max_length=16)  # first | expired | released
    previous_holder: Optional[str] = Field(default=None, max_length=200)
    previous_host: Optional[str] = Field(default=None, max_length=200)
    previous_pid: Optional[int] = None
    previous_deadline: Optional[float] = None


# ---- incident notes (revision 0014): what operators tell visitors beside the state ---------------


class IncidentNoteRow(SQLModel, table=True):
    """An operator's note on a model, a peer or the whole swarm ("server-7 is being upgraded, back
    at 14:00"), as it reads now; open until resolved. Kept with its history (``incident_note_updates``)."""

    __tablename__ = "incident_notes"
    __table_args__ = (sa.Index(None, "resolved_at"), sa.Index(None, "updated_at"))
    id: Optional[int] = Field(default=None, primary_key=True)
    scope: str = Field(max_length=16)  # swarm | model | peer
    target: Optional[str] = Field(default=None, max_length=256)  # the DHT prefix or peer id; NULL: swarm
    text: str = Field(max_length=1000)
    author: str = Field(max_length=80)  # the name the operator gave (else "operator")
    created_at: float
    updated_at: float
    resolved_at: Optional[float] = None


class IncidentNoteUpdateRow(SQLModel, table=True):
    """Every change of a note (posted, updated, resolved) with its text then, who and when: the
    note's history and the Atom feed's entries."""

    __tablename__ = "incident_note_updates"
    __table_args__ = (sa.Index(None, "note_id"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True)
    note_id: int = Field(foreign_key="incident_notes.id")
    at: float
    action: str = Field(max_length=16)  # posted | updated | resolved
    text: str = Field(max_length=1000)
    author: str = Field(max_length=80)
    via: str = Field(max_length=32)  # api token | browser session
