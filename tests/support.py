"""What the specs share besides fixtures: plain helpers and data (fixtures live in ``conftest.py``).

A spec module imports from here (``from support import ...``), never from another spec module, so
each module can be run, moved or deleted alone. This module is imported under one name only: it
registers itself as both ``support`` and ``tests.support``, so the session's clock and marker
(``SESSION_STARTED``, ``SESSION_MARKER``) exist once, whichever way it was imported.

- waiting: ``wait_until`` (the one poll-until-true loop of the specs);
- processes: ``swarm_processes`` (what this session started and must reap), ``free_port``;
- serving: ``serve`` (a WSGI app on a real threaded server), ``read_sse``, ``close_ws`` (a
  WebSocket the server may have closed first), the chat's ``MESSAGES``;
- the demo: ``start_demo``, ``dashboard_url``;
- the swarm's layout: ``SESSION_SPECS`` (``DEGRADING``, ``DEGRADED_SPAN``), ``STEADY_UPDATE_PERIOD``;
- a populated store: ``populate`` (three polls, reachability checks, chat outcomes and scores
  written through the poller's own path), ``web_settings``, ``PEERS``, ``TINY``, ``peer``,
  ``random_peer_id``, ``seeded_peer_id``, ``petals_announcement`` (what a petals server stores
  under a block); the HTML helpers ``elements``, ``text_of``, ``words`` and
  ``report_of`` ("Is this server OK?" as text); ``no_internals``, ``strict_json``,
  ``metric_families`` and ``metric_sample`` (of /metrics);
- stores: ``STORE_KINDS`` (the params of a fixture run on SQLite and PostgreSQL), ``store_url_of``
  (a param's URL), ``open_migrated_store``, ``migrated_store`` (a store fixture's body),
  ``sqlite_store``, ``fold_wal`` (a SQLite store whole in its file, to copy);
- a monitor of a real swarm: ``tiny_settings`` (watching its tiny model), ``polled_prober`` (a
  poller that has scraped once and its server prober);
- scores from whole histories, the specification the score job's SQL meets: ``peer_histories``
  (every peer's ``PeerHistory`` from a store), ``score_peer``, ``swarm_reference``, ``score_swarm``;
- alerts over a store: ``ALERT_MODEL`` with its one server ``ALERT_PEER``, ``record_state`` (a poll
  stored with its assessment in a state), ``alert_settings`` (webhooks), ``fire_degraded``,
  ``maintenance_window``, ``unix_seconds`` (an Alertmanager's times);
- the pollers' lease: ``lease_of`` (a poller's), ``expire_lease`` (its deadline past);
- a store's rows made by hand: ``STORE_LLAMA``, ``store_peer``, ``store_row``, ``store_snapshot``,
  ``store_health`` (a diagnosis);
- a status page's 90 days: ``STATUS_PLAN`` (each day's polls), ``STATUS_EXPECTED`` (each day's bar),
  ``status_health``, ``day_start``, ``write_status_history`` (conftest's ``status_app`` serves them).
"""

from __future__ import annotations

import contextlib
import os

# One compute thread per process (torch's OpenMP and MKL pools), here and in every process the
# session starts (servers, pollers, the demo inherit it): set before torch is first imported. On
# the 2-core machine a second thread spins beside the first: the tiny model's greedy decoding took
# 2.2× the CPU for no less time (5.1 against 2.3 CPU-s, 10 answers of 48 tokens), CPU that every
# process running beside it lacked (BENCHMARKS.md, "Test suite").
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import atexit  # noqa: E402
import base64  # noqa: E402
from email import message_from_bytes  # noqa: E402
from email.policy import default as email_default_policy  # noqa: E402
import dataclasses
import functools
import hashlib
import json
import math
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing, contextmanager
from datetime import datetime
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import base58
import psutil
import pytest
import sqlalchemy
from simple_websocket import ConnectionClosed
from werkzeug.serving import make_server

from monitor.app.alerter import Alerter
from monitor.app.jobs import Poller
from monitor.app.probing import ServerProber
from monitor.core.alert_rules import FIRED
from monitor.core.assessment import Assessment, BlockCoverage, Recommendation, RouteHop
from monitor.core.maintenance import MaintenanceWindow
from monitor.core import scores
from monitor.core.scores import PeerScore
from monitor.core.snapshot import (
    JOINING, ONLINE, ChatOutcome, ModelInfo, PeerHistory, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot,
)
from monitor.harness.local_swarm import ServerSpec
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.settings import ModelConfig, Settings
from monitor.store import Store

sys.modules.setdefault("support", sys.modules[__name__])
sys.modules.setdefault("tests.support", sys.modules[__name__])

T = TypeVar("T")

SESSION_STARTED = time.time()
# Every process this session starts inherits this marker (p2pd too: hivemind passes the
# environment on), so the leftover check sees only our own processes, not a parallel run's.
SESSION_MARKER = "SWARM_MONITOR_TEST_SESSION"
os.environ[SESSION_MARKER] = str(os.getpid())


# ---- waiting -----------------------------------------------------------------------------------


def require_reference() -> None:
    """Fail (never skip) a spec that checks against the reference transformers when set-up did not
    install it: a missing reference must not pass as a green suite."""
    from monitor.harness import reference

    if not reference.available():
        pytest.fail(f"the reference transformers is missing from {reference.REFERENCE_DIR}: run `make setup`",
                    pytrace=False)


def wait_until(predicate: Callable[[], T], timeout: float, step: float = 0.5) -> T:
    """Call ``predicate`` every ``step`` seconds until it returns something true or ``timeout``
    seconds have passed; returns its last answer (so ``assert wait_until(...)`` fails with it).
    A predicate may raise to give up early (e.g. when the process it waits for died)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))


def probe_rounds_until(prober, done: Callable[[list], bool], timeout: float = 90.0, pause: float = 0.5) -> list:
    """Run a prober's rounds as its job does (one per tick, ``pause`` apart) until ``done(probes so
    far)``; returns them, or fails naming what the rounds gave."""
    seen: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(prober.run_once())
        if done(seen):
            return seen
        time.sleep(pause)
    raise AssertionError(f"not done within {timeout:.0f} s; probes: {seen}")


# ---- processes ---------------------------------------------------------------------------------


SWARM_MODULES = ("server_process", "fork_server")  # the harness's processes (and the fork server's children)


def swarm_processes(since: float = SESSION_STARTED) -> list[psutil.Process]:
    """petals servers, bootstrap peers, p2pd daemons and the harness's fork server this session
    started since ``since``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time", "name"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.info["create_time"] < since - 1 or proc.pid == os.getpid():
                continue
            if "p2pd" in (proc.info["name"] or "") or any(f"monitor.harness.{m}" in cmdline for m in SWARM_MODULES):
                if proc.environ().get(SESSION_MARKER) == os.environ[SESSION_MARKER]:
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- serving -----------------------------------------------------------------------------------


@contextmanager
def serve(app) -> Iterator[str]:
    """The app on a real threaded HTTP server on 127.0.0.1 (a free port); yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def close_ws(ws) -> None:
    """Close a WebSocket client, whether or not the server closed it first.

    The chat closes a socket itself after some errors (chat.petals.dev's handler returns after
    its error reply); whether the client's reader has seen that close frame yet when the spec
    closes is a race, and simple_websocket raises ``ConnectionClosed`` (or the socket ``OSError``)
    when it has."""
    try:
        ws.close()
    except (ConnectionClosed, OSError):
        pass


def read_sse(response):
    """(event, data) pairs of a text/event-stream response, as a browser's EventSource sees them."""
    from monitor.harness.event_stream import events

    return events(response.iter_content(chunk_size=None, decode_unicode=True))


# the conversation the chat's specs send (through the APIs, and to gunicorn's chat worker)
MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Hello, world!"}]


# ---- the demo ----------------------------------------------------------------------------------


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_demo(args: list[str], env: dict) -> subprocess.Popen:
    """``swarm-monitor demo`` in its own process group (a hung demo is killed whole), its output
    on a pipe. A runner started in the background of a non-interactive shell (or under nohup)
    ignores SIGINT, and children inherit that: the demo gets the disposition a terminal would."""
    return subprocess.Popen([sys.executable, "-m", "monitor.app.cli", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                            preexec_fn=_sigint_default)


def dashboard_url(demo: subprocess.Popen, output: list[str], timeout: float = 300) -> str:
    """Read the demo's output (kept in ``output``) until it prints its dashboard's address."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = demo.stdout.readline()
        assert line, "demo exited early:\n" + "".join(output)
        output.append(line)
        match = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/", line)
        if match:
            return match.group(1)
    raise AssertionError("no dashboard address within the time:\n" + "".join(output))


def keep_reading(process: subprocess.Popen, output: list[str]) -> threading.Thread:
    """Read ``process``'s output into ``output`` on a thread, as it comes (``stop_process`` ends it)."""
    reader = threading.Thread(target=lambda: output.extend(process.stdout or ()), name="output-reader", daemon=True)
    reader.start()
    return reader


def stop_process(process: subprocess.Popen, output: list[str], *, signum: int, timeout: float,
                 reader: threading.Thread | None = None) -> bool:
    """Send ``signum`` to ``process`` (its output read into ``output`` by ``reader``, else from now
    on) and wait for it to exit; its group is killed if it has not within ``timeout`` (then False).
    It has ended when it exits, not when its output pipe closes: a helper of torch's it started
    (``torch_shm_manager``, for hivemind's shared memory) keeps the pipe open for seconds after;
    what the process wrote before it exited is read within a second."""
    reader = reader or keep_reading(process, output)
    process.send_signal(signum)
    try:
        process.wait(timeout=timeout)
        stopped = True
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the process, its DHT process and their p2pd
        process.wait(timeout=30)
        stopped = False
    reader.join(1.0)
    return stopped


def run_in_group(args: list[str], *, timeout: float) -> subprocess.CompletedProcess:
    """``args`` run to its end in a process group of its own, its output captured; whatever it
    left behind in that group (a petals client's DHT process and its p2pd outlive an interpreter
    that exits without shutting them down) is killed when it ends, or when ``timeout`` passes."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    finally:
        reap_group(process)


def reap_group(process: subprocess.Popen) -> None:
    """Kill what is left of ``process``'s group (started with ``start_new_session``) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


# ---- the swarm's layout ------------------------------------------------------------------------

# How often the servers of a swarm re-announce themselves (petals' ``update_period``) when no spec
# stops or kills one of them, so no record has to expire soon: every 5 s (``make_swarm``'s, where
# servers die) costs an idle swarm's processes 6× the CPU (1.2 against 0.2 CPU-s per 20 s for
# three servers), which every spec running beside it on the 2 cores pays for (BENCHMARKS.md,
# "Test suite"). A server still announces itself at once when it starts and when it stops.
STEADY_UPDATE_PERIOD = 60.0


# The session swarm's servers (conftest's ``swarm``): two disjoint halves and one full server, the
# demo's layout (``demo_swarm.demo_layout`` of 3 servers: every block served twice). Stopping
# ``DEGRADING`` leaves blocks 0:4 with one server, the model degraded, as the demo's chaos
# "stop server-2" does.
SESSION_SPECS = (
    ServerSpec("first-half", 0, TINY_NUM_BLOCKS // 2, throughput=50.0, public_name="first-half"),
    ServerSpec("second-half", TINY_NUM_BLOCKS // 2, TINY_NUM_BLOCKS, throughput=50.0, public_name="second-half"),
    ServerSpec("full", 0, TINY_NUM_BLOCKS, throughput=100.0, public_name="full"),
)
DEGRADING = "first-half"
DEGRADED_SPAN = f"0:{TINY_NUM_BLOCKS // 2}"  # the blocks it leaves with one server


# ---- stores: SQLite and PostgreSQL -------------------------------------------------------------

# params of a fixture that runs its specs on both stores; the PostgreSQL ones carry the marker
STORE_KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def store_url_of(request, sqlite_path) -> str:
    """The URL of a fixture's store for its param (one of ``STORE_KINDS``): a SQLite file at
    ``sqlite_path``, or the session's PostgreSQL database (conftest's ``postgres_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{sqlite_path}"
    return request.getfixturevalue("postgres_url")


def fold_wal(path: Path) -> None:
    """Every write of a closed SQLite store put into its file, which a plain copy then carries
    whole (the store stays in WAL mode, as ``Store`` sets it)."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@functools.lru_cache(maxsize=None)
def _migrated_sqlite_template() -> Path:
    """A SQLite store migrated to the newest revision, made once per spec process (removed at
    its exit): what a fresh store's migration makes, to copy."""
    directory = Path(tempfile.mkdtemp(prefix="migrated-store-"))
    atexit.register(shutil.rmtree, directory, True)
    path = directory / "migrated.db"
    store = Store(f"sqlite:///{path}")
    try:
        store.migrate()
    finally:
        store.close()
    fold_wal(path)
    return path


def open_migrated_store(url: str, **options) -> Store:
    """A store on ``url`` (``options``: ``Store``'s) with its schema up to date; the caller closes
    it. A new SQLite file starts as a copy of one migrated once per process (an Alembic run of
    every revision takes 0.07–0.2 s, a copy 0.01 s; BENCHMARKS.md, "Test suite"), which
    ``migrate`` then finds up to date; an existing file, or another database, it migrates."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_migrated_sqlite_template(), path)
    store = Store(url, **options)
    store.migrate()
    return store


@contextmanager
def migrated_store(url: str, **options) -> Iterator[Store]:
    """``open_migrated_store``, closed after (a store fixture's body)."""
    store = open_migrated_store(url, **options)
    try:
        yield store
    finally:
        store.close()


def sqlite_store(data_dir) -> Store:
    """A migrated store in ``data_dir``'s monitor.db; the caller closes it."""
    return open_migrated_store(f"sqlite:///{data_dir / 'monitor.db'}")


@contextlib.contextmanager
def chat_app(swarm, models: list, data_dir, *, forecasts: bool = False, **engine_options) -> Iterator[tuple]:
    """A chat engine of ``models`` on ``swarm`` whose request rows go to a fresh store in
    ``data_dir``, and the web app serving it; yields (engine, store, rows, app). ``forecasts``: the
    engine's forecasts read that store (refreshed by the spec: ``engine.forecast_source.refresh()``);
    ``engine_options``: the engine's parameters."""
    from chat.engine import ChatEngine
    from chat.feedback import StoreForecasts, StoreRequests
    from chat.http import create_blueprint
    from monitor.web import create_app

    store = sqlite_store(data_dir)
    rows = StoreRequests(store, period=0.2).start()
    source = StoreForecasts(store, [m.dht_prefix for m in models], period=3600).start() if forecasts else None
    engine = ChatEngine(swarm.dht, models, request_sink=rows, forecast_source=source, **engine_options)
    app = create_app(Settings(data_dir=data_dir, chat_rate_limit="1000 per minute"), store,
                     chat_blueprints=[create_blueprint(engine)])
    try:
        yield engine, store, rows, app
    finally:
        engine.close()
        if source is not None:
            source.close()
        rows.close()
        store.close()


# ---- a monitor of a real swarm (the probe and check specs) ---------------------------------------


def tiny_settings(swarm, data_dir, path=None, **overrides) -> Settings:
    """Settings that watch ``swarm``'s tiny model (its client files at ``path``), their data in
    ``data_dir``; ``overrides``: any other settings."""
    return Settings(data_dir=data_dir, initial_peers=swarm.initial_peers,
                    models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS, path=path)],
                    **overrides)


def alerting_settings(swarm, data_dir, hook_url: str, rules: list[dict]) -> Settings:
    """Settings that watch ``swarm``'s tiny model closely (a poll and a reachability check every
    2 s, alerts checked every second) and alert by ``rules`` alone (no default rules) to one
    webhook, ``ops`` at ``hook_url``."""
    return tiny_settings(swarm, data_dir, scrape_period=2, reachability_period=2, reachability_timeout=2,
                         score_period=600, alerts={"check_period": 1, "default_rules": False,
                                                   "webhooks": [{"name": "ops", "url": hook_url}], "rules": rules})


def polled_prober(settings: Settings, store: Store, dht) -> tuple[Poller, ServerProber]:
    """A poller that has scraped the swarm once, and the server prober that probes what it saw
    (rounds are run by the specs); the caller closes the prober."""
    poller = Poller(settings, store, dht)
    assert poller.poll_once() is not None
    prober = ServerProber(settings, store, dht, snapshot=lambda: poller._last_snapshot,
                          after_round=poller.assess_latest)
    return poller, prober


# ---- scores from whole histories ----------------------------------------------------------------
# The score job counts in SQL (``Store.peer_aggregates``); ``scores.aggregate`` counts the same from
# a ``PeerHistory`` in Python, and these put it to work for the specs on small histories.


def peer_histories(store: Store, since: float, until: float, *, merge_runs: bool = False,
                   reachability_since: float | None = None) -> list[PeerHistory]:
    """``Store.peer_history`` of every peer observed or chatted with in [since, until], by peer id.
    ``reachability_since``: reachability checks only from then on (the scores look at 24 h of them)."""
    from monitor.store import history

    with store.db.read("reading peer histories") as conn:
        found = history.histories(conn, since, until, None, merge_runs, reachability_since)
    return sorted(found.values(), key=lambda h: h.peer_id)


def score_peer(history: PeerHistory, now: float, *, reference_sec_per_block: float | None = None) -> PeerScore:
    """``scores.score`` of the history's aggregates."""
    return scores.score(scores.aggregate(history, now), now, reference_sec_per_block=reference_sec_per_block)


def swarm_reference(histories, now: float) -> float | None:
    """``scores.swarm_median`` of the histories' aggregates."""
    return scores.swarm_median(scores.aggregate(h, now) for h in histories)


def score_swarm(histories, now: float) -> dict[str, PeerScore]:
    """``scores.score_all`` of the histories' aggregates."""
    return scores.score_all((scores.aggregate(h, now) for h in histories), now)


# ---- alerts: one watched model whose stored assessment a spec sets ----------------------------

ALERT_PERIOD = 60.0  # the scrape period of ``alert_settings``
ALERT_MODEL = ModelInfo("llama", 4, name="Llama 2", official=True)
ALERT_PEER = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"  # its one server, public name "a"


def alert_diagnosis(state: str) -> Assessment:
    """``ALERT_MODEL``'s assessment in ``state`` (its one server alone on blocks 0:4)."""
    reasons = () if state == "healthy" else ("blocks 0:4 have one server",)
    return Assessment(model="llama", state=state, reasons=reasons,
                      coverage_pct=100.0, servers_online=1, min_redundancy=1, blocks=(), missing_ranges=(),
                      single_served_ranges=(), bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=2.0,
                      route=(), recommendation=Recommendation(0, 4, 4, "--block_indices 0:4", "redundancy"))


def record_state(store: Store, at: float, state: str) -> None:
    """A poll at ``at`` of ``ALERT_MODEL``, stored with its assessment in ``state``."""
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(ALERT_MODEL,), servers=(
        ServerRow(peer_id=ALERT_PEER, model="llama", start=0, end=4, state="ONLINE", public_name="a"),)),
        [alert_diagnosis(state)])


def alert_settings(tmp_path, *urls, **alerts) -> Settings:
    """Settings with a webhook per URL (2 s timeout, retried after 10 s) and ``alerts`` overriding the rest."""
    hooks = [{"name": f"hook-{i}", "url": url, "timeout": 2} for i, url in enumerate(urls, 1)]
    return Settings(data_dir=tmp_path, scrape_period=ALERT_PERIOD, initial_peers=[],
                    alerts={"webhooks": hooks, "retry_backoff": 10, **alerts})


def unix_seconds(iso: str) -> float:
    """An ISO 8601 time (``Z`` for UTC, as Alertmanager writes it) in unix seconds."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def maintenance_window(scope="peer", target="my-box", start=0.0, end=None, rec=None, wid=1) -> MaintenanceWindow:
    """A maintenance window as an operator makes it (reason "upgrade", by "alice")."""
    return MaintenanceWindow(id=wid, scope=scope, target=target, starts_at=start, ends_at=end, reason="upgrade",
                             recurrence=rec, created_by="alice")


def fire_degraded(store: Store, settings: Settings, now: float) -> Alerter:
    """A degraded model, seen long enough: the alerter's first evaluation after it fires."""
    alerter = Alerter(settings, store, watching_since=now - 1000)
    record_state(store, now - 200, "degraded")
    alerter.evaluate(now - 200)
    record_state(store, now, "degraded")
    assert [n.event for n in alerter.evaluate(now).notices] == [FIRED]
    return alerter


# ---- the pollers' lease -------------------------------------------------------------------------


def lease_of(who, *, epoch=1, deadline=110.0, released=False):
    """The lease ``who`` (a ``PollerId``) holds, as the store keeps it."""
    from monitor.core.leadership import Lease

    return Lease(holder=who.holder, host=who.host, pid=who.pid, started_at=who.started_at, epoch=epoch, since=50.0,
                 deadline=deadline, renewed_at=deadline - 10, released=released)


def expire_lease(store: Store) -> None:
    """Move the pollers' lease deadline into the past (as the clock would, a lease length later)."""
    with store.engine.begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE poller_leases SET deadline = deadline - 3600"))


# ---- a store's rows, made by hand (test_store.py, test_sqlite_store.py) ------------------------

STORE_LLAMA = ModelInfo("llama-70b-hf", 8, repository="meta-llama/Llama-2-70b-hf", name="Llama 2 70B", official=True)


def store_peer(name: str) -> str:
    """A peer id of the usual length (52 characters: ``12D3KooW`` and the name, padded)."""
    return f"12D3KooW{name:_<44}"[:52]


def store_row(name: str, model: ModelInfo = STORE_LLAMA, start: int = 0, end: int = None, state: str = ONLINE,
              **extra) -> ServerRow:
    return ServerRow(peer_id=store_peer(name), model=model.dht_prefix, start=start,
                     end=model.num_blocks if end is None else end, state=state, **extra)


def store_snapshot(at: float, rows, models=(STORE_LLAMA,), **extra) -> Snapshot:
    return Snapshot(taken_at=at, duration=1.5, models=tuple(models), servers=tuple(rows), **extra)


def store_health(model: ModelInfo, state: str, blocks=None, **extra) -> Assessment:
    """A diagnosis as ``coverage.diagnose`` returns it; ``blocks``: (serving servers, their throughput)
    per block, by default one server of throughput 1 on every block."""
    blocks = blocks if blocks is not None else [(1, 1.0)] * model.num_blocks
    fields = dict(
        model=model.dht_prefix, state=state, reasons=(f"{state} because",), coverage_pct=100.0, servers_online=2,
        min_redundancy=1, est_tokens_per_s=5.0, missing_ranges=(), single_served_ranges=(), bottleneck_ranges=(),
        low_cache_ranges=(), route=(RouteHop(store_peer("a"), 0, model.num_blocks),),
        blocks=tuple(BlockCoverage(index=i, peers=(store_peer("a"),) * n, online=n, total_throughput=t,
                                   min_throughput=t / n if n else None, cache_tokens_left=None)
                     for i, (n, t) in enumerate(blocks)),
        recommendation=Recommendation(0, model.num_blocks, model.num_blocks, f"--block_indices 0:{model.num_blocks}",
                                      "more redundancy"),
    )
    return Assessment(**{**fields, **extra})


# ---- a status page's 90 days ------------------------------------------------------------------

STATUS_POLL_EVERY = 3 * 3600.0
# days ago -> the state of each of its polls (every 3 h, from 00:10 UTC); a missing day: no poll
STATUS_PLAN = {
    9: ["healthy"] * 8,
    8: ["healthy"] * 4 + ["degraded"] + ["healthy"] * 3,
    7: ["healthy"] * 2 + ["broken"] + ["healthy"] * 5,
    6: ["broken"] * 4 + ["healthy"] * 4,  # the broken half inside a maintenance window
    4: ["healthy"] * 8,
    3: ["healthy"] * 8,
    2: ["healthy"] * 8,
    1: ["healthy"] * 8,  # raw polls from here on (raw retention: 2 days)
    0: ["degraded"] * 8,
}
# days ago -> the state its bar shows (the maintenance window: conftest's ``status_app``)
STATUS_EXPECTED = {9: "healthy", 8: "degraded", 7: "broken", 6: "maintenance", 5: "no data", 4: "healthy",
                   1: "healthy", 0: "degraded", 20: "no data"}


def status_health(state: str) -> Assessment:
    base = Assessment.not_diagnosed(TINY.dht_prefix, TINY.num_blocks, "unused")
    return dataclasses.replace(base, state=state, reasons=() if state == "healthy" else (f"the model is {state}",),
                               coverage_pct=100.0 if state != "broken" else 50.0, servers_online=2)


def day_start(now: float, days_ago: int) -> float:
    """The start (00:00 UTC) of the day ``days_ago`` days before ``now``'s."""
    return math.floor(now / 86400) * 86400 - days_ago * 86400


def write_status_history(store: Store, now: float) -> None:
    """``STATUS_PLAN`` through the poller's write path, then the hourly rollup and retention."""
    last = STATUS_PLAN[0][0]  # today's state, even in the first minutes after midnight (no poll of today yet)
    for days_ago in sorted(STATUS_PLAN, reverse=True):
        for k, state in enumerate(STATUS_PLAN[days_ago]):
            at = day_start(now, days_ago) + k * STATUS_POLL_EVERY + 600
            if at > now - 120:
                break
            store.record_poll(Snapshot(taken_at=at, duration=0.5, models=(TINY,), servers=()), [status_health(state)])
            if days_ago == 0:
                last = state
    # today's last poll, a minute ago (today always has one, whatever the hour now)
    store.record_poll(Snapshot(taken_at=now - 60, duration=0.5, models=(TINY,), servers=()), [status_health(last)])
    store.rollup_and_prune(now, raw_retention_days=2, rollup_retention_days=90)


# ---- a populated store (the web's specs) -------------------------------------------------------


MALICIOUS_NAME = "<img src=x onerror=alert(1)>"
TINY = ModelInfo("tiny-llama", 8, repository="https://huggingface.co/test/tiny-llama", name="Tiny Llama", official=True)
OTHER = ModelInfo("other-model", 4, repository="javascript:alert(2)")


def peer(name: str) -> str:
    """A real-format libp2p peer id (sha256 multihash, base58: ``Qm...``)."""
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(name.encode()).digest()).decode()


def seeded_peer_id(rng) -> str:
    """A well-formed peer id (sha2-256 multihash) drawn from ``rng`` (a ``random.Random``)."""
    return base58.b58encode(b"\x12\x20" + rng.randbytes(32)).decode()


def random_peer_id() -> str:
    """A well-formed peer id (sha2-256 multihash) that no process owns."""
    return base58.b58encode(b"\x12\x20" + os.urandom(32)).decode()


def petals_announcement(state=None, throughput=10.0, **extra) -> tuple:
    """What a petals server stores under each of its block uids (ONLINE unless ``state`` says otherwise)."""
    from monitor import compat  # noqa: F401  (before petals)
    from petals.data_structures import ServerInfo, ServerState

    return ServerInfo(state=ServerState.ONLINE if state is None else state, throughput=throughput, **extra).to_tuple()


PEERS = {name: peer(name) for name in ("first", "second", "full", "joining", "unreachable", "other", "bootstrap")}
BOOTSTRAP_ADDR = f"/ip4/127.0.0.1/tcp/31337/p2p/{PEERS['bootstrap']}"


def web_settings(**overrides) -> Settings:
    values = dict(initial_peers=[BOOTSTRAP_ADDR], models=[{"dht_prefix": TINY.dht_prefix, "num_blocks": 8}],
                  scrape_period=60, refresh_seconds=7)
    values.update(overrides)
    return Settings(**values)


def poll_rows(stage: int, infinite_ping: bool = True) -> list[ServerRow]:
    """The servers of ``populate``'s poll number ``stage`` (0: first half only; 1: the model
    covered twice; 2: plus a joining one, an unreachable one and another model's)."""
    p = PEERS
    first = ServerRow(p["first"], TINY.dht_prefix, 0, 4, ONLINE, throughput=50.0, inference_rps=40.0, forward_rps=400.0,
                      network_rps=100.0, cache_tokens_left=16384, version="2.2.0", torch_dtype="bfloat16",
                      quant_type="none", using_relay=False, public_name="first-half",
                      next_pings={p["second"]: 0.02, p["full"]: 0.01})
    found = [first]
    if stage >= 1:
        found += [
            ServerRow(p["second"], TINY.dht_prefix, 4, 8, ONLINE, throughput=50.0, inference_rps=30.0,
                      forward_rps=300.0, network_rps=90.0, cache_tokens_left=16384, version="2.2.0",
                      torch_dtype="float16", quant_type="nf4", using_relay=True, public_name="second-half"),
            ServerRow(p["full"], TINY.dht_prefix, 0, 8, ONLINE, throughput=100.0, inference_rps=60.0,
                      forward_rps=600.0, network_rps=120.0, cache_tokens_left=65536, version="2.3.0.dev0",
                      torch_dtype="bfloat16", using_relay=False, public_name="https://example.org/full",
                      adapters=("artek0chumak/guanaco-7b",),
                      next_pings={p["first"]: 0.015, **({p["unreachable"]: float("inf")} if stage >= 2 and infinite_ping else {})}),
        ]
    if stage >= 2:
        found += [
            ServerRow(p["joining"], TINY.dht_prefix, 2, 6, JOINING, throughput=10.0, version="2.2.0",
                      public_name=MALICIOUS_NAME),
            ServerRow(p["unreachable"], TINY.dht_prefix, 0, 8, ONLINE, throughput=80.0, version="2.2.0",
                      public_name="javascript:alert(1)"),
            ServerRow(p["other"], OTHER.dht_prefix, 0, 2, ONLINE, throughput=20.0, version="2.2.0"),
        ]
    return found


def populate(store, settings, now: float, *, infinite_ping: bool = True) -> dict:
    """Three polls (broken at now-2h, healthy at now-1h and now-60s), reachability checks, chat
    outcomes, scores, written as the poller writes them (``Poller.analyse`` /
    ``Poller.refresh_scores``, which run ``coverage.diagnose`` and ``scores.score_all``).

    ``infinite_ping``: one server reports an infinite RTT to the unreachable one, as petals servers do."""
    poller = Poller(settings, store, dht=None)  # analysis and scoring only: no DHT needed
    times = [now - 7200, now - 3600, now - 60]
    for stage, at in enumerate(times):
        checks = ReachabilityBatch(taken_at=at - 5, duration=0.2, results=tuple(
            [ReachabilityResult(PEERS["first"], "server", True, rtt=0.004)]
            + ([ReachabilityResult(PEERS["second"], "server", True, rtt=0.006),
                ReachabilityResult(PEERS["full"], "server", True, rtt=0.003)] if stage >= 1 else [])
            + ([ReachabilityResult(PEERS["joining"], "server", False, error="protocol not supported", joining=True),
                ReachabilityResult(PEERS["unreachable"], "server", False, error="Failed to connect in 5 sec"),
                ReachabilityResult(PEERS["other"], "server", True, rtt=0.002)] if stage >= 2 else [])
            + [ReachabilityResult(PEERS["bootstrap"], "bootstrap", True, rtt=0.001, address=BOOTSTRAP_ADDR)]
        ))
        store.record_reachability(checks)
        snapshot = Snapshot(taken_at=at, duration=1.25 + stage, models=(TINY, OTHER) if stage >= 2 else (TINY,),
                            servers=tuple(poll_rows(stage, infinite_ping)), invalid_records=stage)
        store.record_poll(snapshot, poller.assess(snapshot, store.latest_reachability()))
    store.record_chat_outcome(ChatOutcome(now - 120, PEERS["full"], TINY.dht_prefix, 0, 8, True, seconds_per_token=0.4))
    store.record_chat_outcome(ChatOutcome(now - 110, PEERS["first"], TINY.dht_prefix, 0, 4, False,
                                          error="timeout after 30 s"))
    scored = poller.refresh_scores(now)
    assert scored, "the poller's scoring should have scored the populated peers"
    return {"times": times, "scores": scored}


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text of <script> elements."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._in_script: dict | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_data(self, data):
        if self._in_script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = None


def no_internals(text: str, *paths) -> None:
    """What a user is told names no traceback, file, exception or any of ``paths``."""
    assert "Traceback" not in text and 'File "' not in text and "Error:" not in text and "OSError" not in text
    for path in paths:
        assert str(path) not in text


def strict_json(text: str):
    """JSON as browsers and strict parsers read it: NaN and Infinity are not JSON."""
    def reject(constant):
        raise AssertionError(f"{constant} in a JSON document")
    return json.loads(text, parse_constant=reject)


def metric_families(client) -> dict:
    """name -> the metric family, of what the app's /metrics answers."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.get_data(as_text=True))}


def metric_sample(families, name, **labels) -> float:
    [value] = [s.value for s in families[name].samples if s.name == name and s.labels == labels]
    return value


def words(html: str) -> str:
    """A page's text, its entities unescaped."""
    return text_of(unescape(html))


def report_of(client, peer_id: str) -> str:
    """The "Is this server OK?" section of the peer's page, as text."""
    response = client.get(f"/peers/{peer_id}")
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    text = words(response.get_data(as_text=True))
    return text[text.index("Is this server OK?"):text.index("What it announces now")]


def elements(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def figures(html: str) -> list[dict]:
    """The chart figures a page ships to charts.js (each ``.chart``'s ``data-figure``), in page order."""
    return [json.loads(attrs["data-figure"]) for _, attrs in elements(html).tags if "data-figure" in attrs]


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# ---- owners' proofs (tests/test_ownership.py, tests/test_owners.py) ----------------------------------


def identity_file(tmp_path, name="id.key"):
    """A real hivemind identity file (as a petals server's ``--identity_path``) and its peer id."""
    from cryptography.hazmat.primitives import serialization

    from monitor import compat  # noqa: F401
    from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID
    from hivemind.proto import crypto_pb2
    from hivemind.utils.crypto import RSAPrivateKey

    key = RSAPrivateKey()
    data = crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=key._private_key.private_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PrivateFormat.TraditionalOpenSSL,
        encryption_algorithm=serialization.NoEncryption())).SerializeToString()
    path = tmp_path / name
    path.write_bytes(data)
    return path, PeerID.from_identity(data).to_base58()


def owner_signature(path, claim) -> tuple[str, str]:
    """What an owner's tool sends: its public key and its signature over the statement it built."""
    from cryptography.hazmat.primitives import hashes, serialization
    from hivemind.proto import crypto_pb2

    from monitor.core import ownership

    private = serialization.load_der_private_key(crypto_pb2.PrivateKey.FromString(path.read_bytes()).data, None)
    der = private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    signature = private.sign(ownership.statement(claim), ownership._PSS, hashes.SHA256())
    return base64.b64encode(der).decode(), base64.b64encode(signature).decode()


# ---- a real SMTP server (aiosmtpd) for e-mail specs ------------------------------------------------


class Inbox:
    """An aiosmtpd handler: takes messages, or refuses them while ``refusing``."""

    def __init__(self):
        self.messages: list = []
        self.refusing = False

    async def handle_DATA(self, server, session, envelope):
        if self.refusing:
            return "554 5.7.1 message refused by policy"
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content, policy=email_default_policy)))
        return "250 OK"


class Smtp:
    """An SMTP server on 127.0.0.1 (aiosmtpd) that can be stopped and started again on its port."""

    def __init__(self):
        self.inbox, self.port, self.controller = Inbox(), free_port(), None

    def start(self) -> None:
        from aiosmtpd.controller import Controller

        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
