"""The measuring job: speed and correctness probes of every ONLINE server, on their own schedule.

On a thread of its own, whenever a server is due (and at least every tick, a second to ``TICK_MAX``
seconds, for servers that just appeared) it probes the servers that are due: each
(server, model) once per ``speed_probe_period``, except that a probe which would change the
server's verdict (slow or not, ``core.probes.worth_confirming``) is confirmed after half a
period, so a server throttled just after a probe is named slow within two periods; and less often
when its last probe took so long that the next would exceed ``speed_probe_max_share`` of the
server's time (``core.probes.next_probe_delay``): a probe's cost to a server is the time its
steps took, so the share it takes is bounded by ``speed_probe_max_share`` whatever the server's
speed. A server judged slow, wrong or failing is *recovering* (routing sends it nothing, and its
recovery is what is worth knowing): it is probed every quarter period, within 2.5 times
``speed_probe_max_share``, and a probe that would clear it is confirmed 5 % of a period later, so
its recovery is seen within a minute at the defaults (``next_probe_delay(recovering=True)``).
At most ``speed_probe_concurrency`` sessions run at once over all servers. Probes run on their own thread
and event loop (``swarm.speed.ProbeLoop``), so a slow or silent server never delays a scrape or a
page; the DHT process only answers one tiny call.

Correctness: a model with a local ``path`` is checked against the monitor's own computation of
its blocks (``swarm.correctness.ReferenceModel``; the whole span per probe); other models' servers
are compared with one another segment by segment (``swarm.correctness.CrossCheck``). Each round's
probes are stored (``Store.record_server_probes``) and then the newest stored poll (not the one the
round started from: a poll may land meanwhile) is assessed again with them (``after_round``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Optional

from monitor.core.common import short_peer_id
from monitor.core.assessment import CAUSE_FAILING, CAUSE_SLOW, CAUSE_WRONG
from monitor.core.probes import (
    WRONG,
    BY_PEERS,
    BY_REFERENCE,
    ServerProbe,
    first_server_error,
    judge,
    latest_per_peer,
    measured_speeds,
    next_probe_delay,
    recent_window,
    refused_with_room,
    tolerance,
    worth_confirming,
)
from monitor.app.rounds import start_rounds
from monitor.core.snapshot import ONLINE, ServerRow, Snapshot
from monitor.swarm.correctness import CrossCheck, ReferenceModel, relative_error
from monitor.swarm.speed import ProbeLoop, SpanResult, SpanTarget

log = logging.getLogger(__name__)

TICK_MAX = 15.0  # seconds between two looks for servers that are due


def tick_seconds(period: float) -> float:
    """How often the job looks for due servers: new servers are measured within this long."""
    return min(TICK_MAX, max(1.0, period / 4))


class ServerProber:
    """Probes servers that are due, judges their outputs, stores what it measured."""

    def __init__(self, settings, store, dht, *, snapshot: Callable[[], Optional[Snapshot]],
                 after_round: Optional[Callable[[], object]] = None):
        """``snapshot``: the newest poll (whose ONLINE servers are probed); ``after_round``: called
        once a round's probes are stored, to diagnose the newest poll again with them."""
        self.settings = settings
        self.store = store
        self.dht = dht
        self.snapshot = snapshot
        self.after_round = after_round
        self.period = settings.speed_probe_period
        self.max_age = recent_window(self.period)
        self.cross = CrossCheck(max_age=self.max_age)
        self.next_due: dict[tuple[str, str], float] = {}
        self.rounds = self.probes = self.failures = 0
        self._loop: Optional[ProbeLoop] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._paths = {m.dht_prefix: m.path for m in settings.models if m.path is not None}
        self._references: dict[str, Optional[ReferenceModel]] = {}  # built on first use; None: unusable

    # ---- one round ---------------------------------------------------------------------------
    def run_once(self, now: Optional[float] = None) -> list[ServerProbe]:
        """Probe every due server once; returns (and stores) the probes."""
        snapshot = self.snapshot()
        if snapshot is None:
            return []
        now = time.time() if now is None else now
        rows = self._due_rows(snapshot, now)
        if not rows:
            return []
        blocks = {model.dht_prefix: model.num_blocks for model in snapshot.models}
        targets = [self._target(row, snapshot, blocks.get(row.model, 0)) for row in rows]
        if self._loop is None:
            self._loop = ProbeLoop(self.dht, concurrency=self.settings.speed_probe_concurrency)
        try:
            results = self._loop.probe(targets, timeout=self.settings.speed_probe_timeout)
        except Exception:
            self._loop.reset()  # the daemon may have gone: connect again next round
            raise
        probes = self._judge(rows, results, now)
        confirm = self._worth_confirming(probes, rows, now)
        judged_bad = self._judged_bad()
        self._schedule(probes, confirm, judged_bad)
        self.store.record_server_probes(probes)
        self.rounds += 1
        self.probes += len(probes)
        self.failures += sum(1 for p in probes if not p.ok)
        if self.after_round is not None:
            self.after_round()
            newly_bad = self._judged_bad() - judged_bad  # this round's probes made the verdict
            self._schedule([p for p in probes if (p.peer_id, p.model) in newly_bad], confirm, newly_bad)
        return probes

    def _schedule(self, probes: list[ServerProbe], confirm: set, judged_bad: set) -> None:
        """When each probed server is due again, counted from its probe's own start (a round may
        take a while): ``next_probe_delay``, recovering when it is judged bad (or just measured wrong)."""
        for probe in probes:
            key = (probe.peer_id, probe.model)
            self.next_due[key] = probe.at + next_probe_delay(
                probe.duration, self.period, self.settings.speed_probe_max_share, confirm=key in confirm,
                recovering=key in judged_bad or probe.verdict == WRONG)

    def _worth_confirming(self, probes: list[ServerProbe], rows: list[ServerRow], now: float) -> set:
        """(peer, model) of the probes that would change their server's verdict against what the
        stored probes measured so far (``worth_confirming``; a first error of the server's own,
        ``first_server_error``; a refusal as "cache full" while it announced room, ``refused_with_room``):
        probed again after half a period."""
        try:
            before = self.store.recent_server_probes(now - self.max_age)
        except Exception as e:  # noqa: BLE001 - then the period, as without this
            log.warning("server probes not read, no probe confirmed sooner: %s", e)
            return set()
        announced = {(row.peer_id, row.model): row.inference_rps for row in rows}
        speeds: dict[str, dict[str, float]] = {}
        found = set()
        for probe in probes:
            previous = latest_per_peer((p for p in before if p.peer_id == probe.peer_id), probe.model).get(probe.peer_id)
            if first_server_error(probe, previous) or refused_with_room(probe):
                found.add((probe.peer_id, probe.model))
                continue
            if probe.model not in speeds:
                speeds[probe.model] = measured_speeds(before, now=now, max_age=self.max_age, model=probe.model)
            known = speeds[probe.model]
            others = [seconds for peer, seconds in known.items() if peer != probe.peer_id]
            if worth_confirming(probe.seconds_per_token_per_block, known.get(probe.peer_id),
                                announced.get((probe.peer_id, probe.model)), others, blocks=probe.blocks):
                found.add((probe.peer_id, probe.model))
        return found

    def _judged_bad(self) -> set:
        """(peer, model) of the servers the stored assessments call slow, wrong or failing: probed
        every ``RECOVERY_AFTER`` of a period, so that their recovery is seen within a minute."""
        try:
            assessments = self.store.latest_assessments()
        except Exception as e:  # noqa: BLE001 - then every period, as without this
            log.warning("assessments not read, no server probed sooner: %s", e)
            return set()
        return {(peer, model) for model, assessment in assessments.items()
                for peer, server in assessment.servers.items() if server.cause in (CAUSE_SLOW, CAUSE_WRONG, CAUSE_FAILING)}

    def _due_rows(self, snapshot: Snapshot, now: float) -> list[ServerRow]:
        """ONLINE rows not failing their reachability check, one per (peer, model), that are due."""
        reachability = self.store.latest_reachability()
        rows: dict[tuple[str, str], ServerRow] = {}
        online: dict[tuple[str, str], float] = {}
        for row in snapshot.servers:
            check = reachability.get(row.peer_id)
            if row.state != ONLINE or row.end <= row.start:
                continue
            key = (row.peer_id, row.model)
            online[key] = self.next_due.get(key, 0.0)
            if check is not None and not check.ok:  # unreachable: look again in a tick
                online[key] = max(online[key], now + tick_seconds(self.period))
            elif now >= online[key] and key not in rows:
                rows[key] = row
        self.next_due = online  # (servers gone from the snapshot are forgotten)
        return list(rows.values())

    def _target(self, row: ServerRow, snapshot: Snapshot, num_blocks: int) -> SpanTarget:
        reference = self._reference(row.model, num_blocks)
        if reference is not None:
            return SpanTarget(row.peer_id, row.model, row.start, row.end,
                              inputs=reference.input_for(row.start), keep_outputs=True)
        if not self.settings.correctness_checks:
            return SpanTarget(row.peer_id, row.model, row.start, row.end)
        spans = [(r.start, r.end) for r in snapshot.rows_for(row.model) if r.state == ONLINE and r.end > r.start]
        start, end = self.cross.segment_for(row.peer_id, row.model, (row.start, row.end), spans)
        return SpanTarget(row.peer_id, row.model, start, end, keep_outputs=True)

    def _reference(self, model: str, num_blocks: int) -> Optional[ReferenceModel]:
        """The model's reference, computed on first use; None without weights (or if they fail)."""
        if not self.settings.correctness_checks or model not in self._paths or num_blocks < 1:
            return None
        if model not in self._references:
            self._references[model] = ReferenceModel(self._paths[model], num_blocks)
        reference = self._references[model]
        if reference is None:
            return None
        try:
            reference.states()
            return reference
        except Exception as e:  # noqa: BLE001 - a checkpoint we cannot use: compare servers instead
            log.warning("the weights of %s cannot serve as a reference (%s); comparing its servers with one "
                        "another instead", model, e)
            self._references[model] = None
            return None

    # ---- verdicts ----------------------------------------------------------------------------
    def _judge(self, rows: list[ServerRow], results: list[SpanResult], now: float) -> list[ServerProbe]:
        probes: list[ServerProbe] = []
        segments = set()
        quant = {(row.peer_id, row.model): row.quant_type for row in rows}
        room = {(row.peer_id, row.model): row.cache_tokens_left for row in rows}
        for result in results:
            probe = replace(result.probe, room=room.get((result.probe.peer_id, result.probe.model)))
            if probe.ok and result.outputs is not None:
                reference = self._references.get(probe.model) if self.settings.correctness_checks else None
                if reference is not None and reference.ready:
                    error = relative_error(result.outputs, reference.expected(probe.start, probe.end))
                    allowed = tolerance(result.torch_dtype, quant.get((probe.peer_id, probe.model)), probe.blocks)
                    probe = replace(probe, verdict=judge(error, allowed), error_ratio=error, tolerance=allowed,
                                    checked_against=BY_REFERENCE)
                else:
                    self.cross.add(probe.peer_id, probe.model, probe.start, probe.end, result.outputs, at=probe.at,
                                   torch_dtype=result.torch_dtype, quant_type=quant.get((probe.peer_id, probe.model)))
                    segments.add((probe.model, probe.start, probe.end))
            probes.append(probe)
        return self._cross_verdicts(probes, segments, now)

    def _cross_verdicts(self, probes: list[ServerProbe], segments: set, now: float) -> list[ServerProbe]:
        verdicts = {}
        for model, start, end in segments:
            for peer, said in self.cross.verdicts(model, start, end, now).items():
                verdicts[(peer, model, start, end)] = said
        judged = []
        for probe in probes:
            found = verdicts.get((probe.peer_id, probe.model, probe.start, probe.end))
            if probe.ok and probe.verdict is None and found is not None:
                verdict, against, error, allowed = found
                detail = f"disagrees with {', '.join(short_peer_id(p) for p in against)}" if against else None
                probe = replace(probe, verdict=verdict, error_ratio=error, tolerance=allowed,
                                checked_against=BY_PEERS, detail=detail)
            judged.append(probe)
        return judged

    def due_now(self, peers: set) -> None:
        """Probe these servers at the next round (their compute checks say they answer again: a
        probe that failed with their own error before would keep calling them failing a period)."""
        for key in list(self.next_due):
            if key[0] in peers:
                self.next_due[key] = 0.0

    # ---- the job's thread ----------------------------------------------------------------------
    def seconds_to_next_round(self) -> float:
        """Until the first server is due (so each is probed on time), but at least half a second
        and at most a tick (servers that appeared meanwhile are probed within a tick)."""
        tick = tick_seconds(self.period)
        if not self.next_due:
            return tick
        return min(tick, max(0.5, min(self.next_due.values()) - time.time()))

    def start(self, *, stats=None, run_now: bool = True) -> "ServerProber":
        """Run a round every ``tick_seconds(period)`` on a thread of its own; ``stats``: the poller's
        JobStats, where each round counts as job "probe" (failures with their error)."""
        self._thread = start_rounds("probe", self.run_once, self.seconds_to_next_round, self._stop, stats=stats,
                                    first_pause=None if run_now else tick_seconds(self.period))
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.speed_probe_timeout * 12 + 30)
            self._thread = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


# ---- the job (``app/job_table.py``) -----------------------------------------------------------


def _prober(ctx) -> ServerProber:
    return ServerProber(ctx.settings, ctx.store, ctx.dht, snapshot=ctx.latest_snapshot, after_round=ctx.assess_latest)


def start_probing(ctx, run_now: bool = True) -> ServerProber:
    """The job's rounds: its own thread (never delays a scrape, and a long round simply delays the
    next one), stopped by ``ServerProber.close``."""
    return _prober(ctx).start(stats=ctx.stats, run_now=run_now)


def probes(ctx) -> list[ServerProbe]:
    """One round of the servers that are due (``swarm-monitor job probes --once``: all of them, by a
    prober of its own)."""
    prober = _prober(ctx)
    try:
        return prober.run_once()
    finally:
        prober.close()


def probe_soon(ctx, peers: list, by=None) -> None:
    """Requested probes of these servers: the running rounds probe them next."""
    ctx.probe_soon(peers)
