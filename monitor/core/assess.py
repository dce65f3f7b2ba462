"""The one step that combines a poll's inputs into each model's assessment (``core.assessment``).

Pure: every input is given, read at one ``now``. ``assess`` takes the poll's snapshot, the latest
reachability check per peer, the compute checks of their window (``compute_checks.window``; where a
server's newest check is newer than its reachability check, the check decides whether it answers),
the server probes of the recent window (``probes.recent_window``: one window for every probe
verdict) and each model's newest generation check (counted only while ``generation.is_current``),
and returns per model the diagnosis (``coverage.diagnose``) with, per
announced server, its cause and what the probes measured of it. The poller stores the result with
its poll and again after any later input of that poll (``monitor.app.assessing``); every reader
reads what was stored. Which input makes which figure of the model page:

- state, reasons, coverage, redundancy, bottlenecks, recommendation: the snapshot and the
  reachability checks (``coverage.diagnose``);
- the best route and its speed ("measured", "partly measured", "announced"): announced speeds and
  pings, the speed probes' measurements, the reachability checks' RTTs (petals' own routing);
- each server's cause (failing, wrong outputs, slow, disagrees, unreachable): the probes and the
  compute checks (``server_assessments``, one window per kind);
- "broken" after a failed generation check: a current check only;
- the servers the model lost (served it within ``LOST_WITHIN``, by the stored polls and this one,
  and do not serve now) and whether its state rests on confirmed verdicts only
  (``Assessment.with_lost``): what the alerts and /metrics read.

Scores are not assessed here: the score job reads history and the stored assessments' verdicts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence

from monitor.core import coverage, generation
from monitor.core.assessment import (CAUSE_FAILING, CAUSE_PHRASE, CAUSE_SERVING, CAUSE_SLOW, CAUSE_UNREACHABLE,
                                     CAUSE_WRONG, Assessment, ServerAssessment)
from monitor.core.common import HOUR, short_error
from monitor.core.compute_checks import (ComputeCheck, ComputeVerdicts, failing_with, heard_from, reachability_with,
                                         since_away)
from monitor.core.compute_checks import verdicts as compute_verdicts
from monitor.core.generation import GenerationCheck
from monitor.core.probes import RecentProbes, ServerProbe, latest_per_peer, slowness
from monitor.core.snapshot import ONLINE, ReachabilityResult, ServerRow, Snapshot

log = logging.getLogger(__name__)

LOST_WITHIN = HOUR  # a server that served a model this recently and does not now is one it lost


@dataclass(frozen=True)
class Thresholds:
    """The settings an assessment is drawn with."""

    min_tokens_per_s: float
    min_cache_tokens: int
    probe_window: float  # seconds of server probes every verdict reads (``probes.recent_window``)
    generation_check_period: float  # a check older than ``generation.MAX_AGE_PERIODS`` of it is ignored
    compute_window: float = 60.0  # seconds of compute checks a verdict reads (``compute_checks.window``)


def server_assessments(recent: RecentProbes, model: str, announced_rps: Mapping[str, Optional[float]],
                       causes: Mapping[str, str], compute: Optional[ComputeVerdicts] = None,
                       failing: Optional[Mapping[str, str]] = None) -> dict[str, ServerAssessment]:
    """peer -> its assessment for ``model``: ``announced_rps``, peer -> the inference_rps it
    announces (every server of the model); ``causes``: the diagnosis' causes of the servers that
    do not serve (the others serve, or serve slowly); ``compute``: the compute checks' verdicts;
    ``failing``: the failing servers (the probes' and the checks', else the probes')."""
    speeds = recent.speeds(model)
    round_trips = recent.round_trip_speeds(model)
    confirmed = recent.confirmed(model)
    fresh = [p for p in recent.probes if p.model == model and p.at >= recent.now - recent.max_age]
    newest = latest_per_peer(fresh)
    timed = latest_per_peer(p for p in fresh if p.ok and p.seconds_per_token is not None)
    checked = latest_per_peer([p for p in fresh if p.verdict is not None])
    failing = recent.failing(model) if failing is None else failing
    wrong, disagreeing = recent.wrong(model), recent.disagreeing(model)
    counts: dict[str, int] = {}
    for probe in fresh:
        counts[probe.peer_id] = counts.get(probe.peer_id, 0) + 1
    servers = {}
    for peer, rps in announced_rps.items():
        others = [seconds for other, seconds in speeds.items() if other != peer]
        slow = slowness(speeds.get(peer), rps, others, confirmed=peer in confirmed,
                        blocks=timed[peer].blocks if peer in timed else None)
        cause = causes.get(peer) or (CAUSE_SLOW if slow is not None and slow.slow else CAUSE_SERVING)
        settled = (cause in (CAUSE_FAILING, CAUSE_WRONG) or (cause == CAUSE_SLOW and slow is not None and slow.confirmed)
                     or (cause == CAUSE_UNREACHABLE and compute is not None and peer in compute.silent))
        servers[peer] = ServerAssessment(
            peer_id=peer, cause=cause, measured=speeds.get(peer), round_trip=round_trips.get(peer),
            measured_at=timed[peer].at if peer in timed else None, slowness=slow, verdict=checked.get(peer),
            last=newest.get(peer), probes=counts.get(peer, 0), failing=failing.get(peer),
            wrong_outputs=wrong.get(peer), disagreeing=disagreeing.get(peer),
            checked=compute.newest.get(peer) if compute is not None else None, confirmed=settled)
    return servers


def assess(snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult], probes: Sequence[ServerProbe],
           checks: Mapping[str, GenerationCheck], *, now: float, thresholds: Thresholds,
           routing: coverage.Routing, compute: Sequence[ComputeCheck] = (),
           away: Mapping[str, float] = {},
           served_lately: Mapping[str, Mapping[str, Optional[str]]] = {},
           answered: Mapping[str, float] = {}) -> list[Assessment]:
    """Each polled model's assessment at ``now``. ``compute``: the compute checks of the window
    (``compute_checks``: their confirmed verdicts count as the newest evidence of whether a server
    answers and computes; ``away``: when each suspect — a server whose newest compute or
    reachability check failed — last came back from away, ``Store.last_away``: a failure before it
    counts against nobody; ``served_lately``: model -> the servers the stored polls saw serving it
    within ``LOST_WITHIN``, peer id -> public name, ``Store.serving_since``; ``answered``: peer -> when
    it last answered a user's request, ``Store.answered_since``: a failed round or unanswered compute
    checks older than that name nobody, ``compute_checks.heard_from``).
    A model whose diagnosis fails (a bug, or a value the DHT edge should
    have bounded) is assessed as not diagnosed, with the error, so that every reader shows it and
    none diagnoses by itself; the other models are not affected."""
    raw = reachability
    recent = RecentProbes(probes, now, thresholds.probe_window)
    found = compute_verdicts(compute, now=now, max_age=thresholds.compute_window, poll_at=snapshot.taken_at,
                             away=away)
    current_reachability = since_away(reachability, away)
    back = {peer: away[peer] for peer in reachability if peer not in current_reachability}  # (set aside)
    current_reachability, found = heard_from(current_reachability, found, answered)
    heard, _ = heard_from(raw, found, answered)  # (what readers are shown of it: ``assessed_reachability``)
    reachability = reachability_with(current_reachability, found)
    current = {model: check for model, check in checks.items()
               if generation.is_current(check, now, thresholds.generation_check_period)}
    assessed = []
    for model in snapshot.models:
        prefix = model.dht_prefix
        rows = snapshot.rows_for(prefix)
        failing = failing_with(recent.failing(prefix), found)
        try:
            assessment = coverage.diagnose(
                model, rows, reachability, routing=routing,
                min_tokens_per_s=thresholds.min_tokens_per_s, min_cache_tokens=thresholds.min_cache_tokens,
                measured=recent.speeds(prefix), confirmed=recent.confirmed(prefix), wrong=recent.wrong(prefix),
                disagreeing=recent.disagreeing(prefix), failing=failing,
                generation=current.get(prefix))
            servers = server_assessments(recent, prefix, {row.peer_id: row.inference_rps for row in rows},
                                         assessment.excluded_causes, found, failing)
            servers = {peer: replace(server, back_at=back[peer]) if peer in back else server
                       for peer, server in servers.items()}
        except Exception as e:  # noqa: BLE001 - one model's failure costs only its own assessment
            log.exception("assessing %s failed; stored as not diagnosed", prefix)  # (a bug: its traceback)
            assessment, servers = Assessment.not_diagnosed(prefix, model.num_blocks, short_error(e)), {}
        assessment = replace(assessment, servers=servers, assessed_at=now, poll_at=snapshot.taken_at)
        judged = assessed_reachability(heard, {prefix: assessment})
        assessment = replace(assessment, reachability={peer: judged[peer] for peer in servers if peer in judged})
        assessed.append(assessment.with_lost(lost_servers(rows, served_lately.get(prefix, {}),
                                                          assessment.excluded_peers)))
    return assessed


def lost_servers(rows: Sequence[ServerRow], served_lately: Mapping[str, Optional[str]],
                 excluded: Mapping[str, str]) -> dict[str, Optional[str]]:
    """peer id -> public name of the model's servers that served it lately (``served_lately``, or
    ONLINE in this poll's ``rows``) and do not serve now: not ONLINE in this poll, or ONLINE but
    ``excluded`` (unreachable, failing, wrong outputs). The name this poll announces, else the
    stored one."""
    names = {row.peer_id: row.public_name for row in rows if row.public_name}
    serving = {row.peer_id for row in rows if row.state == ONLINE and row.peer_id not in excluded}
    lately = {*served_lately, *(row.peer_id for row in rows if row.state == ONLINE)}
    return {peer: names.get(peer) or served_lately.get(peer) for peer in sorted(lately - serving)}


def flagged(assessments: Mapping[str, Assessment], cause: str) -> dict[str, str]:
    """peer -> why, over every model's assessment (``Assessment.flagged``): the alerts, the scores
    and the chat's weights ask about peers, whichever model they serve."""
    found: dict[str, str] = {}
    for assessment in assessments.values():
        for peer, why in assessment.flagged(cause).items():
            found.setdefault(peer, why)
    return found


def assessed_reachability(reachability: Mapping[str, ReachabilityResult], assessments: Mapping[str, Assessment]
                          ) -> dict[str, ReachabilityResult]:
    """Each peer's reachability as its assessment judged it (readers show this, not the raw round): a
    failed check from before the server was last away (``since_away``) is not shown — none since;
    where a server's newest compute check is newer than its last reachability round, the check
    decides — unreachable where the assessment calls it so (its confirmed checks went unanswered),
    answering where its newest check succeeded (``compute_checks.reachability_with``, as stored)."""
    merged = dict(reachability)
    for assessment in assessments.values():
        for peer, server in assessment.servers.items():
            check, known = server.checked, merged.get(peer)
            if (server.back_at is not None and known is not None and not known.ok and known.at is not None
                    and known.at <= server.back_at):  # a failure of before it left: not checked since it is back
                merged.pop(peer, None)
                known = None
            if check is None or (known is not None and known.at is not None and check.at <= known.at):
                continue
            if server.cause == CAUSE_UNREACHABLE and (known is None or known.ok):
                why = f"no answer to its compute checks: {check.error}" if check.error else CAUSE_PHRASE[CAUSE_UNREACHABLE]
                merged[peer] = ReachabilityResult(peer, "server", False, error=why, at=check.at)
            elif check.ok and known is not None and not known.ok and not known.joining:
                merged[peer] = ReachabilityResult(peer, "server", True, rtt=check.duration, at=check.at)
    return merged


def judged_reachability(reachability: Mapping[str, ReachabilityResult], assessments: Mapping[str, Assessment]
                        ) -> dict[str, ReachabilityResult]:
    """What readers show of each peer's reachability: for the servers of an assessment, what it
    judged (stored with it: ``Assessment.reachability``); for the other peers (bootstrap peers, the
    servers of models not assessed), the newest round as stored. An assessment stored before it
    kept its judgment is judged from the rounds as then (``assessed_reachability``)."""
    merged = dict(reachability)
    older = {model: a for model, a in assessments.items() if a.reachability is None}
    for assessment in assessments.values():
        if assessment.reachability is not None:
            for peer in assessment.servers:
                merged.pop(peer, None)
    for assessment in assessments.values():
        if assessment.reachability is not None:
            merged.update(assessment.reachability)
    return assessed_reachability(merged, older) if older else merged


def round_trip_speeds(assessments: Mapping[str, Assessment]) -> dict[str, tuple[float, float]]:
    """peer -> (seconds per token per block with the round trip, when its newest timed probe ran),
    over every model's assessment (the faster where a peer serves two)."""
    found: dict[str, tuple[float, float]] = {}
    for assessment in assessments.values():
        for peer, server in assessment.servers.items():
            if server.round_trip is not None and server.measured_at is not None:
                if peer not in found or server.round_trip < found[peer][0]:
                    found[peer] = (server.round_trip, server.measured_at)
    return found


def scoring_inputs(assessments: Mapping[str, Assessment]) -> dict:
    """What the peer scores take from the assessments (``scores.score_all``'s ``measured``, ``wrong``
    and ``failing``): per peer, the median of its newest probes' one-token steps per block, round
    trip included (the chats' own measure, so both compare), why its outputs are wrong, and the
    error it fails every inference with, if it does."""
    return {"measured": {peer: seconds for peer, (seconds, _) in round_trip_speeds(assessments).items()},
            "wrong": flagged(assessments, CAUSE_WRONG), "failing": flagged(assessments, CAUSE_FAILING)}
