"""Fixtures: a real private Petals swarm on loopback (bootstrap + real petals servers).

The session swarm serves the tiny Llama with two disjoint servers and one full server; tests that
kill or restart servers get their own swarm from ``make_swarm``. After the session, no server or
p2pd process we started may be left running.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model

SESSION_STARTED = time.time()
# Every process this session starts inherits this marker (p2pd too: hivemind passes the
# environment on), so the leftover check sees only our own processes, not a parallel run's.
SESSION_MARKER = "SWARM_MONITOR_TEST_SESSION"
os.environ[SESSION_MARKER] = str(os.getpid())
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def swarm_processes(since: float = SESSION_STARTED) -> list[psutil.Process]:
    """petals servers, bootstrap peers and p2pd daemons started since `since`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "name"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.info["create_time"] < since - 1 or proc.pid == os.getpid():
                continue
            if "p2pd" in (proc.info["name"] or "") or "monitor.harness.server_process" in cmdline:
                if proc.environ().get(SESSION_MARKER) == os.environ[SESSION_MARKER]:
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("SWARM_MONITOR_TEST_DATA", Path.home() / ".cache" / "petals-swarm-monitor-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(data_dir) -> Path:
    return ensure_tiny_model(data_dir)


SESSION_SPECS = (
    ServerSpec("first-half", 0, TINY_NUM_BLOCKS // 2, throughput=50.0, public_name="first-half"),
    ServerSpec("second-half", TINY_NUM_BLOCKS // 2, TINY_NUM_BLOCKS, throughput=50.0, public_name="second-half"),
    ServerSpec("full", 0, TINY_NUM_BLOCKS, throughput=100.0, public_name="full"),
)


@pytest.fixture(scope="session")
def swarm(tiny_model) -> LocalSwarm:
    """Shared read-only swarm: do not kill, stop or throttle its servers (use make_swarm)."""
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=5) as s:
        s.start(SESSION_SPECS)
        yield s


@pytest.fixture
def make_swarm(tiny_model):
    """Factory for a private swarm of the tiny model that the test may break; reaped afterwards."""
    made: list[LocalSwarm] = []

    def make(specs, **kwargs) -> LocalSwarm:
        kwargs.setdefault("update_period", 5)
        s = LocalSwarm(tiny_model, TINY_DHT_PREFIX, **kwargs)
        made.append(s)
        s.start(specs)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def pytest_sessionfinish(session, exitstatus):
    """The suite fails if any swarm process it started outlives it."""
    deadline = time.time() + 15
    left = swarm_processes()
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = swarm_processes()
    if left:
        lines = "\n".join(f"  pid {p.pid}: {p.info['cmdline']}"[:200] for p in left)
        print(f"\nLEFTOVER SWARM PROCESSES after the test session:\n{lines}")
        session.exitstatus = 1


# ---- PostgreSQL (the store's tests; tests/postgres.py) ----------------------------------------


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL cluster for the session: ``.url`` (database ``monitor``),
    ``.create_database()`` -> URL of a fresh one, ``.stop()`` / ``.start()``.
    Fails (never skips) when PostgreSQL cannot start: CI must test the PostgreSQL store."""
    from postgres import PostgresUnavailable, start_cluster

    try:
        cluster = start_cluster()
    except PostgresUnavailable as e:
        pytest.fail(f"PostgreSQL test cluster did not start: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def postgres_url(postgres) -> str:
    """URL of a new empty database in the session cluster (restarted if a test left it stopped)."""
    if not postgres.running:
        postgres.start()
    return postgres.create_database()
