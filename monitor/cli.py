"""Command line: ``swarm-monitor demo | poll --once | serve``."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from monitor import compat  # noqa: F401  (must precede petals)


@click.group()
def main() -> None:
    """Swarm monitor for Petals."""


def _demo_specs(num_blocks: int, servers: int):
    """Spread `servers` spans over the blocks so that every block has at least two servers
    (when there are two or more), i.e. any one server may die and the model stays served."""
    from monitor.local_swarm import ServerSpec

    if servers < 1:
        raise click.BadParameter("at least one server is needed", param_hint="--servers")
    if servers == 1:
        return [ServerSpec("server-1", 0, num_blocks)]
    span = min(num_blocks, -(-2 * num_blocks // servers))  # ceil(2N/S): double coverage
    specs = []
    for i in range(servers):
        start = (i * num_blocks) // servers
        end = min(start + span, num_blocks)
        start = max(0, end - span)
        specs.append(ServerSpec(f"server-{i + 1}", start, end, throughput=100.0, public_name=f"demo-{i + 1}"))
    return specs


@main.command()
@click.option("--servers", default=3, show_default=True, help="How many petals servers to start.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Where models and the database live.")
def demo(servers: int, data_dir: Path | None) -> None:
    """Start a private swarm on loopback and show which peer serves which blocks (Ctrl-C stops it)."""
    from monitor.local_swarm import LocalSwarm, SwarmError
    from monitor.settings import Settings
    from monitor.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model

    data_dir = data_dir or Settings().data_dir
    click.echo(f"Preparing the tiny model in {data_dir} ...")
    model_path = ensure_tiny_model(data_dir)
    specs = _demo_specs(TINY_NUM_BLOCKS, servers)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with LocalSwarm(model_path, TINY_DHT_PREFIX) as swarm:
        try:
            click.echo(f"Starting a bootstrap peer and {len(specs)} servers on 127.0.0.1 ...")
            swarm.start(specs)
        except SwarmError as e:
            click.echo(f"Error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted; stopping everything.")
            return
        click.echo(f"Swarm is up. Initial peers: {' '.join(swarm.initial_peers)}")
        for row in swarm.describe():
            click.echo(f"  {row['name']:<10} blocks {row['blocks']:<7} peer {row['peer_id']}  pid {row['pid']}")
        click.echo("Press Ctrl-C to stop.")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            click.echo("Stopping the swarm ...")
    click.echo("Stopped.")


if __name__ == "__main__":
    main()
