"""`swarm-monitor migrate`, and what a web worker says before it ran.

The production order (README: Production serving) is migrate first, then the poller, web workers
and chat in any order. A web worker never migrates: on a database with no schema yet, or one at an
older revision, every page and API answers 503 naming the revision it is at, the one this version
needs (Alembic's head, so a new revision changes nothing here) and the command to run; a database
that is really down still answers "unavailable". On SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from monitor.app.cli import main
from monitor.settings import Settings
from monitor.store import Store, head_revision
from monitor.store.engine import MIGRATIONS_DIR
from monitor.web import create_app

ROOT = Path(__file__).resolve().parent.parent
RUN = "run `swarm-monitor migrate`"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """An empty database: a SQLite file not created yet, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'monitor.db'}"
    return request.getfixturevalue("postgres_url")


def migrate_cli(url: str):
    """``swarm-monitor migrate --database-url URL``, in this process."""
    return CliRunner().invoke(main, ["migrate", "--database-url", url], catch_exceptions=False)


def previous_revision() -> str:
    """The revision before the head (what an older version of the monitor migrated to)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_revision(head_revision()).down_revision


def downgrade(url: str, revision: str) -> None:
    """``alembic downgrade revision`` on the database, as an operator would roll back."""
    from alembic import command
    from alembic.config import Config

    store = Store(url)
    try:
        with store.engine.begin() as conn:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.attributes["connection"] = conn
            command.downgrade(config, revision)
        assert store.current_revision() == revision
    finally:
        store.close()


def web(url: str, tmp_path):
    """A web worker's app over the database, as ``monitor.web.wsgi`` makes it (no migration)."""
    store = Store(url)
    return create_app(Settings(data_dir=tmp_path / "web"), store), store


def json_error(client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 503, (path, response.status_code)
    return response.get_json()["error"]


# ---- the command -----------------------------------------------------------------------------


def test_migrate_on_an_empty_sqlite_file_prints_one_line_with_the_head_revision(tmp_path):
    """The command in its own process, as an operator runs it: one line, no Alembic log per revision."""
    path = tmp_path / "new" / "monitor.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_MONITOR_")}
    done = subprocess.run([sys.executable, "-m", "monitor.app.cli", "migrate", "--database-url", f"sqlite:///{path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"Created the schema of sqlite:///{path}: revision {head_revision()}."]
    assert "Running upgrade" not in done.stderr and "alembic" not in done.stderr, done.stderr
    store = Store(f"sqlite:///{path}")
    assert store.current_revision() == head_revision()
    store.close()


def test_help_a_usage_error_and_migrate_import_neither_petals_nor_torch(tmp_path):
    """What an operator runs on a web-only host, or before a deploy, answers in a fraction of a
    second: the commands that need a DHT import petals (and torch) themselves."""
    code = ("import sys, click\n"
            "from monitor.app.cli import main\n"
            "for args in (['--help'], ['demo', '--tiny', '--webhook', 'ftp://x/y'],\n"
            f"             ['migrate', '--database-url', 'sqlite:///{tmp_path / 'monitor.db'}']):\n"
            "    try:\n"
            "        main(args, standalone_mode=False)\n"
            "    except click.UsageError as e:\n"
            "        print('usage error:', e.format_message())\n"
            "print(sorted(m for m in ('petals', 'torch', 'hivemind', 'transformers') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_MONITOR_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("Usage: ") for line in lines)
    assert "usage error: Invalid value for --webhook: 'ftp://x/y': must be an http:// or https:// URL" in done.stdout
    assert f"revision {head_revision()}." in done.stdout
    assert lines[-1] == "[]", done.stdout


def test_migrate_twice_says_up_to_date_and_from_an_older_revision_says_from_which(db_url):
    first = migrate_cli(db_url)
    assert first.exit_code == 0 and "Created the schema of " in first.output
    assert first.output.strip().endswith(f"revision {head_revision()}.")
    again = migrate_cli(db_url)
    assert again.exit_code == 0 and again.output.strip().endswith(f"is up to date: revision {head_revision()}.")

    older = previous_revision()
    downgrade(db_url, older)
    upgraded = migrate_cli(db_url)
    assert upgraded.exit_code == 0
    assert upgraded.output.strip().endswith(f"from revision {older} to {head_revision()}."), upgraded.output


# ---- a web worker before `migrate` ---------------------------------------------------------------


def test_a_web_worker_on_an_empty_database_says_to_run_migrate_until_it_ran(db_url, tmp_path):
    app, store = web(db_url, tmp_path)
    client = app.test_client()
    try:
        wanted = f"the monitor's database has no schema yet (revision none, this version needs {head_revision()}): {RUN}"
        page = client.get("/")
        assert page.status_code == 503
        html = page.get_data(as_text=True)
        assert "Database not set up" in html and "revision none" in html and "swarm-monitor migrate" in html
        for path in ("/api/v1/state", "/metrics", "/healthz"):
            assert json_error(client, path) == wanted, path
        assert client.get("/static/app.css").status_code == 200  # the error page keeps its stylesheet
        for answer in (html, json_error(client, "/api/v1/state")):  # internals stay in the log
            assert str(tmp_path) not in answer and "sqlite:" not in answer and "postgresql" not in answer

        assert migrate_cli(db_url).exit_code == 0  # the same worker, no restart
        assert "no poll has completed yet" in json_error(client, "/api/v1/state")
        assert client.get("/").status_code == 200
    finally:
        store.close()


def test_a_web_worker_on_an_older_schema_names_its_revision(db_url, tmp_path):
    setup = Store(db_url)
    setup.migrate()
    setup.close()
    older = previous_revision()
    downgrade(db_url, older)
    app, store = web(db_url, tmp_path)
    client = app.test_client()
    try:
        wanted = f"the monitor's database is at revision {older}, this version needs {head_revision()}: {RUN}"
        assert json_error(client, "/api/v1/state") == wanted
        page = client.get("/")
        assert page.status_code == 503
        html = page.get_data(as_text=True)
        assert "Database schema out of date" in html and f"is at revision {older}" in html and "swarm-monitor migrate" in html
    finally:
        store.close()


def test_a_database_that_is_down_is_still_unavailable_not_unmigrated(db_url, tmp_path, request):
    """A worker that never read the schema, on a database it cannot reach: the old answer."""
    if db_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'gone' / 'monitor.db'}"
        app, store = web(url, tmp_path)
        (tmp_path / "gone").rmdir()  # (the engine made the directory: SQLite cannot open the file now)
        stop = start = lambda: None
    else:
        cluster = request.getfixturevalue("postgres")
        app, store = web(db_url, tmp_path)
        stop, start = cluster.stop, cluster.start
    stop()
    try:
        client = app.test_client()
        error = json_error(client, "/api/v1/state")
        assert "unavailable" in error and "migrate" not in error and "revision" not in error
        page = client.get("/")
        assert page.status_code == 503 and "Database unavailable" in page.get_data(as_text=True)
    finally:
        start()
        store.close()


# ---- data the migrations convert -------------------------------------------------------------------


def test_assessments_stored_before_causes_get_the_cause_their_reasons_begin_with(db_url):
    """Revision 0021: a diagnosis stored before causes were (kept as an assessment by 0015) gets each
    excluded server's cause from its reason, once, so readers never parse reasons; a row with its
    causes keeps them as they are, and every row stays."""
    import sqlalchemy as sa

    from monitor.core.assessment import Assessment

    assert migrate_cli(db_url).exit_code == 0
    downgrade(db_url, "0020")
    reasons = {"a": "ONLINE but failing: CUDA out of memory", "b": "ONLINE but unreachable",
               "c": "ONLINE but returning wrong outputs (3 probes)", "d": "JOINING", "e": "OFFLINE",
               "f": 'ONLINE but failing: it said "excluded_causes": {}'}  # (the key's words in a value)
    old = {**Assessment.not_diagnosed("old", 4, "x").to_dict(), "excluded_peers": reasons}
    del old["excluded_causes"]
    newer = {**Assessment.not_diagnosed("newer", 4, "x").to_dict(), "excluded_peers": {"a": "ONLINE but unreachable"},
             "excluded_causes": {"a": "failing"}}
    table = sa.table("assessments", sa.column("poll_id", sa.BigInteger()), sa.column("model", sa.String()),
                     sa.column("at", sa.Float()), sa.column("assessment", sa.JSON(none_as_null=True)))
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(table.insert(), [{"poll_id": 1, "model": "old", "at": 0.0, "assessment": old},
                                          {"poll_id": 2, "model": "newer", "at": 60.0, "assessment": newer},
                                          {"poll_id": 2, "model": "none", "at": 60.0, "assessment": None}])
    finally:
        store.close()

    assert migrate_cli(db_url).exit_code == 0
    store = Store(db_url)
    try:
        with store.engine.connect() as conn:
            rows = {model: data for model, data in conn.execute(sa.select(table.c.model, table.c.assessment))}
    finally:
        store.close()
    assert set(rows) == {"old", "newer", "none"} and rows["none"] is None
    assert Assessment.from_dict(rows["old"]).excluded_causes == {
        "a": "failing", "b": "unreachable", "c": "wrong outputs", "d": "JOINING", "e": "OFFLINE", "f": "failing"}
    assert rows["old"]["excluded_peers"] == reasons and rows["newer"] == newer
