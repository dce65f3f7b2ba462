"""Specs of the command line's shape (``monitor/app/cli.py``): the commands and their help, ``--config``
once on the group (and still after a command), the ``chaos`` group calling the dashboard the
settings name, and ``migrate`` in its own process (one line; no petals or torch imported by what a
web-only host runs). (``report`` and ``poll --once`` on a real swarm: ``test_cli_swarm.py``; the
migrations and a web worker before them: ``test_migrate.py``.)

The chaos commands call a small HTTP server of the spec's own on 127.0.0.1, which records what it
was asked and checks the bearer token; the rest runs through click's CliRunner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from monitor.app.chaos_cli import ACTIONS
from monitor.app.cli import COMMANDS, main
from monitor.settings import Settings
from monitor.web.auth import resolve_token
from monitor.store import Store, head_revision
from support import free_port

ROOT = Path(__file__).resolve().parent.parent
SERVER_ACTIONS = ("stop", "start", "throttle", "unthrottle", "corrupt", "uncorrupt", "fail", "unfail")


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch):
    """Only what a spec passes counts (a developer's SWARM_MONITOR_* would change what it reads)."""
    for name in list(os.environ):
        if name.startswith("SWARM_MONITOR_"):
            monkeypatch.delenv(name)


def run(*args: str, **env: str):
    return CliRunner().invoke(main, list(args), prog_name="swarm-monitor", env=env or None)


def commands_section(help_text: str) -> dict[str, str]:
    """The help's "Commands:" rows: name -> summary."""
    rows = help_text.split("\nCommands:\n", 1)[1].splitlines()
    return dict(re.match(r"\s+(\S+)\s+(.*)", row).groups() for row in rows if row.strip())


# ---- the commands and their help ---------------------------------------------------------------


def test_the_help_lists_every_command_first_ones_first_each_with_a_one_line_summary():
    done = run("--help")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("Usage: swarm-monitor [OPTIONS] COMMAND [ARGS]...")
    listed = commands_section(done.output)
    assert list(listed) == ["demo", "serve", "poll", "report", "job", "migrate", "chaos"] == list(COMMANDS)
    for name, summary in listed.items():
        assert summary.endswith(".") and not summary.endswith("..."), f"{name}: {summary!r} is cut"
    assert "--config FILE" in done.output  # once, on the group


def every_command():
    """(args, command) of every command, the chaos group's too."""
    for name in COMMANDS:
        command = main.commands[name]
        yield (name,), command
        for sub_name, sub in getattr(command, "commands", {}).items():
            yield (name, sub_name), sub


@pytest.mark.parametrize("args", [args for args, _ in every_command()], ids=" ".join)
def test_every_command_s_help_says_what_it_does_and_what_each_option_is(args):
    command = dict(every_command())[args]
    done = run(*args, "--help")
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"Usage: swarm-monitor {' '.join(args)} [OPTIONS]")
    assert (command.help or "").strip(), f"{args}: no help"
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        assert getattr(param, "help", None) or param.param_type_name == "argument", f"{args}: {param.name} has no help"
        assert param.param_type_name == "argument" or param.opts[-1] in done.output
    assert not re.search(r"^\s+--config\b", done.output, re.M)  # the group's (still read after a command: below)


def test_chaos_is_a_group_of_one_command_per_action_the_server_ones_taking_a_server():
    chaos = main.commands["chaos"]
    listed = commands_section(run("chaos", "--help").output)
    assert list(listed) == [*SERVER_ACTIONS, "hostile"] == list(ACTIONS)
    for name, summary in listed.items():
        assert summary.endswith(".") and not summary.endswith("..."), f"chaos {name}: {summary!r} is cut"
    for action in SERVER_ACTIONS:
        done = run("chaos", action, "--help")
        assert f"Usage: swarm-monitor chaos {action} [OPTIONS] SERVER" in done.output
        assert "server-2" in done.output  # what SERVER is
        missing = run("chaos", action)
        assert missing.exit_code == 2 and "Missing argument 'SERVER'" in missing.output
    assert "Usage: swarm-monitor chaos hostile [OPTIONS]\n" in run("chaos", "hostile", "--help").output
    extra = run("chaos", "hostile", "server-2")
    assert extra.exit_code == 2 and "unexpected extra argument (server-2)" in extra.output
    unknown = run("chaos", "explode", "server-2")
    assert unknown.exit_code == 2 and "No such command 'explode'" in unknown.output
    assert set(chaos.commands) == set(ACTIONS)


def test_report_is_a_command_and_poll_once_its_old_spelling():
    report = run("report", "--help").output
    poll = run("poll", "--help").output
    assert "Poll the swarm once and print a report per model." in report
    assert "`poll --once` is its old spelling" in report
    assert "--once" in poll and "old spelling of `swarm-monitor report`" in poll
    for args in (("report",), ("poll", "--once")):  # the same check first, the same words
        done = run(*args)
        assert done.exit_code == 1
        assert done.output.strip().splitlines()[-1] == ("Error: no initial peers: pass --initial-peers (or 'public'), "
                                                        "or set SWARM_MONITOR_INITIAL_PEERS")


# ---- --config, once on the group ---------------------------------------------------------------


def test_config_is_read_before_the_command_and_still_after_it(tmp_path):
    config = tmp_path / "monitor.toml"
    config.write_text("scrape_period = 17\nrollup_period = 1234\n")
    for args in (("--config", str(config), "job", "--list"), ("job", "--list", "--config", str(config)),
                 ("--config", str(config), "job", "--list", "--config", str(config))):  # (the same file twice: fine)
        done = run(*args)
        assert done.exit_code == 0, done.output
        assert re.search(r"^scrape\s+every 17 s\s", done.output, re.M), done.output
        assert re.search(r"^rollup\s+every 1234 s\s", done.output, re.M), done.output
    defaults = run("job", "--list")
    assert re.search(r"^scrape\s+every 60 s\s", defaults.output, re.M), defaults.output
    from_env = run("job", "--list", SWARM_MONITOR_CONFIG=str(config))
    assert re.search(r"^scrape\s+every 17 s\s", from_env.output, re.M), from_env.output


def test_a_command_does_what_the_groups_config_says(tmp_path):
    """``--config`` on the group reaches the command: ``migrate`` creates the database it names."""
    database = tmp_path / "elsewhere.db"
    config = tmp_path / "monitor.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\ndatabase_url = "sqlite:///{database}"\n')
    done = run("--config", str(config), "migrate")
    assert done.exit_code == 0, done.output
    assert f"Created the schema of sqlite:///{database}: revision" in done.output
    assert database.exists()
    again = run("migrate", "--config", str(config))  # after the command, as every command took it once
    assert f"The schema of sqlite:///{database} is up to date" in again.output, again.output


def test_two_different_config_files_are_refused_with_one_clear_line(tmp_path):
    (tmp_path / "a.toml").write_text("scrape_period = 17\n")
    (tmp_path / "b.toml").write_text("scrape_period = 18\n")
    done = run("--config", str(tmp_path / "a.toml"), "job", "--list", "--config", str(tmp_path / "b.toml"))
    assert done.exit_code == 2
    assert (f"Error: --config names two files ({tmp_path / 'a.toml'} and {tmp_path / 'b.toml'}): pass one, "
            "before the command (swarm-monitor --config FILE COMMAND)") in done.output
    missing = run("--config", str(tmp_path / "none.toml"), "job", "--list")
    assert missing.exit_code == 1 and f"config file {tmp_path / 'none.toml'} does not exist" in missing.output


# ---- chaos: the dashboard the settings name ----------------------------------------------------


class Dashboard:
    """A stand-in for the demo's dashboard on 127.0.0.1: records each request (method, path, bearer
    token) and answers 200 if the token is the operator's, 403 if not, 404 for an unknown server."""

    def __init__(self, token: str):
        self.token, self.requests = token, []
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                dashboard.requests.append(("POST", self.path, bearer))
                if bearer != dashboard.token:
                    status, body = 403, {"error": "operators only"}
                elif self.path.startswith("/demo/servers/server-9/"):
                    status, body = 404, {"error": "no demo server named 'server-9'"}
                else:
                    status, body = 200, {"ok": True}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def demo_data(tmp_path) -> Path:
    """A data directory with the operator token in it, as the running service leaves it."""
    data = tmp_path / "data"
    resolve_token(Settings(data_dir=data))
    return data


@pytest.fixture
def dashboard(demo_data):
    served = Dashboard(resolve_token(Settings(data_dir=demo_data), create=False))
    yield served
    served.close()


def write_config(config: Path, data: Path, port: int, host: str = "127.0.0.1") -> Path:
    config.write_text(f'data_dir = "{data}"\nhost = "{host}"\nport = {port}\n')
    return config


def test_chaos_calls_the_dashboard_at_the_settings_host_and_port_with_the_operator_token(tmp_path, demo_data, dashboard):
    config = write_config(tmp_path / "monitor.toml", demo_data, dashboard.port)
    for action in SERVER_ACTIONS:
        done = run("--config", str(config), "chaos", action, "server-2")
        assert done.exit_code == 0, done.output
        assert done.output == f"{action} server-2: done\n"
    hostile = run("--config", str(config), "chaos", "hostile")
    assert hostile.exit_code == 0 and hostile.output == "hostile swarm: done\n", hostile.output
    assert dashboard.requests == [("POST", f"/demo/servers/server-2/{action}", dashboard.token)
                                  for action in SERVER_ACTIONS] + [("POST", "/demo/hostile", dashboard.token)]


def test_chaos_listening_everywhere_calls_this_machine(tmp_path, demo_data, dashboard):
    config = write_config(tmp_path / "monitor.toml", demo_data, dashboard.port, host="0.0.0.0")
    done = run("--config", str(config), "chaos", "fail", "server-2")
    assert done.exit_code == 0, done.output
    assert dashboard.requests == [("POST", "/demo/servers/server-2/fail", dashboard.token)]


def test_the_old_spellings_of_chaos_still_work(tmp_path, demo_data, dashboard):
    """``chaos ACTION SERVER`` with its options anywhere, as the one command took them."""
    config = write_config(tmp_path / "monitor.toml", demo_data, dashboard.port)
    elsewhere = write_config(tmp_path / "elsewhere.toml", demo_data, free_port())  # nothing listens there
    spellings = [
        ("chaos", "stop", "server-2", "--config", str(config)),
        ("chaos", "--config", str(config), "start", "server-2"),
        ("chaos", "--url", dashboard.url, "throttle", "server-2", "--config", str(elsewhere)),
        ("chaos", "unthrottle", "server-2", "--url", dashboard.url, "--config", str(elsewhere)),
        ("chaos", "--token", dashboard.token, "corrupt", "server-2", "--url", dashboard.url),
    ]
    for args in spellings:
        done = run(*args)
        assert done.exit_code == 0, (args, done.output)
        assert done.output.endswith(f"{args[args.index('server-2') - 1]} server-2: done\n"), (args, done.output)
    assert [path for _, path, _ in dashboard.requests] == [
        f"/demo/servers/server-2/{action}" for action in ("stop", "start", "throttle", "unthrottle", "corrupt")]
    assert {token for _, _, token in dashboard.requests} == {dashboard.token}


def test_chaos_url_and_token_override_the_configuration(tmp_path, demo_data, dashboard):
    nowhere = write_config(tmp_path / "monitor.toml", demo_data, free_port())  # nothing listens there
    done = run("--config", str(nowhere), "chaos", "fail", "server-2", "--url", dashboard.url + "/")
    assert done.exit_code == 0, done.output
    wrong = run("--config", str(nowhere), "chaos", "unfail", "server-2", "--url", dashboard.url,
                "--token", "not-the-operators-token")
    assert wrong.exit_code == 1 and "Error: unfail server-2: HTTP 403: " in wrong.output, wrong.output
    from_env = run("--config", str(nowhere), "chaos", "unfail", "server-2", "--url", dashboard.url,
                   SWARM_MONITOR_ADMIN_TOKEN="also-not-the-operators-token")
    assert from_env.exit_code == 1 and "HTTP 403" in from_env.output, from_env.output
    assert dashboard.requests == [("POST", "/demo/servers/server-2/fail", dashboard.token),
                                  ("POST", "/demo/servers/server-2/unfail", "not-the-operators-token"),
                                  ("POST", "/demo/servers/server-2/unfail", "also-not-the-operators-token")]
    down = run("--config", str(nowhere), "chaos", "fail", "server-2")
    assert down.exit_code == 1
    assert "Error: cannot reach the demo at http://127.0.0.1:" in down.output and "Is `make demo` running?" in down.output


def test_chaos_says_in_one_line_what_is_wrong(tmp_path, demo_data, dashboard):
    config = write_config(tmp_path / "monitor.toml", demo_data, dashboard.port)
    unknown = run("--config", str(config), "chaos", "stop", "server-9")
    assert unknown.exit_code == 1
    assert unknown.output.strip() == "Error: stop server-9: HTTP 404: {\"error\": \"no demo server named 'server-9'\"}"
    no_token = run("--config", str(write_config(tmp_path / "empty.toml", tmp_path / "empty", dashboard.port)),
                   "chaos", "stop", "server-2")
    assert no_token.exit_code == 1
    assert f"Error: no operator token: {tmp_path / 'empty' / 'admin_token'} does not exist" in no_token.output
    picked = run("--config", str(write_config(tmp_path / "picked.toml", demo_data, 0)), "chaos", "stop", "server-2")
    assert picked.exit_code == 2 and "the settings' port is 0" in picked.output and "pass --url" in picked.output
    assert dashboard.requests == [("POST", "/demo/servers/server-9/stop", dashboard.token)]


def test_chaos_imports_neither_petals_nor_torch(tmp_path, demo_data, dashboard):
    """It answers in a fraction of a second, on any host (a process of its own: this one has petals)."""
    config = write_config(tmp_path / "monitor.toml", demo_data, dashboard.port)
    code = ("import sys\n"
            "from monitor.app.cli import main\n"
            "try:\n"
            f"    main(['--config', {str(config)!r}, 'chaos', 'fail', 'server-2'], prog_name='swarm-monitor')\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(sorted(m for m in ('petals', 'torch', 'hivemind', 'transformers') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_MONITOR_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["fail server-2: done", "[]"], done.stdout
    assert dashboard.requests == [("POST", "/demo/servers/server-2/fail", dashboard.token)]




# ---- migrate -----------------------------------------------------------------------------------


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
    assert "usage error: Invalid value for --webhook: 'ftp://x/y': url: not a URL Apprise can send to" in done.stdout
    assert f"revision {head_revision()}." in done.stdout
    assert lines[-1] == "[]", done.stdout
