"""``swarm-monitor chaos ACTION [SERVER]``: the demo panel's controls from the command line.

Each action is a command of the ``chaos`` group. It asks the running demo's dashboard (the settings'
host and port, or ``--url``) as an operator, with the token the service keeps in its data directory
(or ``--token``). Imports neither petals nor torch: it answers in a fraction of a second."""

from __future__ import annotations

from typing import Optional

import click
from click.core import ParameterSource

from monitor.app.cli_common import Listed, config_option, settings as load_settings

# action -> its help: first sentence the one-line summary in `swarm-monitor chaos --help`
ACTIONS = {
    "stop": "Stop a server's process.\n\nThe dashboard shows it within seconds (a stop is polled at once); "
            "`chaos start` starts it again.",
    "start": "Start a stopped server again.\n\nIt comes back under the same peer id; the dashboard shows it "
             "within seconds.",
    "throttle": "Make a server slow but alive.\n\nIts compute is paused for 80 % of every quarter second, while "
                "its connections still answer pings, until `chaos unthrottle`.",
    "unthrottle": "Let a throttled server run at full speed again.",
    "corrupt": "Make a server answer with wrong outputs.\n\nIt keeps answering, fast, with wrong outputs, "
               "until `chaos uncorrupt`.",
    "uncorrupt": "Make a corrupted server answer correctly again.",
    "fail": "Make every inference step through a server fail.\n\nThe server stays ONLINE and reachable, and "
            "every inference and forward step through it raises its own error (\"CUDA error: out of "
            "memory\", as a server out of GPU memory does), until `chaos unfail`.",
    "unfail": "Let a failing server's steps succeed again.",
    "hostile": "Make a made-up peer announce hostile records.\n\nFor 10 minutes, on every block: numbers at "
               "the edge of what the DHT carries, NaN and negative RTTs, control characters and malformed "
               "records. Takes no server.",
}
SERVER_HELP = "SERVER is a demo server's name (server-1, server-2, ...), as the dashboard's panel lists them."
URL_HELP = ("The running demo's dashboard (default: http://HOST:PORT of the settings' host and port, "
            "http://127.0.0.1:5000 unless configured).")
TOKEN_HELP = "The operator token (default: the running service's, from the settings' data directory)."
_BEFORE = "swarm_monitor.chaos"  # ctx.meta: --url/--token given before the action (chaos --url URL stop server-2)


@click.group(cls=Listed, order=tuple(ACTIONS))
@config_option
@click.option("--url", default=None, hidden=True, help=URL_HELP)  # (also read before the action, as once)
@click.option("--token", default=None, hidden=True, help=TOKEN_HELP)
@click.pass_context
def chaos(ctx: click.Context, url: Optional[str], token: Optional[str]) -> None:
    """Break or mend a server of a running demo, as its panel does.

    \b
      swarm-monitor chaos fail server-2     its inference steps fail
      swarm-monitor chaos unfail server-2   ... and succeed again
      swarm-monitor chaos hostile           hostile records in the DHT

    Each command asks the running demo's dashboard, at the settings' host and port
    (http://127.0.0.1:5000 unless configured: swarm-monitor --config FILE chaos ...) or at --url (a
    demo started with --port), as an operator: with the token the service keeps in its data
    directory, or --token.
    """
    ctx.meta[_BEFORE] = {"url": url, "token": token}


def _command(action: str, doc: str) -> click.Command:
    def run(url: Optional[str], token: Optional[str], server: Optional[str] = None) -> None:
        act(action, server, url, token)

    run = click.option("--token", envvar="SWARM_MONITOR_ADMIN_TOKEN", default=None, help=TOKEN_HELP)(run)
    run = click.option("--url", metavar="URL", default=None, help=URL_HELP)(run)
    run = config_option(run)
    if action != "hostile":
        run = click.argument("server")(run)
        doc = f"{doc}\n\n{SERVER_HELP}"
    return click.command(action, help=doc)(run)


for _action, _doc in ACTIONS.items():
    chaos.add_command(_command(_action, _doc))


def dashboard_url(settings) -> str:
    """Where the configured service listens, as a client on this machine reaches it."""
    if settings.port == 0:
        raise click.UsageError("the settings' port is 0 (the service picked a free one at start): pass --url, "
                               "the Dashboard: URL the service printed")
    host = settings.host
    if host in ("", "0.0.0.0", "::"):  # listening everywhere: here too
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def act(action: str, server: Optional[str], url: Optional[str], token: Optional[str]) -> None:
    """POST the action to the running demo; one line says it was done, or why not."""
    import urllib.error
    import urllib.request

    from monitor.web.auth import TokenError, resolve_token, token_path

    ctx = click.get_current_context()
    before = ctx.meta.get(_BEFORE, {})
    url = url or before.get("url")
    if before.get("token") and ctx.get_parameter_source("token") is not ParameterSource.COMMANDLINE:
        token = before["token"]
    settings = load_settings()
    url = url or dashboard_url(settings)
    try:
        token = token or resolve_token(settings, create=False)
    except TokenError as e:
        raise click.ClickException(str(e)) from None
    if not token:
        raise click.ClickException(f"no operator token: {token_path(settings)} does not exist (is the demo running "
                                   f"as this user, with this data directory?); pass --token")
    path = "/demo/hostile" if action == "hostile" else f"/demo/servers/{server}/{action}"
    server = server or "swarm"
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60):
            click.echo(f"{action} {server}: done")
    except urllib.error.HTTPError as e:
        raise click.ClickException(f"{action} {server}: HTTP {e.code}: {e.read().decode()[:300]}") from None
    except urllib.error.URLError as e:
        raise click.ClickException(f"cannot reach the demo at {url}: {e.reason}. Is `make demo` running?") from None
