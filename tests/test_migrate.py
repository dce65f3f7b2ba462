"""`swarm-monitor migrate`, and what a web worker says before it ran.

The production order (README: Production serving) is migrate first, then the poller, web workers
and chat in any order. A web worker never migrates: on a database with no schema yet, or one at an
older revision, every page and API answers 503 naming the revision it is at, the one this version
needs (Alembic's head, so a new revision changes nothing here) and the command to run; a database
that is really down still answers "unavailable". On SQLite and PostgreSQL alike. (``migrate`` in
its own process, printing one line and importing neither petals nor torch: ``test_cli.py``.)
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from monitor.app.cli import main
from monitor.settings import Settings
from monitor.store import Store, head_revision
from monitor.store.engine import MIGRATIONS_DIR
from monitor.web import create_app

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



def rows_of(url: str, *tables: str) -> dict[str, list[dict]]:
    """table -> its rows (by id, peer, hour: what it has of them), as its reflected columns read them."""
    import sqlalchemy as sa

    store = Store(url)
    try:
        with store.engine.connect() as conn:
            found = {}
            for name in tables:
                table = sa.Table(name, sa.MetaData(), autoload_with=conn)
                order = [table.c[c] for c in ("id", "peer", "hour") if c in table.c]
                found[name] = [dict(r) for r in conn.execute(sa.select(table).order_by(*order)).mappings()]
            return found
    finally:
        store.close()


def test_reachability_tables_keep_every_row_under_their_new_names(db_url):
    """Revision 0022: ``probe_results``, ``latest_probes`` and ``hourly_probes`` (reachability
    checks, not probes) become ``reachability_results``, ``latest_reachability`` and
    ``hourly_reachability`` with every row and their indexes, the schema then exactly the models'
    (on PostgreSQL new ids go on from the renamed sequence); a stored score's components
    ``probe_success``/``probe_rtt`` are ``reachability_success``/``reachability_rtt``. Downgrade
    gives the old names back, rows and all."""
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult
    from monitor.store import metadata

    old_tables = ("probe_results", "latest_probes", "hourly_probes")
    new_tables = ("reachability_results", "latest_reachability", "hourly_reachability")
    checks = [{"at": 100.0 + i, "peer": 1, "kind": "server", "ok": i % 3 != 0, "rtt": 0.01 * i,
               "error": None if i % 3 else "timeout", "joining": False, "address": None} for i in range(1, 8)]
    latest = [{"peer": 1, "at": 107.0, "kind": "server", "ok": True, "rtt": 0.07, "error": None, "joining": False,
               "address": None},
              {"peer": 2, "at": 90.0, "kind": "bootstrap", "ok": False, "rtt": None, "error": "refused",
               "joining": False, "address": "/ip4/127.0.0.1/tcp/1"}]
    hourly = [{"peer": 1, "hour": 0.0, "n": 7, "ok": 5, "joining": 0, "mean_rtt": 0.04, "rtt_bins": [3, 5, 0.2],
               "last_error": "timeout"}]
    components = {"uptime": {"value": 1.0, "weight": 30, "points": 30.0},
                  "probe_success": {"value": 0.9, "weight": 15, "points": 13.5},
                  "probe_rtt": {"value": 0.8, "weight": 10, "points": 8.0}}
    assert migrate_cli(db_url).exit_code == 0
    downgrade(db_url, "0021")
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO peers (id, peer_id) VALUES (1, 'peer-a'), (2, 'peer-boot')"))
            for name, rows in zip(old_tables, (checks, latest, hourly)):
                conn.execute(sa.Table(name, sa.MetaData(), autoload_with=conn).insert(), rows)
            conn.execute(sa.Table("peer_scores", sa.MetaData(), autoload_with=conn).insert(),
                         [{"peer": 1, "at": 107.0, "score": 71.5, "explanation": ["a"], "components": components}])
    finally:
        store.close()
    before = rows_of(db_url, *old_tables)
    assert [{k: v for k, v in row.items() if k != "id"} for row in before["probe_results"]] == checks

    upgraded = migrate_cli(db_url)
    assert upgraded.exit_code == 0 and upgraded.output.strip().endswith(f"from revision 0021 to {head_revision()}.")
    assert list(rows_of(db_url, *new_tables).values()) == list(before.values())
    store = Store(db_url)
    try:
        inspector = sa.inspect(store.engine)
        assert not set(old_tables) & set(inspector.get_table_names())
        assert {i["name"] for t in new_tables for i in inspector.get_indexes(t)} == {
            "ix_reachability_results_at", "ix_reachability_results_peer_at", "ix_hourly_reachability_hour"}
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata) == []
            if conn.dialect.name == "postgresql":  # (SQLite keeps constraints' names in the table's text only)
                assert conn.execute(sa.text("SELECT pg_get_serial_sequence('reachability_results', 'id')")
                                    ).scalar() == "public.reachability_results_id_seq"
                assert [(inspector.get_pk_constraint(t)["name"], inspector.get_foreign_keys(t)[0]["name"])
                        for t in new_tables] == [(f"pk_{t}", f"fk_{t}_peer_peers") for t in new_tables]
        score = store.latest_scores()["peer-a"]
        assert list(score.components) == ["uptime", "reachability_success", "reachability_rtt"]
        assert score.components["reachability_success"] == (0.9, 15.0, 13.5)
        assert store.latest_reachability()["peer-boot"].error == "refused"
        store.record_reachability(ReachabilityBatch(200.0, 1.0, (ReachabilityResult("peer-a", "server", True, rtt=0.02),)))
        assert [r.rtt for _, r in store.peer_history("peer-a", 0, 300).reachability][-2:] == [0.07, 0.02]
    finally:
        store.close()
    assert rows_of(db_url, "reachability_results")["reachability_results"][-1]["id"] == 8  # (after the kept ids)

    downgrade(db_url, "0021")
    kept = rows_of(db_url, *old_tables, "peer_scores")
    assert kept["probe_results"][:7] == before["probe_results"] and len(kept["probe_results"]) == 8
    assert kept["latest_probes"][1:] == latest[1:] and kept["hourly_probes"] == hourly
    assert kept["peer_scores"][0]["components"] == components


def test_the_ledger_s_days_are_filled_from_its_hours_and_read_as_the_hours_were(db_url):
    """Revision 0028: a ledger kept by hour (revision 0026) gets its days, summed from the hours
    kept, so that a week's and a month's leaderboards (read from the days since) say what they
    said; the all-time rows stay; a downgrade gives the hours back as they were."""
    import sqlalchemy as sa

    from monitor.core.common import DAY, HOUR
    from monitor.core.contributions import window_start

    now = 40 * DAY + 5 * HOUR
    hours = [{"peer_id": peer, "model": "m", "hour": now - k * 7 * HOUR, "announced": 8 * 3600.0 * (k + 1),
              "serving": 8 * 3000.0, "verified": 8 * 1000.0 * (k % 2), "watched": 3600.0, "serving_seconds": 3000.0,
              "speed_seconds": 3000.0, "speed_sum": 30.0, "block_tokens": 100 + k, "requests": k}
             for peer in ("peer-a", "peer-b") for k in range(60)]  # 17 days of hours, 7 h apart
    total = {"peer_id": "peer-a", "model": "m", "first_hour": 0.0, "last_hour": DAY, "announced": 5.0, "serving": 4.0,
             "verified": 3.0, "watched": 2.0, "serving_seconds": 1.0, "speed_seconds": 1.0, "speed_sum": 0.01,
             "block_tokens": 7, "requests": 1}
    assert migrate_cli(db_url).exit_code == 0
    downgrade(db_url, "0027")
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(sa.Table("contribution_hours", sa.MetaData(), autoload_with=conn).insert(), hours)
            conn.execute(sa.Table("contribution_totals", sa.MetaData(), autoload_with=conn).insert(), [total])
        before = {w: {c.peer_id: c for c in store.contributions(window_start(w, now)[0] if w != "all" else 0.0)}
                  for w in ("week", "month", "all")}  # (as revision 0027 read them: from the hours; all: and totals)
    finally:
        store.close()
    assert migrate_cli(db_url).exit_code == 0
    store = Store(db_url)
    try:
        for w, found in before.items():  # the same sums, read from the days
            since, days = window_start(w, now)
            after = {c.peer_id: c for c in store.contributions(since, days=days)}
            if w == "all":  # and the all-time rows, as before
                assert after["peer-a"].announced_block_hours == pytest.approx(
                    found["peer-a"].announced_block_hours + 5.0 / HOUR)
                after, found = {"peer-b": after["peer-b"]}, {"peer-b": found["peer-b"]}
            assert days and {p: c.to_dict() for p, c in after.items()} == {p: c.to_dict() for p, c in found.items()}, w
        assert before["week"] != before["month"]  # (17 days of hours: a week holds less)
    finally:
        store.close()
    assert len(rows_of(db_url, "contribution_days")["contribution_days"]) == 2 * len({h["hour"] // DAY for h in hours[:60]})
    downgrade(db_url, "0027")
    assert len(rows_of(db_url, "contribution_hours")["contribution_hours"]) == len(hours)
