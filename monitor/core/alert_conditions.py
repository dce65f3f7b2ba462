"""What the alert rules look at and what each rule sees of each subject, as pure functions: a rule
(as the settings configure it), the view of the store (``SwarmView``: models with the servers
behind their state, peers, bootstrap peers, the latest poll) -> one ``Condition`` per subject,
active or not, in words. ``core/alert_rules.py`` turns conditions into alerts and notices.

A model's condition carries the servers behind its state (``Cause``: failing, wrong outputs,
unreachable, slow, or ``LEFT``: OFFLINE, JOINING or gone from the DHT). A model whose every block is
still served but that lost servers of the last hour is active too, as ``LOST_SERVERS`` (severity
``info``): nobody's request fails, but the swarm lost capacity and the server's owner may not know.

No I/O, no SQL, no petals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, NamedTuple, Optional

from monitor.core.common import STALE_PERIODS, short_error, short_peer_id
from monitor.core.assessment import BROKEN, DEGRADED, HEALTHY
from monitor.core.snapshot import ONLINE
from monitor.core.timefmt import duration, utc

MODEL_DEGRADED = "model_degraded"  # the model is degraded or broken (the state follows it)
MODEL_BROKEN = "model_broken"  # the model is broken
BOOTSTRAP_DOWN = "bootstrap_down"  # a bootstrap peer does not answer its reachability check
PEER_OFFLINE = "peer_offline"  # a watched peer announces no ONLINE span
PEER_UNREACHABLE = "peer_unreachable"  # a watched peer announces ONLINE but fails its reachability check
PEER_WRONG_OUTPUTS = "peer_wrong_outputs"  # correctness probes flag a watched peer
PEER_FAILING = "peer_failing"  # a watched peer answers every recent probe with an error of its own
PEER_SCORE_BELOW = "peer_score_below"  # a watched peer's health score is below ``below``
MONITOR_STALE = "monitor_stale"  # no successful poll for ``periods`` scrape periods
MODEL_KINDS = (MODEL_DEGRADED, MODEL_BROKEN)
LOST_SERVERS = "lost-servers"  # a model_degraded alert's state: healthy, but servers of the last hour do not serve
PEER_KINDS = (PEER_OFFLINE, PEER_UNREACHABLE, PEER_WRONG_OUTPUTS, PEER_FAILING, PEER_SCORE_BELOW)
KINDS = (*MODEL_KINDS, BOOTSTRAP_DOWN, *PEER_KINDS, MONITOR_STALE)

# alert status, and the events a notice announces
PENDING, FIRING = "pending", "firing"
FIRED, CHANGED, NEWS, REPEATED, RESOLVED = "firing", "changed", "news", "repeat", "resolved"
EVENTS = (FIRED, CHANGED, NEWS, REPEATED, RESOLVED)
CRITICAL, WARNING, INFO, OK = "critical", "warning", "info", "ok"

# Why a server is behind a model alert: the assessment's cause (``core.assessment``: failing, wrong
# outputs, unreachable, slow) or LEFT: it announces OFFLINE or JOINING, or no poll shows it any more.
LEFT = "left"
CAUSE_WORDS = {LEFT: "left (OFFLINE, or gone from the DHT)", "failing": "is failing", "wrong outputs":
               "returns wrong outputs", "unreachable": "is ONLINE but unreachable", "slow": "is slow"}

SUMMARY_CHARS = 300  # one line
MAX_DETAILS, DETAIL_CHARS = 10, 200  # the reasons behind a notice


@dataclass(frozen=True)
class Rule:
    """One alert rule, as the settings configure it (durations already in seconds)."""

    name: str
    kind: str
    for_seconds: float = 0.0  # the condition must hold this long before anyone is told
    left_seconds: Optional[float] = None  # ... when it rests on servers that left (None: ``for_seconds``)
    repeat_seconds: float = 0.0  # remind this often while it fires; 0: never
    models: tuple[str, ...] = ()  # model kinds: these dht_prefixes; empty: every polled model
    peers: tuple[str, ...] = ()  # peer kinds: peer ids or public names
    below: Optional[float] = None  # peer_score_below: the threshold, 0-100
    periods: float = STALE_PERIODS  # monitor_stale: scrape periods without a successful poll

    @property
    def left_wait(self) -> float:
        """How long a server that left must stay gone before anyone is told (at most ``for``)."""
        return self.for_seconds if self.left_seconds is None else min(self.for_seconds, self.left_seconds)


# ---- what the rules look at ----------------------------------------------------------------


class Cause(NamedTuple):
    """One server behind a model's alert and why. The view gives ``peer``, ``name``, ``why`` and
    ``confirmed``; the alert remembers, per (peer, why), when it first saw it (``since``) and
    whether its receivers were told of it (``told``): a cause not told yet is news."""

    peer: str
    name: Optional[str] = None
    why: str = ""  # LEFT, or the assessment's cause
    confirmed: bool = False  # it rests on confirming checks: told at once
    since: Optional[float] = None
    told: bool = False
    seen: Optional[float] = None  # (LEFT) the latest poll that shows it away: it is told only once a
    # poll ``left_wait`` after it was first seen away still shows it away (a restart is back by then)

    @property
    def key(self) -> tuple[str, str]:
        return (self.peer, self.why)

    @property
    def phrase(self) -> str:
        who = self.name or short_peer_id(self.peer)
        return f"{who} {CAUSE_WORDS.get(self.why, self.why or 'does not serve')}"


@dataclass(frozen=True)
class ModelView:
    dht_prefix: str
    name: str
    state: str  # healthy | degraded | broken (``diagnosis``)
    reasons: tuple[str, ...] = ()
    troubled: tuple[Cause, ...] = ()  # its servers of the last hour not serving now, and its slow ones
    confirmed: bool = False  # its state rests only on confirmed verdicts (``Assessment.confirmed``)


@dataclass(frozen=True)
class PeerView:
    peer_id: str
    public_name: Optional[str] = None
    state: Optional[str] = None  # best state it announces in the latest poll (ONLINE, ...); None: absent
    reachable: Optional[bool] = None  # latest reachability check: False = unreachable; None = not checked, or JOINING
    reachability_error: Optional[str] = None
    score: Optional[float] = None
    wrong_outputs: Optional[str] = None  # why correctness probes judge its outputs wrong; None: they do not
    failing: Optional[str] = None  # the error it answers every recent probe with; None: it does not
    models: tuple[str, ...] = ()  # the models it serves (or served, the last time a poll saw it)
    confirmed: bool = False  # its assessment's cause rests on confirming checks (``ServerAssessment.confirmed``)


@dataclass(frozen=True)
class BootstrapView:
    peer_id: str
    up: Optional[bool]  # None: not checked yet
    error: Optional[str] = None


@dataclass(frozen=True)
class SwarmView:
    """What the store holds now: the latest poll's models and peers, reachability checks, scores."""

    at: float  # when this was read
    scrape_period: float
    last_ok_poll_at: Optional[float]  # the latest successful poll
    watching_since: float  # the evaluator's start: "no poll yet" counts from here
    models: tuple[ModelView, ...] = ()
    peers: tuple[PeerView, ...] = ()
    bootstrap: tuple[BootstrapView, ...] = ()

    @property
    def fresh(self) -> bool:
        """The latest poll is recent and was made since the evaluator started: data rules may judge
        it (a restarted poller waits for its first poll instead of judging what it found)."""
        last = self.last_ok_poll_at
        return last is not None and last >= self.watching_since and \
            self.at - last <= STALE_PERIODS * self.scrape_period


@dataclass(frozen=True)
class Condition:
    """What one rule sees of one subject now, active or not, in words."""

    subject: str  # stable key: dht_prefix, peer id or name as configured, "poller"
    label: str  # for people
    active: bool
    state: str  # degraded, broken, offline, unreachable, wrong-outputs, low-score, down, stale; "ok"
    severity: str  # critical | warning | ok
    summary: str
    details: tuple[str, ...] = ()
    models: tuple[str, ...] = ()  # the model, or the models a peer serves (labels, inhibition)
    peer: Optional[str] = None  # the peer's id, when known
    peer_name: Optional[str] = None
    causes: tuple[Cause, ...] = ()  # a model's: the servers behind it (news, ``muting.holds``)
    confirmed: bool = False  # it rests on confirmed checks only: told at once, without waiting ``for``
    seen: Optional[float] = None  # (a peer offline) the latest poll it rests on: told once one taken the
    # rule's ``left_wait`` after it began still shows it (as a server that left a model: ``Cause.seen``)


# ---- conditions -----------------------------------------------------------------------------


def _details(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(short_error(line, DETAIL_CHARS) for line in list(lines)[:MAX_DETAILS])


def severity_for(kind: str, state: str) -> str:
    """The severity of an alert of ``kind`` in ``state`` ("ok" when it does not fire)."""
    if state == "ok":
        return OK
    if kind in MODEL_KINDS:
        return CRITICAL if state == BROKEN else INFO if state == LOST_SERVERS else WARNING
    return CRITICAL if kind in (BOOTSTRAP_DOWN, MONITOR_STALE) else WARNING


def _model_condition(rule: Rule, dht_prefix: str, model: Optional[ModelView]) -> Condition:
    reasons: tuple[str, ...]
    if model is None:  # named by the rule but in no poll: nobody serves it
        label = dht_prefix
        state, reasons = BROKEN, ("no server announces the model in the latest poll",)
    else:
        label = model.name if model.name == dht_prefix else f"{model.name} ({dht_prefix})"
        state, reasons = model.state, model.reasons
    troubled = model.troubled if model is not None else ()
    active = state == BROKEN or (rule.kind == MODEL_DEGRADED and state == DEGRADED)
    if rule.kind == MODEL_DEGRADED and state == HEALTHY and any(c.why != "slow" for c in troubled):
        # every block still served, but servers it had do not serve now: an operator hears of it
        active, state = True, LOST_SERVERS
        lost = "; ".join(c.phrase for c in troubled if c.why != "slow")
        reasons = (f"every block is still served by others, but {lost}", *reasons)
    if active and state == LOST_SERVERS:
        summary = f"{label} lost servers: {lost} (every block is still served by others)"
    elif active:
        why = f": {reasons[0]}" if reasons else ""
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        summary = f"{label} is {state}{why}{more}"
    elif rule.kind == MODEL_BROKEN and state == DEGRADED:
        summary = f"{label} is no longer broken (now degraded)"
    else:
        summary = f"{label} is {state} again" if state == HEALTHY else f"{label} is {state}"
    return Condition(subject=dht_prefix, label=label, active=active, state=state if active else "ok",
                     severity=severity_for(rule.kind, state if active else "ok"),
                     summary=short_error(summary, SUMMARY_CHARS),
                     details=_details(_naming_causes(reasons, troubled, state if active else "ok")), models=(dht_prefix,),
                     causes=troubled if active else (),
                     confirmed=active and model is not None and model.confirmed)


def _naming_causes(reasons: Iterable[str], causes: Iterable[Cause], state: str) -> list[str]:
    """A model's reasons, after the servers behind it that none of them names (its assessment's
    reasons name no server that left, nor one whose blocks others still serve)."""
    reasons = list(reasons)
    said = " ".join(reasons)
    unnamed = [c.phrase for c in causes if c.why != "slow" and (c.name or short_peer_id(c.peer)) not in said]
    return [*unnamed, *reasons] if state in (DEGRADED, BROKEN) else reasons


def _model_conditions(rule: Rule, view: SwarmView) -> dict[str, Condition]:
    by_prefix = {m.dht_prefix: m for m in view.models}
    prefixes = rule.models or tuple(by_prefix)
    return {p: _model_condition(rule, p, by_prefix.get(p)) for p in prefixes}


def _bootstrap_conditions(view: SwarmView) -> dict[str, Condition]:
    found = {}
    for boot in view.bootstrap:
        label = f"bootstrap peer {short_peer_id(boot.peer_id)}"
        down = boot.up is False
        summary = f"{label} does not answer: {boot.error or 'unreachable'}" if down else f"{label} answers again"
        found[boot.peer_id] = Condition(boot.peer_id, label, down, "down" if down else "ok",
                                        CRITICAL if down else OK, short_error(summary, SUMMARY_CHARS))
    return found


def _peer_label(target: str, matches: list[PeerView]) -> str:
    """``peer NAME (…abc123)`` for a peer id with a public name, ``peer NAME`` for a name."""
    by_id = [p for p in matches if p.peer_id == target]
    if by_id:
        name = next((p.public_name for p in by_id if p.public_name), None)
        return f"peer {name} ({short_peer_id(target)})" if name else f"peer {short_peer_id(target)}"
    return f"peer {short_peer_id(target)}" if not matches and len(target) >= 32 else f"peer {target}"


def _peer_condition(rule: Rule, target: str, matches: list[PeerView]) -> Condition:
    label = _peer_label(target, matches)
    details: tuple[str, ...] = ()
    confirmed = False  # offline and low scores wait out ``for``: a clean restart is back before it
    if rule.kind == PEER_OFFLINE:
        states = sorted({p.state for p in matches if p.state})
        active = ONLINE not in states
        why = f"announces {'/'.join(states)}" if states else "not announced in the latest poll"
        summary = f"{label} is offline: {why}" if active else f"{label} is online again"
        state = "offline"
    elif rule.kind == PEER_UNREACHABLE:
        failed = [p for p in matches if p.state == ONLINE and p.reachable is False]
        active = bool(failed)
        confirmed = active and all(p.confirmed for p in failed)
        summary = (f"{label} announces ONLINE but does not answer reachability checks: "
                   f"{failed[0].reachability_error or 'unreachable'}"
                   if active else f"{label} answers reachability checks again")
        state = "unreachable"
    elif rule.kind == PEER_WRONG_OUTPUTS:
        details = tuple(p.wrong_outputs for p in matches if p.wrong_outputs)
        active = confirmed = bool(details)
        summary = (f"{label} returns wrong outputs in correctness probes" if active
                   else f"{label} passes correctness probes again")
        state = "wrong-outputs"
    elif rule.kind == PEER_FAILING:
        details = tuple(p.failing for p in matches if p.failing)
        active = confirmed = bool(details)
        summary = (f"{label} is ONLINE and reachable, but fails every probe with its own error" if active
                   else f"{label} answers probes without errors again")
        state = "failing"
    else:  # PEER_SCORE_BELOW
        scores = [p.score for p in matches if p.score is not None]
        lowest = min(scores) if scores else None
        active = lowest is not None and rule.below is not None and lowest < rule.below
        summary = (f"{label} has a health score of {lowest:.1f}, below {rule.below:g}" if active
                   else f"{label} has a health score of {lowest:.1f}, back above {rule.below:g}" if lowest is not None
                   else f"{label} has no health score")
        state = "low-score"
    by_id = [p for p in matches if p.peer_id == target]
    ids = sorted({p.peer_id for p in matches})
    peer = target if by_id else (ids[0] if len(ids) == 1 else None)
    name = next((p.public_name for p in (by_id or matches) if p.public_name), None if by_id else target)
    return Condition(subject=target, label=label, active=active, state=state if active else "ok",
                     severity=severity_for(rule.kind, state if active else "ok"),
                     summary=short_error(summary, SUMMARY_CHARS), details=_details(details),
                     models=tuple(sorted({m for p in matches for m in p.models})), peer=peer, peer_name=name,
                     confirmed=active and confirmed)


def _peer_conditions(rule: Rule, view: SwarmView) -> dict[str, Condition]:
    return {
        target: replace(_peer_condition(rule, target, [p for p in view.peers if target in (p.peer_id, p.public_name)]),
                        seen=view.last_ok_poll_at)
        for target in rule.peers
    }


def _stale_condition(rule: Rule, view: SwarmView, held: bool) -> dict[str, Condition]:
    """Stale: no successful poll for ``periods`` scrape periods. A poller that just started gets
    that long for its first poll, unless the alert was already pending or firing (a restart does
    not clear it: only a successful poll does)."""
    limit = rule.periods * view.scrape_period
    last = view.last_ok_poll_at
    if held:
        active = last is None or view.at - last > limit
    else:
        active = view.at - max(last if last is not None else view.watching_since, view.watching_since) > limit
    if not active:
        summary = "the monitor polls the swarm again" if last is not None else "waiting for the first poll"
    elif last is None:
        summary = f"no successful poll since the monitor started at {utc(view.watching_since)}"
    else:
        summary = (f"no successful poll since {utc(last)} (more than {duration(limit)}): "
                   f"is the swarm's DHT reachable, is the database up?")
    return {"poller": Condition("poller", "the monitor's poller", active, "stale" if active else "ok",
                                CRITICAL if active else OK, short_error(summary, SUMMARY_CHARS))}


def conditions(rule: Rule, view: SwarmView, held: bool = False) -> Optional[dict[str, Condition]]:
    """Every subject the rule looks at, active or not; None: it cannot judge now (hold its alerts).
    ``held``: the rule has alerts pending or firing."""
    if rule.kind == MONITOR_STALE:
        return _stale_condition(rule, view, held)
    if rule.kind == BOOTSTRAP_DOWN:
        return _bootstrap_conditions(view)
    if not view.fresh:
        return None
    if rule.kind in MODEL_KINDS:
        return _model_conditions(rule, view)
    if rule.kind in PEER_KINDS:
        return _peer_conditions(rule, view)
    raise ValueError(f"unknown alert rule kind {rule.kind!r}; known: {', '.join(KINDS)}")
