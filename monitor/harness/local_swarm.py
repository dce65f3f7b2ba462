"""The one swarm launcher: a real private Petals swarm on loopback (tests, demo, benchmarks).

It starts a bootstrap DHT peer and petals servers as separate processes (``monitor.harness.server_process``,
forked from a process that has imported petals once: ``monitor.harness.fork_server``),
waits until each server is ONLINE in the DHT, can stop, kill, throttle, corrupt, fail and restart any server,
and reaps every process it started, whatever happens. Each child runs in its own session, so its
whole process group (handler processes, DHT process, p2pd daemon) is ended together.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.harness.fork_server import FORK_SERVER, ForkedProcess
from monitor.swarm.dht_options import LOOPBACK_HOST


# Seconds a restarted server must read ONLINE in every look before ``restart`` returns. Right
# after a restart under the same identity, a look can still find, for some of its blocks, the
# JOINING record the server announced a moment before: measured on the session swarm's layout,
# after 6 of 12 kills, up to 1.0 s after the first look that found it ONLINE (none after 12
# graceful stops). A monitor polling just then would count the server as joining.
RESTART_SETTLE = 1.5


class SwarmError(RuntimeError):
    """A swarm process failed to start or to come ONLINE; the message carries its log tail."""


@dataclass(frozen=True)
class ServerSpec:
    name: str
    start: int
    end: int
    throughput: float = 100.0
    public_name: Optional[str] = None
    inference_max_length: Optional[int] = None  # the longest session it accepts (petals' default: 2048)
    attn_cache_tokens: Optional[int] = None  # its attention cache, in tokens per block (petals' default: 4096)
    torch_dtype: str = "float32"  # what its blocks compute in (bfloat16: half the memory, fast with AMX)
    step_timeout: Optional[float] = None  # seconds it keeps an idle session open (petals' default: 300)

    @property
    def block_indices(self) -> str:
        return f"{self.start}:{self.end}"


@dataclass
class _Proc:
    name: str
    args: list[str]
    log_path: Path
    ready_path: Path
    popen: Optional[subprocess.Popen | ForkedProcess] = None
    info: dict = field(default_factory=dict)

    @property
    def pid(self) -> Optional[int]:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


def _child_env() -> dict:
    env = os.environ.copy()
    project_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = project_root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


class LocalSwarm:
    """A private swarm serving one local checkpoint, on 127.0.0.1 only.

    Use as a context manager; ``close()`` reaps everything it started even after errors.
    """

    def __init__(
        self,
        model_path: Path,
        dht_prefix: str,
        *,
        workdir: Optional[Path] = None,
        update_period: float = 10.0,
        start_timeout: float = 120.0,
        bootstrap_port: int = 0,
    ):
        self.model_path = Path(model_path)
        self.dht_prefix = dht_prefix
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="petals-swarm-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.update_period = update_period
        self.start_timeout = start_timeout
        self.bootstrap_port = bootstrap_port
        self.bootstrap: Optional[_Proc] = None
        self.servers: dict[str, _Proc] = {}
        self.specs: dict[str, ServerSpec] = {}
        self._throttles: dict[str, threading.Event] = {}
        self._dht = None
        self._lock = threading.Lock()
        for stale in [*self.workdir.glob("*.corrupt"), *self.workdir.glob("*.fail")]:
            stale.unlink(missing_ok=True)  # a workdir reused from an earlier run starts honest and working

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "LocalSwarm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def initial_peers(self) -> list[str]:
        if not self.bootstrap or not self.bootstrap.info:
            raise SwarmError("the bootstrap peer is not running; call start_bootstrap() first")
        return [a for a in self.bootstrap.info["maddrs"] if f"/ip4/{LOOPBACK_HOST}/" in a]

    def future_initial_peers(self) -> list[str]:
        """The bootstrap peer's multiaddr before it runs (a fixed ``bootstrap_port`` needed): its
        identity is made now, as hivemind makes one, and ``start_bootstrap`` later starts it with
        that identity on that port. For a monitor started while its swarm is down."""
        from hivemind.p2p import P2P, PeerID

        if not self.bootstrap_port:
            raise SwarmError("a bootstrap peer's address is known before it runs only on a fixed bootstrap_port")
        identity = self.workdir / "bootstrap.id"
        if not identity.exists():
            P2P.generate_identity(str(identity))
        peer_id = PeerID.from_identity(identity.read_bytes())
        return [f"/ip4/{LOOPBACK_HOST}/tcp/{self.bootstrap_port}/p2p/{peer_id.to_base58()}"]

    def start(self, specs: Sequence[ServerSpec]) -> "LocalSwarm":
        """Start the bootstrap peer and the servers (in parallel), and wait until all are ONLINE."""
        self.start_bootstrap()
        for spec in specs:
            self._spawn_server(spec)
        _ = self.dht  # the harness's own DHT client starts while the servers load their blocks
        for spec in specs:
            self.wait_online(spec.name)
        return self

    def start_bootstrap(self) -> None:
        args = ["bootstrap", "--port", str(self.bootstrap_port),
                "--identity-path", str(self.workdir / "bootstrap.id")]
        self.bootstrap = self._spawn("bootstrap", args)
        self._wait_ready_file(self.bootstrap)

    def add_server(self, spec: ServerSpec) -> str:
        """Start one more server and wait until it is ONLINE; returns its peer id."""
        self._spawn_server(spec)
        return self.wait_online(spec.name)

    def _spawn_server(self, spec: ServerSpec) -> None:
        if spec.name in self.servers and self.servers[spec.name].alive():
            raise SwarmError(f"server {spec.name!r} is already running")
        args = [
            "server",
            "--model", str(self.model_path),
            "--dht-prefix", self.dht_prefix,
            "--block-indices", spec.block_indices,
            "--throughput", str(spec.throughput),
            "--initial-peers", *self.initial_peers,
            "--identity-path", str(self.workdir / f"{spec.name}.id"),
            "--update-period", str(self.update_period),
            "--corrupt-flag", str(self._corrupt_flag(spec.name)),
            "--fail-flag", str(self._fail_flag(spec.name)),
            "--refuse-flag", str(self._refuse_flag(spec.name)),
        ]
        if spec.public_name:
            args += ["--public-name", spec.public_name]
        if spec.inference_max_length:
            args += ["--inference-max-length", str(spec.inference_max_length)]
        if spec.attn_cache_tokens:
            args += ["--attn-cache-tokens", str(spec.attn_cache_tokens)]
        if spec.step_timeout:
            args += ["--step-timeout", str(spec.step_timeout)]
        if spec.torch_dtype != "float32":
            args += ["--torch-dtype", spec.torch_dtype]
        self.specs[spec.name] = spec
        self.servers[spec.name] = self._spawn(spec.name, args)

    def _spawn(self, name: str, args: list[str]) -> _Proc:
        log_path = self.workdir / f"{name}.log"
        ready_path = self.workdir / f"{name}.ready.json"
        ready_path.unlink(missing_ok=True)
        proc = _Proc(name=name, args=args, log_path=log_path, ready_path=ready_path)
        argv = [*args, "--ready-file", str(ready_path)]
        env = _child_env()
        proc.popen = FORK_SERVER.spawn(argv, log_path, env)  # petals imported once (fork_server)
        if proc.popen is None:
            with open(log_path, "ab") as log:
                proc.popen = subprocess.Popen(
                    [sys.executable, "-m", "monitor.harness.server_process", *argv], stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                )
        return proc

    def _wait_ready_file(self, proc: _Proc) -> dict:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.ready_path.exists():
                proc.info = json.loads(proc.ready_path.read_text())
                return proc.info
            if not proc.alive():
                raise SwarmError(
                    f"{proc.name} exited with code {proc.popen.returncode} before it was ready; "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )
            time.sleep(0.1)
        raise SwarmError(f"{proc.name} was not ready after {self.start_timeout:.0f} s; "
                         f"log {proc.log_path}:\n{proc.log_tail()}")

    def wait_online(self, name: str, settle: float = 0.0) -> str:
        """Wait until every block of the server's span shows it ONLINE in the DHT, and has in
        every look for ``settle`` seconds since."""
        proc = self.servers[name]
        spec = self.specs[name]
        info = self._wait_ready_file(proc)
        peer_id = info["peer_id"]
        deadline = time.monotonic() + self.start_timeout
        online_since = None
        while time.monotonic() < deadline:
            if not proc.alive():
                raise SwarmError(f"server {name!r} ({spec.block_indices}) exited with code "
                                 f"{proc.popen.returncode}; log {proc.log_path}:\n{proc.log_tail()}")
            if self.server_states(range(spec.start, spec.end)).get(peer_id) == {"ONLINE"}:
                online_since = time.monotonic() if online_since is None else online_since
                if time.monotonic() - online_since >= settle:
                    return peer_id
            else:
                online_since = None
            time.sleep(0.2)  # a look takes ~20 ms on loopback
        raise SwarmError(f"server {name!r} ({spec.block_indices}, peer {peer_id}) did not come ONLINE "
                         f"within {self.start_timeout:.0f} s; log {proc.log_path}:\n{proc.log_tail()}")

    # ---- observing -------------------------------------------------------------------------
    @property
    def dht(self):
        """The harness's own DHT client (NAT traversal off), started on first use."""
        with self._lock:
            if self._dht is None:
                from monitor.swarm import start_dht

                self._dht = start_dht(self.initial_peers)
            return self._dht

    def server_states(self, blocks: Sequence[int]) -> dict[str, set[str]]:
        """peer id -> the set of states it announces for the given blocks (latest DHT view)."""
        from petals.utils.dht import get_remote_module_infos

        uids = [f"{self.dht_prefix}.{i}" for i in blocks]
        states: dict[str, set[str]] = {}
        infos = get_remote_module_infos(self.dht, uids, latest=True)
        for block, info in zip(blocks, infos):
            for peer_id, server_info in info.servers.items():
                states.setdefault(peer_id.to_base58(), set()).add(server_info.state.name)
        return states

    def peer_id(self, name: str) -> str:
        proc = self.servers[name]
        return proc.info.get("peer_id") or self._wait_ready_file(proc)["peer_id"]

    def pid(self, name: str) -> int:
        return self.servers[name].pid

    # ---- chaos -----------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        """SIGKILL the server and its whole process group: it vanishes without announcing OFFLINE."""
        self.unthrottle(name)
        self._reap(self.servers[name], graceful=False)

    def stop(self, name: str, grace: float = 15.0) -> None:
        """Ask the server to shut down (it announces OFFLINE), then reap whatever is left."""
        self.unthrottle(name)
        self._reap(self.servers[name], graceful=True, grace=grace)

    def restart(self, name: str) -> str:
        """Start the server again with the same span and identity (same peer id), and wait until
        every look finds it ONLINE (``wait_online(settle=…)``)."""
        if self.servers[name].alive():
            self.stop(name)
        self._spawn_server(self.specs[name])
        return self.wait_online(name, settle=RESTART_SETTLE)

    def throttle(self, name: str, duty: float = 0.7, period: float = 0.2) -> None:
        """Make the server slow but alive: its main process (the compute runtime) is stopped for
        ``duty`` of every ``period`` seconds; its connection handlers and p2pd still answer pings."""
        if not 0 < duty < 1:
            raise ValueError(f"duty must be between 0 and 1, got {duty}")
        self.unthrottle(name)
        pid = self.pid(name)
        done = threading.Event()

        def cycle():
            try:
                while not done.is_set():
                    os.kill(pid, signal.SIGSTOP)
                    done.wait(duty * period)
                    os.kill(pid, signal.SIGCONT)
                    done.wait((1 - duty) * period)
            except ProcessLookupError:
                pass
            finally:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

        self._throttles[name] = done
        threading.Thread(target=cycle, name=f"throttle-{name}", daemon=True).start()

    def unthrottle(self, name: str) -> None:
        done = self._throttles.pop(name, None)
        if done is not None:
            done.set()
            time.sleep(0.05)
            try:
                os.kill(self.pid(name), signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass

    def is_throttled(self, name: str) -> bool:
        return name in self._throttles

    def _corrupt_flag(self, name: str) -> Path:
        return self.workdir / f"{name}.corrupt"

    def corrupt(self, name: str) -> None:
        """Make the server return wrong outputs (noise as large as the outputs themselves) while it
        stays fast and ONLINE: its process perturbs every block's outputs while a flag file exists."""
        if name not in self.specs:
            raise KeyError(name)
        self._corrupt_flag(name).touch()

    def uncorrupt(self, name: str) -> None:
        self._corrupt_flag(name).unlink(missing_ok=True)

    def is_corrupted(self, name: str) -> bool:
        return self._corrupt_flag(name).exists()

    def _fail_flag(self, name: str) -> Path:
        return self.workdir / f"{name}.fail"

    def fail(self, name: str) -> None:
        """Make every inference and forward step of the server raise (as a CUDA out-of-memory error
        or a broken driver would) while it stays ONLINE, announced and reachable: its process raises
        from every block's step while a flag file exists (``server_process.FAIL_MESSAGE``)."""
        if name not in self.specs:
            raise KeyError(name)
        self._fail_flag(name).touch()

    def unfail(self, name: str) -> None:
        self._fail_flag(name).unlink(missing_ok=True)

    def is_failing(self, name: str) -> bool:
        return self._fail_flag(name).exists()

    def _refuse_flag(self, name: str) -> Path:
        return self.workdir / f"{name}.refuse"

    def refuse(self, name: str) -> None:
        """Make the server refuse every session as "cache full" while it announces its whole cache
        free (a leaked or wedged cache): its process answers every allocation with petals' own
        "Could not allocate … bytes immediately: out of memory" while a flag file exists."""
        if name not in self.specs:
            raise KeyError(name)
        self._refuse_flag(name).touch()

    def unrefuse(self, name: str) -> None:
        self._refuse_flag(name).unlink(missing_ok=True)

    # ---- teardown --------------------------------------------------------------------------
    def _reap(self, proc: Optional[_Proc], *, graceful: bool, grace: float = 15.0) -> None:
        if proc is None or proc.popen is None:
            return
        pgid = proc.popen.pid  # start_new_session: the child leads its own group
        if proc.alive() and graceful:
            try:
                os.kill(proc.popen.pid, signal.SIGCONT)
                os.kill(proc.popen.pid, signal.SIGINT)
                proc.popen.wait(timeout=grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(pgid)

    def close(self) -> None:
        for name in list(self._throttles):
            self.unthrottle(name)
        if self._dht is not None:
            try:
                self._dht.shutdown()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
            self._dht = None
        for proc in self.servers.values():
            self._reap(proc, graceful=False)
        self._reap(self.bootstrap, graceful=False)
        if self._own_workdir:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)

    def describe(self) -> list[dict]:
        """What runs where: one row per server (name, blocks, peer id, pid, running)."""
        return [
            {
                "name": name,
                "blocks": self.specs[name].block_indices,
                "peer_id": proc.info.get("peer_id"),
                "pid": proc.pid,
                "running": proc.alive(),
                "throttled": self.is_throttled(name),
                "corrupted": self.is_corrupted(name),
                "failing": self.is_failing(name),
                "refusing": self._refuse_flag(name).exists(),
            }
            for name, proc in self.servers.items()
        ]


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Wait until no live process of the group is left (zombies wait for init to reap them)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    alive = True
                    break
            except (ProcessLookupError, psutil.Error):
                continue
        if not alive:
            return
        time.sleep(0.05)
