"""Spec: the poller's jobs are a table, each runnable once on its own, and they talk through the
store (README: Operations, "Jobs").

- ``swarm-monitor job NAME --once`` runs one job against the configured store, as a cron line or an
  operator would, and a job only the leader runs refuses while another poller leads the database;
- a request written into the store by another process ("check this server now", "assess now") is
  carried out by the leader's ``requests`` job, once for all the requests of the same job, and an
  equal request within ``min_interval`` is not written twice, whatever the traffic.
Through a real store (SQLite), the real CLI in a subprocess and a real leadership.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.app.job_table import BY_NAME, JOBS
from monitor.app.jobs import Poller
from monitor.app.leadership import Leadership
from monitor.core.snapshot import Snapshot
from monitor.settings import Settings
from support import TINY, poll_rows, sqlite_store

CLI = Path(sys.executable).with_name("swarm-monitor")


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path


def run_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir),
           "SWARM_MONITOR_MODELS": f'[{{"dht_prefix": "{TINY.dht_prefix}", "num_blocks": {TINY.num_blocks}}}]'}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=240, env=env,
                          stdin=subprocess.DEVNULL)


def test_the_table_lists_every_job_once_and_each_has_a_method_of_its_own():
    names = [job.name for job in JOBS]
    assert len(names) == len(set(names))
    assert {"scrape", "reachability", "probes", "generation-check", "assess", "scores", "rollup", "alerts",
            "heartbeat", "requests"} <= set(names)
    for job in JOBS:
        assert callable(getattr(Poller, "job_" + job.name.replace("-", "_"))), job.name
        assert job.period(Settings()) is None or job.period(Settings()) > 0


def test_job_once_runs_one_job_and_refuses_while_another_poller_leads(data_dir):
    store = sqlite_store(data_dir)
    try:
        snapshot = Snapshot(taken_at=time.time(), duration=0.2, models=(TINY,), servers=tuple(poll_rows(1)))
        store.record_poll(snapshot)  # stored without its assessment: the assess job writes it
        assert store.latest_assessments() == {}
        done = run_cli(data_dir, "job", "assess", "--once")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "job assess: done" in done.stdout
        assert store.latest_assessments()[TINY.dht_prefix].poll_at == snapshot.taken_at

        other = Leadership(store, 30.0)  # another poller leads this database now
        other.start()
        try:
            assert other.held()
            refused = run_cli(data_dir, "job", "scores", "--once")
            assert refused.returncode != 0 and "leads this database" in refused.stderr, refused.stderr[-2000:]
        finally:
            other.stop()
            other.release()
        listed = run_cli(data_dir, "job", "--list")
        assert listed.returncode == 0 and all(job.name in listed.stdout for job in JOBS)
    finally:
        store.close()


def test_requests_through_the_store_are_carried_out_by_the_leader_once_per_interval(data_dir):
    store = sqlite_store(data_dir)
    elsewhere = sqlite_store(data_dir)  # another process's store (a chat worker, a standby)
    try:
        settings = Settings(data_dir=data_dir, models=[{"dht_prefix": TINY.dht_prefix, "num_blocks": TINY.num_blocks}])
        poller = Poller(settings, store, dht=None)
        snapshot = Snapshot(taken_at=time.time(), duration=0.2, models=(TINY,), servers=tuple(poll_rows(1)))
        store.record_poll(snapshot)
        first = elsewhere.request_job("assess", by="chat", why="a request failed on a server", min_interval=30)
        assert first is not None
        assert elsewhere.request_job("assess", by="chat", min_interval=30) is None  # the same, within the interval
        assert elsewhere.request_job("assess", by="generation-check", min_interval=30) is None  # whoever asks
        assert [r.id for r in store.pending_job_requests()] == [first]

        carried = BY_NAME["requests"].run(poller)
        assert [r.id for r in carried] == [first]
        assert store.latest_assessments()[TINY.dht_prefix].poll_at == snapshot.taken_at
        assert store.pending_job_requests() == []
        assert BY_NAME["requests"].run(poller) == []  # nothing twice
        assert elsewhere.request_job("assess", by="chat", min_interval=30) is None  # done, still within it
        assert elsewhere.request_job("assess", by="chat", min_interval=30, at=time.time() + 31) is not None
        for job, target in (("x" * 33, None), ("reachability", "Q" * 129), ("reachability", "")):
            with pytest.raises(ValueError, match="at most"):  # refused before SQL, whatever the database
                elsewhere.request_job(job, target, by="chat")
        assert elsewhere.request_job("no-such-job", by="chat") is not None
        BY_NAME["requests"].run(poller)  # an unknown job is dropped (logged), not retried forever
        assert store.pending_job_requests() == []
    finally:
        elsewhere.close()
        store.close()
