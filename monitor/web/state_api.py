"""The swarm's current state as one dict in health.petals.dev's ``/api/v1/state`` shape (pure).

health.petals.dev's consumers read ``bootstrap_states``, ``top_contributors``, ``model_reports[]``
(each with ``server_rows[]`` carrying ``span`` = {peer_id, start, end, server_info}),
``reachability_issues``, ``last_updated``, ``update_period`` and ``update_duration``; those keep
their names and meanings here. Our additions ride alongside: per model ``degraded``, ``reasons``,
``monitor_state`` (healthy / degraded / broken), coverage figures, ``speed_source`` (whether
``est_tokens_per_s`` is measured by the speed probes or as announced) and a ``recommendation``; per
server row ``score``; top level ``scores``, ``recommendations``, ``bootstrap_peers`` and ``poll``.

The dashboard's pages render from this same dict, so the page and the API never disagree.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from monitor.core.common import finite
from monitor.core.assessment import BROKEN, DEGRADED, Assessment
from monitor.core.generation import GenerationCheck
from monitor.core.leadership import PollerStatus, takeover_within
from monitor.core.scores import PeerScore
from monitor.core.snapshot import (JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityResult, ServerRow, Snapshot,
                                   session_room, unreachable)

ROW_STATES = ("online", "joining", "offline", "unreachable")


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


def row_state(row: ServerRow, check: Optional[ReachabilityResult]) -> str:
    """online / joining / offline / unreachable, as health.petals.dev names a server row's state."""
    if row.state == ONLINE and unreachable(check):
        return "unreachable"
    return {ONLINE: "online", JOINING: "joining", OFFLINE: "offline"}.get(row.state, "offline")


def server_info(row: ServerRow) -> dict:
    """The row as petals' ``ServerInfo`` fields (the names health.petals.dev's JSON carries)."""
    return {
        "state": row.state.lower(),
        "throughput": finite(row.throughput) if row.throughput is not None else 0.0,
        "start_block": row.start,
        "end_block": row.end,
        "public_name": row.public_name,
        "version": row.version,
        "network_rps": finite(row.network_rps),
        "forward_rps": finite(row.forward_rps),
        "inference_rps": finite(row.inference_rps),
        "adapters": list(row.adapters),
        "torch_dtype": row.torch_dtype,
        "quant_type": row.quant_type,
        "using_relay": row.using_relay,
        "cache_tokens_left": row.cache_tokens_left,
        "next_pings": {peer: finite(rtt) for peer, rtt in row.next_pings.items()} if row.next_pings else None,
    }


def score_dict(score: Optional[PeerScore]) -> Optional[dict]:
    """A peer's score as the API and the peer page show it; None while it is not scored yet."""
    return None if score is None else score.to_dict()


def server_rows(model: ModelInfo, rows: Sequence[ServerRow], reachability: Mapping[str, ReachabilityResult],
                scores: Mapping[str, PeerScore]) -> list[dict]:
    """One dict per server of this model, as health.petals.dev's ``server_rows[]``, sorted by peer id."""
    result = []
    for row in sorted(rows, key=lambda r: (r.peer_id, r.start)):
        state = row_state(row, reachability.get(row.peer_id))
        score = scores.get(row.peer_id)
        entry = {
            "short_peer_id": "..." + row.peer_id[-6:],  # health.petals.dev's exact form (ASCII dots)
            "peer_id": row.peer_id,
            "peer_ip_info": "unknown",
            "show_public_name": state == "online" and bool(row.public_name),
            "state": state,
            "span": {"peer_id": row.peer_id, "start": row.start, "end": row.end, "length": row.length,
                     "server_info": server_info(row)},
            "adapters": [{"name": name, "short_name": name.split("/")[-1]} for name in row.adapters],
            "pings_to_me": {
                other.peer_id: finite(other.next_pings[row.peer_id])
                for other in rows
                if other.peer_id != row.peer_id and row.peer_id in other.next_pings
            },
            "score": None if score is None else score.score,
        }
        if row.cache_tokens_left is not None and row.length > 0:
            # keys and values: two cache entries per token per block, as health.petals.dev divides
            entry["cache_tokens_left_per_block"] = session_room(row.cache_tokens_left, row.length)
        result.append(entry)
    return result


def monitor_state(assessment: Optional[Assessment]) -> str:
    """The model's state by its diagnosis; a model without one (no known blocks: it cannot be
    diagnosed) counts as broken."""
    return BROKEN if assessment is None else assessment.state


def _diagnosis_fields(assessment: Optional[Assessment]) -> dict:
    """Our additions to a model report, from its diagnosis (None: a model without known blocks,
    which cannot be diagnosed and so counts as broken)."""
    if assessment is None:
        return {"monitor_state": monitor_state(assessment), "degraded": False, "reasons": [], "coverage_pct": None,
                "servers_online": None, "min_redundancy": None, "est_tokens_per_s": None, "speed_source": None,
                "recommendation": None}
    rec = assessment.recommendation
    recommendation = None if rec is None else {
        "start": rec.start, "end": rec.end, "num_blocks": rec.num_blocks, "block_indices": f"{rec.start}:{rec.end}",
        "argument": rec.argument, "reason": rec.reason}
    return {
        "monitor_state": monitor_state(assessment),
        "degraded": assessment.state == DEGRADED,
        "reasons": list(assessment.reasons),
        "coverage_pct": finite(assessment.coverage_pct),
        "servers_online": assessment.servers_online,
        "min_redundancy": assessment.min_redundancy,
        "est_tokens_per_s": finite(assessment.est_tokens_per_s),
        # what the estimate rests on: "measured" (speed probes), "partly measured", "announced"; None: no route
        "speed_source": assessment.speed_source if assessment.est_tokens_per_s is not None else None,
        "recommendation": recommendation,
    }


def model_report(model: ModelInfo, rows: Sequence[ServerRow], assessment: Optional[Assessment],
                 reachability: Mapping[str, ReachabilityResult], scores: Mapping[str, PeerScore]) -> dict:
    """One ``model_reports[]`` entry. ``assessment``: the model's diagnosis for the latest poll and
    probe round, as the poller stored it."""
    ours = _diagnosis_fields(assessment)
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
        "state": "broken" if ours["monitor_state"] == BROKEN else "healthy",
        "server_rows": server_rows(model, rows, reachability, scores),
        **ours,
    }


def generation_check_dict(check: Optional[GenerationCheck]) -> Optional[dict]:
    """A model's newest generation check as the state API carries it (None: never checked)."""
    if check is None:
        return None
    return {"ok": check.ok, "at": check.at, "error": check.error, "answer": check.answer, "expect": check.expect,
            "matched": check.matched, "time_to_first_token": finite(check.time_to_first_token),
            "tokens_per_second": finite(check.tokens_per_second), "tokens": check.tokens,
            "duration": finite(check.duration), "route": list(check.route_peers),
            "failed_peers": list(check.failed_peers)}


def bootstrap_addresses(initial_peers: Sequence[str], reachability: Mapping[str, ReachabilityResult]) -> dict[str, str]:
    """peer id -> address of each bootstrap peer, in order: the configured ones first, then any
    other checked as one."""
    addresses: dict[str, str] = {}
    for maddr in initial_peers:
        peer = peer_id_of_multiaddr(maddr)
        if peer and peer not in addresses:
            addresses[peer] = maddr
    for peer, check in sorted(reachability.items()):
        if check.kind == "bootstrap" and peer not in addresses:
            addresses[peer] = check.address or ""
    return addresses


def bootstrap_peers(initial_peers: Sequence[str], reachability: Mapping[str, ReachabilityResult]) -> list[dict]:
    """Each bootstrap peer (``bootstrap_addresses``) with its state."""
    result = []
    for peer, address in bootstrap_addresses(initial_peers, reachability).items():
        check = reachability.get(peer)
        state = "unknown" if check is None else "online" if check.ok else "unreachable"
        result.append({"peer_id": peer, "address": address, "state": state,
                       "rtt": finite(check.rtt) if check else None, "error": check.error if check else None})
    return result


def top_contributors(snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult]) -> dict[str, int]:
    """public_name -> blocks it serves online (reachable), most first."""
    counts: Counter = Counter()
    for row in snapshot.servers:
        if row.public_name and row_state(row, reachability.get(row.peer_id)) == "online":
            counts[row.public_name] += row.length
    return dict(counts.most_common())


def unreachable_peers(snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult],
                      bootstrap: Iterable[str]) -> list[str]:
    """Peers whose latest check failed, among the latest poll's servers and the bootstrap peers
    only (sorted): a peer that announced itself once and left is not an issue forever."""
    peers = {row.peer_id for row in snapshot.servers} | set(bootstrap)
    return [peer for peer, check in sorted(reachability.items()) if peer in peers and unreachable(check)]


def reachability_issues(snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult],
                        bootstrap: Iterable[str]) -> list[dict]:
    """``unreachable_peers`` with their errors, as health.petals.dev's ``reachability_issues``."""
    return [{"peer_id": peer, "err": reachability[peer].error or "unreachable", "kind": reachability[peer].kind}
            for peer in unreachable_peers(snapshot, reachability, bootstrap)]


def build_state(
    snapshot: Snapshot,
    *,
    assessments: Mapping[str, Assessment],
    reachability: Mapping[str, ReachabilityResult],
    scores: Mapping[str, PeerScore],
    initial_peers: Sequence[str],
    update_period: float,
    generation: Mapping[str, GenerationCheck] = {},
) -> dict:
    """The whole ``/api/v1/state`` dict for one snapshot (JSON-ready: plain types, no NaN)."""
    reports = [
        {**model_report(model, snapshot.rows_for(model.dht_prefix), assessments.get(model.dht_prefix), reachability, scores),
         "generation_check": generation_check_dict(generation.get(model.dht_prefix))}
        for model in snapshot.models
    ]
    boot = bootstrap_peers(initial_peers, reachability)
    return {
        "bootstrap_states": [peer["state"] for peer in boot],
        "top_contributors": top_contributors(snapshot, reachability),
        "model_reports": reports,
        "reachability_issues": reachability_issues(snapshot, reachability, (peer["peer_id"] for peer in boot)),
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


def poller_section(status: Optional[PollerStatus], *, database: str) -> dict:
    """Who polls the store, as the state API, the overview and /metrics say it: the leader (host,
    pid, start, since when, its lease), the standbys seen recently (each with what it cannot
    reach), the recent take-overs, and on SQLite that one poller is all it takes (high availability
    needs PostgreSQL). ``status``: None while the database does not say."""
    single = None if database == "postgresql" else (
        "SQLite: one poller per database file (a standby on the same file works, but a frozen leader "
        "holds the file's lock); several pollers on several machines need PostgreSQL")
    if status is None:
        return {"summary": "unknown: the database did not answer", "leading": False, "leader": None,
                "lapsed": None, "standbys": [], "standbys_seen": 0, "takeovers": [], "lease_seconds": None,
                "takeover_within": None, "single": single}
    lease, member = status.leader, status.holder_member
    leader = None if lease is None else {
        "host": lease.host, "pid": lease.pid, "started_at": lease.started_at, "since": lease.since,
        "epoch": lease.epoch, "lease_expires_at": lease.deadline,
        "last_poll_at": member.last_poll_at if member else None, "problem": member.problem if member else None}
    last = status.lease
    standbys = [{"host": m.host, "pid": m.pid, "started_at": m.started_at, "seen_at": m.seen_at, "problem": m.problem}
                for m in status.standbys()]
    return {
        "summary": status.summary(),
        "leading": leader is not None,
        "leader": leader,
        # the last leader whose lease ran out (None while one leads)
        "lapsed": None if leader is not None or last is None else {
            "host": last.host, "pid": last.pid, "epoch": last.epoch, "lease_expired_at": last.deadline,
            "last_poll_at": member.last_poll_at if member else None},
        "standbys": standbys,
        "standbys_seen": len(standbys),
        "takeovers": [{"at": t.since, "epoch": t.epoch, "host": t.host, "pid": t.pid, "reason": t.reason,
                       "previous_host": t.previous_host, "previous_pid": t.previous_pid, "summary": t.summary()}
                      for t in status.takeovers],
        "lease_seconds": status.lease_seconds,
        "takeover_within": takeover_within(status.lease_seconds) if status.lease_seconds else None,
        "single": single,
    }
