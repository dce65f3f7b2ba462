"""I/O with the swarm: the process's DHT client, the scrape and the probes.

The scrape reads what servers announce in the DHT (every block of every watched model, plus the
model index ``_petals.models``) and returns one ``Snapshot``; the probes ask servers and bootstrap
peers directly whether they answer. They are separate calls, so a peer that does not answer can
slow a probe batch (bounded by its timeout) but never a scrape.

Everything in the DHT is written by peers we do not control. The ``parse_*`` functions here are
pure: they turn one raw DHT record into plain, length-limited data or raise ``InvalidRecord``, so a
malformed record is dropped and counted on its own and never poisons a poll. They reuse petals'
own parsing (``ServerInfo.from_tuple``, ``ModelInfo.from_dict``) and add what petals does not
check: bool/str coercions, spans that leave the model, oversized or control-character strings.

DHT work runs inside the DHT's own process (``DHT.run_coroutine``), which receives its arguments
through a pipe that hangs on large pickles: calls carry small batches of block uids or peer ids,
parse there, and send back compact plain tuples and dicts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import re
import time
import unicodedata
from functools import partial
from typing import Any, Optional, Sequence

from monitor import compat  # noqa: F401  (before hivemind/petals users)
from monitor.dht_options import NO_NAT_TRAVERSAL, loopback_maddrs
from monitor.reaper import guard_dht_daemons
from monitor.snapshot import ModelInfo, ProbeBatch, ProbeResult, ServerRow, Snapshot

# Imported here, before any DHT process is forked, so the DHT child already has petals loaded
# and the probe/scrape coroutines never stall its event loop on a multi-second import.
from petals.data_structures import UID_DELIMITER, RemoteModuleInfo, ServerInfo, ServerState  # noqa: E402
from petals.data_structures import ModelInfo as PetalsModelInfo  # noqa: E402
from petals.utils.dht import compute_spans  # noqa: E402

MODEL_INDEX_KEY = "_petals.models"  # petals servers announce {dht_prefix: ModelInfo.to_dict()} here

MAX_TEXT_CHARS = 200  # announced strings are cut to this after control characters are removed
MAX_RAW_TEXT_CHARS = 4096  # a longer announced string is not a name but an attack: drop the record
MAX_NUM_BLOCKS = 1024  # the largest petals model has ~130 blocks; more is a bogus announcement
MAX_DISCOVERED_MODELS = 100  # models taken from `_petals.models` per scrape
MAX_ADAPTERS = 64
MAX_NEXT_PINGS = 256
MAX_EXTRA_FIELDS = 64
MAX_PEER_ID_CHARS = 128
PROBE_BATCH_PEERS = 48  # peers per DHT call: its pickle stays under PIPE_BUF (4 KB), an atomic write
SCRAPE_BATCHES_IN_FLIGHT = 4

# p2pd's answer when the peer is up but has no rpc_info handler (yet): "protocol not supported",
# or in newer daemons "failed to negotiate protocol: protocols not supported: [...]"
_NOT_SERVED = re.compile(r"protocols? not supported")

_CONTROL_CATEGORIES = {"Cc", "Cf", "Cs", "Co"}  # controls, format (bidi, zero-width), surrogates, private
_STRING_FIELDS = ("public_name", "version", "torch_dtype", "quant_type")


def start_dht(initial_peers: Sequence[str], *, client_mode: bool = True, startup_timeout: float = 60, **kwargs):
    """Start this process's DHT client, with NAT traversal and relays off.

    A client-mode peer listens on loopback only; it dials out to the initial peers it is given.
    """
    import hivemind

    options = dict(NO_NAT_TRAVERSAL)
    options.update(kwargs)
    options.setdefault("host_maddrs", loopback_maddrs())
    dht = hivemind.DHT(
        initial_peers=list(initial_peers),
        client_mode=client_mode,
        start=True,
        startup_timeout=startup_timeout,
        **options,
    )
    guard_dht_daemons(dht)
    return dht


# ---- validation of what peers announce (pure) -----------------------------------------------


class InvalidRecord(ValueError):
    """One announced record is malformed; it is dropped and counted, the poll goes on."""


def clean_text(value: Any, *, limit: int = MAX_TEXT_CHARS) -> Optional[str]:
    """An announced string as safe data: control/format characters removed, at most `limit` chars.

    None stays None; a non-string or a string longer than MAX_RAW_TEXT_CHARS is invalid.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecord(f"expected a string, got {type(value).__name__}")
    if len(value) > MAX_RAW_TEXT_CHARS:
        raise InvalidRecord(f"string of {len(value)} characters (limit {MAX_RAW_TEXT_CHARS})")
    kept = "".join(ch for ch in value if unicodedata.category(ch) not in _CONTROL_CATEGORIES)
    return kept[:limit]


def parse_peer_id(value: Any) -> str:
    """A peer id as its canonical base58 string, or InvalidRecord."""
    from hivemind.p2p import PeerID

    if not isinstance(value, str) or not 0 < len(value) <= MAX_PEER_ID_CHARS:
        raise InvalidRecord(f"peer id must be a short string, got {type(value).__name__}")
    try:
        canonical = PeerID.from_base58(value).to_base58()
    except Exception as e:  # noqa: BLE001 - any decoding failure means "not a peer id"
        raise InvalidRecord(f"not a base58 peer id: {e!r}"[:MAX_TEXT_CHARS]) from None
    if canonical != value:
        raise InvalidRecord("peer id is not in canonical base58 form")
    return canonical


def parse_dht_prefix(value: Any) -> str:
    """A model's dht_prefix as announced under `_petals.models`; it becomes part of DHT keys, so it
    is rejected (not cleaned) if it has a delimiter, whitespace or control characters."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT_CHARS:
        raise InvalidRecord(f"dht_prefix must be a string of 1..{MAX_TEXT_CHARS} characters")
    if UID_DELIMITER in value or any(ch.isspace() or unicodedata.category(ch)[0] == "C" for ch in value):
        raise InvalidRecord(f"dht_prefix {value[:40]!r} contains '.', whitespace or control characters")
    return value


def parse_model_entry(dht_prefix: Any, raw: Any) -> tuple[str, int, Optional[str]]:
    """One entry of `_petals.models` -> (dht_prefix, num_blocks, repository)."""
    prefix = parse_dht_prefix(dht_prefix)
    if not isinstance(raw, dict) or len(raw) > MAX_EXTRA_FIELDS or not all(isinstance(k, str) for k in raw):
        raise InvalidRecord(f"model {prefix}: entry must be a small dict with string keys")
    try:
        info = PetalsModelInfo.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - pydantic/TypeError: the peer sent garbage
        raise InvalidRecord(f"model {prefix}: {e}"[:MAX_TEXT_CHARS]) from None
    if info.num_blocks > MAX_NUM_BLOCKS:
        raise InvalidRecord(f"model {prefix}: num_blocks={info.num_blocks} exceeds {MAX_NUM_BLOCKS}")
    return prefix, info.num_blocks, clean_text(info.repository)


def parse_server_record(raw: Any, *, num_blocks: int) -> dict:
    """One server's announcement (petals ``ServerInfo.to_tuple()``) -> a plain dict of clean fields.

    Unknown extra fields are ignored, as petals does, so newer servers still parse.
    """
    if not isinstance(raw, (tuple, list)) or not 2 <= len(raw) <= 8:
        raise InvalidRecord(f"expected (state, throughput, extra), got {type(raw).__name__}")
    state, throughput = raw[0], raw[1]
    extra = raw[2] if len(raw) > 2 else {}
    if type(state) is not int or state not in {s.value for s in ServerState}:
        raise InvalidRecord(f"state must be one of {[s.value for s in ServerState]}, got {state!r}"[:MAX_TEXT_CHARS])
    if isinstance(throughput, bool) or not isinstance(throughput, (int, float)):
        raise InvalidRecord(f"throughput must be a number, got {type(throughput).__name__}")
    if not isinstance(extra, dict) or len(extra) > MAX_EXTRA_FIELDS or not all(isinstance(k, str) for k in extra):
        raise InvalidRecord("extra info must be a small dict with string keys")
    for name in _STRING_FIELDS:  # petals would coerce bytes to str; a peer sending bytes is broken
        if extra.get(name) is not None and not isinstance(extra[name], str):
            raise InvalidRecord(f"{name} must be a string, got {type(extra[name]).__name__}")
    if extra.get("using_relay") is not None and not isinstance(extra["using_relay"], bool):
        raise InvalidRecord(f"using_relay must be a bool, got {type(extra['using_relay']).__name__}")
    if not isinstance(extra.get("adapters", ()), (list, tuple)) or len(extra.get("adapters", ())) > MAX_ADAPTERS:
        raise InvalidRecord(f"adapters must be a list of at most {MAX_ADAPTERS} names")
    if extra.get("next_pings") is not None and (
        not isinstance(extra["next_pings"], dict) or len(extra["next_pings"]) > MAX_NEXT_PINGS
    ):
        raise InvalidRecord(f"next_pings must be a dict of at most {MAX_NEXT_PINGS} entries")

    try:
        info = ServerInfo.from_tuple((state, throughput, extra))
    except Exception as e:  # noqa: BLE001 - pydantic ValidationError, TypeError, ValueError
        raise InvalidRecord(" ".join(str(e).split())[:MAX_TEXT_CHARS]) from None

    start, end = info.start_block, info.end_block
    if start is not None and end is not None and not start < end <= num_blocks:
        raise InvalidRecord(f"span {start}:{end} is empty or leaves the model's {num_blocks} blocks")
    if (start is not None and start >= num_blocks) or (end is not None and end > num_blocks):
        raise InvalidRecord(f"span {start}:{end} leaves the model's {num_blocks} blocks")

    return {
        "state": info.state.value,
        "throughput": float(info.throughput),
        "start_block": start,
        "end_block": end,
        "public_name": clean_text(info.public_name),
        "version": clean_text(info.version),
        "torch_dtype": clean_text(info.torch_dtype),
        "quant_type": clean_text(info.quant_type),
        "network_rps": _optional_float(info.network_rps),
        "forward_rps": _optional_float(info.forward_rps),
        "inference_rps": _optional_float(info.inference_rps),
        "adapters": tuple(clean_text(name) for name in info.adapters),
        "using_relay": info.using_relay,
        "cache_tokens_left": info.cache_tokens_left,
        "next_pings": {parse_peer_id(peer): float(rtt) for peer, rtt in (info.next_pings or {}).items()},
    }


def block_in_announced_span(record: dict, block: int) -> bool:
    """A record found under a block its own announced span does not contain is inconsistent."""
    start, end = record["start_block"], record["end_block"]
    return (start is None or start <= block) and (end is None or block < end)


def _optional_float(value) -> Optional[float]:
    return None if value is None else float(value)


# ---- coroutines that run inside the DHT process ---------------------------------------------


async def _read_model_index(dht, node) -> tuple[dict[str, tuple[int, Optional[str]]], int]:
    """`_petals.models` -> ({dht_prefix: (num_blocks, repository)}, invalid entry count)."""
    found = await node.get(MODEL_INDEX_KEY, latest=True)
    if found is None:
        return {}, 0
    if not isinstance(found.value, dict):
        return {}, 1
    models, invalid = {}, 0
    for subkey, entry in found.value.items():
        try:
            prefix, num_blocks, repository = parse_model_entry(subkey, getattr(entry, "value", None))
            models[prefix] = (num_blocks, repository)
        except InvalidRecord:
            invalid += 1
    return models, invalid


async def _read_blocks(dht, node, uids: list[str], num_blocks: dict[str, int]) -> dict:
    """Fetch a batch of block uids; parse each distinct (peer, record) once.

    Returns {"records": [clean dict], "placements": [(uid position, peer id, record index)],
    "invalid": count of rejected (block, peer) entries}.
    """
    num_workers = len(uids) if dht.num_workers is None else min(len(uids), dht.num_workers)
    found = await node.get_many(uids, math.inf, num_workers=max(num_workers, 1))

    records: list[dict] = []
    placements: list[tuple[int, str, int]] = []
    invalid = 0
    parsed: dict[tuple, list[tuple[Any, Optional[int]]]] = {}  # (subkey, expiration) -> [(raw, index)]
    for position, uid in enumerate(uids):
        prefix, block = uid.rsplit(UID_DELIMITER, 1)
        entry = found.get(uid)
        if entry is None:
            continue
        if not isinstance(entry.value, dict):
            invalid += 1
            continue
        for subkey, item in entry.value.items():
            raw = getattr(item, "value", None)
            key = (subkey, getattr(item, "expiration_time", None))
            index = _parsed_index(parsed.setdefault(key, []), raw)
            if index is _UNPARSED:
                try:
                    peer_id = parse_peer_id(subkey)
                    records.append(dict(parse_server_record(raw, num_blocks=num_blocks[prefix]), peer_id=peer_id))
                    index = len(records) - 1
                except Exception:  # noqa: BLE001 - InvalidRecord, or anything a hostile value triggers
                    index = None
                parsed[key].append((raw, index))
            if index is None or not block_in_announced_span(records[index], int(block)):
                invalid += 1
                continue
            placements.append((position, records[index]["peer_id"], index))
    return {"records": records, "placements": placements, "invalid": invalid}


_UNPARSED = object()


def _parsed_index(candidates: list, raw):
    for seen_raw, index in candidates:
        try:
            if seen_raw == raw:
                return index
        except Exception:  # noqa: BLE001 - exotic values may refuse comparison
            continue
    return _UNPARSED


MAX_CALL_BYTES = 12_000  # uid characters per DHT call: a few calls in flight stay far below the pipe's 64 KB


def _batches_by_size(uids: list[str], max_count: int) -> list[list[str]]:
    """Cut the block uids into DHT calls of at most ``max_count`` uids and ~MAX_CALL_BYTES bytes:
    prefixes are announced by peers and may be long, and a large call kills hivemind's DHT process."""
    batches, current, size = [], [], 0
    for uid in uids:
        if current and (len(current) >= max_count or size + len(uid) + 8 > MAX_CALL_BYTES):
            batches.append(current)
            current, size = [], 0
        current.append(uid)
        size += len(uid) + 8
    if current:
        batches.append(current)
    return batches


_PROBE_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def _probe_semaphore(concurrency: int) -> asyncio.Semaphore:
    """One semaphore per DHT event loop, shared by all the batches of probes in flight, so that
    at most ``concurrency`` probes run at once whatever the batching (lives in the DHT process)."""
    key = (id(asyncio.get_running_loop()), concurrency)
    if key not in _PROBE_SEMAPHORES:
        _PROBE_SEMAPHORES[key] = asyncio.Semaphore(concurrency)
    return _PROBE_SEMAPHORES[key]


async def _probe_servers(dht, node, peer_ids: list[str], timeout: float, concurrency: int) -> list[tuple]:
    """rpc_info on each peer, at most `concurrency` at once -> [(peer, ok, rtt, error, joining)]."""
    from hivemind.p2p import PeerID
    from hivemind.proto import runtime_pb2
    from petals.server.handler import TransformerConnectionHandler

    semaphore = _probe_semaphore(concurrency)

    async def probe(peer: str) -> tuple:
        async with semaphore:
            started = time.perf_counter()
            try:
                stub = TransformerConnectionHandler.get_stub(node.p2p, PeerID.from_base58(peer))
                # empty uid: the server answers about its first block, whatever span it serves
                await asyncio.wait_for(stub.rpc_info(runtime_pb2.ExpertUID(), timeout=timeout), timeout)
                return peer, True, time.perf_counter() - started, None, False
            except asyncio.TimeoutError:
                return peer, False, None, f"no answer to rpc_info within {timeout:g} s", False
            except Exception as e:  # noqa: BLE001 - every failure is a probe result
                message = str(e) or repr(e)
                if _NOT_SERVED.search(message):  # handlers not registered yet: still joining
                    return peer, False, None, "joining: rpc_info not served yet", True
                return peer, False, None, _short_error(message), False

    return list(await asyncio.gather(*(probe(peer) for peer in peer_ids)))


async def _probe_bootstrap(dht, node, targets: list[tuple[str, str]], timeout: float) -> list[tuple]:
    """Connect to each (peer id, multiaddr) and ping its DHT -> [(peer, ok, rtt, error)]."""
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils.multiaddr import Multiaddr

    async def probe(peer: str, address: str) -> tuple:
        try:
            peer_id = PeerID.from_base58(peer)
            async with asyncio.timeout(timeout):
                # the daemon client's connect (as health.petals.dev does): dials this exact address
                await node.p2p._client.connect(peer_id, [Multiaddr(address).decapsulate(Multiaddr(f"/p2p/{peer}"))])
                started = time.perf_counter()
                request = dht_pb2.PingRequest(peer=node.protocol.node_info)
                await node.protocol.get_stub(peer_id).rpc_ping(request, timeout=timeout)
                return peer, True, time.perf_counter() - started, None
        except (asyncio.TimeoutError, TimeoutError):
            return peer, False, None, f"no connection and DHT ping within {timeout:g} s"
        except Exception as e:  # noqa: BLE001 - every failure is a probe result
            return peer, False, None, _short_error(str(e) or repr(e))

    return list(await asyncio.gather(*(probe(peer, address) for peer, address in targets)))


def _submit(dht, coroutine):
    """Start a coroutine in the DHT process; a dead DHT process gives a failed future, not a crash."""
    try:
        return dht.run_coroutine(coroutine, return_future=True)
    except Exception as e:  # noqa: BLE001 - e.g. BrokenPipeError after the DHT process died
        failed = concurrent.futures.Future()
        failed.set_exception(RuntimeError(f"the DHT client process is not running ({e!r}); restart the monitor"))
        return failed


def _short_error(message: str) -> str:
    return clean_text(" ".join(message[:MAX_RAW_TEXT_CHARS].split())) or "error"


# ---- the scrape --------------------------------------------------------------------------------


def scrape(
    dht,
    models: Sequence[ModelInfo],
    *,
    discover: bool = True,
    batch_blocks: int = 256,
    timeout: float = 60.0,
) -> Snapshot:
    """Read every block of every watched model (and, with `discover`, of every model announced under
    `_petals.models`) and return one Snapshot: a ServerRow per (peer, model).

    A configured model whose num_blocks is unset (None or 0) takes it from `_petals.models`; if no
    server announces it there, the model is left out with an error in ``Snapshot.errors``.
    Each round of DHT calls is bounded by `timeout` seconds; a failed call costs its models (named in
    ``errors``), not the scrape. Invalid records are counted per (block, peer) entry.
    """
    if batch_blocks < 1:
        raise ValueError(f"batch_blocks must be at least 1, got {batch_blocks}")
    taken_at, started = time.time(), time.perf_counter()
    errors: list[str] = []
    invalid = 0

    index: dict[str, tuple[int, Optional[str]]] = {}
    if discover or any(not m.num_blocks for m in models):
        future = _submit(dht, _read_model_index)
        try:
            index, invalid = future.result(timeout)
        except Exception as e:  # noqa: BLE001 - the scrape goes on without the index
            future.cancel()
            errors.append(f"reading {MODEL_INDEX_KEY} from the DHT failed: {_short_error(repr(e))}")
    watched, model_errors = _resolve_models(models, index, discover=discover)
    errors.extend(model_errors)

    uids = [f"{m.dht_prefix}{UID_DELIMITER}{i}" for m in watched for i in range(m.num_blocks)]
    num_blocks = {m.dht_prefix: m.num_blocks for m in watched}
    batches = _batches_by_size(uids, batch_blocks)
    blocks: dict[str, list[dict[str, dict]]] = {m.dht_prefix: [{} for _ in range(m.num_blocks)] for m in watched}
    failed: set[str] = set()

    for window in range(0, len(batches), SCRAPE_BATCHES_IN_FLIGHT):
        deadline = time.monotonic() + timeout
        pending = [
            (batch, _submit(dht, partial(_read_blocks, uids=batch, num_blocks=num_blocks)))
            for batch in batches[window : window + SCRAPE_BATCHES_IN_FLIGHT]
        ]
        for batch, future in pending:
            try:
                result = future.result(max(0.0, deadline - time.monotonic()))
            except Exception as e:  # noqa: BLE001 - this batch's models are marked failed
                future.cancel()
                prefixes = sorted({uid.rsplit(UID_DELIMITER, 1)[0] for uid in batch})
                failed.update(prefixes)
                errors.append(f"reading blocks {batch[0]}..{batch[-1]} from the DHT failed "
                              f"({_short_error(repr(e))}); models {prefixes} are left out of this snapshot")
                continue
            invalid += result["invalid"]
            for position, peer_id, record_index in result["placements"]:
                prefix, block = batch[position].rsplit(UID_DELIMITER, 1)
                blocks[prefix][int(block)][peer_id] = result["records"][record_index]

    servers = [row for m in watched if m.dht_prefix not in failed for row in _rows_for_model(m, blocks[m.dht_prefix])]
    return Snapshot(
        taken_at=taken_at,
        duration=time.perf_counter() - started,
        models=tuple(watched),
        servers=tuple(servers),
        invalid_records=invalid,
        errors=tuple(errors),
    )


def _resolve_models(
    configured: Sequence[ModelInfo], index: dict[str, tuple[int, Optional[str]]], *, discover: bool
) -> tuple[list[ModelInfo], list[str]]:
    """Configured models (num_blocks filled from the index when unset), then discovered ones."""
    from dataclasses import replace

    watched, errors, seen = [], [], set()
    for model in configured:
        try:
            parse_dht_prefix(model.dht_prefix)
        except InvalidRecord as e:
            errors.append(f"configured model {model.dht_prefix!r} is left out: {e}; use the dht_prefix petals "
                          f"servers announce (the model name with '.' replaced)")
            continue
        if model.dht_prefix in seen:
            errors.append(f"model {model.dht_prefix!r} is configured twice; watching it once")
            continue
        seen.add(model.dht_prefix)
        if model.num_blocks:
            watched.append(model)
        elif model.dht_prefix in index:
            num_blocks, repository = index[model.dht_prefix]
            watched.append(replace(model, num_blocks=num_blocks, repository=model.repository or repository))
        else:
            errors.append(f"model {model.dht_prefix!r} has no num_blocks configured and no server announces it "
                          f"under {MODEL_INDEX_KEY}; set num_blocks for it in the settings")
    if discover:
        found = sorted((prefix, entry) for prefix, entry in index.items() if prefix not in seen)
        if len(found) > MAX_DISCOVERED_MODELS:
            errors.append(f"{len(found)} models are announced under {MODEL_INDEX_KEY}; watching the first "
                          f"{MAX_DISCOVERED_MODELS} by dht_prefix (configure the ones you need)")
        for prefix, (num_blocks, repository) in found[:MAX_DISCOVERED_MODELS]:
            watched.append(ModelInfo(dht_prefix=prefix, num_blocks=num_blocks, repository=repository,
                                     name=_name_from_repository(repository), official=False))
    return watched, errors


def _name_from_repository(repository: Optional[str]) -> Optional[str]:
    if not repository:
        return None
    return repository.removeprefix("https://huggingface.co/").strip("/") or None


def _rows_for_model(model: ModelInfo, blocks: list[dict[str, dict]]) -> list[ServerRow]:
    """Spans by petals' compute_spans (announced start/end preferred, the best state wins)."""
    from hivemind.p2p import PeerID

    if not blocks:
        return []
    peer_ids: dict[str, PeerID] = {}
    infos: dict[int, ServerInfo] = {}  # id(record) -> the minimal ServerInfo compute_spans needs
    by_info: dict[int, dict] = {}
    module_infos = []
    for block, servers in enumerate(blocks):
        module_servers = {}
        for peer, record in servers.items():
            if id(record) not in infos:
                info = ServerInfo(state=ServerState(record["state"]), throughput=record["throughput"],
                                  start_block=record["start_block"], end_block=record["end_block"])
                infos[id(record)], by_info[id(info)] = info, record
            if peer not in peer_ids:
                peer_ids[peer] = PeerID.from_base58(peer)
            module_servers[peer_ids[peer]] = infos[id(record)]
        module_infos.append(RemoteModuleInfo(uid=f"{model.dht_prefix}{UID_DELIMITER}{block}", servers=module_servers))

    rows = []
    for peer_id, span in sorted(compute_spans(module_infos, min_state=ServerState.OFFLINE).items()):
        record = by_info[id(span.server_info)]
        rows.append(ServerRow(
            peer_id=peer_id.to_base58(), model=model.dht_prefix, start=span.start, end=span.end,
            state=span.state.name, throughput=record["throughput"], inference_rps=record["inference_rps"],
            forward_rps=record["forward_rps"], network_rps=record["network_rps"],
            cache_tokens_left=record["cache_tokens_left"], version=record["version"],
            torch_dtype=record["torch_dtype"], quant_type=record["quant_type"],
            using_relay=record["using_relay"], public_name=record["public_name"],
            adapters=record["adapters"], next_pings=dict(record["next_pings"]),
        ))
    return rows


# ---- the probes --------------------------------------------------------------------------------


def probe_servers(dht, peer_ids: Sequence[str], *, timeout: float = 5.0, concurrency: int = 32) -> ProbeBatch:
    """Ask each server for its rpc_info, concurrently: ok and RTT, or why not.

    N silent peers cost about ``ceil(N / concurrency) * timeout`` seconds, never N * timeout.
    A server that answers "protocol not supported" is still loading its blocks (joining=True).
    """
    if timeout <= 0 or concurrency < 1:
        raise ValueError(f"probe timeout must be > 0 and concurrency >= 1, got {timeout} and {concurrency}")
    taken_at, started = time.time(), time.perf_counter()
    results: dict[str, ProbeResult] = {}
    valid = []
    for peer in dict.fromkeys(peer_ids):
        try:
            valid.append(parse_peer_id(peer))
        except InvalidRecord as e:
            results[peer] = ProbeResult(peer_id=str(peer)[:MAX_TEXT_CHARS], kind="server", ok=False, error=str(e))

    # All batches go at once; a semaphore shared inside the DHT process bounds the concurrency.
    # Each call stays under PIPE_BUF (4 KB pickled), so concurrent writes to hivemind's command
    # pipe are atomic and a slow peer holds up only its own probe, not a whole batch.
    batches = [valid[i : i + PROBE_BATCH_PEERS] for i in range(0, len(valid), PROBE_BATCH_PEERS)]
    pending = [
        (batch, _submit(dht, partial(_probe_servers, peer_ids=batch, timeout=timeout, concurrency=concurrency)))
        for batch in batches
    ]
    waits = math.ceil(len(valid) / concurrency) * timeout + 30
    for batch, future in pending:
        try:
            for peer, ok, rtt, error, joining in future.result(waits):
                results[peer] = ProbeResult(peer_id=peer, kind="server", ok=ok, rtt=rtt, error=error,
                                            joining=joining)
        except Exception as e:  # noqa: BLE001 - the DHT process failed this batch
            future.cancel()
            for peer in batch:
                results[peer] = ProbeResult(peer_id=peer, kind="server", ok=False,
                                            error=f"probe batch failed in the DHT process: {_short_error(repr(e))}")
    ordered = tuple(results[peer] for peer in dict.fromkeys(peer_ids))
    return ProbeBatch(taken_at=taken_at, duration=time.perf_counter() - started, results=ordered)


def probe_bootstrap(dht, initial_peers: Sequence[str], timeout: float = 5.0) -> list[ProbeResult]:
    """Connect to each bootstrap multiaddr and ping its DHT, all at once."""
    from hivemind.utils.multiaddr import Multiaddr

    results: dict[str, ProbeResult] = {}
    targets = []
    for address in dict.fromkeys(initial_peers):
        try:
            peer = parse_peer_id(Multiaddr(address).value_for_protocol("p2p"))
            targets.append((peer, address))
        except Exception as e:  # noqa: BLE001 - a bad configured address is a failed probe, named
            results[address] = ProbeResult(
                peer_id="", kind="bootstrap", ok=False, address=clean_text(address[:MAX_RAW_TEXT_CHARS]),
                error=f"not a multiaddr ending in /p2p/<peer id>: {_short_error(repr(e))}",
            )
    if targets:
        future = _submit(dht, partial(_probe_bootstrap, targets=targets, timeout=timeout))
        try:
            answers = future.result(timeout + 30)
        except Exception as e:  # noqa: BLE001
            future.cancel()
            answers = [(peer, False, None, f"probe failed in the DHT process: {_short_error(repr(e))}")
                       for peer, _ in targets]
        for (peer, ok, rtt, error), (_, address) in zip(answers, targets):
            results[address] = ProbeResult(peer_id=peer, kind="bootstrap", ok=ok, rtt=rtt, error=error,
                                           address=address)
    return [results[address] for address in dict.fromkeys(initial_peers)]
