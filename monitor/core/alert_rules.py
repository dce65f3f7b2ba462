"""Alert rules over what the monitor last stored, as pure functions: rule + view + memory -> notices.

A monitor that has to be watched is half a monitor: operators want to hear when a model they care
about breaks, a bootstrap peer or one of their servers goes down, or the monitor itself stops
polling, and when that is over. This module decides *what to say and when*; the poller's alert job
(``monitor/app/alerter.py``) reads the view from the store, keeps the memory (``Alert``) in the
store, and delivers the notices to webhooks.

Lifecycle of one alert (one rule, one subject: a model, a peer, a bootstrap peer, the poller):

- the rule's condition holds -> the alert is **pending** since then; nobody hears of it yet;
- it still holds ``for`` seconds later -> **firing**: one notice (``firing``);
- while firing, the subject's state changes (degraded -> broken) and the new state holds ``for``
  -> one notice (``changed``); every ``repeat`` seconds without change -> a reminder (``repeat``);
- the condition no longer holds -> a firing alert sends one recovery notice (``resolved``); a
  pending one is dropped silently: a flap shorter than ``for`` pages nobody.

Held alerts (``core/muting.py``: a silence, a maintenance window, inhibition by a firing model
alert) go through the same lifecycle and keep their state on the dashboard, but send nothing:
the notice they would have sent is kept in the history as *held*. An alert remembers what its
receivers were told (``announced_state``): once it is no longer held and still fires, the notice
they missed goes out then (``firing``, or ``changed`` if they heard an older state); a resolved
alert sends its recovery only if they were told it fired.

Confirmed verdicts do not wait out ``for``: when a model's state (or a peer's) rests only on
servers named by confirming checks — two failed compute checks, two failing probes, a wrong output,
two slow probes (``Condition.confirmed``) — it is told at once, since ``for`` would only count scrape
periods on top of the confirmation. A server that left (OFFLINE, gone from the DHT) or a low score
still waits ``for``, so a clean restart back within it pages nobody. An alert told that way resolves
once its condition has been clear for ``RESOLVE_HOLD`` (or its ``for``, if shorter): a server down
and up several times within a minute is one notice pair.

Defaults (``default_rules``): ``model-health`` (``model_degraded``, every model), ``bootstrap-down``
and ``monitor-stale``; ``for`` is ``DEFAULT_FOR_PERIODS`` scrape periods (none for ``monitor_stale``,
whose ``periods`` already wait), ``repeat`` ``DEFAULT_REPEAT``.

While the latest poll is not fresh (older than ``STALE_PERIODS`` scrape periods, or made before
the evaluator started) the rules that read polls hold their alerts as they are: old data proves
nothing either way. ``bootstrap_down`` (reachability checks) and ``monitor_stale`` are judged regardless.

No I/O, no SQL, no petals: plain dataclasses in, plain dataclasses out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional

from monitor.core import muting
from monitor.core.common import STALE_PERIODS, short_error, short_peer_id
from monitor.core.assessment import BROKEN, DEGRADED, HEALTHY
from monitor.core.snapshot import ONLINE
from monitor.core.timefmt import duration, utc

# rule kinds
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
PEER_KINDS = (PEER_OFFLINE, PEER_UNREACHABLE, PEER_WRONG_OUTPUTS, PEER_FAILING, PEER_SCORE_BELOW)
KINDS = (*MODEL_KINDS, BOOTSTRAP_DOWN, *PEER_KINDS, MONITOR_STALE)

# alert status, and the events a notice announces
PENDING, FIRING = "pending", "firing"
FIRED, CHANGED, REPEATED, RESOLVED = "firing", "changed", "repeat", "resolved"
EVENTS = (FIRED, CHANGED, REPEATED, RESOLVED)
CRITICAL, WARNING, OK = "critical", "warning", "ok"

SUMMARY_CHARS = 300  # one line
MAX_DETAILS, DETAIL_CHARS = 10, 200  # the reasons behind a notice


@dataclass(frozen=True)
class Rule:
    """One alert rule, as the settings configure it (durations already in seconds)."""

    name: str
    kind: str
    for_seconds: float = 0.0  # the condition must hold this long before anyone is told
    repeat_seconds: float = 0.0  # remind this often while it fires; 0: never
    models: tuple[str, ...] = ()  # model kinds: these dht_prefixes; empty: every polled model
    peers: tuple[str, ...] = ()  # peer kinds: peer ids or public names
    below: Optional[float] = None  # peer_score_below: the threshold, 0-100
    periods: float = STALE_PERIODS  # monitor_stale: scrape periods without a successful poll


# ---- what the rules look at ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelView:
    dht_prefix: str
    name: str
    state: str  # healthy | degraded | broken (``diagnosis``)
    reasons: tuple[str, ...] = ()
    troubled: tuple[tuple[str, Optional[str]], ...] = ()  # (peer id, name) of its recent servers not serving now
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
    causes: tuple[tuple[str, Optional[str]], ...] = ()  # a model's: the servers it lost (``muting.holds``)
    confirmed: bool = False  # it rests on confirmed checks only: told at once, without waiting ``for``


# ---- the memory and the output --------------------------------------------------------------


class _Labelled:
    """What silences and inhibition rules match an alert or a notice by (``muting.labels``): the
    same labels from the same fields, so a notice is muted exactly as its alert is."""

    @property
    def labels(self) -> dict[str, tuple[str, ...]]:
        return muting.labels(rule=self.rule, kind=self.kind, severity=self.severity, subject=self.subject,
                             models=self.models, peer=self.peer, peer_name=self.peer_name)


@dataclass(frozen=True)
class Alert(_Labelled):
    """A pending or firing alert: what the evaluator remembers between runs (kept in the store)."""

    rule: str
    kind: str
    subject: str
    label: str
    status: str  # pending | firing
    state: str  # the state announced (firing) or about to be (pending)
    severity: str
    summary: str  # what holds now
    since: float  # when the condition started to hold
    details: tuple[str, ...] = ()
    fired_at: Optional[float] = None
    notified_at: Optional[float] = None  # the latest notice (for repeats)
    next_state: Optional[str] = None  # a new state, waiting out ``for`` before it is announced
    next_since: Optional[float] = None
    models: tuple[str, ...] = ()
    peer: Optional[str] = None
    peer_name: Optional[str] = None
    held: tuple[str, ...] = ()  # why its notices are held now (``muting.holds``); empty: they are not
    announced_state: Optional[str] = None  # the state its receivers were last told; None: told nothing
    causes: tuple[tuple[str, Optional[str]], ...] = ()  # a model alert's: the servers it lost
    clear_since: Optional[float] = None  # fired on confirmation, its condition clear since (``RESOLVE_HOLD``)

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.subject)


@dataclass(frozen=True)
class Notice(_Labelled):
    """Something to tell people: one event of one alert."""

    rule: str
    kind: str
    subject: str
    label: str
    event: str  # firing | changed | repeat | resolved
    state: str
    severity: str
    summary: str
    at: float
    since: float  # when the alert's condition started to hold
    details: tuple[str, ...] = ()
    previous_state: Optional[str] = None  # changed, resolved: the state announced before
    models: tuple[str, ...] = ()
    peer: Optional[str] = None
    peer_name: Optional[str] = None
    held: Optional[str] = None  # why it was not sent (a held notice, kept in the history only)


@dataclass(frozen=True)
class Evaluation:
    alerts: dict[tuple[str, str], Alert]  # every pending or firing alert after this run
    notices: tuple[Notice, ...] = ()  # to tell the webhooks
    changed: tuple[Alert, ...] = ()  # alerts new or different from the memory (to store)
    removed: tuple[tuple[str, str], ...] = ()  # keys no longer pending or firing (to delete)
    held: tuple[Notice, ...] = ()  # notices not sent, each with why (kept in the history)

    @property
    def writes(self) -> bool:
        return bool(self.notices or self.changed or self.removed or self.held)


# ---- conditions -----------------------------------------------------------------------------


def _details(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(short_error(line, DETAIL_CHARS) for line in list(lines)[:MAX_DETAILS])


def severity_for(kind: str, state: str) -> str:
    """The severity of an alert of ``kind`` in ``state`` ("ok" when it does not fire)."""
    if state == "ok":
        return OK
    if kind in MODEL_KINDS:
        return CRITICAL if state == BROKEN else WARNING
    return CRITICAL if kind in (BOOTSTRAP_DOWN, MONITOR_STALE) else WARNING


def _model_condition(rule: Rule, dht_prefix: str, model: Optional[ModelView]) -> Condition:
    if model is None:  # named by the rule but in no poll: nobody serves it
        label = dht_prefix
        state, reasons = BROKEN, ("no server announces the model in the latest poll",)
    else:
        label = model.name if model.name == dht_prefix else f"{model.name} ({dht_prefix})"
        state, reasons = model.state, model.reasons
    active = state == BROKEN or (rule.kind == MODEL_DEGRADED and state == DEGRADED)
    if active:
        why = f": {reasons[0]}" if reasons else ""
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        summary = f"{label} is {state}{why}{more}"
    elif rule.kind == MODEL_BROKEN and state == DEGRADED:
        summary = f"{label} is no longer broken (now degraded)"
    else:
        summary = f"{label} is {state} again" if state == HEALTHY else f"{label} is {state}"
    return Condition(subject=dht_prefix, label=label, active=active, state=state if active else "ok",
                     severity=severity_for(rule.kind, state if active else "ok"),
                     summary=short_error(summary, SUMMARY_CHARS), details=_details(reasons), models=(dht_prefix,),
                     causes=model.troubled if active and model is not None else (),
                     confirmed=active and model is not None and model.confirmed)


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
        target: _peer_condition(rule, target, [p for p in view.peers if target in (p.peer_id, p.public_name)])
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


# ---- transitions ----------------------------------------------------------------------------


def _notice(alert: Alert, event: str, at: float, *, previous: Optional[str] = None,
            condition: Optional[Condition] = None) -> Notice:
    source = condition or alert
    return Notice(rule=alert.rule, kind=alert.kind, subject=alert.subject, label=source.label, event=event,
                  state=source.state, severity=source.severity, summary=source.summary, at=at,
                  since=alert.since, details=source.details, previous_state=previous,
                  models=alert.models, peer=alert.peer, peer_name=alert.peer_name)


def _gone(alert: Alert) -> Condition:
    """A subject the rule no longer sees (a discovered model nobody announces any more)."""
    return Condition(alert.subject, alert.label, False, "ok", OK,
                     short_error(f"{alert.label} is no longer watched (not in the latest poll)", SUMMARY_CHARS))


def step(rule: Rule, alert: Optional[Alert], condition: Optional[Condition], now: float
         ) -> tuple[Optional[Alert], Optional[Notice]]:
    """One subject's transition: (the alert to remember or None, the notice to send or None)."""
    if condition is None or not condition.active:
        if alert is None or alert.status == PENDING:
            return None, None  # nothing, or a flap shorter than ``for``: nobody hears of it
        if condition is not None and _fired_on_confirmation(rule, alert):
            clear_since = alert.clear_since if alert.clear_since is not None else now
            if now - clear_since < min(rule.for_seconds, RESOLVE_HOLD):  # a flap: one notice pair at most
                return replace(alert, clear_since=clear_since), None
        condition = condition or _gone(alert)
        return None, _notice(alert, RESOLVED, now, previous=alert.state, condition=condition)
    text = dict(label=condition.label, summary=condition.summary, details=condition.details,
                # a peer no poll sees any more still concerns what it served
                models=condition.models or (alert.models if alert is not None else ()),
                peer=condition.peer or (alert.peer if alert is not None else None),
                peer_name=condition.peer_name or (alert.peer_name if alert is not None else None),
                causes=condition.causes or (alert.causes if alert is not None else ()))
    if alert is None or alert.status == PENDING:
        since = alert.since if alert is not None else now
        alert = Alert(rule=rule.name, kind=rule.kind, subject=condition.subject, status=PENDING,
                      state=condition.state, severity=condition.severity, since=since, **text)
        if now - since >= rule.for_seconds or condition.confirmed:
            alert = replace(alert, status=FIRING, fired_at=now, notified_at=now)
            return alert, _notice(alert, FIRED, now)
        return alert, None
    if condition.state != alert.state:
        next_since = alert.next_since if alert.next_state == condition.state and alert.next_since else now
        if now - next_since >= rule.for_seconds or condition.confirmed:
            previous = alert.state
            alert = replace(alert, state=condition.state, severity=condition.severity, notified_at=now,
                            next_state=None, next_since=None, **text)
            return alert, _notice(alert, CHANGED, now, previous=previous)
        return replace(alert, next_state=condition.state, next_since=next_since, **text), None
    alert = replace(alert, next_state=None, next_since=None, clear_since=None, **text)
    if rule.repeat_seconds > 0 and now - (alert.notified_at or alert.fired_at or now) >= rule.repeat_seconds:
        alert = replace(alert, notified_at=now)
        return alert, _notice(alert, REPEATED, now)
    return alert, None


def _fired_on_confirmation(rule: Rule, alert: Alert) -> bool:
    """It fired before its ``for`` was over, on confirmed checks: its resolution waits out a flap."""
    return alert.fired_at is not None and alert.fired_at - alert.since < rule.for_seconds


def _tell(memory: Mapping[tuple[str, str], Alert], alerts: dict[tuple[str, str], Alert],
          stepped: list[Notice], held: Mapping[tuple[str, str], tuple[str, ...]], now: float
          ) -> tuple[list[Notice], list[Notice]]:
    """What the receivers are told of the stepped notices, given what holds alerts now and what
    each alert told them before: (notices to send, notices held). Updates ``alerts`` (their
    ``held`` and ``announced_state``)."""
    told: list[Notice] = []
    kept: list[Notice] = []
    for key, alert in alerts.items():
        alerts[key] = replace(alert, held=held.get(key, ()))
    noticed = set()
    for notice in stepped:
        key = (notice.rule, notice.subject)
        noticed.add(key)
        if notice.event == RESOLVED:
            before = memory[key]
            if before.announced_state is None:
                why = before.held[0] if before.held else "unannounced: nobody was told it fired"
                kept.append(replace(notice, held=why))
            else:
                told.append(replace(notice, previous_state=before.announced_state))
            continue
        alert = alerts[key]
        if alert.held:
            kept.append(replace(notice, held=alert.held[0]))
            continue
        if alert.announced_state is None:
            notice = replace(notice, event=FIRED, previous_state=None)
        elif notice.event == CHANGED:
            if alert.announced_state == alert.state:
                continue  # back to what they were told (it changed while held)
            notice = replace(notice, previous_state=alert.announced_state)
        alerts[key] = replace(alert, announced_state=alert.state)
        told.append(notice)
    for key, alert in alerts.items():  # no longer held: what the receivers missed
        if key in noticed or alert.status != FIRING or alert.held or alert.announced_state == alert.state:
            continue
        if alert.announced_state is None:
            notice = _notice(alert, FIRED, now)
        else:
            notice = _notice(alert, CHANGED, now, previous=alert.announced_state)
        alerts[key] = replace(alert, announced_state=alert.state, notified_at=now)
        told.append(notice)
    return told, kept


def _subjects(alerts: Mapping[tuple[str, str], Alert]) -> list[muting.Subject]:
    return [muting.Subject(key, alert.labels, alert.status == FIRING, alert.causes) for key, alert in alerts.items()]


def evaluate(rules: Iterable[Rule], view: SwarmView, memory: Mapping[tuple[str, str], Alert],
             now: Optional[float] = None, mutes: Optional[muting.Mutes] = None) -> Evaluation:
    """Every rule over the view, against the remembered alerts, then what holds them
    (``mutes``: silences, maintenance windows, inhibition). Alerts of rules no longer configured
    are dropped without a notice (the operator removed or renamed the rule)."""
    now = view.at if now is None else now
    rules = list(rules)
    alerts: dict[tuple[str, str], Alert] = {}
    stepped: list[Notice] = []
    for rule in rules:
        mine = {subject: a for (name, subject), a in memory.items() if name == rule.name}
        found = conditions(rule, view, held=bool(mine))
        if found is None:  # cannot judge: hold
            alerts.update({(rule.name, subject): a for subject, a in mine.items()})
            continue
        for subject in list(found) + [s for s in mine if s not in found]:
            alert, notice = step(rule, mine.get(subject), found.get(subject), now)
            if alert is not None:
                alerts[alert.key] = alert
            if notice is not None:
                stepped.append(notice)
    held = muting.holds(_subjects(alerts), mutes, now) if mutes is not None else {}
    notices, kept = _tell(memory, alerts, stepped, held, now)
    changed = tuple(a for key, a in alerts.items() if memory.get(key) != a)
    removed = tuple(key for key in memory if key not in alerts)
    return Evaluation(alerts=alerts, notices=tuple(notices), changed=changed, removed=removed, held=tuple(kept))


# ---- defaults --------------------------------------------------------------------------------


DEFAULT_FOR_PERIODS = 2  # a rule's default ``for``: two scrape periods (one bad poll pages nobody)
DEFAULT_REPEAT = 4 * 3600.0  # remind every 4 h while an alert fires (Alertmanager's default)
RESOLVE_HOLD = 60.0  # an alert told on confirmation resolves once clear this long (or its ``for``, if shorter)


HEARTBEAT = 60.0  # the store learns that the rules were evaluated at least this often (/alerts, /metrics)


def default_for(kind: str, scrape_period: float) -> float:
    """A rule's ``for`` unless configured: two scrape periods; none for ``monitor_stale``, whose
    ``periods`` already wait."""
    return 0.0 if kind == MONITOR_STALE else DEFAULT_FOR_PERIODS * scrape_period


def default_rules(scrape_period: float) -> tuple[Rule, ...]:
    """The rules every monitor has unless the operator turns them off or replaces one by name."""
    return tuple(Rule(name, kind, for_seconds=default_for(kind, scrape_period), repeat_seconds=DEFAULT_REPEAT)
                 for name, kind in (("model-health", MODEL_DEGRADED), ("bootstrap-down", BOOTSTRAP_DOWN),
                                    ("monitor-stale", MONITOR_STALE)))

