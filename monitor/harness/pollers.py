"""Poller processes for the high-availability specs and the fail-over benchmark: real
``swarm-monitor poll`` processes on one database, killed (SIGKILL), frozen (SIGSTOP of the whole
process group: the poller, its DHT child and p2pd, as a frozen machine) and woken, and what the
database says about them (who leads, since when, every stored poll).

Each process runs in its own session with its output in a log file; ``close()`` kills the group
and waits until it is gone (the DHT child and p2pd included), whatever state it was left in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import sqlalchemy as sa

from monitor.harness.local_swarm import _child_env


def write_config(path: Path, *, initial_peers: Sequence[str], models: Sequence[tuple[str, int]],
                 scrape_period: float, lease_seconds: Optional[float] = None, heartbeat_url: Optional[str] = None,
                 webhook_url: Optional[str] = None, rule_for: float = 4.0, speed_probe_period: float = 3600,
                 extra: str = "") -> Path:
    """A poller's TOML settings: the swarm, its models, the periods, the webhook its notices go to
    (one ``model_degraded`` rule waiting ``rule_for`` seconds) and the heartbeat URL."""
    lines = [f"initial_peers = {list(initial_peers)!r}".replace("'", '"'),
             f"scrape_period = {scrape_period}", f"reachability_period = {scrape_period}",
             "reachability_timeout = 3", "score_period = 600", f"speed_probe_period = {speed_probe_period}",
             "discover_models = false"]
    if lease_seconds is not None:
        lines.append(f"leader_lease_seconds = {lease_seconds}")
    if heartbeat_url:
        lines.append(f'heartbeat_url = "{heartbeat_url}"')
    lines.append(extra)
    for prefix, blocks in models:
        lines += ["[[models]]", f'dht_prefix = "{prefix}"', f"num_blocks = {blocks}"]
    lines += ["[alerts]", "check_period = 2", "retry_backoff = 1"]
    if webhook_url:
        lines += ["[[alerts.webhooks]]", 'name = "ops"', f'url = "{webhook_url}"', "timeout = 3",
                  "[[alerts.rules]]", 'name = "model-health"', 'kind = "model_degraded"', f"for = {rule_for}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class PollerProcess:
    """One ``swarm-monitor poll`` process."""

    name: str
    config: Path
    database_url: str
    data_dir: Path
    log_path: Path = field(init=False)
    popen: Optional[subprocess.Popen] = None
    started_at: float = 0.0

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / f"{self.name}.log"

    def start(self) -> "PollerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = _child_env()
        env.update({"SWARM_MONITOR_DATA_DIR": str(self.data_dir), "SWARM_MONITOR_DATABASE_URL": self.database_url})
        self.started_at = time.time()
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen([sys.executable, "-m", "monitor.app.cli", "--config", str(self.config), "poll"],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> float:
        """kill -9 the poller (its DHT child and p2pd are ended by the reaper's watchdog); when."""
        at = time.time()
        os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(30)
        return at

    def freeze(self) -> float:
        """SIGSTOP the poller's whole process group (as a frozen machine would be); when."""
        at = time.time()
        os.killpg(self.pid, signal.SIGSTOP)
        return at

    def wake(self) -> float:
        at = time.time()
        os.killpg(self.pid, signal.SIGCONT)
        return at

    def close(self) -> None:
        if self.popen is None:
            return
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _group_alive(self.pid):
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# ---- what the database says ------------------------------------------------------------------------


def leader_pid(store) -> Optional[int]:
    """The pid of the poller whose lease holds now (None: none)."""
    leader = store.poller_status().leader
    return leader.pid if leader is not None else None


def poll_times(store, since: float = 0.0) -> list[float]:
    """When each successful poll since ``since`` was taken, oldest first."""
    with store.engine.connect() as conn:
        return [row[0] for row in conn.execute(
            sa.text("SELECT at FROM polls WHERE ok AND at >= :since ORDER BY at"), {"since": since})]


def gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]
