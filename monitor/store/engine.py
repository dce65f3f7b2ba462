"""The connection to the database: engine set-up per dialect, read and write transactions, the
guard that turns driver errors into errors an operator can act on, and migrations.

SQLite (default, a file in the data dir) or PostgreSQL, one schema, migrated by Alembic
(``monitor/store/migrations``). Every call takes its own pooled connection and transaction, so
threads and processes share a database, not Python state. A database that is down or locked
makes a call raise ``StoreUnavailable`` within a few seconds instead of hanging, and the next call
works again once the database is back. Data the database refuses (a number beyond its column, a
constraint) is a different failure, ``StoreDataError``: retrying cannot help, but the other rows
can still go in, which ``insert_rows`` does (one refused row costs that row, not the batch).

A database with no schema yet, or one older than this version's (Alembic's head revision), is a
third: ``check_schema`` raises ``StoreNotMigrated`` with the revision it is at and the one needed,
so a web worker started before ``swarm-monitor migrate`` ran says that, not "unavailable".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from monitor.core.common import short_error

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
MIGRATION_LOCK = 4242001  # PostgreSQL advisory lock held while migrating (several processes may start at once)

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """A store call failed for a reason the operator can act on; the message says which."""


class StoreUnavailable(StoreError):
    """The database is down, unreachable or locked; the call may succeed later as is."""


class StoreSchemaError(StoreError):
    """The database has not been migrated to this version's schema (run ``swarm-monitor migrate``)."""


class StoreNotMigrated(StoreSchemaError):
    """The database has no schema yet, or an older one than this version needs: ``revision`` is the
    one it is at (None: no schema), ``needed`` this version's (Alembic's head). Run
    ``swarm-monitor migrate``."""

    def __init__(self, where: str, *, revision: Optional[str], needed: str):
        self.revision = revision
        self.needed = needed
        super().__init__(f"the database {where} {self.state}: run `swarm-monitor migrate`")

    @property
    def state(self) -> str:
        """"has no schema yet (revision none, this version needs 0009)" / "is at revision 0007, this
        version needs 0009" (no URL: the web shows it to anyone)."""
        if self.revision is None:
            return f"has no schema yet (revision none, this version needs {self.needed})"
        return f"is at revision {self.revision}, this version needs {self.needed}"


@dataclass(frozen=True)
class Migration:
    """What ``migrate`` did: the revision the schema was at (None: none) and the one it reached."""

    before: Optional[str]
    after: Optional[str]


class StoreDataError(StoreError, ValueError):
    """The database (or its driver) refused the values of a write: a number beyond its column, a
    constraint, a value its type cannot hold. Retrying the same write fails the same way."""


class Database:
    """One database URL's engine, and the transactions every store call runs in."""

    def __init__(self, url: str, *, timeout: float = 5.0):
        """``timeout``: seconds a call may wait for a locked SQLite file or an unreachable server."""
        self.url = _normalised(make_url(url))
        self.timeout = timeout
        self.display_url = self.url.render_as_string(hide_password=True)
        self.engine = _make_engine(self.url, timeout)
        self._migrate_lock = threading.Lock()
        self._schema_checked = False  # check_schema found this version's schema (or a newer one)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def read(self, what: str = "reading") -> Iterator[Connection]:
        with self.guard(what), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def write(self, what: str = "writing") -> Iterator[Connection]:
        """A write transaction; on SQLite it takes the write lock up front (``BEGIN IMMEDIATE``), so
        concurrent writers wait ``timeout`` for each other rather than fail half-way."""
        with self.guard(what, writing=True), self.engine.connect() as conn:
            conn.execution_options(store_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def guard(self, what: str, *, writing: bool = False) -> Iterator[None]:
        """Turn driver errors that the operator can act on into StoreUnavailable / StoreSchemaError /
        StoreDataError (a data error is never reported as an unavailable database). ``writing``:
        a plain ``ValueError`` / ``OverflowError`` (the driver refusing a value) is a data error
        too; in a read it is a bug and stays what it is."""
        try:
            yield
        except StoreError:
            raise
        except (exc.StatementError, OverflowError, ValueError) as e:
            if not writing and not isinstance(e, exc.StatementError):
                raise
            if isinstance(e, exc.DBAPIError) and _is_schema_error(e):
                self._schema_checked = False  # (the schema changed under us: the next check reads it again)
                raise StoreSchemaError(
                    f"{what}: the database {self.display_url} lacks this version's tables or columns "
                    f"({short_error(e.orig)}); run `swarm-monitor migrate`"
                ) from e
            if is_data_error(e):
                raise StoreDataError(f"{what}: the database refused the data ({data_error_text(e)})") from e
            if not isinstance(e, exc.DBAPIError):
                raise
            if isinstance(e, (exc.OperationalError, exc.InterfaceError)) or e.connection_invalidated:
                hint = ("is another process holding the file locked, or is its directory gone?"
                        if self.dialect == "sqlite" else "is the database server up and reachable?")
                raise StoreUnavailable(f"{what}: the database {self.display_url} is unavailable "
                                       f"({short_error(e.orig)}); {hint} Calls work again once it is back") from e
            raise
        except exc.TimeoutError as e:
            raise StoreUnavailable(f"{what}: no free connection to {self.display_url} within "
                                   f"{self.timeout:g} s ({e})") from e

    # ---- schema ------------------------------------------------------------------------------

    def migrate(self, revision: str = "head") -> Migration:
        """Bring the schema to ``revision`` (Alembic upgrade; creates it in an empty database); keeps
        all data. A schema at a revision this version does not know (a newer version migrated it)
        is left as it is: ``StoreSchemaError``."""
        from alembic import command
        from alembic.runtime.migration import MigrationContext

        with self._migrate_lock, self.guard("migrating the schema"):
            if self.dialect == "sqlite" and not _sqlite_in_memory(self.url):
                raw = self.engine.raw_connection()
                try:
                    raw.cursor().execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
                finally:
                    raw.close()
            with self.write() as conn:
                if self.dialect == "postgresql":
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
                before = MigrationContext.configure(conn).get_current_revision()
                if before is not None and before not in known_revisions():
                    raise StoreSchemaError(
                        f"the database {self.display_url} is at revision {before}, which this version does not "
                        f"know (its newest is {head_revision()}): a newer version migrated it; run that one")
                config = _alembic_config()
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
                after = MigrationContext.configure(conn).get_current_revision()
        self._schema_checked = after == head_revision()
        return Migration(before, after)

    def check_schema(self) -> None:
        """Raise ``StoreNotMigrated`` unless the schema is this version's (Alembic's head) or newer (a
        later version migrated it; what it added, this one does not read). Once it is, later calls
        cost nothing; until then each reads the revision (one small query)."""
        if self._schema_checked:
            return
        revision, needed = self.current_revision(), head_revision()
        if revision is not None and revision not in known_revisions():
            log.warning("the database %s is at revision %s, newer than this version's %s; reading it as it is",
                        self.display_url, revision, needed)
        elif revision != needed:
            raise StoreNotMigrated(self.display_url, revision=revision, needed=needed)
        self._schema_checked = True

    def current_revision(self) -> Optional[str]:
        from alembic.runtime.migration import MigrationContext

        with self.read("reading the schema revision") as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def size_bytes(self) -> int:
        """The database's size on disk (SQLite: with its write-ahead log)."""
        with self.read("measuring the database") as conn:
            if self.dialect == "postgresql":
                return int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar())
            size = conn.exec_driver_sql("PRAGMA page_count").scalar() * conn.exec_driver_sql("PRAGMA page_size").scalar()
        if not _sqlite_in_memory(self.url):
            wal = Path(f"{self.url.database}-wal")
            size += wal.stat().st_size if wal.exists() else 0
        return int(size)


# ---- data errors -----------------------------------------------------------------------------


def is_data_error(error: BaseException) -> bool:
    """True when the database or its driver refused the *values* of a statement (not the statement,
    the schema or the connection): the same values fail again, other rows may still go in.
    PostgreSQL: SQLSTATE classes 22 (data exception) and 23 (integrity); SQLite: an integer beyond
    64 bits (``OverflowError``), a value it cannot bind, a constraint; either: a value its column
    type could not convert (SQLAlchemy's ``StatementError``, e.g. JSON)."""
    if isinstance(error, (exc.DataError, exc.IntegrityError)):
        return True
    if isinstance(error, exc.DBAPIError):
        code = str(getattr(error.orig, "sqlstate", None) or "")
        if code[:2] in ("22", "23"):
            return True
        return (isinstance(error, (exc.ProgrammingError, exc.InterfaceError))
                and "binding parameter" in str(error.orig).lower())
    if isinstance(error, exc.StatementError):  # raised while converting a value, before the database saw it
        return True
    return isinstance(error, (OverflowError, ValueError))


def data_error_text(error: BaseException) -> str:
    """What the database said about the refused values, in one short line (no SQL, no parameters)."""
    cause = getattr(error, "orig", None) or error
    return short_error(cause)


@dataclass(frozen=True)
class Refused:
    """A row the database refused, and what it said."""

    row: dict
    error: str


def insert_rows(conn: Connection, statement, rows: Sequence[dict]) -> tuple[list[dict], list[Refused]]:
    """Execute ``statement`` for every row (one executemany); rows the database refuses as data
    (``is_data_error``) are left out and the others written. The batch is tried whole inside a
    SAVEPOINT; if it is refused, each half is tried the same way, down to single rows, so k bad rows
    among n cost about 2·k·log2(n) statements. Returns (written rows, refused rows)."""
    refused: list[Refused] = []

    def attempt(part: Sequence[dict]) -> None:
        try:
            with conn.begin_nested():
                conn.execute(statement, list(part))
            return
        except Exception as e:  # noqa: BLE001 - only data errors are handled, the rest re-raised
            if not is_data_error(e):
                raise
            if len(part) == 1:
                refused.append(Refused(part[0], data_error_text(e)))
                return
        middle = len(part) // 2
        attempt(part[:middle])
        attempt(part[middle:])

    if rows:
        attempt(rows)
    bad = {id(r.row) for r in refused}
    return [row for row in rows if id(row) not in bad], refused


def insert(conn: Connection, table: sa.Table):
    """INSERT with ON CONFLICT support (``on_conflict_do_update``) for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    return dialect_insert(table)


def count_if(condition):
    """SQL: how many rows of the group meet ``condition`` (NULL for an empty group)."""
    return sa.func.sum(sa.case((condition, 1), else_=0))


# ---- set-up ----------------------------------------------------------------------------------


def _normalised(url: URL) -> URL:
    if url.get_backend_name() == "postgresql" and url.get_driver_name() in ("", "psycopg2"):
        return url.set(drivername="postgresql+psycopg")  # psycopg 3 is what we install
    return url


def _sqlite_in_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and (url.database in (None, "", ":memory:")
                                                   or url.query.get("mode") == "memory")


def _make_engine(url: URL, timeout: float) -> Engine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, timeout)
    if url.get_backend_name() == "postgresql":
        return sa.create_engine(
            url, pool_pre_ping=True, pool_timeout=timeout, pool_recycle=1800,
            connect_args={"connect_timeout": max(2, math.ceil(timeout)),
                          "options": f"-c statement_timeout={int(max(60, 12 * timeout) * 1000)}"
                                     f" -c lock_timeout={int(timeout * 1000)}"},
        )
    return sa.create_engine(url, pool_pre_ping=True)


def _sqlite_engine(url: URL, timeout: float) -> Engine:
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


def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


@functools.lru_cache(maxsize=1)
def _scripts():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    """This version's schema: the newest revision in ``migrations/`` (what ``migrate()`` reaches)."""
    return _scripts().get_current_head()


@functools.lru_cache(maxsize=1)
def known_revisions() -> frozenset[str]:
    """Every revision in ``migrations/``."""
    return frozenset(script.revision for script in _scripts().walk_revisions())


def _is_schema_error(e: exc.DBAPIError) -> bool:
    code = getattr(e.orig, "sqlstate", None)
    if code in ("42P01", "42703"):  # undefined table / column
        return True
    text = str(e.orig).lower()
    return "no such table" in text or "no such column" in text or "has no column named" in text
