"""The embedded demo's swarm layout and its chaos controls (the dashboard's demo panel and
``swarm-monitor chaos``).

Layout (``demo_layout``): every block served by two servers, so any one can die with the model still
fully served; 3 servers on the demo model's 30 blocks are ``0:30``, ``0:15`` and ``15:30``. Server
``i`` is ``server-i`` everywhere (harness, panel, CLI, the public name it announces).

Controls (``DemoControls``), each what a real server can do to a swarm:

- ``stop`` / ``start``: the server's process goes and comes back; the service polls at once
  (``on_change``), so the dashboard shows it within seconds, not a scrape period later;
- ``throttle``: the server's compute runtime is stopped 80 % of every 0.25 s (SIGSTOP/SIGCONT) — slow,
  but its handlers still answer pings: what petals' default routing cannot see;
- ``corrupt``: it perturbs its blocks' outputs — fast, ONLINE, wrong;
- ``fail``: every inference and forward step raises "CUDA error: out of memory" — ONLINE, reachable,
  failing;
- ``hostile``: a made-up peer announces extreme and malformed records on every block for ten
  minutes (``harness/hostile.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

# The demo's periods and shares, and the settings they override (printed at start): in
# monitor/demo_settings.py, a light module (no petals) the CLI and its specs read.
from monitor.demo_settings import (DEMO_COMPUTE_CHECK_PERIOD, DEMO_GENERATION_CHECK_PERIOD,  # noqa: F401
                                           DEMO_ROUND_PERIOD, DEMO_SPEED_PROBE_MAX_SHARE, DEMO_SPEED_PROBE_PERIOD)
from monitor.harness.local_swarm import LocalSwarm, ServerSpec


def demo_expect(tiny: bool, prompt: str) -> Optional[str]:
    """What the demo model's generation check must answer: "Paris" to the default prompt (the
    capital of France, which ``demo_model``'s own sanity check verifies at build time); nothing for
    the tiny random model (it answers gibberish) or another prompt."""
    from monitor.harness.demo_model import SANITY_ANSWER, SANITY_QUESTION

    return SANITY_ANSWER if not tiny and prompt.strip() == SANITY_QUESTION else None


def prepare_model(data_dir: Path, *, tiny: bool, family: str = "llama") -> tuple[Path, str, int, str]:
    """The demo's model, built into ``data_dir`` once: (path, dht_prefix, num_blocks, name).
    SmolLM2-135M-Instruct, or with ``tiny`` a tiny random model of ``family`` (bloom, falcon or
    llama; fast, answers gibberish)."""
    if tiny:
        from monitor.harness.tiny_model import tiny_model

        model = tiny_model(data_dir, family)
        return model.path, model.dht_prefix, model.num_blocks, model.name
    from monitor.harness.demo_model import DEMO_DHT_PREFIX, DEMO_NUM_BLOCKS, ensure_demo_model

    return ensure_demo_model(data_dir), DEMO_DHT_PREFIX, DEMO_NUM_BLOCKS, "SmolLM2-135M-Instruct"


def prepare_checkpoint(path: Path, servers: int) -> tuple[Path, str, int, str]:
    """A local checkpoint for the demo to serve: (path, dht_prefix, num_blocks, name), checked as
    untrusted input before any server loads it (``families.checkpoint``): its family, its weights'
    headers, the memory the demo's layout of ``servers`` needs, and that this process reads its
    config and tokenizer. Raises CheckpointError with a one-line message."""
    from monitor import families
    from monitor.families.checkpoint import CheckpointError, check_memory, inspect, supported

    checkpoint = inspect(path)
    check_memory(checkpoint, [(s.start, s.end) for s in demo_layout(checkpoint.num_blocks, servers)])
    try:
        families.install()
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(checkpoint.path))
        if checkpoint.family in ("llama", "llama3"):  # (what 4.34's Llama block cannot compute)
            from monitor.families.llama3 import check_blocks_supported

            check_blocks_supported(config)
        families.load_tokenizer(checkpoint.path)
    except Exception as e:  # noqa: BLE001 - any failure to read it is the checkpoint's, in one line
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise CheckpointError(f"{checkpoint.path}: its {checkpoint.label} config or tokenizer cannot be read: "
                              f"{detail} (supported: {supported()})") from None
    return checkpoint.path, checkpoint.dht_prefix, checkpoint.num_blocks, checkpoint.path.name


def demo_layout(num_blocks: int, servers: int, throughput: float = 100.0) -> list[ServerSpec]:
    """Spans such that every block is served by two servers (when there are two or more), so any
    one server can die and the model stays fully served.

    The servers form two layers that each cover all blocks: layer one cut into ``servers // 2``
    parts, layer two into the rest, with its cuts shifted so the two layers' seams differ.
    With 3 servers and 30 blocks: 0:30, 0:15, 15:30.
    Server ``i`` is ``server-i`` everywhere: the harness, the demo panel, ``swarm-monitor chaos``
    and the public name it announces (so the reasons name it the same).
    """
    if servers < 1:
        raise ValueError(f"at least one server is needed, got {servers}")
    if servers > num_blocks:
        raise ValueError(f"{servers} servers for {num_blocks} blocks: at most one server per block")
    if servers == 1:
        return [ServerSpec("server-1", 0, num_blocks, throughput, "server-1")]
    first, second = servers // 2, servers - servers // 2
    cuts_one = [round(i * num_blocks / first) for i in range(first + 1)]
    step = num_blocks / second
    shift = step / 2 if first == second else 0
    cuts_two = [0] + [round(j * step - shift) for j in range(1, second)] + [num_blocks]
    spans = list(zip(cuts_one, cuts_one[1:])) + list(zip(cuts_two, cuts_two[1:]))
    return [ServerSpec(f"server-{i + 1}", a, b, throughput, f"server-{i + 1}") for i, (a, b) in enumerate(spans)]


class DemoControls:
    """What the dashboard's demo panel may do to the demo swarm: stop, start, throttle, corrupt, fail."""

    ACTIONS = ("stop", "start", "throttle", "unthrottle", "corrupt", "uncorrupt", "fail", "unfail")

    def __init__(self, swarm: LocalSwarm):
        self.swarm = swarm
        # called once a server stopped or started (set by the service, which polls the DHT then),
        # so the dashboard shows what the click did within seconds, not up to a scrape period later
        self.on_change: Optional[Callable[[], None]] = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def servers(self) -> list[dict]:
        return self.swarm.describe()

    def _known(self, name: str) -> None:
        if name not in self.swarm.servers:
            raise KeyError(f"no demo server named {name!r}; known: {', '.join(self.swarm.servers)}")

    def stop(self, name: str) -> None:
        self._known(name)
        self.swarm.stop(name)
        self._changed()

    def start(self, name: str) -> None:
        self._known(name)
        if not self.swarm.servers[name].alive():
            self.swarm.restart(name)
            self._changed()

    def throttle(self, name: str) -> None:
        self._known(name)
        self.swarm.throttle(name, duty=0.8, period=0.25)

    def unthrottle(self, name: str) -> None:
        self._known(name)
        self.swarm.unthrottle(name)

    def corrupt(self, name: str) -> None:
        """The server keeps answering, fast, with wrong outputs (until ``uncorrupt``)."""
        self._known(name)
        self.swarm.corrupt(name)

    def uncorrupt(self, name: str) -> None:
        self._known(name)
        self.swarm.uncorrupt(name)

    def fail(self, name: str) -> None:
        """The server stays ONLINE and reachable, and every inference step through it fails with
        its own error (until ``unfail``)."""
        self._known(name)
        self.swarm.fail(name)

    def unfail(self, name: str) -> None:
        self._known(name)
        self.swarm.unfail(name)

    def hostile(self) -> int:
        """A made-up peer announces hostile records on every block (numbers at the edge of the DHT's
        wire format, garbage text, malformed records) for ten minutes; returns how many
        (``harness/hostile.py``). The monitor must bound or drop them and keep every poll."""
        from monitor.harness.hostile import announce_hostile

        num_blocks = max(spec.end for spec in self.swarm.specs.values())
        return len(announce_hostile(self.swarm.dht, self.swarm.dht_prefix, num_blocks))
