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

from monitor.app.job_table import JOBS, After
from monitor.app.jobs import Poller
from monitor.app.leadership import Leadership
from monitor.core.snapshot import Snapshot
from monitor.settings import Settings
from support import TINY, poll_rows, sqlite_store, wait_until

CLI = Path(sys.executable).with_name("swarm-monitor")


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path


def run_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir),
           "SWARM_MONITOR_MODELS": f'[{{"dht_prefix": "{TINY.dht_prefix}", "num_blocks": {TINY.num_blocks}}}]'}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=240, env=env,
                          stdin=subprocess.DEVNULL)


def test_the_table_lists_every_job_once_each_a_function_with_its_triggers():
    names = [job.name for job in JOBS]
    assert len(names) == len(set(names))
    assert {"scrape", "reachability", "probes", "generation-check", "assess", "scores", "rollup", "alerts",
            "heartbeat", "requests"} <= set(names)
    for job in JOBS:
        assert callable(job.run) and job.triggers, job.name
        assert job.period(Settings()) is None or job.period(Settings()) > 0
        for trigger in job.triggers:  # a job follows only jobs of the table
            assert not isinstance(trigger, After) or set(trigger.jobs) <= set(names), job.name


ADDED_JOBS = """
from pathlib import Path

from monitor.app.job_table import After, Every, Job

RUNS = Path(__file__).with_name("runs.txt")


def said() -> list:
    return RUNS.read_text().split() if RUNS.exists() else []


def tally(ctx) -> int:
    with RUNS.open("a") as out:
        out.write(f"tally:{len(said())} ")
    return sum(1 for run in said() if run.startswith("tally:"))


def after_tally(ctx) -> None:
    with RUNS.open("a") as out:
        out.write(f"after-tally:{len(said())} ")


ROWS = (Job("tally", "count its runs", tally, (Every(lambda s: 0.2),)),
        Job("after-tally", "follow an odd tally", after_tally, (After(("tally",), when=lambda n: n % 2 == 1),)))
"""


def test_a_job_added_as_one_function_and_one_table_row_runs_on_its_trigger_on_request_and_once(data_dir, monkeypatch):
    """The table is the source of truth: two rows added to it (a module of their own) — one every
    0.2 s, one after it when the first's result is odd, neither known anywhere else — run on their
    triggers in a running poller, when another process asks for them through the store, and by the
    real ``swarm-monitor job NAME --once`` (the triggered one too, and nothing after it)."""
    (data_dir / "added_jobs.py").write_text(ADDED_JOBS)
    monkeypatch.syspath_prepend(str(data_dir))
    import added_jobs

    runs = lambda: [run.split(":") for run in added_jobs.said()]  # noqa: E731
    store = sqlite_store(data_dir)
    try:
        settings = Settings(data_dir=data_dir, models=[{"dht_prefix": TINY.dht_prefix, "num_blocks": TINY.num_blocks}])
        poller = Poller(settings, store, dht=None, jobs=JOBS + added_jobs.ROWS)
        poller.start()
        try:
            assert wait_until(lambda: sum(1 for name, _ in runs() if name == "tally") >= 4, 20, step=0.05)
        finally:
            poller.shutdown()
        tallies = [int(i) for name, i in runs() if name == "tally"]
        followed = [int(i) for name, i in runs() if name == "after-tally"]
        # each odd tally (the 1st, 3rd, ...) followed at once, in its thread, before the next tally
        assert followed == [i + 1 for n, i in enumerate(tallies, 1) if n % 2 == 1], runs()

        added_jobs.RUNS.unlink()
        store.request_job("after-tally", by="spec")
        assert [r.job for r in poller.job_requests()] == ["after-tally"] and runs() == [["after-tally", "0"]]

        added_jobs.RUNS.unlink()
        with_rows = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import added_jobs; "
                     "from monitor.app import job_table as t; t.JOBS += added_jobs.ROWS; "
                     "t.BY_NAME.update((job.name, job) for job in added_jobs.ROWS); "
                     "from monitor.app.cli import main; main(prog_name='swarm-monitor')")
        cli = lambda *args: subprocess.run(  # noqa: E731
            [sys.executable, "-c", with_rows, str(data_dir), *args], capture_output=True, text=True, timeout=240,
            stdin=subprocess.DEVNULL, env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir), "SWARM_MONITOR_MODELS":
                                           f'[{{"dht_prefix": "{TINY.dht_prefix}", "num_blocks": {TINY.num_blocks}}}]'})
        done = cli("job", "after-tally", "--once")
        assert done.returncode == 0 and "job after-tally: done" in done.stdout, done.stderr[-2000:]
        assert runs() == [["after-tally", "0"]]  # once, and nothing after it
        listed = cli("job", "--list")
        assert "every 0.2 s" in listed.stdout and "after tally" in listed.stdout, listed.stdout
        assert all(job.name in listed.stdout for job in JOBS)
    finally:
        store.close()


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
        unknown = run_cli(data_dir, "job", "no-such-job", "--once")
        assert unknown.returncode != 0 and "no job named 'no-such-job'" in unknown.stderr, unknown.stderr
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

        carried = poller.job_requests()
        assert [r.id for r in carried] == [first]
        assert store.latest_assessments()[TINY.dht_prefix].poll_at == snapshot.taken_at
        assert store.pending_job_requests() == []
        assert poller.job_requests() == []  # nothing twice
        assert elsewhere.request_job("assess", by="chat", min_interval=30) is None  # done, still within it
        assert elsewhere.request_job("assess", by="chat", min_interval=30, at=time.time() + 31) is not None
        for job, target in (("x" * 33, None), ("reachability", "Q" * 129), ("reachability", "")):
            with pytest.raises(ValueError, match="at most"):  # refused before SQL, whatever the database
                elsewhere.request_job(job, target, by="chat")
        assert elsewhere.request_job("no-such-job", by="chat") is not None
        poller.job_requests()  # an unknown job is dropped (logged), not retried forever
        assert store.pending_job_requests() == []
    finally:
        elsewhere.close()
        store.close()
