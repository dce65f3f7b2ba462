"""Entry point of each process the swarm harness starts: a bootstrap peer or a petals server.

Run as ``python -m monitor.harness.server_process {bootstrap,server} ...``. It imports the compat module
before petals, starts hivemind with NAT traversal off, listens on loopback only, creates petals
servers through petals' ``Server`` class with a numeric throughput (no speed test, no PyPI
version check), writes a small JSON "ready file" for the harness, and kills its own process group
if the harness dies, so no server or p2pd daemon outlives it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.swarm.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs


def _write_ready(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(payload))
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """If the harness process goes away, take the whole process group (p2pd included) down."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _interrupt_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


class _ProbeOnFirstUse:
    """What petals' ReachabilityProtocol gets for its *probe* (a second P2P daemon, from which it
    dials a peer that asks to be checked) until somebody asks: then the daemon is created, as
    petals creates it, and used. petals starts it with every server and bootstrap peer; on
    loopback nobody asks (servers ask when they join a public swarm, and the harness's skip that),
    and a daemon costs ~0.6 CPU-s to start: half the daemons of a spec swarm (BENCHMARKS.md,
    "Test suite"). The service itself (``rpc_check``) is attached and answers as petals' does."""

    def __init__(self, create, args, kwargs):
        import asyncio

        self._create, self._args, self._kwargs = create, args, kwargs
        self._p2p = None
        self._lock = asyncio.Lock()  # (it binds to the event loop that first awaits it)

    async def _started(self):
        async with self._lock:
            if self._p2p is None:
                self._p2p = await self._create(*self._args, **self._kwargs)
        return self._p2p

    async def call_protobuf_handler(self, *args, **kwargs):
        return await (await self._started()).call_protobuf_handler(*args, **kwargs)

    async def iterate_protobuf_handler(self, *args, **kwargs):
        return await (await self._started()).iterate_protobuf_handler(*args, **kwargs)

    async def shutdown(self) -> None:
        if self._p2p is not None:
            await self._p2p.shutdown()


def _reachability_probe_on_first_use() -> None:
    """petals' reachability module creates nothing but the probe with ``P2P.create``: it gets a
    ``_ProbeOnFirstUse`` in its place (in this process only)."""
    from hivemind.p2p import P2P
    from petals.server import reachability

    class _LazyProbeP2P:
        @staticmethod
        async def create(*args, **kwargs):
            return _ProbeOnFirstUse(P2P.create, args, kwargs)

    reachability.P2P = _LazyProbeP2P


def run_bootstrap(args) -> None:
    import hivemind
    from petals.cli.run_dht import report_status
    from petals.server.reachability import ReachabilityProtocol

    dht = hivemind.DHT(
        start=True,
        initial_peers=args.initial_peers,
        host_maddrs=loopback_maddrs(args.port),
        identity_path=args.identity_path,
        **NO_NAT_TRAVERSAL,
    )
    _reachability_probe_on_first_use()
    protocol = ReachabilityProtocol.attach_to_dht(dht, await_ready=True)
    _write_ready(
        args.ready_file,
        {"peer_id": dht.peer_id.to_base58(), "maddrs": [str(a) for a in dht.get_visible_maddrs()]},
    )
    try:
        while True:
            dht.run_coroutine(report_status, return_future=False)
            time.sleep(5)
    except KeyboardInterrupt:
        pass
    finally:
        protocol.shutdown()
        dht.shutdown()


def _corrupt_outputs_when_flagged(flag: str) -> None:
    """Chaos: while the file ``flag`` exists, every block's outputs (inference and forward) get
    noise as large as the outputs themselves, so the server still answers, fast, but wrong.
    Patched on petals' TransformerBackend in this process, where the compute runtime runs."""
    import torch
    from petals.server.backend import TransformerBackend

    def perturbed(outputs):
        if not os.path.exists(flag):
            return outputs
        return tuple(o + torch.randn_like(o) * o.float().std().to(o.dtype) if torch.is_tensor(o) and
                     o.is_floating_point() and o.numel() > 1 else o for o in outputs)

    inference_step, forward = TransformerBackend.inference_step, TransformerBackend.forward
    TransformerBackend.inference_step = lambda self, *a, **k: perturbed(inference_step(self, *a, **k))
    TransformerBackend.forward = lambda self, *a, **k: perturbed(forward(self, *a, **k))


FAIL_MESSAGE = "CUDA error: out of memory (simulated: chaos fail)"


def _fail_steps_when_flagged(flag: str) -> None:
    """Chaos: while the file ``flag`` exists, every block's inference and forward step raises, as a
    CUDA out-of-memory error or a broken driver would: the server stays ONLINE, announced and
    reachable (``rpc_info`` answers), and every client step through it fails with the server's own
    error text (petals' handler sends it back). Patched on petals' TransformerBackend in this
    process, where the compute runtime runs; the runtime survives each failure and goes on."""
    from petals.server.backend import TransformerBackend

    def failing(method):
        def step(self, *args, **kwargs):
            if os.path.exists(flag):
                raise RuntimeError(FAIL_MESSAGE)
            return method(self, *args, **kwargs)

        return step

    TransformerBackend.inference_step = failing(TransformerBackend.inference_step)
    TransformerBackend.forward = failing(TransformerBackend.forward)


def _refuse_sessions_when_flagged(flag: str) -> None:
    """Chaos: while the file ``flag`` exists, every session's attention cache is refused with
    petals' own words for a full cache, while the cache stays empty (so the server announces all of
    it as free). Patched on petals' MemoryCache in this process, before its handlers are forked."""
    from petals.server.memory_cache import AllocationFailed, MemoryCache

    schedule = MemoryCache._schedule_alloc

    async def refusing(self, alloc_size, *descriptors, timeout):
        if os.path.exists(flag):
            raise AllocationFailed(f"Could not allocate {alloc_size} bytes immediately: out of memory")
        return await schedule(self, alloc_size, *descriptors, timeout=timeout)

    MemoryCache._schedule_alloc = refusing


def run_server(args) -> None:
    from petals.server.server import Server

    from monitor import families

    families.install()  # the newer families' configs and blocks (Llama 3.x, Mixtral)

    _reachability_probe_on_first_use()
    if args.corrupt_flag:
        _corrupt_outputs_when_flagged(args.corrupt_flag)
    if args.fail_flag:
        _fail_steps_when_flagged(args.fail_flag)
    if args.refuse_flag:
        _refuse_sessions_when_flagged(args.refuse_flag)
    options = dict(NO_NAT_TRAVERSAL)
    server = Server(
        initial_peers=args.initial_peers,
        dht_prefix=args.dht_prefix,
        converted_model_name_or_path=args.model,
        public_name=args.public_name,
        throughput=args.throughput,
        block_indices=args.block_indices,
        num_handlers=args.num_handlers,
        torch_dtype=args.torch_dtype,
        device="cpu",
        update_period=args.update_period,
        inference_max_length=args.inference_max_length,
        attn_cache_tokens=args.attn_cache_tokens,
        step_timeout=args.step_timeout,
        host_maddrs=loopback_maddrs(args.port),
        identity_path=args.identity_path,
        skip_reachability_check=True,
        reachable_via_relay=False,
        mean_balance_check_period=3600,
        **options,
    )
    _write_ready(args.ready_file, {"peer_id": server.dht.peer_id.to_base58(), "pid": os.getpid()})
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m monitor.harness.server_process")
    sub = parser.add_subparsers(dest="role", required=True)

    boot = sub.add_parser("bootstrap", help="a bootstrap DHT peer")
    boot.add_argument("--ready-file", required=True)
    boot.add_argument("--port", type=int, default=0)
    boot.add_argument("--identity-path")
    boot.add_argument("--initial-peers", nargs="*", default=[])

    srv = sub.add_parser("server", help="a petals server for a local checkpoint")
    srv.add_argument("--ready-file", required=True)
    srv.add_argument("--model", required=True, help="local checkpoint directory")
    srv.add_argument("--dht-prefix", required=True)
    srv.add_argument("--block-indices", required=True, help="start:end")
    srv.add_argument("--throughput", type=float, required=True)
    srv.add_argument("--initial-peers", nargs="+", required=True)
    srv.add_argument("--public-name")
    srv.add_argument("--identity-path")
    srv.add_argument("--port", type=int, default=0)
    srv.add_argument("--update-period", type=float, default=10)
    srv.add_argument("--num-handlers", type=int, default=2)
    srv.add_argument("--inference-max-length", type=int, default=2048)
    srv.add_argument("--attn-cache-tokens", type=int, default=None)
    srv.add_argument("--step-timeout", type=float, default=5 * 60)
    srv.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default="float32")
    srv.add_argument("--corrupt-flag", default=None, help="chaos: outputs are perturbed while this file exists")
    srv.add_argument("--fail-flag", default=None, help="chaos: every inference and forward step raises while "
                                                         "this file exists")
    srv.add_argument("--refuse-flag", default=None, help="chaos: every session is refused as 'cache full' while "
                                                           "this file exists")

    args = parser.parse_args(argv)
    _die_with_parent()
    _interrupt_on_sigterm()
    (run_bootstrap if args.role == "bootstrap" else run_server)(args)


if __name__ == "__main__":
    sys.exit(main())
