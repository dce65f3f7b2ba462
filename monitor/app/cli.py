"""Command line: ``swarm-monitor [--config FILE] demo | serve | poll | report | job | migrate | chaos``.

``--config`` is the group's, given once before the command (``monitor/app/cli_common.py``; after a
command it still works, as when every command took it). ``chaos`` is a group of its own
(``monitor/app/chaos_cli.py``); ``poll --once`` is the old spelling of ``report``."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Optional

import click

from monitor import logs
from monitor.app.chaos_cli import chaos
from monitor.app.cli_common import Listed, config_option, group_config_option
from monitor.app.cli_common import settings as _settings
from monitor.core import leadership as lease_rules
from monitor.harness.tiny_model import DEFAULT_FAMILY, FAMILIES
from monitor.settings import ModelConfig, Settings

# the order of `swarm-monitor --help`: the first ones to try first
COMMANDS = ("demo", "serve", "poll", "report", "job", "migrate", "chaos")


def _sigterm_as_interrupt() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _wait_for_interrupt() -> None:
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass


def _model_option(values: tuple[str, ...]) -> Optional[list[ModelConfig]]:
    """--model PREFIX[:NUM_BLOCKS[:PATH]]"""
    if not values:
        return None
    models = []
    for value in values:
        prefix, _, rest = value.partition(":")
        blocks, _, path = rest.partition(":")
        try:
            models.append(ModelConfig(dht_prefix=prefix, num_blocks=int(blocks) if blocks else None,
                                      path=Path(path) if path else None))
        except ValueError as e:
            raise click.BadParameter(f"{value!r}: expected PREFIX[:NUM_BLOCKS[:PATH]] ({e})",
                                     param_hint="--model") from None
    return models


def _swarm_options(command):
    """--initial-peers and --model: the swarm to watch (else the settings')."""
    command = click.option("--model", "models", multiple=True, metavar="MODEL",
                           help="Model to watch, PREFIX[:NUM_BLOCKS[:PATH]] (repeatable; adds to the models "
                                "the DHT announces).")(command)
    return click.option("--initial-peers", multiple=True, metavar="MULTIADDR",
                        help="Bootstrap multiaddr (repeatable), or 'public' (petals' public swarm).")(command)


@click.group(cls=Listed, order=COMMANDS)
@group_config_option
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Swarm monitor for Petals: coverage, history, diagnosis, peer scores, and chat.

    Settings come from a TOML file (--config FILE, before the command, or SWARM_MONITOR_CONFIG),
    then from SWARM_MONITOR_<SETTING> variables, then from the command's options. Start with
    `swarm-monitor demo`; `swarm-monitor COMMAND --help` says more of each command.
    """
    logs.configure(logs.TEXT, level=logging.DEBUG if verbose else logging.INFO)  # (the settings' format once read)
    if not verbose:  # Alembic's plugin and per-revision lines: the start-up says in one line what it did
        logging.getLogger("alembic").setLevel(logging.WARNING)


@main.command()
@config_option
@click.option("--database-url", metavar="URL", default=None,
              help="The database (default: the database_url setting, else monitor.db in the data dir).")
def migrate(database_url) -> None:
    """Create or upgrade the database's schema, keeping all data.

    Says which revision it reached, and from which. Run it before the web workers of a new version
    start (they answer 503 on an older schema; `serve` and `poll` migrate at start too). It imports
    neither petals nor torch.
    """
    settings = _settings(database_url=database_url)
    from monitor.store import Store, StoreError

    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # one line below, not one per revision (-v: both)
        alembic_log.setLevel(logging.WARNING)
    store = Store.from_settings(settings)
    try:
        done = store.migrate()
    except StoreError as e:
        raise click.ClickException(str(e)) from None
    finally:
        store.close()
        alembic_log.setLevel(level)
    click.echo(_migration_line(store.db.display_url, done))


def _migration_line(where: str, done) -> str:
    if done.before == done.after:
        return f"The schema of {where} is up to date: revision {done.after}."
    if done.before is None:
        return f"Created the schema of {where}: revision {done.after}."
    return f"Upgraded the schema of {where} from revision {done.before} to {done.after}."


def _open_store(settings: Settings):
    """The settings' store, migrated, with one line saying so (a database that is down: one line too)."""
    from monitor.store import Store, StoreError

    store = Store.from_settings(settings)
    try:
        click.echo(_migration_line(store.db.display_url, store.migrate()))
    except StoreError as e:
        store.close()
        raise click.ClickException(str(e)) from None
    return store


@main.command()
@config_option
@click.option("--once", is_flag=True,
              help="Poll once, print a report per model and exit: the old spelling of `swarm-monitor report`.")
@_swarm_options
def poll(once, initial_peers, models) -> None:
    """Run the poller alone: scrape, probe, score, roll up.

    On schedule, until Ctrl-C. Run it as its own process when several web workers serve the dashboard, and as several (on
    several machines, one PostgreSQL database) for a standby that takes over (see README). It
    starts whether or not a bootstrap peer answers, and keeps trying. `poll --once` is the old
    spelling of `swarm-monitor report`.
    """
    settings = _swarm_settings(initial_peers, models)
    if once:
        _report(settings, spelling="poll --once")
        return
    from monitor.app.jobs import Poller
    from monitor.app.leadership import for_settings
    from monitor.swarm import DhtClient

    store = _open_store(settings)
    dht = DhtClient(settings.resolved_initial_peers)
    dht.start(retry=True)
    poller = Poller(settings, store, dht, leadership=for_settings(store, settings))
    try:
        _sigterm_as_interrupt()
        poller.start()
        click.echo(f"Polling every {settings.scrape_period:g} s into {store.db.display_url}; Ctrl-C stops.")
        click.echo(_role_line(poller))
        if dht.problem:
            click.echo(f"Swarm: {dht.problem}; polling starts by itself once a bootstrap peer answers.")
        _wait_for_interrupt()
    finally:
        poller.shutdown()
        dht.shutdown()
        store.close()


@main.command()
@config_option
@_swarm_options
def report(initial_peers, models) -> None:
    """Poll the swarm once and print a report per model.

    One round of the poller (scrape, reachability checks, diagnosis, peer scores, stored in the
    configured database like any poll), then, per model: its state and why, the best route's speed,
    where a new server helps most, and each server's span, state, speed and score. Fails at once,
    in one line, when no bootstrap peer answers, and refuses while another poller leads the database.
    `poll --once` is its old spelling.
    """
    _report(_swarm_settings(initial_peers, models), spelling="report")


def _swarm_settings(initial_peers, models) -> Settings:
    settings = _settings(initial_peers=list(initial_peers) or None, models=_model_option(models))
    if not settings.resolved_initial_peers:
        raise click.ClickException("no initial peers: pass --initial-peers (or 'public'), "
                                   "or set SWARM_MONITOR_INITIAL_PEERS")
    return settings


def _report(settings: Settings, *, spelling: str) -> None:
    """``report`` (``poll --once``): one poll, its report on stdout; a swarm that is down fails at once."""
    from monitor.app.jobs import Poller
    from monitor.app.leadership import for_settings
    from monitor.swarm import BootstrapUnreachable, DhtClient

    store = _open_store(settings)
    dht = DhtClient(settings.resolved_initial_peers)
    try:
        dht.start(retry=False)
    except BootstrapUnreachable as e:
        store.close()
        instead = "`swarm-monitor poll` without --once" if spelling == "poll --once" else "`swarm-monitor poll`"
        raise click.ClickException(f"{e}: is the swarm up, and are these its initial peers? "
                                   f"({instead} starts anyway and keeps trying)") from None
    poller = Poller(settings, store, dht, leadership=for_settings(store, settings))
    try:
        click.echo(_poll_once_report(poller, spelling))
    finally:
        poller.shutdown()
        dht.shutdown()
        store.close()


def _role_line(poller) -> str:
    """Whether this poller leads, or which one does (several may share a database)."""
    lease = poller.leadership.lease if poller.leadership is not None else None
    if poller.leads():
        if poller.store.db.dialect == "sqlite":
            return (f"Leading: this poller ({poller.leadership.me.label}) scrapes, probes, scores and alerts "
                    "(SQLite: one poller; for a standby on another machine, use PostgreSQL).")
        return (f"Leading: this poller ({poller.leadership.me.label}) scrapes, probes, scores and alerts; "
                f"a standby on the same database takes over within "
                f"{lease_rules.takeover_within(poller.leadership.lease_seconds):g} s if it stops.")
    who = f"poller {lease.label}" if lease is not None else "another poller"
    return f"Standing by: {who} leads; this one takes over if it stops (its DHT client kept warm)."


def _poll_once_report(poller, spelling: str) -> str:
    from monitor.core.report import poll_report

    poller.leadership.start()  # (renewed while it polls)
    if not poller.leads():
        lease = poller.leadership.lease
        who = f"poller {lease.label}" if lease is not None else "another poller"
        raise click.ClickException(f"{who} leads this database: `{spelling}` would poll beside it. "
                                   f"Its dashboard shows the latest poll; or point `{spelling}` at another database")
    poller.check_reachability_once()  # reachability checks first, so they count in the diagnosis
    snapshot = poller.poll_once()
    if snapshot is None:
        raise click.ClickException(f"the scrape failed: {poller.stats.last_error.get('scrape')}")
    poller.check_reachability_once()  # (re-diagnoses the poll with these reachability checks)
    poller.refresh_scores()
    return poll_report(snapshot, poller.store.latest_assessments(), poller.store.latest_scores())


@main.command()
@click.argument("name", metavar="[NAME]", required=False)
@click.option("--once", is_flag=True, help="Run the job once against the configured store, then exit.")
@click.option("--list", "list_jobs", is_flag=True, help="List the jobs: name, trigger, who runs it, what it does.")
@config_option
def job(name, once, list_jobs) -> None:
    """Run one of the poller's jobs once, or list them.

    `swarm-monitor job scrape --once` runs it against the configured store, as a cron line or an
    operator would — any job of the table, those run only when triggered too; `--list` (or no NAME)
    lists them all. A job only the leader runs refuses while another poller leads the database.
    """
    from monitor.app.job_table import BY_NAME, JOBS

    settings = _settings()
    if list_jobs or name is None:
        for entry in JOBS:
            click.echo(f"{entry.name:<17} {entry.when(settings):<28} "
                       f"{'leader' if entry.leader_only else 'any poller':<11} {entry.what}")
        return
    if name not in BY_NAME:
        raise click.BadParameter(f"no job named {name!r}; the jobs: {', '.join(BY_NAME)}", param_hint="NAME")
    if not once:
        raise click.UsageError("say --once: a job runs on its schedule inside `swarm-monitor poll` or `serve`")
    entry = BY_NAME[name]
    from monitor.app.jobs import Poller
    from monitor.app.leadership import for_settings

    store = _open_store(settings)
    dht = None
    try:
        if entry.needs_dht:
            if not settings.resolved_initial_peers:
                raise click.ClickException(f"job {name} reads the swarm: set initial peers (SWARM_MONITOR_INITIAL_PEERS)")
            from monitor.swarm import BootstrapUnreachable, DhtClient

            dht = DhtClient(settings.resolved_initial_peers)
            try:
                dht.start(retry=False)
            except BootstrapUnreachable as e:
                raise click.ClickException(f"job {name}: {e}") from None
        poller = Poller(settings, store, dht, leadership=for_settings(store, settings), jobs=JOBS)
        try:
            if entry.leader_only:
                poller.leadership.start()
                if not poller.leads():
                    lease = poller.leadership.lease
                    who = f"poller {lease.label}" if lease is not None else "another poller"
                    raise click.ClickException(f"{who} leads this database and runs job {name} itself; "
                                               "stop it first, or point --config at another database")
            started = time.monotonic()
            result = poller.run(name)
            failed = poller.stats.failures
            if failed:
                job_name, _ = next(iter(failed.items()))
                raise click.ClickException(f"job {name} failed: {poller.stats.last_error.get(job_name)}")
            click.echo(f"job {name}: done in {time.monotonic() - started:.1f} s{_job_result(result)}")
        finally:
            poller.shutdown()
    finally:
        if dht is not None:
            dht.shutdown()
        store.close()


def _job_result(result) -> str:
    """A few words on what a job returned (a count, or a poll), for `job NAME --once`."""
    if isinstance(result, tuple) and result and hasattr(result[0], "servers"):  # (scrape: the poll, stored)
        result = result[0]
    if result is None or result is True:
        return ""
    if result is False:
        return " (nothing to do)"
    if hasattr(result, "servers") and hasattr(result, "models"):
        return f": {len(result.models)} models, {len(result.servers)} server records"
    if hasattr(result, "results"):
        return f": {len(result.results)} peers checked"
    try:
        return f": {len(result)} items"
    except TypeError:
        return ""


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default: the host setting, 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default: the port setting, 5000; 0 picks a free one).")
@_swarm_options
@click.option("--no-poller", is_flag=True, help="Serve only; a separate `swarm-monitor poll` fills the store.")
def serve(host, port, initial_peers, models, no_poller) -> None:
    """Serve the dashboard, API and chat, and run the poller.

    All in one process, on the development server (see README for production's layout: web
    workers, a chat worker and pollers). It starts whether or not a bootstrap peer answers, and
    prints the dashboard's URL and the operator's login URL.
    """
    settings = _settings(host=host, port=port, initial_peers=list(initial_peers) or None,
                         models=_model_option(models))
    if not settings.resolved_initial_peers:
        raise click.ClickException("no initial peers: pass --initial-peers (or 'public'), or run `swarm-monitor demo`")
    _run_service(settings, run_poller=not no_poller)


def _with_webhooks(settings: Settings, urls: tuple[str, ...]) -> Settings:
    """``--webhook URL`` (repeatable): alert notices go to these webhooks too (README: Alerts)."""
    if not urls:
        return settings
    try:
        alerts = settings.alerts.with_webhook_urls(list(urls))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--webhook") from None
    return settings.model_copy(update={"alerts": alerts})


def _run_service(settings: Settings, *, run_poller: bool = True, demo_controls=None, before_close=None,
                 chat_workers: int = 1) -> None:
    from monitor.app.service import Service
    from monitor.web.auth import login_url

    _sigterm_as_interrupt()
    workers = None
    if chat_workers > 1:  # the chat in its own processes, nginx in front of them and of this dashboard
        front_port = settings.port
        settings = settings.model_copy(update={"proxy_hops": 1})
    service = Service(settings, run_poller=run_poller, demo_controls=demo_controls, enable_chat=chat_workers <= 1)
    try:
        try:
            service.start()
        except ValueError as e:  # a setting this machine cannot honour (e.g. chat_device cuda without CUDA)
            from chat.client_side import ClientSideError

            if not isinstance(e, ClientSideError):
                raise
            raise click.ClickException(str(e)) from None
        click.echo(_migration_line(service.store.db.display_url, service.migration))
        if service.dht is None:
            click.echo(f"Swarm:     {service.dht_client.problem}; the dashboard says so, and polling starts "
                       "by itself once a bootstrap peer answers.")
        if service.poller is not None:
            click.echo(_role_line(service.poller))
        port = service.serve_in_thread(port=0 if chat_workers > 1 else None)
        if chat_workers > 1:
            from monitor.harness.chat_workers import ChatWorkers, ChatWorkersError, worker_env
            from monitor.harness.ports import free_port

            front = front_port or free_port()
            click.echo(f"Starting {chat_workers} chat workers (gunicorn, sharing a private Redis) behind nginx ...")
            try:
                workers = ChatWorkers(settings.data_dir / "chat-workers", chat_workers,
                                      worker_env(settings, [m for m in settings.models if m.path]),
                                      port=front, dashboard_port=port).start()
            except ChatWorkersError as e:
                raise click.ClickException(str(e)) from None
            port = front
        base = f"http://{settings.host}:{port}"
        click.echo(f"Dashboard: {base}/")
        if service.engine is not None or workers is not None:
            click.echo(f"Chat:      {base}/chat   (OpenAI API: {base}/v1, chat.petals.dev API: {base}/api/v2/generate)"
                       + (f"\n           {chat_workers} chat workers: " + ", ".join(
                           f"{tag} on 127.0.0.1:{p}" for tag, p in workers.workers.items()) if workers else ""))
        click.echo(f"API:       {base}/api/v1/state   Metrics: {base}/metrics")
        hooks = len(settings.alerts.webhooks) if settings.alerts.enabled else 0
        click.echo(f"Alerts:    {base}/alerts   ({hooks} webhook{'s' if hooks != 1 else ''} notified)")
        click.echo(f"Operator login (pin/block peers{', chaos controls' if demo_controls else ''}): "
                   f"{login_url(base, service.app.extensions['operator_token'])}")
        click.echo("Press Ctrl-C to stop.")
        _wait_for_interrupt()
    finally:
        click.echo("Stopping ...")
        if workers is not None:
            workers.close()
        service.close()


@main.command()
@config_option
@click.option("--servers", default=3, show_default=True, help="How many petals servers to start.")
@click.option("--tiny", is_flag=True, help="Serve a tiny random model instead of SmolLM2-135M (fast, answers gibberish).")
@click.option("--family", type=click.Choice(FAMILIES), default=DEFAULT_FAMILY, show_default=True,
              help="With --tiny: the tiny model's family.")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="Serve this local checkpoint (a folder with config.json, safetensors weights and a tokenizer) "
                   "instead of the demo's model; its family, DHT prefix and block count are read from it.")
@click.option("--port", type=int, default=None, help="Dashboard port (default: the port setting, 5000; 0 picks a free one).")
@click.option("--bootstrap-port", type=int, default=0, show_default=True, help="Port of the demo's bootstrap peer (0: any).")
@click.option("--initial-peers", multiple=True, metavar="MULTIADDR",
              help="Watch a real swarm instead of starting one: bootstrap multiaddr (repeatable) or 'public'.")
@click.option("--model", "models", multiple=True, metavar="MODEL",
              help="With --initial-peers: model to watch, PREFIX[:NUM_BLOCKS[:PATH]].")
@click.option("--webhook", "webhooks", multiple=True, metavar="URL",
              help="Send alert notices to this webhook too (repeatable; Slack and Discord URLs get their format).")
@click.option("--chat-workers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Serve the chat from this many gunicorn workers sharing a private Redis, behind nginx (which "
                   "must be installed), as the README's production section lays them out.")
def demo(servers, tiny, family, checkpoint, port, bootstrap_port, initial_peers, models, webhooks,
         chat_workers) -> None:
    """Run a private swarm on 127.0.0.1, with the dashboard and chat.

    A bootstrap peer and petals servers serving SmolLM2-135M-Instruct (or --tiny, or your
    --checkpoint), three by default so that any one can die with the model still served, and the
    monitor in this process: the dashboard's panel (or `swarm-monitor chaos`) stops, slows,
    corrupts or fails them. With --initial-peers it watches that swarm instead, as `serve` does.
    """
    if family != DEFAULT_FAMILY and not tiny:
        raise click.UsageError(f"--family {family} needs --tiny (the full demo model, SmolLM2-135M, is a Llama)")
    if checkpoint is not None and tiny:
        raise click.UsageError("--checkpoint serves your checkpoint; --tiny a tiny random one: pass one of them")
    settings = _settings(port=port, models=_model_option(models),
                         initial_peers=list(initial_peers) or None)
    settings = _with_webhooks(settings, webhooks)
    if settings.initial_peers:
        click.echo("Watching the given swarm (no local swarm started).")
        _run_service(settings, chat_workers=chat_workers)
        return

    from monitor.demo_settings import demo_overrides, describe_overrides
    from monitor.harness.demo_swarm import DemoControls, demo_expect, demo_layout, prepare_checkpoint, prepare_model
    from monitor.families.checkpoint import CheckpointError
    from monitor.harness.local_swarm import LocalSwarm, SwarmError

    if checkpoint is not None:
        if servers < 1:
            raise click.BadParameter(f"at least one server is needed, got {servers}", param_hint="--servers")
        try:
            model_path, prefix, num_blocks, name = prepare_checkpoint(checkpoint, servers)
        except CheckpointError as e:
            raise click.ClickException(str(e)) from None
        except ValueError as e:  # (the layout: more servers than blocks)
            raise click.BadParameter(str(e), param_hint="--servers") from None
        click.echo(f"Serving {model_path} as {prefix} ({num_blocks} blocks).")
    else:
        if not tiny:
            click.echo(f"Preparing SmolLM2-135M-Instruct in {settings.data_dir} (first run only) ...")
        model_path, prefix, num_blocks, name = prepare_model(settings.data_dir, tiny=tiny, family=family)
    try:
        specs = demo_layout(num_blocks, servers)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--servers") from None
    overrides = demo_overrides(settings)  # printed before anything starts (after the inputs are checked)
    for line in describe_overrides(overrides):
        click.echo(line)
    _sigterm_as_interrupt()
    workdir = settings.data_dir / "demo-swarm" / prefix  # stable peer ids: history carries over runs
    with LocalSwarm(model_path, prefix, workdir=workdir, bootstrap_port=bootstrap_port, update_period=10) as swarm:
        try:
            click.echo(f"Starting a bootstrap peer and {len(specs)} petals servers on 127.0.0.1: "
                       + ", ".join(f"{s.name} {s.block_indices}" for s in specs))
            swarm.start(specs)
        except SwarmError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("Interrupted; stopping the swarm.")
            return
        for row in swarm.describe():
            click.echo(f"  {row['name']:<10} blocks {row['blocks']:<7} peer {row['peer_id']}  pid {row['pid']}")
        click.echo(f"Initial peers: {' '.join(swarm.initial_peers)}")
        settings = settings.model_copy(update={
            "initial_peers": swarm.initial_peers,
            "models": [ModelConfig(dht_prefix=prefix, num_blocks=num_blocks, path=model_path, name=name,
                                   expect=None if checkpoint is not None
                                   else demo_expect(tiny, settings.generation_check_prompt))],
            # the demo's servers are ours: measured often (monitor/demo_settings.py), printed above
            **{row.name: row.demos for row in overrides},
        })
        _run_service(settings, demo_controls=DemoControls(swarm), chat_workers=chat_workers)
    click.echo("Stopped.")


main.add_command(chaos)

if __name__ == "__main__":
    main(prog_name="swarm-monitor")
