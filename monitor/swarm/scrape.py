"""The scrape: what servers announce in the DHT, read into one ``Snapshot``.

It reads every block of every watched model (and the model index ``_petals.models``), parses each
announcement once with ``announce.parse_server_record`` inside the DHT process, and builds each
server's span with petals' own ``compute_spans``. Work per poll is bounded, whatever peers announce:

- ``MAX_SERVERS_PER_BLOCK`` announcements are read per block (ONLINE first, then by peer id);
- ``MAX_SERVERS_PER_MODEL`` distinct servers are kept per model (the ones serving most blocks);
- ``MAX_DISCOVERED_MODELS`` models are taken from ``_petals.models`` besides the configured ones,
  which are always watched; when more are announced, the ones with the most distinct servers on
  their first block win, so squatting on model names cannot push real models out.

What is dropped or cut is counted and named in the snapshot's errors.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Optional, Sequence

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.common import short_error
from monitor.core.snapshot import ModelInfo, ServerRow, Snapshot
from monitor.swarm.announce import InvalidRecord, ParsedServer, parse_dht_prefix, parse_model_entry, parse_peer_id, \
    parse_server_record
from monitor.swarm.client import submit
from petals.data_structures import UID_DELIMITER, RemoteModuleInfo, ServerInfo, ServerState
from petals.utils.dht import compute_spans

MODEL_INDEX_KEY = "_petals.models"  # petals servers announce {dht_prefix: ModelInfo.to_dict()} here
MAX_DISCOVERED_MODELS = 100  # models taken from `_petals.models` per scrape, besides the configured ones
MAX_INDEX_ENTRIES = 2000  # entries of `_petals.models` parsed per scrape
MAX_SERVERS_PER_BLOCK = 256  # announcements read per block
MAX_SERVERS_PER_MODEL = 1024  # distinct servers kept per model
SCRAPE_BATCHES_IN_FLIGHT = 4
MAX_CALL_BYTES = 12_000  # uid characters per DHT call: a few calls in flight stay far below the pipe's 64 KB
_ONLINE = ServerState.ONLINE.value


# ---- coroutines that run inside the DHT process ---------------------------------------------


async def _read_model_index(dht, node) -> tuple[dict[str, tuple[int, Optional[str]]], int]:
    """`_petals.models` -> ({dht_prefix: (num_blocks, repository)}, invalid entry count)."""
    found = await node.get(MODEL_INDEX_KEY, latest=True)
    if found is None:
        return {}, 0
    if not isinstance(found.value, dict):
        return {}, 1
    models, invalid = {}, 0
    for n, (subkey, entry) in enumerate(found.value.items()):
        if n >= MAX_INDEX_ENTRIES:
            invalid += len(found.value) - MAX_INDEX_ENTRIES
            break
        try:
            prefix, num_blocks, repository = parse_model_entry(subkey, getattr(entry, "value", None))
            models[prefix] = (num_blocks, repository)
        except InvalidRecord:
            invalid += 1
    return models, invalid


async def _count_servers(dht, node, uids: list[str]) -> dict[str, int]:
    """uid -> how many distinct, well-formed peer ids announce it (ranks discovered models)."""
    found = await node.get_many(uids, math.inf, num_workers=max(1, min(len(uids), dht.num_workers or len(uids))))
    counts = {}
    for uid in uids:
        entry = found.get(uid)
        value = getattr(entry, "value", None)
        if not isinstance(value, dict):
            counts[uid] = 0
            continue
        valid = 0
        for subkey in list(value)[:MAX_SERVERS_PER_BLOCK]:
            try:
                parse_peer_id(subkey)
                valid += 1
            except InvalidRecord:
                pass
        counts[uid] = valid
    return counts


async def _read_blocks(dht, node, uids: list[str], num_blocks: dict[str, int]) -> dict:
    """Fetch a batch of block uids; parse each distinct (peer, record) once.

    Returns {"records": [ParsedServer], "placements": [(uid position, peer id, record index)],
    "invalid": count of rejected (block, peer) entries, "over_cap": entries beyond the per-block cap}.
    """
    num_workers = len(uids) if dht.num_workers is None else min(len(uids), dht.num_workers)
    found = await node.get_many(uids, math.inf, num_workers=max(num_workers, 1))

    records: list[ParsedServer] = []
    placements: list[tuple[int, str, int]] = []
    invalid = over_cap = 0
    parsed: dict[tuple, list[tuple]] = {}  # (subkey, expiration) -> [(raw, index)]
    for position, uid in enumerate(uids):
        prefix, block = uid.rsplit(UID_DELIMITER, 1)
        entry = found.get(uid)
        if entry is None:
            continue
        if not isinstance(entry.value, dict):
            invalid += 1
            continue
        kept = []
        for subkey, item in entry.value.items():
            raw = getattr(item, "value", None)
            key = (subkey, getattr(item, "expiration_time", None))
            index = _parsed_index(parsed.setdefault(key, []), raw)
            if index is _UNPARSED:
                try:
                    peer_id = parse_peer_id(subkey)
                    records.append(parse_server_record(raw, num_blocks=num_blocks[prefix], peer_id=peer_id))
                    index = len(records) - 1
                except Exception:  # noqa: BLE001 - InvalidRecord, or anything a hostile value triggers
                    index = None
                parsed[key].append((raw, index))
            if index is None or not records[index].covers(int(block)):
                invalid += 1
                continue
            kept.append(index)
        if len(kept) > MAX_SERVERS_PER_BLOCK:
            kept.sort(key=lambda i: (records[i].state != _ONLINE, records[i].peer_id))
            over_cap += len(kept) - MAX_SERVERS_PER_BLOCK
            kept = kept[:MAX_SERVERS_PER_BLOCK]
        placements.extend((position, records[i].peer_id, i) for i in kept)
    return {"records": records, "placements": placements, "invalid": invalid, "over_cap": over_cap}


_UNPARSED = object()


def _parsed_index(candidates: list, raw):
    for seen_raw, index in candidates:
        try:
            if seen_raw == raw:
                return index
        except Exception:  # noqa: BLE001 - exotic values may refuse comparison
            continue
    return _UNPARSED


def batches_by_size(uids: list[str], max_count: int, max_bytes: int = MAX_CALL_BYTES) -> list[list[str]]:
    """Cut the block uids into DHT calls of at most ``max_count`` uids and ~``max_bytes`` bytes:
    prefixes are announced by peers and may be long, and a large call kills hivemind's DHT process."""
    batches: list[list[str]] = []
    current: list[str] = []
    size = 0
    for uid in uids:
        if current and (len(current) >= max_count or size + len(uid) + 8 > max_bytes):
            batches.append(current)
            current, size = [], 0
        current.append(uid)
        size += len(uid) + 8
    if current:
        batches.append(current)
    return batches


# ---- the scrape --------------------------------------------------------------------------------


def scrape(
    dht,
    models: Sequence[ModelInfo],
    *,
    discover: bool = True,
    batch_blocks: int = 256,
    timeout: float = 60.0,
) -> Snapshot:
    """Read every block of every watched model (and, with `discover`, of the models announced under
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
    index, invalid_entries = _model_index(dht, models, discover=discover, timeout=timeout, errors=errors)
    watched, model_errors = _resolve_models(models, index, discover=discover)
    errors.extend(model_errors)
    if discover:
        watched = _rank_discovered(dht, watched, errors, timeout)
    found = _read_watched_blocks(dht, watched, batch_blocks=batch_blocks, timeout=timeout, errors=errors)
    servers, clamped = _server_rows(watched, found, errors)
    return Snapshot(
        taken_at=taken_at,
        duration=time.perf_counter() - started,
        models=tuple(watched),
        servers=tuple(servers),
        invalid_records=invalid_entries + found.invalid,
        clamped_values=clamped,
        errors=tuple(errors),
    )


def _model_index(dht, models: Sequence[ModelInfo], *, discover: bool, timeout: float,
                 errors: list[str]) -> tuple[dict[str, tuple[int, Optional[str]]], int]:
    """`_petals.models` when the scrape needs it (to discover models, or to size a configured one):
    ({dht_prefix: (num_blocks, repository)}, invalid entry count); empty when it cannot be read."""
    if not (discover or any(not m.num_blocks for m in models)):
        return {}, 0
    future = submit(dht, _read_model_index)
    try:
        return future.result(timeout)
    except Exception as e:  # noqa: BLE001 - the scrape goes on without the index
        future.cancel()
        errors.append(f"reading {MODEL_INDEX_KEY} from the DHT failed: {short_error(e)}")
        return {}, 0


@dataclass
class _BlocksRead:
    """What the block reads found: per model, per block, peer id -> its record; the models whose
    reads failed; rejected entries and entries beyond the per-block cap."""

    blocks: dict[str, list[dict[str, ParsedServer]]]
    failed: set[str] = field(default_factory=set)
    invalid: int = 0
    over_cap: int = 0

    def add(self, batch: list[str], result: dict) -> None:
        """One DHT call's result (``_read_blocks``) for the uids of ``batch``."""
        self.invalid += result["invalid"]
        self.over_cap += result["over_cap"]
        for position, peer_id, record_index in result["placements"]:
            prefix, block = batch[position].rsplit(UID_DELIMITER, 1)
            self.blocks[prefix][int(block)][peer_id] = result["records"][record_index]

    def fail(self, batch: list[str], error: BaseException) -> str:
        """The models of a failed call are left out of the snapshot; the error that says so."""
        prefixes = sorted({uid.rsplit(UID_DELIMITER, 1)[0] for uid in batch})
        self.failed.update(prefixes)
        return (f"reading blocks {batch[0]}..{batch[-1]} from the DHT failed "
                f"({short_error(error)}); models {prefixes} are left out of this snapshot")


def _read_watched_blocks(dht, watched: Sequence[ModelInfo], *, batch_blocks: int, timeout: float,
                         errors: list[str]) -> _BlocksRead:
    """Every block of every watched model, in DHT calls of at most ``batch_blocks`` uids,
    ``SCRAPE_BATCHES_IN_FLIGHT`` at a time."""
    uids = [f"{m.dht_prefix}{UID_DELIMITER}{i}" for m in watched for i in range(m.num_blocks)]
    num_blocks = {m.dht_prefix: m.num_blocks for m in watched}
    batches = batches_by_size(uids, batch_blocks)
    found = _BlocksRead({m.dht_prefix: [{} for _ in range(m.num_blocks)] for m in watched})
    for window in range(0, len(batches), SCRAPE_BATCHES_IN_FLIGHT):
        _read_batches(dht, batches[window : window + SCRAPE_BATCHES_IN_FLIGHT], num_blocks, timeout, found, errors)
    if found.over_cap:
        errors.append(f"{found.over_cap} announcements beyond {MAX_SERVERS_PER_BLOCK} per block were not read")
    return found


def _read_batches(dht, batches: list[list[str]], num_blocks: dict[str, int], timeout: float,
                  found: _BlocksRead, errors: list[str]) -> None:
    """Some DHT calls in flight at once, all within one ``timeout``; a failed call costs its models."""
    deadline = time.monotonic() + timeout
    pending = [(batch, submit(dht, partial(_read_blocks, uids=batch, num_blocks=num_blocks))) for batch in batches]
    for batch, future in pending:
        try:
            result = future.result(max(0.0, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - this batch's models are marked failed
            future.cancel()
            errors.append(found.fail(batch, e))
            continue
        found.add(batch, result)


def _server_rows(watched: Sequence[ModelInfo], found: _BlocksRead, errors: list[str]) -> tuple[list[ServerRow], int]:
    """A row per (peer, model) of every model read in full, at most MAX_SERVERS_PER_MODEL servers
    each; also the number of values clamped in their records."""
    servers: list[ServerRow] = []
    clamped = 0
    for model in watched:
        if model.dht_prefix in found.failed:
            continue
        per_block = _cap_servers(model, found.blocks[model.dht_prefix], errors)
        rows, model_clamped = _rows_for_model(model, per_block)
        servers.extend(rows)
        clamped += model_clamped
    return servers, clamped


def _resolve_models(
    configured: Sequence[ModelInfo], index: dict[str, tuple[int, Optional[str]]], *, discover: bool
) -> tuple[list[ModelInfo], list[str]]:
    """Configured models (num_blocks filled from the index when unset), then every discovered one."""
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
        for prefix, (num_blocks, repository) in sorted(index.items()):
            if prefix not in seen:
                watched.append(ModelInfo(dht_prefix=prefix, num_blocks=num_blocks, repository=repository,
                                         name=_name_from_repository(repository), official=False))
    return watched, errors


def _rank_discovered(dht, watched: list[ModelInfo], errors: list[str], timeout: float) -> list[ModelInfo]:
    """Configured models, then at most MAX_DISCOVERED_MODELS discovered ones: those with the most
    distinct servers on their first block (ties by dht_prefix)."""
    configured = [m for m in watched if m.official]
    discovered = [m for m in watched if not m.official]
    if len(discovered) <= MAX_DISCOVERED_MODELS:
        return watched
    uids = [f"{m.dht_prefix}{UID_DELIMITER}0" for m in discovered]
    counts: dict[str, int] = {}
    for batch in batches_by_size(uids, 256):
        future = submit(dht, partial(_count_servers, uids=batch))
        try:
            counts.update(future.result(timeout))
        except Exception as e:  # noqa: BLE001 - unranked models count as unserved
            future.cancel()
            errors.append(f"ranking discovered models failed for {len(batch)} of them: {short_error(e)}")
    ranked = sorted(discovered, key=lambda m: (-counts.get(f"{m.dht_prefix}{UID_DELIMITER}0", 0), m.dht_prefix))
    errors.append(f"{len(discovered)} models are announced under {MODEL_INDEX_KEY}; watching the "
                  f"{MAX_DISCOVERED_MODELS} with the most servers (configure the ones you need)")
    return configured + ranked[:MAX_DISCOVERED_MODELS]


def _cap_servers(model: ModelInfo, blocks: list[dict[str, ParsedServer]], errors: list[str]) -> list[dict]:
    """At most MAX_SERVERS_PER_MODEL distinct servers: those announced on the most blocks."""
    counts: dict[str, int] = {}
    for servers in blocks:
        for peer in servers:
            counts[peer] = counts.get(peer, 0) + 1
    if len(counts) <= MAX_SERVERS_PER_MODEL:
        return blocks
    keep = set(sorted(counts, key=lambda p: (-counts[p], p))[:MAX_SERVERS_PER_MODEL])
    errors.append(f"model {model.dht_prefix}: {len(counts)} servers announced, kept the "
                  f"{MAX_SERVERS_PER_MODEL} that serve the most blocks")
    return [{peer: record for peer, record in servers.items() if peer in keep} for servers in blocks]


def _name_from_repository(repository: Optional[str]) -> Optional[str]:
    if not repository:
        return None
    return repository.removeprefix("https://huggingface.co/").strip("/") or None


def _rows_for_model(model: ModelInfo, blocks: list[dict[str, ParsedServer]]) -> tuple[list[ServerRow], int]:
    """Spans by petals' compute_spans (announced start/end preferred, the best state wins);
    also the number of values clamped in the records these rows came from."""
    from hivemind.p2p import PeerID

    if not blocks:
        return [], 0
    peer_ids: dict[str, PeerID] = {}
    infos: dict[int, ServerInfo] = {}  # id(record) -> the minimal ServerInfo compute_spans needs
    by_info: dict[int, ParsedServer] = {}
    module_infos = []
    for block, servers in enumerate(blocks):
        module_servers = {}
        for peer, record in servers.items():
            if id(record) not in infos:
                info = ServerInfo(state=ServerState(record.state), throughput=record.throughput,
                                  start_block=record.start_block, end_block=record.end_block)
                infos[id(record)], by_info[id(info)] = info, record
            if peer not in peer_ids:
                peer_ids[peer] = PeerID.from_base58(peer)
            module_servers[peer_ids[peer]] = infos[id(record)]
        module_infos.append(RemoteModuleInfo(uid=f"{model.dht_prefix}{UID_DELIMITER}{block}", servers=module_servers))

    rows, clamped = [], 0
    for peer_id, span in sorted(compute_spans(module_infos, min_state=ServerState.OFFLINE).items()):
        record = by_info[id(span.server_info)]
        clamped += record.clamped
        rows.append(ServerRow(
            peer_id=peer_id.to_base58(), model=model.dht_prefix, start=span.start, end=span.end,
            state=span.state.name, throughput=record.throughput, inference_rps=record.inference_rps,
            forward_rps=record.forward_rps, network_rps=record.network_rps,
            cache_tokens_left=record.cache_tokens_left, version=record.version,
            torch_dtype=record.torch_dtype, quant_type=record.quant_type,
            using_relay=record.using_relay, public_name=record.public_name,
            adapters=record.adapters, next_pings=dict(record.next_pings),
        ))
    return rows, clamped
