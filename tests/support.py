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
- a populated store: ``populate`` (three polls, probes, chat outcomes and scores written through
  the poller's own path), ``web_settings``, ``PEERS``, ``TINY``, ``peer``, and the HTML helpers
  ``elements`` and ``text_of``;
- stores: ``STORE_KINDS`` (the params of a fixture run on SQLite and PostgreSQL), ``store_url_of``
  (a param's URL), ``open_migrated_store``, ``migrated_store`` (a store fixture's body),
  ``sqlite_store``, ``fold_wal`` (a SQLite store whole in its file, to copy);
- a monitor of a real swarm: ``tiny_settings`` (watching its tiny model), ``polled_prober`` (a
  poller that has scraped once and its server prober);
- scores from whole histories, the specification the score job's SQL meets: ``peer_histories``
  (every peer's ``PeerHistory`` from a store), ``score_peer``, ``swarm_reference``, ``score_swarm``.
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
import functools
import hashlib
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
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import base58
import psutil
import pytest
from simple_websocket import ConnectionClosed
from werkzeug.serving import make_server

from monitor.app.jobs import Poller
from monitor.app.probing import ServerProber
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
    event, data = "message", []
    for line in response.iter_lines(decode_unicode=True):
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:][1:] if line[5:].startswith(" ") else line[5:])


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
    reader = threading.Thread(target=lambda: output.extend(process.stdout), name="output-reader", daemon=True)
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


# ---- a populated store (the web's specs) -------------------------------------------------------


MALICIOUS_NAME = "<img src=x onerror=alert(1)>"
TINY = ModelInfo("tiny-llama", 8, repository="https://huggingface.co/test/tiny-llama", name="Tiny Llama", official=True)
OTHER = ModelInfo("other-model", 4, repository="javascript:alert(2)")


def peer(name: str) -> str:
    """A real-format libp2p peer id (sha256 multihash, base58: ``Qm...``)."""
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(name.encode()).digest()).decode()


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
    """Three polls (broken at now-2h, healthy at now-1h and now-60s), probes, chat outcomes, scores,
    written as the poller writes them (``Poller.analyse`` / ``Poller.refresh_scores``, which run
    ``coverage.diagnose`` and ``scores.score_all``).

    ``infinite_ping``: one server reports an infinite RTT to the unreachable one, as petals servers do."""
    poller = Poller(settings, store, dht=None)  # analysis and scoring only: no DHT needed
    times = [now - 7200, now - 3600, now - 60]
    for stage, at in enumerate(times):
        probes = ReachabilityBatch(taken_at=at - 5, duration=0.2, results=tuple(
            [ReachabilityResult(PEERS["first"], "server", True, rtt=0.004)]
            + ([ReachabilityResult(PEERS["second"], "server", True, rtt=0.006),
                ReachabilityResult(PEERS["full"], "server", True, rtt=0.003)] if stage >= 1 else [])
            + ([ReachabilityResult(PEERS["joining"], "server", False, error="protocol not supported", joining=True),
                ReachabilityResult(PEERS["unreachable"], "server", False, error="Failed to connect in 5 sec"),
                ReachabilityResult(PEERS["other"], "server", True, rtt=0.002)] if stage >= 2 else [])
            + [ReachabilityResult(PEERS["bootstrap"], "bootstrap", True, rtt=0.001, address=BOOTSTRAP_ADDR)]
        ))
        store.record_reachability(probes)
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


def elements(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
