#!/usr/bin/env python
"""A simulated Petals swarm of N virtual servers for M models, in a real hivemind DHT on loopback.

Why: the monitor must stay fast at the public swarm's scale (hundreds of servers, several models),
but a real petals server per virtual server is far too heavy for one machine. The scrape only reads
what servers *announce*, so announcing exactly what petals servers announce is a faithful load:

- every virtual server is announced like ``petals.utils.dht.declare_active_modules`` does: DHT key
  ``f"{dht_prefix}.{block}"`` for each block of its span, subkey = its peer id, value =
  ``ServerInfo.to_tuple()``, expiring ``max(2 * update_period, 3)`` s later, refreshed every
  ``update_period`` (spread over the period, as independent servers would be); every model is
  announced under ``_petals.models`` (subkey dht_prefix, value ``ModelInfo.to_dict()``);
- the records are realistic: spans of 1/10..1/3 of the model (the first servers tile every model),
  throughputs and rps, cache_tokens_left, versions, dtypes, quantization, relays, public names,
  adapters, next_pings to servers holding the next block; 5 % JOINING and 3 % OFFLINE (they keep
  announcing that state, so the fractions stay steady; states do not churn here).

What is behind a peer id (what the probes meet) — this is the honest part:

- ``answering`` (the first ``responders`` servers, default 8): a real libp2p peer (a hivemind P2P,
  one p2pd daemon each, ~60 MB) that answers petals' ``rpc_info`` like a petals server does
  (version, dht_client_mode, cache_tokens_available). A probe of it succeeds.
- ``hung`` (the first ``hung`` of the unreachable ones, default 0): the same kind of peer, then
  frozen with SIGSTOP: its address is known and its TCP port accepts, but it never answers, so a
  probe runs into its timeout, like a server that hangs or sits behind a firewall that drops.
- ``unreachable`` (``unreachable`` fraction, default 10 %, hung included): a peer id with no
  process behind it: a probe fails when the lookup finds no address ("routing: not found").
- ``announced`` (all other servers): records that are refreshed like a live server's, whose peer id
  has no process either (one p2pd per virtual server would need ~60 MB each): probes of them fail
  like the unreachable ones. Only the scrape sees them as the live servers they pretend to be.

Peer ids without a process are made like p2pd makes its own ("12D3KooW...", from a fresh Ed25519
key), from a seeded RNG so runs are reproducible; they sort among the real peers' ids at random.

Run ``python scripts/simulate_swarm.py --servers 500 --models 4`` (it starts its own bootstrap
peer unless given ``--initial-peers``), or use ``SimulatedSwarm`` from a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor import compat  # noqa: F401,E402  (must precede petals)
from monitor.swarm.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs  # noqa: E402
from monitor.swarm import start_dht  # noqa: E402  (imports petals before the DHT child forks)

MODEL_INDEX_KEY = "_petals.models"
# (dht_prefix, num_blocks, repository): the shapes of models the public swarm serves
MODEL_SHAPES = (
    ("sim-Meta-Llama-3-1-405B-Instruct-hf", 126, "https://huggingface.co/meta-llama/Meta-Llama-3.1-405B-Instruct"),
    ("sim-Llama-2-70b-chat-hf", 80, "https://huggingface.co/meta-llama/Llama-2-70b-chat-hf"),
    ("sim-Mixtral-8x22B-Instruct-v0-1", 56, "https://huggingface.co/mistralai/Mixtral-8x22B-Instruct-v0.1"),
    ("sim-Meta-Llama-3-1-8B-Instruct", 32, "https://huggingface.co/meta-llama/Meta-Llama-3.1-8B-Instruct"),
)
KINDS = ("answering", "hung", "unreachable", "announced")
# hivemind's DHT child reads its command pipe without blocking: a message over 16 KB is written in two
# parts, and more than the pipe's 64 KB in flight blocks the writer mid-message; either way the child
# can read half a message and die (EOFError / BlockingIOError). So: < 12 KB per call, <= 4 in flight.
MAX_BATCH_BYTES = 12_000
IN_FLIGHT = 4
SLICES_PER_PERIOD = 10  # refreshes are spread over the update period, like independent servers'


@dataclass(frozen=True)
class SimModel:
    dht_prefix: str
    num_blocks: int
    repository: Optional[str] = None


@dataclass
class VirtualServer:
    peer_id: str
    model: str
    start: int
    end: int
    kind: str  # one of KINDS
    info: dict = field(default_factory=dict)  # ServerInfo fields besides start/end

    def server_info(self):
        from petals.data_structures import ServerInfo, ServerState

        fields = dict(self.info)
        state = ServerState[fields.pop("state")]
        return ServerInfo(state=state, start_block=self.start, end_block=self.end, **fields)


# ---- the plan (pure, seeded) ------------------------------------------------------------------


def sim_models(count: int) -> list[SimModel]:
    """`count` models with the public swarm's shapes (cycled with a suffix beyond four)."""
    models = []
    for i in range(count):
        prefix, blocks, repo = MODEL_SHAPES[i % len(MODEL_SHAPES)]
        suffix = f"-{i // len(MODEL_SHAPES)}" if i >= len(MODEL_SHAPES) else ""
        models.append(SimModel(prefix + suffix, blocks, repo))
    return models


def random_peer_id(rng: random.Random) -> str:
    """A peer id as p2pd makes them ("12D3KooW..."): the identity multihash of an Ed25519 public key,
    here of a key made from the seeded RNG, so runs are reproducible."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from hivemind.p2p import PeerID
    from hivemind.proto import crypto_pb2

    key = ed25519.Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)).public_key()
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    public = crypto_pb2.PublicKey(key_type=crypto_pb2.Ed25519, data=raw).SerializeToString()
    return PeerID(bytes([0x00, len(public)]) + public).to_base58()


def plan_spans(num_blocks: int, count: int, rng: random.Random) -> list[tuple[int, int]]:
    """Spans of 1/10..1/3 of the model; the first ones tile it so every block is served."""
    low, high = max(1, num_blocks // 10), max(1, num_blocks // 3)
    spans, cursor = [], 0
    while len(spans) < count:
        length = rng.randint(low, high)
        if cursor < num_blocks:
            start = cursor
            cursor = min(num_blocks, cursor + length)
            spans.append((start, cursor))
        else:
            start = rng.randint(0, num_blocks - length)
            spans.append((start, start + length))
    return spans


def plan_swarm(
    servers: int,
    models: Sequence[SimModel],
    *,
    unreachable: float = 0.1,
    joining: float = 0.05,
    offline: float = 0.03,
    seed: int = 0,
) -> list[VirtualServer]:
    """The virtual servers, their spans and announcements, with kinds left to `assign_kinds`."""
    rng = random.Random(seed)
    per_model = [servers // len(models) + (1 if i < servers % len(models) else 0) for i in range(len(models))]
    planned: list[VirtualServer] = []
    for model, count in zip(models, per_model):
        for start, end in plan_spans(model.num_blocks, count, rng):
            planned.append(VirtualServer(random_peer_id(rng), model.dht_prefix, start, end, "announced"))
    rng.shuffle(planned)

    n_unreachable = round(unreachable * len(planned))
    for i, server in enumerate(planned):
        if i < n_unreachable:
            server.kind = "unreachable"
        roll = rng.random()
        state = "OFFLINE" if roll < offline else "JOINING" if roll < offline + joining else "ONLINE"
        server.info = _announcement(rng, state)

    by_model: dict[str, list[VirtualServer]] = {}
    for server in planned:
        by_model.setdefault(server.model, []).append(server)
    for server in planned:  # next_pings: a few servers that hold the block after this span
        following = [s for s in by_model[server.model] if s.start <= server.end < s.end and s is not server]
        pinged = rng.sample(following, min(len(following), rng.randint(0, 8)))
        server.info["next_pings"] = {s.peer_id: round(rng.uniform(0.005, 0.3), 4) for s in pinged} or None
    return planned


def planned_rows(planned: Sequence[VirtualServer], models: Sequence[SimModel]):
    """(models as ModelInfo, the ServerRows a scrape of the planned servers yields): their records
    through the DHT edge's own parsing, as a poll of the simulated swarm would store them."""
    from monitor.core.snapshot import ModelInfo
    from monitor.swarm.announce import parse_server_record
    from monitor.swarm.scrape import _rows_for_model

    infos = [ModelInfo(m.dht_prefix, m.num_blocks, repository=m.repository) for m in models]
    rows = []
    for model in infos:
        blocks: list[dict] = [{} for _ in range(model.num_blocks)]
        for server in (s for s in planned if s.model == model.dht_prefix):
            record = parse_server_record(server.server_info().to_tuple(), num_blocks=model.num_blocks,
                                         peer_id=server.peer_id)
            for block in range(server.start, server.end):
                blocks[block][server.peer_id] = record
        rows += _rows_for_model(model, blocks)[0]
    return infos, rows


def _announcement(rng: random.Random, state: str) -> dict:
    """ServerInfo fields as petals servers of several versions and setups announce them."""
    gpu_scale = rng.choice((0.3, 0.6, 1.0, 1.0, 2.0, 4.0))
    return {
        "state": state,
        "throughput": round(rng.uniform(20, 400) * gpu_scale, 3),
        "public_name": rng.choice((None, None, "", f"volunteer-{rng.randint(1, 999)}",
                                   f"https://example.org/gpu{rng.randint(1, 99)}", "bigscience@hf-cluster")),
        "version": rng.choices(("2.2.0", "2.3.0.dev2", "2.1.0", "2.0.1.post2"), weights=(70, 15, 10, 5))[0],
        "network_rps": round(rng.uniform(100, 5000), 3),
        "forward_rps": round(rng.uniform(500, 30000) * gpu_scale, 3),
        "inference_rps": round(rng.uniform(20, 700) * gpu_scale, 3),
        "adapters": rng.choices(((), ("artek0chumak/guanaco-65b",), ("timdettmers/guanaco-65b", "x/lora")),
                                weights=(90, 7, 3))[0],
        "torch_dtype": rng.choice(("bfloat16", "float16", "bfloat16")),
        "quant_type": rng.choices(("nf4", "none", "int8"), weights=(60, 30, 10))[0],
        "using_relay": rng.random() < 0.2,
        "cache_tokens_left": rng.randint(0, 400_000),
    }


# ---- coroutines that run inside the DHT process -------------------------------------------------


async def _store_announcements(dht, node, batch: list, expiration_time: float) -> tuple[int, int]:
    """Store each (prefix, start, end, peer id, value) under every block of its span."""
    keys, subkeys, values = [], [], []
    for prefix, start, end, peer_id, value in batch:
        for block in range(start, end):
            keys.append(f"{prefix}.{block}")
            subkeys.append(peer_id)
            values.append(value)
    stored = await node.store_many(keys, values, expiration_time, subkeys=subkeys, num_workers=32)
    return sum(1 for ok in stored.values() if ok), len(stored)


async def _store_models(dht, node, models: list, expiration_time: float) -> None:
    for prefix, info in models:
        await node.store(MODEL_INDEX_KEY, info, expiration_time, subkey=prefix)


# ---- peers that answer (or hang) ------------------------------------------------------------------


class _Responders:
    """Real libp2p peers answering petals' rpc_info, on one asyncio loop in a background thread."""

    def __init__(self, initial_peers: Sequence[str]):
        self.initial_peers = list(initial_peers)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sim-responders", daemon=True)
        self.thread.start()
        self.p2ps: list = []
        self.frozen: list[int] = []

    def start(self, count: int) -> list:
        return asyncio.run_coroutine_threadsafe(self._start(count), self.loop).result(60 + 5 * count)

    async def _start(self, count: int) -> list:
        from hivemind.p2p import P2P
        from hivemind.proto import runtime_pb2
        from hivemind.utils.serializer import MSGPackSerializer
        from petals.server.handler import TransformerConnectionHandler

        import petals
        from monitor.swarm.reaper import guard

        handle_name = TransformerConnectionHandler._get_handle_name(None, "rpc_info")
        started = []
        for _ in range(count):
            p2p = await P2P.create(initial_peers=self.initial_peers, host_maddrs=loopback_maddrs(),
                                   dht_mode="client", **NO_NAT_TRAVERSAL)
            cache_tokens = random.randint(10_000, 400_000)

            async def rpc_info(request, context, cache_tokens=cache_tokens):
                info = {"version": petals.__version__, "dht_client_mode": False,
                        "cache_tokens_available": cache_tokens}
                return runtime_pb2.ExpertInfo(serialized_info=MSGPackSerializer.dumps(info))

            await p2p.add_protobuf_handler(handle_name, rpc_info, runtime_pb2.ExpertUID)
            guard([_daemon_pid(p2p)])
            self.p2ps.append(p2p)
            started.append(p2p)
        return [p2p.peer_id.to_base58() for p2p in started]

    def freeze(self, peer_ids: Sequence[str]) -> None:
        """SIGSTOP these peers' daemons: they keep their port, and never answer."""
        wanted = set(peer_ids)
        for p2p in self.p2ps:
            if p2p.peer_id.to_base58() in wanted:
                pid = _daemon_pid(p2p)
                os.kill(pid, signal.SIGSTOP)
                self.frozen.append(pid)

    def close(self) -> None:
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if self.p2ps:
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            try:
                future.result(30)
            except Exception:  # noqa: BLE001 - teardown goes on; kill what is left
                for p2p in self.p2ps:
                    try:
                        os.kill(_daemon_pid(p2p), signal.SIGKILL)
                    except (ProcessLookupError, AttributeError):
                        pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _shutdown(self) -> None:
        await asyncio.gather(*(p2p.shutdown() for p2p in self.p2ps), return_exceptions=True)


def _daemon_pid(p2p) -> int:
    return p2p._child.pid  # hivemind keeps the p2pd process there; no public accessor


# ---- the simulated swarm -------------------------------------------------------------------------


class SimulatedSwarm:
    """N virtual servers of M models announced into a real DHT; see the module docstring.

    ``with SimulatedSwarm(initial_peers, servers=500, models=4) as sim: ...`` announces everything
    once (blocking), then refreshes in a background thread every ``update_period``; ``close()``
    stops the refresh, the responders and the DHT (the records then expire on their own).
    """

    def __init__(
        self,
        initial_peers: Sequence[str],
        *,
        servers: int = 500,
        models: int = 4,
        unreachable: float = 0.1,
        responders: int = 8,
        hung: int = 0,
        update_period: float = 60.0,
        seed: int = 0,
    ):
        if servers < models or models < 1:
            raise ValueError(f"need at least one server per model, got {servers} servers for {models} models")
        if not 0 <= unreachable <= 1:
            raise ValueError(f"unreachable is a fraction in [0, 1], got {unreachable}")
        self.initial_peers = list(initial_peers)
        self.models = sim_models(models)
        self.servers = plan_swarm(servers, self.models, unreachable=unreachable, seed=seed)
        self.n_unreachable = sum(s.kind == "unreachable" for s in self.servers)
        if hung > self.n_unreachable:
            raise ValueError(f"hung={hung} exceeds the {self.n_unreachable} unreachable servers")
        if responders > len(self.servers) - self.n_unreachable:
            raise ValueError(f"responders={responders} exceeds the {len(self.servers) - self.n_unreachable} "
                             f"servers that are not unreachable")
        self.n_responders, self.n_hung = responders, hung
        self.update_period = update_period
        self.expiration = max(2 * update_period, 3.0)
        self.dht = None
        self._responders: Optional[_Responders] = None
        self._stop = threading.Event()
        self._refresher: Optional[threading.Thread] = None
        self.refreshes = 0
        self.last_refresh_seconds: Optional[float] = None
        self.store_failures = 0

    # lifecycle
    def __enter__(self) -> "SimulatedSwarm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "SimulatedSwarm":
        try:
            self._start_peers()
            self.dht = start_dht(self.initial_peers, client_mode=False)
            started = time.perf_counter()
            self.announce(self.servers)
            self.last_refresh_seconds = time.perf_counter() - started
            self._refresher = threading.Thread(target=self._refresh_forever, name="sim-refresh", daemon=True)
            self._refresher.start()
        except BaseException:
            self.close()
            raise
        return self

    def _start_peers(self) -> None:
        count = self.n_responders + self.n_hung
        if not count:
            return
        self._responders = _Responders(self.initial_peers)
        peer_ids = self._responders.start(count)
        live = [s for s in self.servers if s.kind == "announced"]
        dead = [s for s in self.servers if s.kind == "unreachable"]
        for server, peer_id in zip(live[: self.n_responders], peer_ids[: self.n_responders]):
            self._rename(server, peer_id, "answering")
        for server, peer_id in zip(dead[: self.n_hung], peer_ids[self.n_responders:]):
            self._rename(server, peer_id, "hung")
        self._responders.freeze(peer_ids[self.n_responders:])

    def _rename(self, server: VirtualServer, peer_id: str, kind: str) -> None:
        old = server.peer_id
        server.peer_id, server.kind = peer_id, kind
        for other in self.servers:
            pings = other.info.get("next_pings")
            if pings and old in pings:
                pings[peer_id] = pings.pop(old)

    def close(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(60)
        if self.dht is not None:
            try:
                self.dht.shutdown()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
            self.dht = None
        if self._responders is not None:
            self._responders.close()
            self._responders = None

    # announcing
    def announce(self, servers: Sequence[VirtualServer], *, in_flight: int = IN_FLIGHT) -> None:
        """Announce these servers' records (and the model index) once, in small DHT calls."""
        from petals.data_structures import ModelInfo
        from hivemind.utils import get_dht_time

        expiration_time = get_dht_time() + self.expiration
        index = [(m.dht_prefix, ModelInfo(num_blocks=m.num_blocks, repository=m.repository).to_dict())
                 for m in self.models if not m.dht_prefix.startswith("_")]
        futures = [self.dht.run_coroutine(partial(_store_models, models=index, expiration_time=expiration_time),
                                          return_future=True)]
        for batch in _batches(servers):
            futures.append(self.dht.run_coroutine(
                partial(_store_announcements, batch=batch, expiration_time=expiration_time), return_future=True))
            if len(futures) >= in_flight:
                self._collect(futures.pop(0))
        for future in futures:
            self._collect(future)

    def _collect(self, future) -> None:
        result = future.result(120)
        if result is not None:
            ok, total = result
            self.store_failures += total - ok

    def _refresh_forever(self) -> None:
        slices = [self.servers[i::SLICES_PER_PERIOD] for i in range(SLICES_PER_PERIOD)]
        while not self._stop.is_set():
            started = time.perf_counter()
            for i, part in enumerate(slices):
                if self._stop.wait(max(0.0, started + i * self.update_period / len(slices) - time.perf_counter())):
                    return
                for server in part:  # cache headroom moves as sessions come and go
                    left = server.info.get("cache_tokens_left")
                    if left is not None:
                        server.info["cache_tokens_left"] = max(0, left + random.randint(-2000, 2000))
                try:
                    self.announce(part)
                except Exception:  # noqa: BLE001 - a failed refresh is retried next period
                    self.store_failures += len(part)
            self.refreshes += 1
            self.last_refresh_seconds = time.perf_counter() - started
            self._stop.wait(max(0.0, started + self.update_period - time.perf_counter()))

    # what a benchmark or test needs to know
    def peer_ids(self, *kinds: str) -> list[str]:
        return [s.peer_id for s in self.servers if not kinds or s.kind in kinds]

    @property
    def records(self) -> int:
        """(block, peer) records announced: a server's record repeats for every block of its span."""
        return sum(s.end - s.start for s in self.servers)

    def summary(self) -> dict:
        kinds = {kind: sum(s.kind == kind for s in self.servers) for kind in KINDS}
        states = {}
        for s in self.servers:
            states[s.info["state"]] = states.get(s.info["state"], 0) + 1
        return {"servers": len(self.servers), "models": [m.dht_prefix for m in self.models],
                "records": self.records, "kinds": kinds, "states": states,
                "update_period": self.update_period, "first_announce_seconds": self.last_refresh_seconds,
                "refreshes": self.refreshes, "records_not_stored": self.store_failures}


def _batches(servers: Sequence[VirtualServer]):
    """Announcements grouped so each pickled DHT call stays under MAX_BATCH_BYTES."""
    batch, size = [], 0
    for server in servers:
        item = (server.model, server.start, server.end, server.peer_id, server.server_info().to_tuple())
        item_size = len(pickle.dumps(item))
        if batch and size + item_size > MAX_BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item_size
    if batch:
        yield batch


# ---- command line ------------------------------------------------------------------------------------


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--unreachable", type=float, default=0.1, help="fraction of peer ids with no process")
    parser.add_argument("--responders", type=int, default=8, help="virtual servers backed by a peer that answers")
    parser.add_argument("--hung", type=int, default=0, help="unreachable servers whose peer hangs (reachability checks time out)")
    parser.add_argument("--update-period", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--initial-peers", nargs="*", default=None,
                        help="join this swarm instead of starting a bootstrap peer")
    parser.add_argument("--ready-file", help="write initial peers, the summary and the peer ids by kind here "
                                             "as JSON once everything is announced")
    args = parser.parse_args(argv)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # also when started in the background (SIGINT ignored)
    bootstrap = None
    try:
        initial_peers = args.initial_peers
        if not initial_peers:
            from monitor.harness.local_swarm import LocalSwarm

            bootstrap = LocalSwarm(Path(os.devnull), "unused")  # only its bootstrap peer is started
            bootstrap.start_bootstrap()
            initial_peers = bootstrap.initial_peers
        print(f"announcing {args.servers} virtual servers for {args.models} models ...", flush=True)
        with SimulatedSwarm(initial_peers, servers=args.servers, models=args.models, unreachable=args.unreachable,
                            responders=args.responders, hung=args.hung, update_period=args.update_period,
                            seed=args.seed) as sim:
            summary = dict(sim.summary(), initial_peers=initial_peers)
            print(json.dumps(summary, indent=2), flush=True)
            if args.ready_file:
                ready = dict(summary, peers={kind: sim.peer_ids(kind) for kind in KINDS})
                tmp = Path(args.ready_file + ".tmp")
                tmp.write_text(json.dumps(ready))
                tmp.replace(args.ready_file)
            print("watch it with: swarm-monitor serve " + " ".join(f"--initial-peers {p}" for p in initial_peers),
                  flush=True)
            print("refreshing every %.0f s; Ctrl-C to stop" % args.update_period, flush=True)
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        if bootstrap is not None:
            bootstrap.close()


if __name__ == "__main__":
    main()
