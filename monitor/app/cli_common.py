"""What every ``swarm-monitor`` command shares: ``--config`` (the group's, and its old place after a
command) and the settings it names, and a group that lists its commands in a chosen order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import click

from monitor import logs
from monitor.settings import Settings, SettingsError, load_settings

CONFIG_HELP = "TOML settings file, for every command (also SWARM_MONITOR_CONFIG)."
_CONFIG_FILES = "swarm_monitor.config_files"  # ctx.meta (shared by a command's context and its group's)


def _remember_config(ctx: click.Context, param: click.Parameter, value: Optional[Path]) -> Optional[Path]:
    if value is not None:
        given = ctx.meta.setdefault(_CONFIG_FILES, [])
        if all(path.resolve() != value.resolve() for path in given):
            given.append(value)
    return value


def _config_option(*, hidden: bool):
    return click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, metavar="FILE",
                        expose_value=False, callback=_remember_config, hidden=hidden, help=CONFIG_HELP)


group_config_option = _config_option(hidden=False)  # swarm-monitor --config FILE COMMAND
# its old place, after the command (swarm-monitor serve --config FILE): still read, no longer shown
config_option = _config_option(hidden=True)


def config_file() -> Optional[Path]:
    """The file ``--config`` named, before or after the command (None: SWARM_MONITOR_CONFIG, if set)."""
    given = click.get_current_context().meta.get(_CONFIG_FILES, [])
    if len(given) > 1:
        raise click.UsageError(f"--config names two files ({given[0]} and {given[1]}): "
                               "pass one, before the command (swarm-monitor --config FILE COMMAND)")
    return given[0] if given else None


def settings(**overrides) -> Settings:
    """The settings: the ``--config`` file's, then SWARM_MONITOR_* variables, then ``overrides``
    (a command's options; None: not given)."""
    with logs.held():  # (what reading them logs comes out in the format they set)
        try:
            loaded = load_settings(config_file(), **overrides)
        except SettingsError as e:
            raise click.ClickException(str(e)) from None
        logs.configure(loaded.log_format, level=logging.getLogger().level or logging.INFO)
    return loaded


class Listed(click.Group):
    """A group whose help lists its commands in ``order`` (others after them, alphabetically), not
    alphabetically: the first ones to try first."""

    def __init__(self, *args, order: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.order = order

    def list_commands(self, ctx: click.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(self.order)}
        return sorted(self.commands, key=lambda name: (rank.get(name, len(rank)), name))
