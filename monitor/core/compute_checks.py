"""Compute checks: does each server still compute? Plain data and pure functions, no I/O.

A *compute check* sends one token's hidden state through the first block of a server's span, as
one ``rpc_forward`` (``monitor/swarm/speed.py`` ``forward_check``), every ``compute_check_period``
(20 s by default). It costs the server one block's forward of one token — about a millisecond on a
GPU, well under 0.1 % of its time at that period — and it holds no attention cache. It sees what
stops a server from serving: a process that died or froze (no answer: ``TIMEOUT``, or no connection:
``CLIENT_ERROR``), a compute runtime that fails every step (the server's own error: ``SERVER_ERROR``,
e.g. CUDA out of memory). It misses what only an inference session shows (a full attention cache, a
broken cache path), blocks other than the span's first, and slowness (one step's time is mostly the
round trip): the speed and correctness probes (``monitor.core.probes``) see those, more rarely.

A failed check is confirmed ``CONFIRM_DELAY`` seconds later (and at once when a user's request met
the server failing: ``Store.request_job("compute-check", peer)``), and asks for a poll at once
(``Store.request_job("scrape")``): a server that stopped cleanly announces OFFLINE, and that poll
sees it leave. A verdict rests on the server's newest ``CONFIRMATIONS`` checks within
``window(period)``, all failed, the first of them before a poll that still announces the server:

- all with the server's own error → **failing** (the newest error is the one told);
- else, none answered → **not answering** (the diagnosis calls it unreachable).

One check that succeeds ends either verdict.

Users' failures are evidence (``confirming_request``): a chat request whose step through a server
failed with the server's error or a timeout (a client that left, a bad request or a prompt too long
never reach a server) asks the leader for a compute check of it now, at most once per
``REQUEST_INTERVAL`` per server whatever the traffic; one that measured a span ``SLOW_FACTOR`` times
slower than its probes asks for a speed probe of it, at most once per ``PROBE_REQUEST_INTERVAL``.
Confirmed, the verdict changes for every reader at once; not confirmed, nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Iterable, Mapping, Optional

from monitor.core.probes import CLIENT_ERROR, SERVER_ERROR, SLOW_FACTOR, TIMEOUT
from monitor.core.snapshot import ChatOutcome, ReachabilityResult

CONFIRMATIONS = 2  # newest checks a verdict rests on: one lost packet names nobody
CONFIRM_DELAY = 2.0  # seconds after a failed check, its confirmation
WINDOW_PERIODS = 3.0  # checks older than this many periods no longer count
RETENTION = 3600.0  # seconds a stored check is kept (the peer page shows the last hour)
REQUEST_INTERVAL = 10.0  # at most one requested check per server this often, whatever the traffic
SCRAPE_REQUEST_INTERVAL = 5.0  # a first failure asks for a poll (did it leave?) at most this often
PROBE_REQUEST_INTERVAL = 60.0  # at most one requested speed probe per server this often


def window(period: float) -> float:
    """Seconds of compute checks a verdict reads."""
    return WINDOW_PERIODS * period


@dataclass(frozen=True)
class ComputeCheck:
    """One compute check of one server's block ``block`` of ``model``."""

    peer_id: str
    model: str
    block: int
    at: float  # unix seconds, when it was sent
    ok: bool
    duration: Optional[float] = None  # seconds until the answer (or the failure)
    error: Optional[str] = None  # why it failed (short)
    error_kind: Optional[str] = None  # SERVER_ERROR | TIMEOUT | CLIENT_ERROR when it failed
    requested_by: Optional[str] = None  # who asked for it out of turn ("chat", "generation-check", ...)


@dataclass(frozen=True)
class ComputeVerdicts:
    """What the newest checks say, per peer (over every model it serves)."""

    failing: Mapping[str, str]  # peer -> its own error
    silent: Mapping[str, str]  # peer -> why it is taken for not answering
    newest: Mapping[str, ComputeCheck]  # peer -> its newest check in the window

    def changed(self, other: "ComputeVerdicts") -> bool:
        return set(self.failing) != set(other.failing) or set(self.silent) != set(other.silent)


def newest_per_peer(checks: Iterable[ComputeCheck], *, now: float, max_age: float,
                    keep: int = CONFIRMATIONS) -> dict[str, list[ComputeCheck]]:
    """peer -> its newest ``keep`` checks no older than ``max_age``, newest first."""
    found: dict[str, list[ComputeCheck]] = {}
    for check in sorted(checks, key=lambda c: c.at, reverse=True):
        if check.at < now - max_age:
            continue
        kept = found.setdefault(check.peer_id, [])
        if len(kept) < keep:
            kept.append(check)
    return found


def verdicts(checks: Iterable[ComputeCheck], *, now: float, max_age: float,
             poll_at: Optional[float] = None, away: Mapping[str, float] = {}) -> ComputeVerdicts:
    """Each peer's verdict from its newest ``CONFIRMATIONS`` checks in the window. ``poll_at``: the
    poll the verdict is drawn for — a failure counts only once a poll taken after it began still
    announces the server (a clean stop announces OFFLINE at once: the poll the first failure asks
    for sees it leave, and it is not called unreachable). ``away``: peer -> the end of its last time
    away (``Store.last_away``: the first poll that saw it ONLINE after one that did not) — checks
    before it are of a server that has left or restarted since, and count against nobody (a clean
    restart within the window is not named)."""
    failing, silent, newest = {}, {}, {}
    if away:
        checks = [c for c in checks if c.at > away.get(c.peer_id, float("-inf"))]
    for peer, kept in newest_per_peer(checks, now=now, max_age=max_age).items():
        newest[peer] = kept[0]
        if len(kept) < CONFIRMATIONS or any(check.ok for check in kept):
            continue
        if poll_at is not None and kept[-1].at > poll_at:
            continue
        if all(check.error_kind == SERVER_ERROR for check in kept):
            failing[peer] = kept[0].error or "the server answered its compute checks with an error"
        elif all(check.error_kind in (TIMEOUT, CLIENT_ERROR) for check in kept):
            silent[peer] = (f"no answer to its last {CONFIRMATIONS} compute checks"
                            + (f": {kept[0].error}" if kept[0].error else ""))
    return ComputeVerdicts(failing=failing, silent=silent, newest=newest)


def suspects(checks: Iterable[ComputeCheck], *, now: float, max_age: float) -> list[str]:
    """The peers whose newest check in the window failed: the only ones a verdict may name, for
    which the assessment asks when they were last away (``verdicts``)."""
    return sorted(peer for peer, kept in newest_per_peer(checks, now=now, max_age=max_age, keep=1).items()
                  if not kept[0].ok)


def due_after(check: ComputeCheck, before: Optional[ComputeCheck], period: float) -> float:
    """When the server is checked next: a failure that is not confirmed yet after ``CONFIRM_DELAY``,
    else after a period (a confirmed failure too: one success ends it, so recovery is seen within a
    period)."""
    unconfirmed = not check.ok and (before is None or before.ok)
    return check.at + (CONFIRM_DELAY if unconfirmed else period)


def away_ended(last_away: Mapping[str, tuple[float, Optional[float]]], poll_at: float, online: AbstractSet[str]
               ) -> dict[str, float]:
    """peer -> when its last time away ended (what ``since_away`` and ``verdicts`` take as ``away``),
    from ``Store.last_away`` — (the newest stored poll that did not see it ONLINE, the first stored
    one that saw it back or None) — and the poll being assessed (at ``poll_at``, its ONLINE peers
    ``online``; the poller assesses a poll before storing it): the first poll that saw it back;
    that one, when the stored polls have not; else its time away has not ended, and it counts from
    the poll that saw it away."""
    ended = {}
    for peer, (away_at, back_at) in last_away.items():
        if back_at is None and peer in online and poll_at > away_at:
            back_at = poll_at
        ended[peer] = back_at if back_at is not None else away_at
    return ended


def since_away(reachability: Mapping[str, ReachabilityResult], away: Mapping[str, float]
               ) -> dict[str, ReachabilityResult]:
    """The reachability checks that still speak of the server now announced: a failed check taken
    before the end of the server's last time away (``away``, ``Store.last_away``: the first poll that
    saw it ONLINE again after one that did not) is of a server that has left or restarted since — a
    round that caught it stopping, or starting again — and counts against nobody (as failed compute
    checks before it: ``verdicts``); its next check decides, and ``Poller.check_newly_online``
    checks it at its first poll back."""
    return {peer: check for peer, check in reachability.items()
            if check.ok or check.joining or check.at is None or check.at > away.get(peer, float("-inf"))}


def reachability_with(reachability: Mapping[str, ReachabilityResult], found: ComputeVerdicts
                      ) -> dict[str, ReachabilityResult]:
    """The reachability the diagnosis reads, with the newest evidence of the compute checks: a
    server that answers none of its confirmed checks is unreachable, whatever an older rpc_info
    said; one whose newest check succeeded after a failed round answers."""
    merged = dict(reachability)
    for peer, why in found.silent.items():
        merged[peer] = ReachabilityResult(peer_id=peer, kind="server", ok=False, error=why)
    for peer, check in found.newest.items():
        known = merged.get(peer)
        if (check.ok and known is not None and not known.ok and not known.joining
                and (known.at is None or check.at > known.at)):
            merged[peer] = ReachabilityResult(peer_id=peer, kind="server", ok=True, rtt=check.duration, at=check.at)
    return merged


def heard_from(reachability: Mapping[str, ReachabilityResult], found: ComputeVerdicts,
               answered_at: Mapping[str, float]) -> tuple[dict[str, ReachabilityResult], ComputeVerdicts]:
    """A server that answered users' requests after its failed checks is busy, not gone: a failed
    reachability round, or compute checks that went unanswered, older than its newest successful
    chat span (``answered_at``: ``Store.answered_since``) name nobody (under sixteen sessions at once a small server can take
    longer than a check's timeout to get to it, while it serves every request it has). A frozen
    or killed server answers nobody: its failures stand. Failures with the server's own error are
    not touched (it answered: wrongly)."""
    def newer(peer: str, at: Optional[float]) -> bool:
        return at is not None and answered_at.get(peer, float("-inf")) > at

    merged = {peer: check if check.ok or check.joining or not newer(peer, check.at) else
              ReachabilityResult(peer, check.kind, True, at=answered_at[peer])
              for peer, check in reachability.items()}
    silent = {peer: why for peer, why in found.silent.items()
              if not (peer in found.newest and newer(peer, found.newest[peer].at))}
    return merged, ComputeVerdicts(failing=found.failing, silent=silent, newest=found.newest)


def failing_with(failing: Mapping[str, str], found: ComputeVerdicts) -> dict[str, str]:
    """The servers failing every step: the probes' verdicts (``probes.failing_servers``: an inference
    session fails, which a forward step may not show; a newer successful probe ends it) and the
    compute checks' own."""
    merged = dict(failing)
    for peer, why in found.failing.items():
        merged.setdefault(peer, why)
    return merged


def share(duration: Optional[float], period: float) -> float:
    """Of the server's time, what one check per ``period`` takes at most (its whole answer time)."""
    return (duration or 0.0) / period if period > 0 else 0.0


@dataclass(frozen=True)
class ConfirmingRequest:
    """The check a user's request asks for of one server (``Store.request_job``)."""

    job: str  # "compute-check" | "probes"
    peer_id: str
    why: str
    min_interval: float


def confirming_request(outcome: ChatOutcome, probed: Optional[float]) -> Optional[ConfirmingRequest]:
    """What a request's outcome on one server is evidence of, if anything: a step through it that
    failed (petals' client saw the server's error or a timeout; a client that left, a bad request or
    a prompt too long never reach a server) asks for a compute check; a span ``SLOW_FACTOR`` times
    slower than its newest probes measured (``probed``: seconds per token per block, round trip
    included, as the request measures) asks for a speed probe. Either at most once per interval
    per server, whatever the traffic."""
    if not outcome.ok:
        why = f"a request through it failed: {outcome.error}" if outcome.error else "a request through it failed"
        return ConfirmingRequest("compute-check", outcome.peer_id, why[:300], REQUEST_INTERVAL)
    measured = outcome.seconds_per_token_per_block
    if probed and measured and measured >= SLOW_FACTOR * probed:
        return ConfirmingRequest("probes", outcome.peer_id,
                                 f"a request measured it {measured / probed:.1f}× slower than its probes",
                                 PROBE_REQUEST_INTERVAL)
    return None
