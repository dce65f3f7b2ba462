"""The swarm's current state as one dict in health.petals.dev's ``/api/v1/state`` shape (pure).

health.petals.dev's consumers read ``bootstrap_states``, ``top_contributors``, ``model_reports[]``
(each with ``server_rows[]`` carrying ``span`` = {peer_id, start, end, server_info}),
``reachability_issues``, ``last_updated``, ``update_period`` and ``update_duration``; those keep
their names and meanings here. Our additions ride alongside: per model ``degraded``, ``reasons``,
``monitor_state`` (healthy / degraded / broken), coverage figures and a ``recommendation``; per
server row ``score``; top level ``scores``, ``recommendations``, ``bootstrap_peers`` and ``poll``.

The dashboard's pages render from this same dict, so the page and the API never disagree.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from monitor.snapshot import JOINING, OFFLINE, ONLINE, ModelInfo, ProbeResult, ServerRow, Snapshot

ROW_STATES = ("online", "joining", "offline", "unreachable")


def _finite(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def peer_id_of_multiaddr(maddr: str) -> Optional[str]:
    """``/ip4/1.2.3.4/tcp/31337/p2p/Qm...`` -> ``Qm...``."""
    parts = maddr.split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "p2p":
            return parts[i + 1] or None
    return None


def model_name(model: ModelInfo) -> str:
    """A human name: the configured one, else the repository path, else the DHT prefix."""
    if model.name:
        return model.name
    if model.repository:
        parts = urlsplit(model.repository)
        path = parts.path.strip("/")
        if path and parts.scheme in ("", "http", "https"):
            return path
    return model.dht_prefix


def is_unreachable(probe: Optional[ProbeResult]) -> bool:
    """A failed probe means unreachable, unless the peer answered that it is still loading."""
    return probe is not None and not probe.ok and not probe.joining


def row_state(row: ServerRow, probe: Optional[ProbeResult]) -> str:
    """online / joining / offline / unreachable, as health.petals.dev names a server row's state."""
    if row.state == ONLINE and is_unreachable(probe):
        return "unreachable"
    return {ONLINE: "online", JOINING: "joining", OFFLINE: "offline"}.get(row.state, "offline")


def server_info(row: ServerRow) -> dict:
    """The row as petals' ``ServerInfo`` fields (the names health.petals.dev's JSON carries)."""
    return {
        "state": row.state.lower(),
        "throughput": _finite(row.throughput) if row.throughput is not None else 0.0,
        "start_block": row.start,
        "end_block": row.end,
        "public_name": row.public_name,
        "version": row.version,
        "network_rps": _finite(row.network_rps),
        "forward_rps": _finite(row.forward_rps),
        "inference_rps": _finite(row.inference_rps),
        "adapters": list(row.adapters),
        "torch_dtype": row.torch_dtype,
        "quant_type": row.quant_type,
        "using_relay": row.using_relay,
        "cache_tokens_left": row.cache_tokens_left,
        "next_pings": {peer: _finite(rtt) for peer, rtt in row.next_pings.items()} if row.next_pings else None,
    }


def score_dict(score: Any) -> Optional[dict]:
    if score is None:
        return None
    if isinstance(score, Mapping):
        return dict(score)
    if hasattr(score, "to_dict"):
        return score.to_dict()
    return {"peer_id": getattr(score, "peer_id", None), "score": getattr(score, "score", None),
            "explanation": list(getattr(score, "explanation", ()))}


def score_value(score: Any) -> Optional[float]:
    data = score_dict(score)
    return None if data is None else data.get("score")


def server_rows(model: ModelInfo, rows: Sequence[ServerRow], probes: Mapping[str, ProbeResult],
                scores: Mapping[str, Any]) -> list[dict]:
    """One dict per server of this model, as health.petals.dev's ``server_rows[]``, sorted by peer id."""
    result = []
    for row in sorted(rows, key=lambda r: (r.peer_id, r.start)):
        state = row_state(row, probes.get(row.peer_id))
        entry = {
            "short_peer_id": "..." + row.peer_id[-6:],
            "peer_id": row.peer_id,
            "peer_ip_info": "unknown",
            "show_public_name": state == "online" and bool(row.public_name),
            "state": state,
            "span": {"peer_id": row.peer_id, "start": row.start, "end": row.end, "length": row.length,
                     "server_info": server_info(row)},
            "adapters": [{"name": name, "short_name": name.split("/")[-1]} for name in row.adapters],
            "pings_to_me": {
                other.peer_id: _finite(other.next_pings[row.peer_id])
                for other in rows
                if other.peer_id != row.peer_id and row.peer_id in other.next_pings
            },
            "score": score_value(scores.get(row.peer_id)),
        }
        if row.cache_tokens_left is not None and row.length > 0:
            # keys and values: two cache entries per token per block, as health.petals.dev divides
            entry["cache_tokens_left_per_block"] = row.cache_tokens_left // (row.length * 2)
        result.append(entry)
    return result


def _recommendation(health: Any) -> Optional[dict]:
    rec = getattr(health, "recommendation", None)
    if rec is None:
        return None
    return {"start": rec.start, "end": rec.end, "num_blocks": rec.num_blocks,
            "block_indices": f"{rec.start}:{rec.end}", "argument": rec.argument, "reason": rec.reason}


def model_report(model: ModelInfo, rows: Sequence[ServerRow], status: Mapping[str, Any], health: Any,
                 probes: Mapping[str, ProbeResult], scores: Mapping[str, Any]) -> dict:
    """One ``model_reports[]`` entry. ``status``: the stored diagnosis of the last poll (state,
    reasons, coverage_pct, ...); ``health``: ``coverage.diagnose`` of the same rows (blocks, ranges,
    recommendation)."""
    monitor_state = status.get("state") or getattr(health, "state", "broken")
    name = model_name(model)
    repository = model.repository
    href = repository if repository and urlsplit(repository).scheme in ("http", "https") else None
    return {
        # health.petals.dev's fields
        "num_blocks": model.num_blocks,
        "repository": repository,
        "dht_prefix": model.dht_prefix,
        "official": model.official,
        "limited": False,
        "name": name,
        "short_name": name.split("/")[-1],
        "href": href,
        "state": "broken" if monitor_state == "broken" else "healthy",
        "server_rows": server_rows(model, rows, probes, scores),
        # ours
        "monitor_state": monitor_state,
        "degraded": monitor_state == "degraded",
        "reasons": list(status.get("reasons") or getattr(health, "reasons", ()) or ()),
        "coverage_pct": _finite(status.get("coverage_pct", getattr(health, "coverage_pct", None))),
        "servers_online": status.get("servers_online", getattr(health, "servers_online", None)),
        "min_redundancy": status.get("min_redundancy", getattr(health, "min_redundancy", None)),
        "est_tokens_per_s": _finite(status.get("est_tokens_per_s", getattr(health, "est_tokens_per_s", None))),
        "recommendation": _recommendation(health),
    }


def bootstrap_peers(initial_peers: Sequence[str], probes: Mapping[str, ProbeResult]) -> list[dict]:
    """Each bootstrap peer (configured first, then any other probed as one) with its state."""
    order: list[str] = []
    addresses: dict[str, str] = {}
    for maddr in initial_peers:
        peer = peer_id_of_multiaddr(maddr)
        if peer and peer not in addresses:
            order.append(peer)
            addresses[peer] = maddr
    for peer, probe in sorted(probes.items()):
        if probe.kind == "bootstrap" and peer not in addresses:
            order.append(peer)
            addresses[peer] = probe.address or ""
    result = []
    for peer in order:
        probe = probes.get(peer)
        state = "unknown" if probe is None else "online" if probe.ok else "unreachable"
        result.append({"peer_id": peer, "address": addresses[peer], "state": state,
                       "rtt": _finite(probe.rtt) if probe else None, "error": probe.error if probe else None})
    return result


def top_contributors(snapshot: Snapshot, probes: Mapping[str, ProbeResult]) -> dict[str, int]:
    """public_name -> blocks it serves online (reachable), most first."""
    counts: Counter = Counter()
    for row in snapshot.servers:
        if row.public_name and row_state(row, probes.get(row.peer_id)) == "online":
            counts[row.public_name] += row.length
    return dict(counts.most_common())


def reachability_issues(probes: Mapping[str, ProbeResult]) -> list[dict]:
    return [
        {"peer_id": peer, "err": probe.error or "unreachable", "kind": probe.kind}
        for peer, probe in sorted(probes.items())
        if is_unreachable(probe)
    ]


def build_state(
    snapshot: Snapshot,
    *,
    model_status: Mapping[str, Mapping[str, Any]],
    healths: Mapping[str, Any],
    probes: Mapping[str, ProbeResult],
    scores: Mapping[str, Any],
    initial_peers: Sequence[str],
    update_period: float,
) -> dict:
    """The whole ``/api/v1/state`` dict for one snapshot (JSON-ready: plain types, no NaN)."""
    reports = [
        model_report(model, snapshot.rows_for(model.dht_prefix), model_status.get(model.dht_prefix, {}),
                     healths.get(model.dht_prefix), probes, scores)
        for model in snapshot.models
    ]
    boot = bootstrap_peers(initial_peers, probes)
    return {
        "bootstrap_states": [peer["state"] for peer in boot],
        "top_contributors": top_contributors(snapshot, probes),
        "model_reports": reports,
        "reachability_issues": reachability_issues(probes),
        "last_updated": snapshot.taken_at,
        "update_period": update_period,
        "update_duration": snapshot.duration,
        # ours
        "bootstrap_peers": boot,
        "scores": {peer: score_dict(score) for peer, score in sorted(scores.items())},
        "recommendations": {r["dht_prefix"]: r["recommendation"] for r in reports if r["recommendation"]},
        "poll": {"taken_at": snapshot.taken_at, "duration": snapshot.duration,
                 "invalid_records": snapshot.invalid_records, "errors": list(snapshot.errors)},
    }
