"""A throwaway PostgreSQL cluster for the tests: its own data dir, port and socket, stopped after.

initdb refuses to run as root, so as root the server programs run as the ``postgres`` OS user
(``runuser``); the cluster listens on 127.0.0.1 only, on a free port, with its socket in the temp
dir, trusts local connections (it holds test data only) and runs without fsync (committed data
survives a stop, which kills the server, not the machine). ``stop()`` and
``start()`` let a test take the database away mid-run and bring it back (same port, same data).
If PostgreSQL is missing or does not start, ``PostgresUnavailable`` says why and what to do:
the suite fails rather than skips, since CI must test the PostgreSQL store.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Optional

SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    explicit = os.environ.get("SWARM_MONITOR_TEST_PG_BINDIR")
    candidates = [explicit] if explicit else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0
    )
    for candidate in reversed(candidates):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    raise PostgresUnavailable(
        "PostgreSQL server programs not found (looked for /usr/lib/postgresql/*/bin/initdb"
        + (f" and {explicit}" if explicit else "") + "): run `make system-deps` (apt-get install postgresql), "
        "or point SWARM_MONITOR_TEST_PG_BINDIR at the directory holding initdb and pg_ctl"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    """One private cluster; ``url`` is its default database ``monitor``."""

    def __init__(self, base_dir: Optional[Path] = None):
        self.bindir = _bindir()
        self.as_root = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="swarm-monitor-pg-", dir=base_dir))
        self.data_dir = self.dir / "data"
        self.log_file = self.dir / "server.log"
        self.port = _free_port()
        self.running = False
        if self.as_root:
            try:
                user = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, but there is no {SERVER_USER!r} OS user to run PostgreSQL as "
                    "(initdb refuses root): install the postgresql package, which creates it") from None
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.dir.chmod(0o700)

    # ---- lifecycle ---------------------------------------------------------------------------

    def init(self) -> "PostgresCluster":
        self._run("initdb", "-D", self.data_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        atexit.register(self.close)  # even if the session dies before the fixture's teardown
        return self

    def start(self) -> None:
        """Start (or restart after ``stop``) on the same port and data."""
        for attempt in range(3):
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
                       "-c max_connections=50")
            # (no synchronous_commit=off: an immediate stop would lose the last commits)
            try:
                self._run("pg_ctl", "-D", self.data_dir, "-l", self.log_file, "-o", options, "-w", "-t", "60", "start")
                self.running = True
                return
            except PostgresUnavailable:
                if attempt == 2 or not self._port_in_use():
                    raise
                self.port = _free_port()  # another process took the port meanwhile

    def stop(self) -> None:
        """Stop at once (as a crash or a pulled plug would): clients see the database vanish."""
        if self.running:
            self._run("pg_ctl", "-D", self.data_dir, "stop", "-m", "immediate", "-w", "-t", "60")
            self.running = False

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- databases ---------------------------------------------------------------------------

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_for("monitor")

    def create_database(self, name: Optional[str] = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = name or f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    # ---- internals ---------------------------------------------------------------------------

    def _port_in_use(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def _run(self, program: str, *args) -> None:
        command = [str(self.bindir / program), *map(str, args)]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.dir)
        if result.returncode != 0:
            log = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise PostgresUnavailable(
                f"`{' '.join(command)}` failed with exit code {result.returncode}:\n{result.stderr[-2000:]}"
                f"{result.stdout[-1000:]}\nserver log ({self.log_file}):\n{log}"
            )


def start_cluster(base_dir: Optional[Path] = None) -> PostgresCluster:
    """A running cluster with an empty database ``monitor``; call ``close()`` when done."""
    cluster = PostgresCluster(base_dir).init()
    try:
        cluster.start()
        cluster.create_database("monitor")
    except BaseException:
        cluster.close()
        raise
    return cluster
