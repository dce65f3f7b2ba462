"""The assess job: each model's assessment (``monitor.core.assess``) from what the store holds.

The scrape job assesses its own poll before storing it (``assess_poll``: the poll and its
assessments land in one transaction); every other input of that poll — a reachability round, a
probe round, a compute-check round that changed a verdict, a generation check — is followed by ``assess_latest``, which assesses the newest
stored poll again with the newest inputs and stores that against the same poll (readers take the
newest). Each reads its inputs at one ``now``: the server probes and compute checks of their
windows, the generation checks and the servers the stored polls saw serving within the last hour
(what each model lost). petals' own routing prices the routes (``monitor.swarm.routing``).
"""

from __future__ import annotations

import logging
import time
from typing import Mapping, Optional

from monitor.core.assess import LOST_WITHIN, Thresholds, assess
from monitor.core.assessment import Assessment
from monitor.core.compute_checks import away_ended, suspects, window as compute_window
from monitor.core.probes import recent_window
from monitor.core.snapshot import ONLINE, ReachabilityResult, Snapshot, unreachable
from monitor.store import StoreError
from monitor.swarm.routing import PETALS_ROUTING

log = logging.getLogger(__name__)

ASSESS_TRIES = 3  # a newer poll stored by another process meanwhile: assess that one instead
AWAY_HORIZON = 3600.0  # seconds: a failed reachability check older than this is not set against an absence


def thresholds(settings) -> Thresholds:
    return Thresholds(min_tokens_per_s=settings.min_tokens_per_s, min_cache_tokens=settings.min_cache_tokens,
                      probe_window=recent_window(settings.speed_probe_period),
                      generation_check_period=settings.generation_check_period,
                      compute_window=compute_window(settings.compute_check_period))


def assess_poll(store, settings, snapshot: Snapshot, reachability: Mapping[str, ReachabilityResult],
                now: Optional[float] = None) -> list[Assessment]:
    """Each model of ``snapshot`` assessed at ``now`` with the stored probes and generation checks
    (an input the store cannot give is left out, logged: the assessment then goes by what it has
    rather than not at all)."""
    now = time.time() if now is None else now
    limits = thresholds(settings)
    try:
        probes = store.recent_server_probes(now - limits.probe_window)
    except StoreError as e:
        log.warning("server probes not read, assessing by announced speeds: %s", e)
        probes = []
    try:
        checks = store.latest_generation_checks()
    except StoreError as e:
        log.warning("generation checks not read, assessing without them: %s", e)
        checks = {}
    try:
        computed = store.recent_compute_checks(now - limits.compute_window)
    except StoreError as e:
        log.warning("compute checks not read, assessing without them: %s", e)
        computed = []
    # the servers whose newest compute or reachability check failed: were they away (a restart) since?
    # (of the servers this poll announces ONLINE, within the last hour: rounds recheck those every period)
    online = {row.peer_id for row in snapshot.servers if row.state == ONLINE}
    failed = {peer: check.at for peer, check in reachability.items()
              if peer in online and unreachable(check) and check.at is not None and check.at >= now - AWAY_HORIZON}
    # (from a little before the oldest failure: the poll that saw its server away may precede it)
    since = min([now - limits.compute_window, *failed.values()]) - 2 * settings.scrape_period
    try:
        away = away_ended(store.last_away(suspects(computed, now=now, max_age=limits.compute_window) + sorted(failed),
                                          since), snapshot.taken_at, online)
    except StoreError as e:
        log.warning("server history not read, compute checks taken as they are: %s", e)
        away = {}
    try:  # the servers that answered users' requests since the oldest failure read: busy, not gone
        answered = store.answered_since(since)
    except StoreError as e:
        log.warning("chat outcomes not read, assessing by the checks alone: %s", e)
        answered = {}
    return assess(snapshot, reachability, probes, checks, now=now, thresholds=limits, routing=PETALS_ROUTING,
                  compute=computed, away=away, served_lately=served_lately(store, snapshot.taken_at),
                  answered=answered)


def served_lately(store, poll_at: float) -> dict[str, dict[str, Optional[str]]]:
    """model -> peer id -> public name: the servers the stored polls saw serving each model within
    ``LOST_WITHIN`` of the poll assessed (what it lost is drawn from them). A failed read: nothing
    lost, logged (the next assessment reads again)."""
    try:
        found: dict[str, dict[str, Optional[str]]] = {}
        for peer, name, model, _ in store.serving_since(poll_at - LOST_WITHIN):
            served = found.setdefault(model, {})
            served[peer] = served.get(peer) or name
        return found
    except StoreError as e:
        log.warning("the servers of the last hour not read, assessing without what the models lost: %s", e)
        return {}


def assess_latest(store, settings, snapshot: Optional[Snapshot] = None) -> bool:
    """The newest stored poll assessed again with the newest inputs, stored against it. ``snapshot``:
    that poll, if the caller has it (else read). False if there is no poll, or if other processes
    kept storing newer ones."""
    for _ in range(ASSESS_TRIES):
        if snapshot is None:
            snapshot = store.latest_snapshot()
            if snapshot is None:
                return False
        assessed = assess_poll(store, settings, snapshot, store.latest_reachability())
        if store.record_assessments(assessed, taken_at=snapshot.taken_at):
            return True
        snapshot = None  # a newer poll, stored by another process: read it
    return False
