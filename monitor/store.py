"""The SQL store: what every poll, probe and chat saw, and the few queries the views and scores need.

SQLite (default, a file in the data dir) or PostgreSQL, one schema, migrated by Alembic
(``monitor/migrations``). One ``Store`` is shared by the scheduler thread (the only writer) and the
web threads (readers): every call takes its own pooled connection and transaction, so the object
itself holds no state. A database that is down or locked makes a call raise ``StoreUnavailable``
within a few seconds instead of hanging, and the next call works again once the database is back.

Size: raw rows are kept ``raw_retention_days`` (per poll, per server), hourly rollups after that.
What makes it fit in ~1 GB for 30 days × 60 s polls × 500 servers:
- peers are interned (``peers.id``), so the hot tables carry a 4-byte key, not a 52-char peer id;
- per-block coverage is one row per (poll, model) with JSON arrays, not one row per block
  (4 models × 80 blocks would be 320 rows per poll; the 24 h heatmap reads 1440 rows, not 460 k);
- ``next_pings`` (up to 10 peer ids + RTTs per server, ~0.75 kB) are kept for one hour only in
  ``server_pings``: only the latest snapshot needs them, and per observation they would double
  the raw table.
Measured on SQLite (tests/test_store.py): 113 kB of raw rows per poll of 500 servers (74 of them
observations, 33 probes), 127 kB of rollups per hour: 30 days ≈ 0.44 GB.
Times are unix seconds (float) everywhere, as in ``snapshot.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool
from sqlmodel import Field, SQLModel

from monitor.diagnosis import BROKEN, DEGRADED, HEALTHY
from monitor.snapshot import (
    JOINING,
    OFFLINE,
    ONLINE,
    ChatOutcome,
    ModelInfo,
    Observation,
    PeerHistory,
    ProbeBatch,
    ProbeResult,
    ServerRow,
    Snapshot,
)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
HOUR = 3600.0
DAY = 86400.0
PINGS_RETENTION = HOUR  # next_pings are kept this long (only the latest snapshot uses them)
# Model states worst last; a rollup hour shows the worst state it saw.
STATE_SEVERITY = {HEALTHY: 0, DEGRADED: 1, BROKEN: 2}
_CHUNK = 200  # rows per multi-VALUES statement / ids per IN list (SQLite's variable limit)

SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = SQLModel.metadata

# BIGINT ids on PostgreSQL; on SQLite the id must be "INTEGER PRIMARY KEY" to alias the rowid.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json_field() -> Any:
    return Field(default=None, sa_type=sa.JSON(none_as_null=True), nullable=True)


# ---- tables ----------------------------------------------------------------------------------


class Peer(SQLModel, table=True):
    """Every peer ever seen (announced, probed, or chatted with); ``id`` is the key other tables use."""

    __tablename__ = "peers"
    __table_args__ = (sa.UniqueConstraint("peer_id"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    peer_id: str
    first_seen: Optional[float] = None  # first/last poll that saw it announce (None: only probed)
    last_seen: Optional[float] = None
    public_name: Optional[str] = None  # the last one it announced


class WatchedModel(SQLModel, table=True):
    __tablename__ = "models"
    dht_prefix: str = Field(primary_key=True)
    num_blocks: int
    repository: Optional[str] = None
    name: Optional[str] = None
    official: bool = False
    first_seen: float
    last_seen: float


class Poll(SQLModel, table=True):
    __tablename__ = "polls"
    __table_args__ = (sa.Index(None, "at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    duration: float = 0.0
    n_models: int = 0
    n_servers: int = 0
    invalid_records: int = 0
    errors: Any = _json_field()  # list of strings
    models: Any = _json_field()  # the polled models' dht_prefixes, in order
    ok: bool = True


class ServerObservationRow(SQLModel, table=True):
    __tablename__ = "server_observations"
    __table_args__ = (sa.Index(None, "poll_id"), sa.Index(None, "peer", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    model: str
    peer: int = Field(foreign_key="peers.id")
    state: str
    start: int
    end: int
    throughput: Optional[float] = None
    inference_rps: Optional[float] = None
    forward_rps: Optional[float] = None
    network_rps: Optional[float] = None
    cache_tokens_left: Optional[int] = Field(default=None, sa_type=sa.BigInteger)
    version: Optional[str] = None
    torch_dtype: Optional[str] = None
    quant_type: Optional[str] = None
    using_relay: Optional[bool] = None
    public_name: Optional[str] = None
    adapters: Any = _json_field()  # list of strings; NULL when none


class ServerPingsRow(SQLModel, table=True):
    """A server's announced RTTs to the next servers; kept ``PINGS_RETENTION`` only."""

    __tablename__ = "server_pings"
    __table_args__ = (sa.Index(None, "poll_id"),)
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str
    next_pings: Any = _json_field()


class ModelStatusRow(SQLModel, table=True):
    __tablename__ = "model_status"
    __table_args__ = (sa.Index(None, "poll_id"), sa.Index(None, "model", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    model: str
    state: str
    reasons: Any = _json_field()
    coverage_pct: Optional[float] = None
    servers_online: Optional[int] = None
    min_redundancy: Optional[int] = None
    est_tokens_per_s: Optional[float] = None


class BlockCoverageRow(SQLModel, table=True):
    """One poll's per-block coverage of one model: arrays indexed by block."""

    __tablename__ = "block_coverage"
    __table_args__ = (sa.Index(None, "model", "at"),)
    poll_id: int = Field(foreign_key="polls.id", primary_key=True)
    model: str = Field(primary_key=True)
    at: float
    servers: Any = _json_field()  # serving servers per block
    throughput: Any = _json_field()  # their total throughput per block


class ModelStateChangeRow(SQLModel, table=True):
    """A model's state changed between two consecutive polls (kept as long as the rollups)."""

    __tablename__ = "model_state_changes"
    __table_args__ = (sa.Index(None, "model", "at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    model: str
    from_state: Optional[str] = None  # None: the first status recorded for the model
    to_state: str
    reasons: Any = _json_field()


class ProbeRow(SQLModel, table=True):
    __tablename__ = "probe_results"
    __table_args__ = (sa.Index(None, "peer", "at"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    kind: str
    ok: bool
    rtt: Optional[float] = None
    error: Optional[str] = None
    joining: bool = False
    address: Optional[str] = None


class LatestProbeRow(SQLModel, table=True):
    """Each peer's latest probe, so ``latest_probes`` reads a few hundred rows, not the history."""

    __tablename__ = "latest_probes"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    at: float
    kind: str
    ok: bool
    rtt: Optional[float] = None
    error: Optional[str] = None
    joining: bool = False
    address: Optional[str] = None


class ChatOutcomeRow(SQLModel, table=True):
    __tablename__ = "chat_outcomes"
    __table_args__ = (sa.Index(None, "peer", "at"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str
    start: int
    end: int
    ok: bool
    seconds_per_token: Optional[float] = None
    error: Optional[str] = None  # added by revision 0002


class PeerScoreRow(SQLModel, table=True):
    """Each peer's latest score (the score job recomputes them from history every score period)."""

    __tablename__ = "peer_scores"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    at: float
    score: float
    explanation: Any = _json_field()
    components: Any = _json_field()


class PeerPolicyRow(SQLModel, table=True):
    """An operator's routing decision about one peer, set from its page: "pinned" or "blocked"."""

    __tablename__ = "peer_policies"
    peer_id: str = Field(primary_key=True, max_length=128)
    policy: str = Field(max_length=16)
    at: float


class LatestDiagnosisRow(SQLModel, table=True):
    """Each model's diagnosis (``diagnosis.ModelHealth.to_dict()``) for the latest poll and probe
    round, written by the poller, so web workers show it without running petals' routing."""

    __tablename__ = "latest_diagnoses"
    model: str = Field(primary_key=True, max_length=256)
    poll_id: int = Field(sa_type=BigId)
    at: float  # when it was written
    diagnosis: Any = _json_field()


class StoreMetaRow(SQLModel, table=True):
    __tablename__ = "store_meta"
    key: str = Field(primary_key=True)
    value: str


# hourly rollups: ``hour`` is the hour's start (unix seconds); rows exist for completed hours only.


class HourlyPollsRow(SQLModel, table=True):
    __tablename__ = "hourly_polls"
    hour: float = Field(primary_key=True)
    polls: int
    ok_polls: int
    mean_duration: Optional[float] = None


class HourlyObservationsRow(SQLModel, table=True):
    __tablename__ = "hourly_observations"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    polls: int  # ok polls in the hour since the peer was first seen
    samples: int  # of those, polls that saw it (any state)
    online: int
    joining: int
    mean_throughput: Optional[float] = None
    mean_inference_rps: Optional[float] = None
    min_start: Optional[int] = None
    max_end: Optional[int] = None


class HourlyModelStatusRow(SQLModel, table=True):
    __tablename__ = "hourly_model_status"
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    samples: int
    states: Any = _json_field()  # state -> polls
    worst_state: str
    reasons: Any = _json_field()  # distinct reasons seen in the hour (first 20)
    mean_coverage_pct: Optional[float] = None
    mean_servers_online: Optional[float] = None
    min_redundancy: Optional[int] = None
    mean_tokens_per_s: Optional[float] = None


class HourlyBlockCoverageRow(SQLModel, table=True):
    __tablename__ = "hourly_block_coverage"
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    samples: int
    min_servers: Any = _json_field()
    mean_servers: Any = _json_field()
    min_throughput: Any = _json_field()
    mean_throughput: Any = _json_field()


class HourlyProbesRow(SQLModel, table=True):
    __tablename__ = "hourly_probes"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    hour: float = Field(primary_key=True)
    n: int
    ok: int
    joining: int
    mean_rtt: Optional[float] = None


T_PEERS = Peer.__table__
T_MODELS = WatchedModel.__table__
T_POLLS = Poll.__table__
T_OBS = ServerObservationRow.__table__
T_PINGS = ServerPingsRow.__table__
T_STATUS = ModelStatusRow.__table__
T_BLOCKS = BlockCoverageRow.__table__
T_CHANGES = ModelStateChangeRow.__table__
T_PROBES = ProbeRow.__table__
T_LATEST_PROBES = LatestProbeRow.__table__
T_OUTCOMES = ChatOutcomeRow.__table__
T_SCORES = PeerScoreRow.__table__
T_META = StoreMetaRow.__table__
T_POLICIES = PeerPolicyRow.__table__
T_DIAGNOSES = LatestDiagnosisRow.__table__
PEER_POLICIES = ("pinned", "blocked")
T_H_POLLS = HourlyPollsRow.__table__
T_H_OBS = HourlyObservationsRow.__table__
T_H_STATUS = HourlyModelStatusRow.__table__
T_H_BLOCKS = HourlyBlockCoverageRow.__table__
T_H_PROBES = HourlyProbesRow.__table__


# ---- what the store hands out besides snapshot.py's dataclasses -------------------------------


class StoreError(RuntimeError):
    """A store call failed for a reason the operator can act on; the message says which."""


class StoreUnavailable(StoreError):
    """The database is down, unreachable or locked; the call may succeed later as is."""


class StoreSchemaError(StoreError):
    """The database has not been migrated to this version's schema (run ``Store.migrate()``)."""


@dataclass(frozen=True)
class PollSummary:
    id: int
    at: float
    duration: float
    n_models: int
    n_servers: int
    invalid_records: int
    errors: tuple[str, ...]
    ok: bool


@dataclass(frozen=True)
class StoredScore:
    """A peer's latest score as ``record_scores`` stored it (same shape as ``scores.PeerScore``)."""

    peer_id: str
    at: float
    score: float
    explanation: tuple[str, ...]
    components: dict

    def to_dict(self) -> dict:
        return {"peer_id": self.peer_id, "at": self.at, "score": self.score,
                "components": self.components, "explanation": list(self.explanation)}


class StateChange(NamedTuple):
    at: float
    from_state: Optional[str]
    to_state: str
    reasons: tuple[str, ...]


_STATUS_KEYS = ("model", "state", "reasons", "coverage_pct", "servers_online", "min_redundancy",
                "est_tokens_per_s")


# ---- the store -------------------------------------------------------------------------------


class Store:
    def __init__(self, url: str, *, timeout: float = 5.0):
        """``timeout``: seconds a call may wait for a locked SQLite file or an unreachable server."""
        self.url = make_url(url)
        if self.url.get_backend_name() == "postgresql" and self.url.get_driver_name() in ("", "psycopg2"):
            self.url = self.url.set(drivername="postgresql+psycopg")  # psycopg 3 is what we install
        self.timeout = timeout
        self.display_url = self.url.render_as_string(hide_password=True)
        self.engine = _make_engine(self.url, timeout)
        self._migrate_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings) -> "Store":
        return cls(settings.resolved_database_url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    # ---- schema ----------------------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (Alembic upgrade); keeps all data."""
        from alembic import command

        with self._migrate_lock, self._guard("migrating the schema"):
            if self.dialect == "sqlite" and not _sqlite_in_memory(self.url):
                raw = self.engine.raw_connection()
                try:
                    raw.cursor().execute("PRAGMA journal_mode=WAL")
                finally:
                    raw.close()
            with self._write() as conn:
                if self.dialect == "postgresql":  # several processes may start at once
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(4242001)")
                config = _alembic_config()
                config.attributes["connection"] = conn
                command.upgrade(config, revision)

    def current_revision(self) -> Optional[str]:
        from alembic.runtime.migration import MigrationContext

        with self._read("reading the schema revision") as conn:
            return MigrationContext.configure(conn).get_current_revision()

    # ---- writes ----------------------------------------------------------------------------

    def record_poll(
        self,
        snapshot: Snapshot,
        *,
        model_status: Sequence[Mapping[str, Any]] = (),
        block_coverage: Optional[Mapping[str, Sequence[tuple[int, float]]]] = None,
    ) -> int:
        """Record one successful poll in one transaction; returns the poll id.

        ``model_status``: one dict per model with the keys of ``_STATUS_KEYS`` (as ``jobs.py``
        builds them from ``coverage.diagnose``), and optionally ``diagnosis`` (the whole
        ``ModelHealth.to_dict()``, kept for the latest poll only). ``block_coverage``: model -> per block
        (serving servers, total throughput), as ``coverage.block_redundancy`` returns it.
        """
        at = snapshot.taken_at
        diagnoses = {s["model"]: s["diagnosis"] for s in model_status if s.get("diagnosis") is not None}
        statuses = [_check_status({k: v for k, v in s.items() if k != "diagnosis"}) for s in model_status]
        blocks = {model: ([int(c) for c, _ in per_block], [float(t) for _, t in per_block])
                  for model, per_block in (block_coverage or {}).items()}
        with self._write("recording a poll") as conn:
            poll_id = conn.execute(sa.insert(T_POLLS).values(
                at=at, duration=snapshot.duration, n_models=len(snapshot.models),
                n_servers=len(snapshot.servers), invalid_records=snapshot.invalid_records,
                errors=list(snapshot.errors), models=[m.dht_prefix for m in snapshot.models], ok=True,
            ).returning(T_POLLS.c.id)).scalar_one()
            self._upsert_models(conn, snapshot.models, at)
            keys = self._upsert_seen_peers(conn, snapshot.servers, at)
            obs, pings = [], []
            for row in snapshot.servers:
                peer = keys[row.peer_id]
                obs.append({
                    "poll_id": poll_id, "at": at, "model": row.model, "peer": peer, "state": row.state,
                    "start": row.start, "end": row.end, "throughput": row.throughput,
                    "inference_rps": row.inference_rps, "forward_rps": row.forward_rps,
                    "network_rps": row.network_rps, "cache_tokens_left": row.cache_tokens_left,
                    "version": row.version, "torch_dtype": row.torch_dtype, "quant_type": row.quant_type,
                    "using_relay": row.using_relay, "public_name": row.public_name,
                    "adapters": list(row.adapters) or None,
                })
                if row.next_pings:
                    pings.append({"poll_id": poll_id, "at": at, "peer": peer, "model": row.model,
                                  "next_pings": _pings_to_json(row.next_pings)})
            if obs:
                conn.execute(sa.insert(T_OBS), obs)
            if pings:
                conn.execute(sa.insert(T_PINGS), pings)
            conn.execute(sa.delete(T_PINGS).where(T_PINGS.c.at < at - PINGS_RETENTION))
            if statuses:
                conn.execute(sa.insert(T_STATUS), [{**s, "poll_id": poll_id, "at": at} for s in statuses])
                self._record_state_changes(conn, at, statuses)
            if blocks:
                conn.execute(sa.insert(T_BLOCKS), [
                    {"poll_id": poll_id, "model": model, "at": at, "servers": servers, "throughput": throughput}
                    for model, (servers, throughput) in blocks.items()
                ])
            if diagnoses:  # (older ones are ignored: they belong to an older poll)
                self._replace_diagnoses(conn, poll_id, diagnoses)
            return poll_id

    def record_diagnoses(self, diagnoses: Mapping[str, Mapping]) -> None:
        """Replace the latest poll's diagnoses (model -> ``ModelHealth.to_dict()``): the poller
        re-diagnoses the poll after each probe round."""
        with self._write("recording diagnoses") as conn:
            poll = _latest_ok_poll(conn)
            if poll is not None:
                self._replace_diagnoses(conn, poll["id"], diagnoses)

    def latest_diagnoses(self) -> dict[str, dict]:
        """model -> its diagnosis for the latest successful poll (none for older polls)."""
        t = T_DIAGNOSES.c
        with self._read("reading the latest diagnoses") as conn:
            poll = _latest_ok_poll(conn)
            if poll is None:
                return {}
            rows = conn.execute(sa.select(t.model, t.diagnosis).where(t.poll_id == poll["id"])).all()
        return {model: diagnosis for model, diagnosis in rows if diagnosis}

    @staticmethod
    def _replace_diagnoses(conn: Connection, poll_id: int, diagnoses: Mapping[str, Mapping]) -> None:
        conn.execute(sa.delete(T_DIAGNOSES))
        if diagnoses:
            written = time.time()
            conn.execute(sa.insert(T_DIAGNOSES), [
                {"model": model, "poll_id": poll_id, "at": written, "diagnosis": _jsonable(dict(diagnosis))}
                for model, diagnosis in diagnoses.items()
            ])

    def record_failed_poll(self, at: float, error: str, *, duration: float = 0.0) -> int:
        """A poll that could not scrape: kept (with its error) so gaps are explained; no rows."""
        with self._write("recording a failed poll") as conn:
            return conn.execute(sa.insert(T_POLLS).values(
                at=at, duration=duration, errors=[str(error)], models=[], ok=False,
            ).returning(T_POLLS.c.id)).scalar_one()

    def record_probes(self, batch: ProbeBatch) -> None:
        if not batch.results:
            return
        at = batch.taken_at
        with self._write("recording probes") as conn:
            keys = self._peer_keys(conn, [r.peer_id for r in batch.results])
            rows = [{"at": at, "peer": keys[r.peer_id], "kind": r.kind, "ok": r.ok, "rtt": r.rtt,
                     "error": r.error, "joining": r.joining, "address": r.address} for r in batch.results]
            conn.execute(sa.insert(T_PROBES), rows)
            stmt = _insert(conn, T_LATEST_PROBES)
            stmt = stmt.on_conflict_do_update(
                index_elements=["peer"],
                set_={name: stmt.excluded[name] for name in ("at", "kind", "ok", "rtt", "error", "joining", "address")},
                where=T_LATEST_PROBES.c.at <= stmt.excluded.at,
            )
            conn.execute(stmt, list({row["peer"]: row for row in rows}.values()))

    def record_chat_outcome(self, outcome: ChatOutcome) -> None:
        self.record_chat_outcomes([outcome])

    def record_chat_outcomes(self, outcomes: Iterable[ChatOutcome]) -> None:
        outcomes = list(outcomes)
        if not outcomes:
            return
        with self._write("recording chat outcomes") as conn:
            keys = self._peer_keys(conn, [o.peer_id for o in outcomes])
            conn.execute(sa.insert(T_OUTCOMES), [
                {"at": o.at, "peer": keys[o.peer_id], "model": o.model, "start": o.start, "end": o.end,
                 "ok": o.ok, "seconds_per_token": o.seconds_per_token, "error": o.error}
                for o in outcomes
            ])

    def record_scores(self, at: float, scores: Mapping[str, Any]) -> None:
        """Keep each peer's latest score; ``scores``: peer id -> ``scores.PeerScore`` (or its dict)."""
        if not scores:
            return
        rows = []
        for peer_id, score in scores.items():
            d = score.to_dict() if hasattr(score, "to_dict") else (
                dataclasses.asdict(score) if dataclasses.is_dataclass(score) else dict(score))
            rows.append({"peer_id": peer_id, "at": at, "score": float(d["score"]),
                         "explanation": list(d.get("explanation") or ()),
                         "components": _jsonable(d.get("components") or {})})
        with self._write("recording scores") as conn:
            keys = self._peer_keys(conn, [r["peer_id"] for r in rows])
            stmt = _insert(conn, T_SCORES)
            stmt = stmt.on_conflict_do_update(
                index_elements=["peer"],
                set_={name: stmt.excluded[name] for name in ("at", "score", "explanation", "components")},
            )
            conn.execute(stmt, [{"peer": keys[r["peer_id"]], **{k: v for k, v in r.items() if k != "peer_id"}}
                                for r in rows])

    # ---- latest ----------------------------------------------------------------------------

    def last_poll(self) -> Optional[PollSummary]:
        """The latest poll, failed or not."""
        with self._read("reading the last poll") as conn:
            row = conn.execute(sa.select(T_POLLS).order_by(T_POLLS.c.at.desc(), T_POLLS.c.id.desc())
                               .limit(1)).mappings().first()
        if row is None:
            return None
        return PollSummary(id=row["id"], at=row["at"], duration=row["duration"], n_models=row["n_models"],
                           n_servers=row["n_servers"], invalid_records=row["invalid_records"],
                           errors=tuple(row["errors"] or ()), ok=bool(row["ok"]))

    def change_marks(self) -> tuple:
        """Fingerprints of everything the pages derive from the latest state (the last poll, the
        last probe round, the last score refresh, the last diagnosis), in one cheap query: a
        reader may reuse what it derived while they stay the same. Poll ids only grow; the
        per-peer and per-model tables are counted too, as rows can leave them."""
        def scalar(expression, table):
            return sa.select(expression).select_from(table).scalar_subquery()

        latest = ((T_LATEST_PROBES, T_LATEST_PROBES.c.at), (T_SCORES, T_SCORES.c.at), (T_DIAGNOSES, T_DIAGNOSES.c.at))
        query = sa.select(scalar(sa.func.max(T_POLLS.c.id), T_POLLS), *(
            scalar(expression, table) for table, column in latest
            for expression in (sa.func.max(column), sa.func.count())))
        with self._read("reading change marks") as conn:
            return tuple(conn.execute(query).one())

    def latest_snapshot(self) -> Optional[Snapshot]:
        """The latest successful poll, rebuilt from its rows (equal to the Snapshot recorded)."""
        with self._read("reading the latest snapshot") as conn:
            poll = _latest_ok_poll(conn)
            if poll is None:
                return None
            prefixes = list(poll["models"] or ())
            infos = {
                r.dht_prefix: ModelInfo(dht_prefix=r.dht_prefix, num_blocks=r.num_blocks, repository=r.repository,
                                        name=r.name, official=bool(r.official))
                for r in conn.execute(sa.select(T_MODELS).where(T_MODELS.c.dht_prefix.in_(prefixes)))
            } if prefixes else {}
            pings = {(r.peer, r.model): r.next_pings for r in conn.execute(
                sa.select(T_PINGS.c.peer, T_PINGS.c.model, T_PINGS.c.next_pings)
                .where(T_PINGS.c.poll_id == poll["id"]))}
            o = T_OBS.c
            rows = conn.execute(
                sa.select(T_PEERS.c.peer_id, o.peer, o.model, o.start, o.end, o.state, o.throughput,
                          o.inference_rps, o.forward_rps, o.network_rps, o.cache_tokens_left, o.version,
                          o.torch_dtype, o.quant_type, o.using_relay, o.public_name, o.adapters)
                .join(T_PEERS, T_PEERS.c.id == o.peer).where(o.poll_id == poll["id"]).order_by(o.id)
            ).all()
        servers = tuple(
            ServerRow(peer_id=r[0], model=r[2], start=r[3], end=r[4], state=r[5], throughput=r[6],
                      inference_rps=r[7], forward_rps=r[8], network_rps=r[9], cache_tokens_left=r[10],
                      version=r[11], torch_dtype=r[12], quant_type=r[13],
                      using_relay=None if r[14] is None else bool(r[14]), public_name=r[15],
                      adapters=tuple(r[16] or ()), next_pings=_pings_from_json(pings.get((r[1], r[2]))))
            for r in rows
        )
        return Snapshot(
            taken_at=poll["at"], duration=poll["duration"],
            models=tuple(infos[p] for p in prefixes if p in infos), servers=servers,
            invalid_records=poll["invalid_records"], errors=tuple(poll["errors"] or ()),
        )

    def latest_probes(self, since: Optional[float] = None) -> dict[str, ProbeResult]:
        """Each peer's latest probe (only those taken at or after ``since``, if given)."""
        t = T_LATEST_PROBES.c
        query = sa.select(T_PEERS.c.peer_id, t.kind, t.ok, t.rtt, t.error, t.joining, t.address).join(
            T_PEERS, T_PEERS.c.id == t.peer)
        if since is not None:
            query = query.where(t.at >= since)
        with self._read("reading the latest probes") as conn:
            return {r[0]: _probe(*r) for r in conn.execute(query)}

    def latest_model_status(self) -> dict[str, dict]:
        """model -> the status recorded with the latest successful poll (plus its ``at``)."""
        with self._read("reading the latest model status") as conn:
            poll = _latest_ok_poll(conn)
            if poll is None:
                return {}
            rows = conn.execute(sa.select(T_STATUS).where(T_STATUS.c.poll_id == poll["id"])
                                .order_by(T_STATUS.c.id)).mappings().all()
        return {r["model"]: _status_dict(r) for r in rows}

    def latest_scores(self) -> dict[str, StoredScore]:
        t = T_SCORES.c
        with self._read("reading the latest scores") as conn:
            rows = conn.execute(sa.select(T_PEERS.c.peer_id, t.at, t.score, t.explanation, t.components)
                                .join(T_PEERS, T_PEERS.c.id == t.peer)).all()
        return {r[0]: StoredScore(peer_id=r[0], at=r[1], score=r[2], explanation=tuple(r[3] or ()),
                                  components=r[4] or {}) for r in rows}

    def recent_chat_outcomes(self, since: float, *, limit: int = 5000) -> list[ChatOutcome]:
        """Chat outcomes since ``since`` (newest ``limit``, oldest first): the router's evidence."""
        t = T_OUTCOMES.c
        query = (sa.select(T_PEERS.c.peer_id, t.at, t.model, t.start, t.end, t.ok, t.seconds_per_token, t.error)
                 .join(T_PEERS, T_PEERS.c.id == t.peer).where(t.at >= since).order_by(t.at.desc()).limit(limit))
        with self._read("reading recent chat outcomes") as conn:
            rows = conn.execute(query).all()
        return [ChatOutcome(at=r[1], peer_id=r[0], model=r[2], start=r[3], end=r[4], ok=bool(r[5]),
                            seconds_per_token=r[6], error=r[7]) for r in reversed(rows)]

    def set_peer_policy(self, peer_id: str, policy: Optional[str], at: Optional[float] = None) -> None:
        """Pin or block a peer for the chat's routing; None clears it."""
        if policy is not None and policy not in PEER_POLICIES:
            raise ValueError(f"peer policy must be one of {PEER_POLICIES} or None, got {policy!r}")
        with self._write("setting a peer policy") as conn:
            conn.execute(sa.delete(T_POLICIES).where(T_POLICIES.c.peer_id == peer_id))
            if policy is not None:
                conn.execute(sa.insert(T_POLICIES).values(peer_id=peer_id, policy=policy,
                                                          at=time.time() if at is None else at))

    def peer_policies(self) -> dict[str, str]:
        """peer id -> "pinned" or "blocked", as operators set them from the dashboard."""
        with self._read("reading peer policies") as conn:
            return {r[0]: r[1] for r in conn.execute(sa.select(T_POLICIES.c.peer_id, T_POLICIES.c.policy))}

    def poll_counts(self, since: float) -> dict[str, int]:
        """Polls since ``since`` that succeeded and failed, and the malformed records they dropped."""
        t = T_POLLS.c
        query = sa.select(t.ok, sa.func.count(), sa.func.coalesce(sa.func.sum(t.invalid_records), 0)).where(
            t.at >= since).group_by(t.ok)
        counts = {"ok": 0, "failed": 0, "invalid_records": 0}
        with self._read("counting polls") as conn:
            for ok, n, invalid in conn.execute(query):
                counts["ok" if ok else "failed"] += n
                counts["invalid_records"] += int(invalid)
        return counts

    def peer_ids(self) -> list[str]:
        """Peers that have announced themselves as servers at least once, sorted."""
        with self._read("listing peers") as conn:
            return list(conn.execute(sa.select(T_PEERS.c.peer_id).where(T_PEERS.c.first_seen.is_not(None))
                                     .order_by(T_PEERS.c.peer_id)).scalars())

    # ---- history ---------------------------------------------------------------------------

    def model_status_history(self, model: str, since: float, until: float) -> list[dict]:
        """Oldest first: one dict per poll where raw rows are kept, one per hour before that.

        Every dict has ``at, state, reasons, coverage_pct, servers_online, min_redundancy,
        est_tokens_per_s, samples, states`` (an hour's ``state`` is the worst it saw, ``states``
        counts polls per state, the numbers are hourly means except ``min_redundancy``)."""
        with self._read("reading model status history") as conn:
            raw_start = _raw_start(conn)
            h = T_H_STATUS.c
            hourly = conn.execute(sa.select(T_H_STATUS).where(
                h.model == model, *_rollup_window(h.hour, since, until, raw_start)).order_by(h.hour)).mappings().all()
            s = T_STATUS.c
            raw = conn.execute(sa.select(T_STATUS).where(s.model == model, s.at >= since, s.at <= until)
                               .order_by(s.at, s.id)).mappings().all()
        out = [{"at": r["hour"], "state": r["worst_state"], "reasons": list(r["reasons"] or ()),
                "coverage_pct": r["mean_coverage_pct"], "servers_online": r["mean_servers_online"],
                "min_redundancy": r["min_redundancy"], "est_tokens_per_s": r["mean_tokens_per_s"],
                "samples": r["samples"], "states": dict(r["states"] or {})} for r in hourly]
        for r in raw:
            d = _status_dict(r)
            d.update(samples=1, states={r["state"]: 1})
            out.append(d)
        return out

    def state_changes(self, model: str, since: float, until: float) -> list[StateChange]:
        """Oldest first; the first status ever recorded for a model counts as a change from None."""
        c = T_CHANGES.c
        with self._read("reading state changes") as conn:
            rows = conn.execute(sa.select(c.at, c.from_state, c.to_state, c.reasons).where(
                c.model == model, c.at >= since, c.at <= until).order_by(c.at, c.id)).all()
        return [StateChange(r[0], r[1], r[2], tuple(r[3] or ())) for r in rows]

    def outage_intervals(self, model: str, since: float, until: float, *,
                         state: str = BROKEN) -> list[tuple[float, Optional[float]]]:
        """(start, end) of every stretch in ``state`` that overlaps [since, until], oldest first;
        not clipped to the window; ``end`` None while it lasts."""
        c = T_CHANGES.c
        with self._read("reading outages") as conn:
            before = conn.execute(sa.select(c.at).where(c.model == model, c.at < since)
                                  .order_by(c.at.desc(), c.id.desc()).limit(1)).scalar()
            query = sa.select(c.at, c.to_state).where(c.model == model).order_by(c.at, c.id)
            if before is not None:
                query = query.where(c.at >= before)
            changes = conn.execute(query).all()
        intervals: list[tuple[float, Optional[float]]] = []
        started: Optional[float] = None
        for at, to_state in changes:
            if to_state == state and started is None:
                if at > until:
                    break
                started = at
            elif to_state != state and started is not None:
                if at >= since:
                    intervals.append((started, at))
                started = None
        if started is not None:
            intervals.append((started, None))
        return intervals

    def block_coverage_series(self, model: str, since: float, until: float, *, value: str = "servers",
                              stat: str = "min") -> tuple[list[float], list[list[Optional[float]]]]:
        """(times, matrix[block][time]) for a blocks × time heatmap, oldest first.

        ``value``: "servers" (serving servers) or "throughput" (their total). Where raw rows are
        kept every poll is a column; before that every hour is one, with the hour's ``stat``
        ("min" or "mean") per block. Missing blocks are None."""
        if value not in ("servers", "throughput") or stat not in ("min", "mean"):
            raise ValueError(f"block_coverage_series: value must be 'servers' or 'throughput' (got {value!r}), "
                             f"stat 'min' or 'mean' (got {stat!r})")
        h, b = T_H_BLOCKS.c, T_BLOCKS.c
        with self._read("reading block coverage") as conn:
            raw_start = _raw_start(conn)
            hourly = conn.execute(sa.select(h.hour, h[f"{stat}_{value}"]).where(
                h.model == model, *_rollup_window(h.hour, since, until, raw_start)).order_by(h.hour)).all()
            raw = conn.execute(sa.select(b.at, b[value]).where(b.model == model, b.at >= since, b.at <= until)
                               .order_by(b.at)).all()
        columns = [(at, list(values or ())) for at, values in [*hourly, *raw]]
        n_blocks = max((len(values) for _, values in columns), default=0)
        matrix = [[values[block] if block < len(values) else None for _, values in columns]
                  for block in range(n_blocks)]
        return [at for at, _ in columns], matrix

    def peer_observations(self, peer_id: str, since: float, until: float, *,
                          merge_runs: bool = False) -> list[Observation]:
        """The peer's observations, oldest first, including the polls that did not see it
        (``seen=False``) for the models it served; hourly rows (``samples`` > 1, ``at`` = the hour)
        before raw retention. ``merge_runs``: also merge consecutive polls with the same state and
        span within each clock hour (``samples`` = polls), which keeps uptime and flaps exact at a
        fraction of the rows; consumers must then weigh by ``samples``."""
        with self._read("reading peer observations") as conn:
            key = _peer_key(conn, peer_id)
            if key is None:
                return []
            return self._observations(conn, since, until, [key], merge_runs).get(key, [])

    def peer_history(self, peer_id: str, since: float, until: float, *, merge_runs: bool = False) -> PeerHistory:
        """Observations (as ``peer_observations``), probes and chat outcomes in [since, until].
        Probes are raw only (within raw retention); hourly probe counts are in ``probe_stats``."""
        with self._read("reading peer history") as conn:
            key = _peer_key(conn, peer_id)
            if key is None:
                return PeerHistory(peer_id=peer_id)
            return (self._histories(conn, since, until, [key], merge_runs).get(key)
                    or PeerHistory(peer_id=peer_id))

    def peer_histories(self, since: float, until: float, *, merge_runs: bool = False,
                       probes_since: Optional[float] = None) -> list[PeerHistory]:
        """``peer_history`` of every peer observed or chatted with in [since, until], by peer id
        (what ``scores.score_swarm`` takes). ``probes_since``: probes only from then on (they are
        the bulk of the rows; the scores look at 24 h of them)."""
        with self._read("reading peer histories") as conn:
            return sorted(self._histories(conn, since, until, None, merge_runs, probes_since).values(),
                          key=lambda h: h.peer_id)

    def probe_stats(self, peer_id: str, since: float, until: float) -> list[dict]:
        """Oldest first: ``{at, n, ok, joining, mean_rtt}`` per hour before raw retention and per
        probe after, for charts of probe success over days."""
        with self._read("reading probe stats") as conn:
            key = _peer_key(conn, peer_id)
            if key is None:
                return []
            raw_start = _raw_start(conn, T_PROBES.c.at)
            h, p = T_H_PROBES.c, T_PROBES.c
            hourly = conn.execute(sa.select(h.hour, h.n, h.ok, h.joining, h.mean_rtt).where(
                h.peer == key, *_rollup_window(h.hour, since, until, raw_start)).order_by(h.hour)).all()
            raw = conn.execute(sa.select(p.at, p.ok, p.joining, p.rtt).where(
                p.peer == key, p.at >= since, p.at <= until).order_by(p.at)).all()
        return ([{"at": r[0], "n": r[1], "ok": r[2], "joining": r[3], "mean_rtt": r[4]} for r in hourly]
                + [{"at": r[0], "n": 1, "ok": int(bool(r[1])), "joining": int(bool(r[2])),
                    "mean_rtt": r[3] if r[1] else None} for r in raw])

    # ---- rollups and retention -------------------------------------------------------------

    def rollup_and_prune(self, now: float, *, raw_retention_days: float, rollup_retention_days: float) -> dict:
        """Aggregate every completed hour not yet rolled up, then delete raw rows older than
        ``raw_retention_days`` (whole hours, only rolled-up ones) and rollups, chat outcomes and
        state changes older than ``rollup_retention_days``. Idempotent; returns counts."""
        current_hour = _floor_hour(now)
        with self._read("reading the rollup watermark") as conn:
            done = conn.execute(sa.select(T_META.c.value).where(T_META.c.key == "rolled_up_until")).scalar()
            done = float(done) if done is not None else None
        hours = 0
        hour = done
        while True:
            with self._write("rolling up") as conn:
                hour = _next_hour_with_data(conn, hour)
                if hour is None or hour >= current_hour:
                    _set_meta(conn, "rolled_up_until", repr(max(done or current_hour, current_hour)))
                    break
                self._rollup_hour(conn, hour)
                _set_meta(conn, "rolled_up_until", repr(hour + HOUR))
                hour += HOUR
                hours += 1
        counts: dict[str, int] = {"hours_rolled_up": hours}
        raw_cutoff = min(_floor_hour(now - raw_retention_days * DAY), current_hour)
        rollup_cutoff = _floor_hour(now - rollup_retention_days * DAY)
        with self._write("pruning raw rows") as conn:
            old_polls = sa.select(T_POLLS.c.id).where(T_POLLS.c.at < raw_cutoff).scalar_subquery()
            for table in (T_OBS, T_PINGS, T_STATUS, T_BLOCKS):
                counts[table.name] = conn.execute(sa.delete(table).where(table.c.poll_id.in_(old_polls))).rowcount
            counts["polls"] = conn.execute(sa.delete(T_POLLS).where(T_POLLS.c.at < raw_cutoff)).rowcount
            counts["probe_results"] = conn.execute(sa.delete(T_PROBES).where(T_PROBES.c.at < raw_cutoff)).rowcount
        with self._write("pruning rollups") as conn:
            for table in (T_H_POLLS, T_H_OBS, T_H_STATUS, T_H_BLOCKS, T_H_PROBES):
                counts[table.name] = conn.execute(sa.delete(table).where(table.c.hour < rollup_cutoff)).rowcount
            counts["chat_outcomes"] = conn.execute(
                sa.delete(T_OUTCOMES).where(T_OUTCOMES.c.at < rollup_cutoff)).rowcount
            latest_change = sa.select(sa.func.max(T_CHANGES.c.id)).group_by(T_CHANGES.c.model)
            counts["model_state_changes"] = conn.execute(sa.delete(T_CHANGES).where(
                T_CHANGES.c.at < rollup_cutoff, T_CHANGES.c.id.not_in(latest_change))).rowcount
        return counts

    def database_size_bytes(self) -> int:
        with self._read("measuring the database") as conn:
            if self.dialect == "postgresql":
                return int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar())
            size = conn.exec_driver_sql("PRAGMA page_count").scalar() * conn.exec_driver_sql("PRAGMA page_size").scalar()
        if not _sqlite_in_memory(self.url):
            wal = Path(f"{self.url.database}-wal")
            size += wal.stat().st_size if wal.exists() else 0
        return int(size)

    # ---- internals -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn driver errors that the operator can act on into StoreUnavailable / StoreSchemaError."""
        try:
            yield
        except exc.DBAPIError as e:
            if _is_schema_error(e):
                raise StoreSchemaError(
                    f"{what}: the database {self.display_url} lacks this version's tables or columns "
                    f"({_first_line(e.orig)}); run `swarm-monitor` once (it migrates at start) or Store.migrate()"
                ) from e
            if isinstance(e, (exc.OperationalError, exc.InterfaceError)) or e.connection_invalidated:
                hint = ("is another process holding the file locked, or is its directory gone?"
                        if self.dialect == "sqlite" else "is the database server up and reachable?")
                raise StoreUnavailable(f"{what}: the database {self.display_url} is unavailable "
                                       f"({_first_line(e.orig)}); {hint} Calls work again once it is back") from e
            raise
        except exc.TimeoutError as e:
            raise StoreUnavailable(f"{what}: no free connection to {self.display_url} within "
                                   f"{self.timeout:g} s ({e})") from e

    @contextlib.contextmanager
    def _write(self, what: str = "writing") -> Iterator[Connection]:
        with self._guard(what), self.engine.connect() as conn:
            conn.execution_options(store_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _read(self, what: str = "reading") -> Iterator[Connection]:
        with self._guard(what), self.engine.connect() as conn, conn.begin():
            yield conn

    def _upsert_models(self, conn: Connection, models: Sequence[ModelInfo], at: float) -> None:
        if not models:
            return
        t = T_MODELS.c
        rows = {m.dht_prefix: {"dht_prefix": m.dht_prefix, "num_blocks": m.num_blocks, "repository": m.repository,
                               "name": m.name, "official": m.official, "first_seen": at, "last_seen": at}
                for m in models}
        stmt = _insert(conn, T_MODELS).values(list(rows.values()))
        ex = stmt.excluded
        conn.execute(stmt.on_conflict_do_update(index_elements=["dht_prefix"], set_={
            "num_blocks": sa.case((ex.num_blocks > 0, ex.num_blocks), else_=t.num_blocks),
            "repository": sa.func.coalesce(ex.repository, t.repository),
            "name": sa.func.coalesce(ex.name, t.name),
            "official": ex.official,
            "first_seen": sa.case((ex.first_seen < t.first_seen, ex.first_seen), else_=t.first_seen),
            "last_seen": sa.case((ex.last_seen > t.last_seen, ex.last_seen), else_=t.last_seen),
        }))

    def _upsert_seen_peers(self, conn: Connection, servers: Sequence[ServerRow], at: float) -> dict[str, int]:
        names: dict[str, Optional[str]] = {}
        for row in servers:
            if names.get(row.peer_id) is None:
                names[row.peer_id] = row.public_name
        if not names:
            return {}
        t = T_PEERS.c
        stmt = _insert(conn, T_PEERS)
        ex = stmt.excluded
        stmt = stmt.on_conflict_do_update(index_elements=["peer_id"], set_={
            "first_seen": sa.case((t.first_seen.is_(None), ex.first_seen),
                                  (ex.first_seen < t.first_seen, ex.first_seen), else_=t.first_seen),
            "last_seen": sa.case((t.last_seen.is_(None), ex.last_seen),
                                 (ex.last_seen > t.last_seen, ex.last_seen), else_=t.last_seen),
            "public_name": sa.func.coalesce(ex.public_name, t.public_name),
        })
        # executemany: one statement compiled once (SQLAlchemy batches the rows itself); a
        # multi-row .values([...]) was compiled anew for every poll
        conn.execute(stmt, [{"peer_id": p, "first_seen": at, "last_seen": at, "public_name": n}
                            for p, n in names.items()])
        return self._peer_keys(conn, names)

    def _peer_keys(self, conn: Connection, peer_ids: Iterable[str]) -> dict[str, int]:
        """Keys of these peers, adding the unknown ones (not marked seen: they were probed or chatted)."""
        wanted = list(dict.fromkeys(peer_ids))
        keys: dict[str, int] = {}
        for chunk in _chunks(wanted):
            keys.update({p: k for k, p in conn.execute(sa.select(T_PEERS.c.id, T_PEERS.c.peer_id)
                                                       .where(T_PEERS.c.peer_id.in_(chunk)))})
        missing = [p for p in wanted if p not in keys]
        for chunk in _chunks(missing):
            stmt = _insert(conn, T_PEERS).values([{"peer_id": p} for p in chunk])
            stmt = stmt.on_conflict_do_update(index_elements=["peer_id"], set_={"peer_id": stmt.excluded.peer_id})
            keys.update({p: k for k, p in conn.execute(stmt.returning(T_PEERS.c.id, T_PEERS.c.peer_id))})
        return keys

    def _record_state_changes(self, conn: Connection, at: float, statuses: list[dict]) -> None:
        c = T_CHANGES.c
        changes = []
        for status in statuses:
            before = conn.execute(sa.select(c.to_state).where(c.model == status["model"])
                                  .order_by(c.at.desc(), c.id.desc()).limit(1)).scalar()
            if before != status["state"]:
                changes.append({"at": at, "model": status["model"], "from_state": before,
                                "to_state": status["state"], "reasons": status["reasons"]})
        if changes:
            conn.execute(sa.insert(T_CHANGES), changes)

    def _rollup_hour(self, conn: Connection, hour: float) -> None:
        """Aggregate the raw rows of [hour, hour + 1 h) into the hourly tables (replacing any)."""
        end = hour + HOUR
        for table in (T_H_POLLS, T_H_OBS, T_H_STATUS, T_H_BLOCKS, T_H_PROBES):
            conn.execute(sa.delete(table).where(table.c.hour == hour))
        p = T_POLLS.c
        polls = conn.execute(sa.select(p.id, p.at, p.ok, p.duration).where(p.at >= hour, p.at < end)).all()
        if polls:
            conn.execute(sa.insert(T_H_POLLS).values(
                hour=hour, polls=len(polls), ok_polls=sum(1 for r in polls if r.ok),
                mean_duration=sum(r.duration or 0 for r in polls) / len(polls)))
        ok_times = sorted(r.at for r in polls if r.ok)
        in_hour = sa.select(p.id).where(p.at >= hour, p.at < end, p.ok).scalar_subquery()

        o = T_OBS.c
        groups = conn.execute(
            sa.select(o.peer, o.model, sa.func.max(T_PEERS.c.first_seen), sa.func.count(),
                      _count_if(o.state == ONLINE), _count_if(o.state == JOINING),
                      sa.func.avg(o.throughput), sa.func.avg(o.inference_rps), sa.func.min(o.start),
                      sa.func.max(o.end))
            .join(T_PEERS, T_PEERS.c.id == o.peer).where(o.poll_id.in_(in_hour)).group_by(o.peer, o.model)
        ).all()
        rows = []
        for peer, model, first_seen, samples, online, joining, thr, rps, start, stop in groups:
            since_first = len(ok_times) - bisect.bisect_left(ok_times, first_seen if first_seen is not None else hour)
            rows.append({"peer": peer, "model": model, "hour": hour, "polls": max(since_first, samples),
                         "samples": samples, "online": int(online or 0), "joining": int(joining or 0),
                         "mean_throughput": thr, "mean_inference_rps": rps, "min_start": start, "max_end": stop})
        if rows:
            conn.execute(sa.insert(T_H_OBS), rows)

        s = T_STATUS.c
        by_model: dict[str, list] = {}
        for r in conn.execute(sa.select(s.model, s.state, s.reasons, s.coverage_pct, s.servers_online,
                                        s.min_redundancy, s.est_tokens_per_s)
                              .where(s.poll_id.in_(in_hour)).order_by(s.at)):
            by_model.setdefault(r.model, []).append(r)
        rows = []
        for model, items in by_model.items():
            states: dict[str, int] = {}
            reasons: list[str] = []
            for r in items:
                states[r.state] = states.get(r.state, 0) + 1
                reasons.extend(x for x in (r.reasons or ()) if x not in reasons)
            rows.append({
                "model": model, "hour": hour, "samples": len(items), "states": states,
                "worst_state": max(states, key=lambda st: STATE_SEVERITY.get(st, 1)), "reasons": reasons[:20],
                "mean_coverage_pct": _mean(r.coverage_pct for r in items),
                "mean_servers_online": _mean(r.servers_online for r in items),
                "min_redundancy": min((r.min_redundancy for r in items if r.min_redundancy is not None), default=None),
                "mean_tokens_per_s": _mean(r.est_tokens_per_s for r in items),
            })
        if rows:
            conn.execute(sa.insert(T_H_STATUS), rows)

        b = T_BLOCKS.c
        by_model = {}
        for r in conn.execute(sa.select(b.model, b.servers, b.throughput).where(b.poll_id.in_(in_hour))):
            by_model.setdefault(r.model, []).append(r)
        rows = []
        for model, items in by_model.items():
            servers = _columns([r.servers or [] for r in items])
            throughput = _columns([r.throughput or [] for r in items])
            rows.append({"model": model, "hour": hour, "samples": len(items),
                         "min_servers": [min(c, default=None) for c in servers],
                         "mean_servers": [_mean(c) for c in servers],
                         "min_throughput": [min(c, default=None) for c in throughput],
                         "mean_throughput": [_mean(c) for c in throughput]})
        if rows:
            conn.execute(sa.insert(T_H_BLOCKS), rows)

        q = T_PROBES.c
        rows = [{"peer": peer, "hour": hour, "n": n, "ok": int(ok or 0), "joining": int(joining or 0), "mean_rtt": rtt}
                for peer, n, ok, joining, rtt in conn.execute(
                    sa.select(q.peer, sa.func.count(), _count_if(q.ok), _count_if(q.joining),
                              sa.func.avg(sa.case((q.ok, q.rtt))))
                    .where(q.at >= hour, q.at < end).group_by(q.peer))]
        if rows:
            conn.execute(sa.insert(T_H_PROBES), rows)

    def _observations(self, conn: Connection, since: float, until: float, keys: Optional[list[int]],
                      merge_runs: bool = False) -> dict[int, list[Observation]]:
        """Per peer key: observations oldest first, unseen polls filled in for the models it served."""
        raw_start = _raw_start(conn)
        p, o, h, hp = T_POLLS.c, T_OBS.c, T_H_OBS.c, T_H_POLLS.c
        ok_polls = conn.execute(sa.select(p.id, p.at).where(p.ok, p.at >= since, p.at <= until).order_by(p.at)).all()
        raw_q = sa.select(o.peer, o.poll_id, o.at, o.model, o.state, o.start, o.end, o.throughput,
                          o.inference_rps).where(o.at >= since, o.at <= until).order_by(o.at, o.id)
        hourly_q = sa.select(h.peer, h.hour, h.model, h.polls, h.samples, h.online, h.joining, h.mean_throughput,
                             h.mean_inference_rps, h.min_start, h.max_end).where(
            *_rollup_window(h.hour, since, until, raw_start))
        first_q = sa.select(T_PEERS.c.id, T_PEERS.c.first_seen)
        if keys is not None:
            raw_q, hourly_q = raw_q.where(o.peer.in_(keys)), hourly_q.where(h.peer.in_(keys))
            first_q = first_q.where(T_PEERS.c.id.in_(keys))
        hours = conn.execute(sa.select(hp.hour, hp.ok_polls).where(
            *_rollup_window(hp.hour, since, until, raw_start)).order_by(hp.hour)).all()
        first_seen = dict(conn.execute(first_q).all())

        # per peer: (at, model, state, seen, start, end, throughput, inference_rps, samples)
        rows: dict[int, list[tuple]] = {}
        served: dict[int, set[str]] = {}
        seen_raw: dict[int, set[tuple[int, str]]] = {}
        seen_hours: dict[int, set[tuple[float, str]]] = {}
        for peer, hour, model, polls, samples, online, joining, thr, rps, start, stop in conn.execute(hourly_q).all():
            served.setdefault(peer, set()).add(model)
            seen_hours.setdefault(peer, set()).add((hour, model))
            out = rows.setdefault(peer, [])
            for state, n in ((ONLINE, online), (JOINING, joining), (OFFLINE, samples - online - joining)):
                if n > 0:
                    out.append((hour, model, state, True, start, stop, thr, rps, n))
            if polls > samples:
                out.append((hour, model, OFFLINE, False, None, None, None, None, polls - samples))
        for peer, poll_id, at, model, state, start, stop, thr, rps in conn.execute(raw_q).all():
            served.setdefault(peer, set()).add(model)
            seen_raw.setdefault(peer, set()).add((poll_id, model))
            rows.setdefault(peer, []).append((at, model, state, True, start, stop, thr, rps, 1))
        for peer, models in served.items():
            first = first_seen.get(peer)
            if first is None:
                continue
            out = rows[peer]
            models = sorted(models)
            seen = seen_hours.get(peer, set())
            for hour, n in hours:
                if hour + HOUR > first and n:
                    out.extend((hour, m, OFFLINE, False, None, None, None, None, n)
                               for m in models if (hour, m) not in seen)
            seen = seen_raw.get(peer, set())
            for poll_id, at in ok_polls:
                if at >= first:
                    out.extend((at, m, OFFLINE, False, None, None, None, None, 1)
                               for m in models if (poll_id, m) not in seen)
        result = {}
        for peer, out in rows.items():
            out.sort(key=lambda r: r[0])
            if merge_runs:
                out = _merge_runs(out)
            result[peer] = [Observation(at=r[0], model=r[1], state=r[2], seen=r[3], start=r[4], end=r[5],
                                        throughput=r[6], inference_rps=r[7], samples=r[8]) for r in out]
        return result

    def _histories(self, conn: Connection, since: float, until: float, keys: Optional[list[int]],
                   merge_runs: bool = False, probes_since: Optional[float] = None) -> dict[int, PeerHistory]:
        observations = self._observations(conn, since, until, keys, merge_runs)
        q, c = T_PROBES.c, T_OUTCOMES.c
        probes_q = sa.select(q.peer, q.at, q.kind, q.ok, q.rtt, q.error, q.joining, q.address).where(
            q.at >= max(since, probes_since or since), q.at <= until).order_by(q.at, q.id)
        outcomes_q = sa.select(c.peer, T_PEERS.c.peer_id, c.at, c.model, c.start, c.end, c.ok, c.seconds_per_token,
                               c.error).join(T_PEERS, T_PEERS.c.id == c.peer).where(
            c.at >= since, c.at <= until).order_by(c.at, c.id)
        peers_q = sa.select(T_PEERS.c.id, T_PEERS.c.peer_id, T_PEERS.c.first_seen)
        if keys is not None:
            probes_q, outcomes_q = probes_q.where(q.peer.in_(keys)), outcomes_q.where(c.peer.in_(keys))
            peers_q = peers_q.where(T_PEERS.c.id.in_(keys))
        outcomes: dict[int, list[ChatOutcome]] = {}
        for r in conn.execute(outcomes_q).all():
            outcomes.setdefault(r[0], []).append(ChatOutcome(
                at=r[2], peer_id=r[1], model=r[3], start=r[4], end=r[5], ok=bool(r[6]), seconds_per_token=r[7],
                error=r[8]))
        wanted = set(observations) | set(outcomes) if keys is None else set(keys)
        probes: dict[int, list] = {}
        for r in conn.execute(probes_q).all():
            if r[0] in wanted:
                probes.setdefault(r[0], []).append(r)
        histories = {}
        for key, peer_id, first_seen in conn.execute(peers_q):
            if key not in wanted:
                continue
            histories[key] = PeerHistory(
                peer_id=peer_id,
                observations=tuple(observations.get(key, ())),
                probes=tuple((r[1], ProbeResult(peer_id, r[2], bool(r[3]), r[4], r[5], bool(r[6]), r[7]))
                             for r in probes.get(key, ())),
                outcomes=tuple(outcomes.get(key, ())),
                first_seen=first_seen,
            )
        return histories


# ---- helpers ---------------------------------------------------------------------------------


def _sqlite_in_memory(url) -> bool:
    return url.get_backend_name() == "sqlite" and (url.database in (None, "", ":memory:")
                                                   or url.query.get("mode") == "memory")


def _make_engine(url, timeout: float) -> Engine:
    if url.get_backend_name() == "sqlite":
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": timeout}}
        if _sqlite_in_memory(url):
            kwargs["poolclass"] = StaticPool
        else:
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record):
            # Let SQLAlchemy's "begin" below own transactions (pysqlite's implicit BEGIN would
            # defer the write lock to the first INSERT and can fail without waiting).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            for pragma in (f"busy_timeout={int(timeout * 1000)}", "foreign_keys=ON", "synchronous=NORMAL",
                           f"journal_size_limit={64 * 1024 * 1024}"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            # Writers take the write lock up front, so they wait busy_timeout rather than fail.
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("store_write") else "BEGIN")

        return engine
    if url.get_backend_name() == "postgresql":
        return sa.create_engine(
            url, pool_pre_ping=True, pool_timeout=timeout, pool_recycle=1800,
            connect_args={"connect_timeout": max(2, math.ceil(timeout)),
                          "options": f"-c statement_timeout={int(max(60, 12 * timeout) * 1000)}"
                                     f" -c lock_timeout={int(timeout * 1000)}"},
        )
    return sa.create_engine(url, pool_pre_ping=True)


def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def _insert(conn: Connection, table):
    """INSERT with ON CONFLICT support for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def _is_schema_error(e: exc.DBAPIError) -> bool:
    code = getattr(e.orig, "sqlstate", None)
    if code in ("42P01", "42703"):  # undefined table / column
        return True
    text = str(e.orig).lower()
    return "no such table" in text or "no such column" in text or "has no column named" in text


def _first_line(error) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _chunks(items: Sequence, size: int = _CHUNK) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _merge_runs(rows: list[tuple]) -> list[tuple]:
    """Consecutive polls of one model with the same (state, seen, span) within one clock hour
    become one row with ``samples`` = their count, ``at`` = the first, and mean speeds. Rows sorted
    by time in, rows sorted by time out; transitions (and so flaps) survive, hours stay separate."""
    merged: list[list] = []
    last: dict[str, int] = {}  # model -> index of its open run in merged
    for r in rows:
        at, model, state, seen, start, end, thr, rps, n = r
        i = last.get(model)
        if i is not None:
            m = merged[i]
            if (m[2], m[3], m[4], m[5]) == (state, seen, start, end) and _floor_hour(m[0]) == _floor_hour(at):
                m[9].append(thr)
                m[10].append(rps)
                m[8] += n
                continue
        last[model] = len(merged)
        merged.append([at, model, state, seen, start, end, thr, rps, n, [thr], [rps]])
    return [(m[0], m[1], m[2], m[3], m[4], m[5], _mean(m[9]), _mean(m[10]), m[8]) for m in merged]


def _floor_hour(t: float) -> float:
    return math.floor(t / HOUR) * HOUR


def _count_if(condition):
    return sa.func.sum(sa.case((condition, 1), else_=0))


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _columns(arrays: list[list]) -> list[list]:
    """Per block, the values of every poll that reported that block."""
    n = max((len(a) for a in arrays), default=0)
    return [[a[i] for a in arrays if i < len(a) and a[i] is not None] for i in range(n)]


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _check_status(status: Mapping[str, Any]) -> dict:
    unknown = set(status) - set(_STATUS_KEYS)
    if unknown or "model" not in status or "state" not in status:
        raise ValueError(f"a model status needs the keys 'model' and 'state' and may have {_STATUS_KEYS[2:]}; "
                         f"got {sorted(status)}")
    d = {key: status.get(key) for key in _STATUS_KEYS}
    d["reasons"] = [str(r) for r in (d["reasons"] or ())]
    if d["est_tokens_per_s"] is not None and not math.isfinite(d["est_tokens_per_s"]):
        d["est_tokens_per_s"] = None
    return d


def _status_dict(r: Mapping[str, Any]) -> dict:
    return {"at": r["at"], "state": r["state"], "reasons": list(r["reasons"] or ()), "coverage_pct": r["coverage_pct"],
            "servers_online": r["servers_online"], "min_redundancy": r["min_redundancy"],
            "est_tokens_per_s": r["est_tokens_per_s"]}


def _probe(peer_id, kind, ok, rtt, error, joining, address) -> ProbeResult:
    return ProbeResult(peer_id=peer_id, kind=kind, ok=bool(ok), rtt=rtt, error=error, joining=bool(joining),
                       address=address)


def _latest_ok_poll(conn: Connection):
    p = T_POLLS.c
    return conn.execute(sa.select(p.id, p.at, p.duration, p.invalid_records, p.errors, p.models).where(p.ok)
                        .order_by(p.at.desc(), p.id.desc()).limit(1)).mappings().first()


def _peer_key(conn: Connection, peer_id: str) -> Optional[int]:
    return conn.execute(sa.select(T_PEERS.c.id).where(T_PEERS.c.peer_id == peer_id)).scalar()


def _raw_start(conn: Connection, column=None) -> Optional[float]:
    """The oldest raw row still kept: rollups are used only for hours that end before it."""
    return conn.execute(sa.select(sa.func.min(column if column is not None else T_POLLS.c.at))).scalar()


def _rollup_window(hour_column, since: float, until: float, raw_start: Optional[float]) -> list:
    conditions = [hour_column + HOUR > since, hour_column <= until]
    if raw_start is not None:
        conditions.append(hour_column + HOUR <= raw_start)
    return conditions


def _next_hour_with_data(conn: Connection, after: Optional[float]) -> Optional[float]:
    """The start of the first hour at or after ``after`` that has polls or probes."""
    candidates = []
    for column in (T_POLLS.c.at, T_PROBES.c.at):
        query = sa.select(sa.func.min(column))
        if after is not None:
            query = query.where(column >= after)
        value = conn.execute(query).scalar()
        if value is not None:
            candidates.append(value)
    return _floor_hour(min(candidates)) if candidates else None


def _set_meta(conn: Connection, key: str, value: str) -> None:
    stmt = _insert(conn, T_META).values(key=key, value=value)
    conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": stmt.excluded.value}))


def _pings_to_json(pings: dict) -> dict:
    """petals announces an unreachable next server as an infinite RTT; JSON (PostgreSQL's
    in particular) has no Infinity, so it is stored as null."""
    return {peer: (rtt if rtt is not None and math.isfinite(rtt) else None) for peer, rtt in pings.items()}


def _pings_from_json(pings) -> dict:
    return {peer: (math.inf if rtt is None else rtt) for peer, rtt in (pings or {}).items()}
