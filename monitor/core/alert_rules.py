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
from typing import Any, Iterable, Mapping, Optional

from monitor.core import muting
from monitor.core.common import short_error
from monitor.core.alert_conditions import (  # noqa: F401  (the rules' vocabulary: imported from here too)
    MODEL_DEGRADED, MODEL_BROKEN, BOOTSTRAP_DOWN, PEER_OFFLINE, PEER_UNREACHABLE, PEER_WRONG_OUTPUTS,
    PEER_FAILING, PEER_SCORE_BELOW, MONITOR_STALE, MODEL_KINDS, LOST_SERVERS, PEER_KINDS, KINDS, PENDING,
    FIRING, FIRED, CHANGED, NEWS, REPEATED, RESOLVED, EVENTS, CRITICAL, WARNING, INFO, OK, LEFT, CAUSE_WORDS,
    SUMMARY_CHARS, MAX_DETAILS, DETAIL_CHARS, Rule, Cause, ModelView, PeerView, BootstrapView, SwarmView,
    Condition, severity_for, conditions,
)


# ---- the memory and the output --------------------------------------------------------------


class _Labelled:
    """What silences and inhibition rules match an alert or a notice by (``muting.labels``): the
    same labels from the same fields, so a notice is muted exactly as its alert is."""

    rule: str
    kind: str
    severity: str
    subject: str
    models: tuple[str, ...]
    peer: Optional[str]
    peer_name: Optional[str]

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
    causes: tuple[Cause, ...] = ()  # a model alert's: the servers behind it, each told or not
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
    # a model alert's servers its receivers were told of: (peer id, name, cause) — Alertmanager gets one
    # alert per server besides the model's (not kept in the history: a notice re-read from it has none)
    causes: tuple[tuple[str, Optional[str], str], ...] = ()


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


# ---- transitions ----------------------------------------------------------------------------


def _notice(alert: Alert, event: str, at: float, *, previous: Optional[str] = None,
            condition: Optional[Condition] = None) -> Notice:
    source = condition or alert
    return Notice(rule=alert.rule, kind=alert.kind, subject=alert.subject, label=source.label, event=event,
                  state=source.state, severity=source.severity, summary=source.summary, at=at,
                  since=alert.since, details=source.details, previous_state=previous,
                  models=alert.models, peer=alert.peer, peer_name=alert.peer_name, causes=told_causes(alert))


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
    before = alert.causes if alert is not None else ()
    causes = _remember(condition.causes or before, before, now)  # (a new leader may not know who left yet)
    text: dict[str, Any] = dict(label=condition.label, summary=condition.summary, details=condition.details,
                # a peer no poll sees any more still concerns what it served
                models=condition.models or (alert.models if alert is not None else ()),
                peer=condition.peer or (alert.peer if alert is not None else None),
                peer_name=condition.peer_name or (alert.peer_name if alert is not None else None))
    wait = _wait(rule, condition, causes)
    if alert is None or alert.status == PENDING:
        since = alert.since if alert is not None else now
        alert = Alert(rule=rule.name, kind=rule.kind, subject=condition.subject, status=PENDING,
                      state=condition.state, severity=condition.severity, since=since, causes=causes, **text)
        if now - since >= wait and _confirmed_away(rule, condition, causes, since, now):
            alert = replace(alert, status=FIRING, fired_at=now, notified_at=now, causes=_told(causes))
            return alert, _notice(alert, FIRED, now)
        return alert, None
    if condition.state != alert.state:
        next_since = alert.next_since if alert.next_state == condition.state and alert.next_since else now
        if now - next_since >= wait and _confirmed_away(rule, condition, causes, next_since, now):
            previous = alert.state
            alert = replace(alert, state=condition.state, severity=condition.severity, notified_at=now,
                            next_state=None, next_since=None, causes=_told(causes), **text)
            return alert, _notice(alert, CHANGED, now, previous=previous)
        return replace(alert, next_state=condition.state, next_since=next_since, causes=causes, **text), None
    alert = replace(alert, next_state=None, next_since=None, clear_since=None, causes=causes, **text)
    news = [c for c in causes if not c.told and _held(rule, c, now)]
    if news:  # the same state, but a server behind it that nobody was told of: news
        keys = {c.key for c in news}
        alert = replace(alert, notified_at=now, causes=tuple(c._replace(told=True) if c.key in keys else c
                                                             for c in causes))
        what = "; ".join(c.phrase for c in news)
        summary = short_error(f"{condition.label} is {condition.state}: now also {what}", SUMMARY_CHARS)
        notice = _notice(alert, NEWS, now, previous=alert.state, condition=replace(condition, summary=summary))
        return alert, replace(notice, peer=news[0].peer, peer_name=news[0].name)  # (the server that is news)
    if rule.repeat_seconds > 0 and now - (alert.notified_at or alert.fired_at or now) >= rule.repeat_seconds:
        alert = replace(alert, notified_at=now)
        return alert, _notice(alert, REPEATED, now)
    return alert, None


def told_causes(alert: Alert) -> tuple[tuple[str, Optional[str], str], ...]:
    """(peer id, name, cause) of the servers behind a model alert that its receivers were told of."""
    return tuple((c.peer, c.name, c.why) for c in alert.causes if c.told)


def _remember(causes: Iterable[Cause], before: Iterable[Cause], now: float) -> tuple[Cause, ...]:
    """The causes behind an alert now, each with when the alert first saw it and whether its
    receivers were told (a cause that went away and came back is news again)."""
    known = {c.key: c for c in before}
    kept = []
    for cause in causes:
        old = known.get(cause.key)
        kept.append(cause._replace(since=old.since if old is not None and old.since is not None else now,
                                   told=old is not None and old.told))
    return tuple(kept)


def _told(causes: Iterable[Cause]) -> tuple[Cause, ...]:
    return tuple(c._replace(told=True) for c in causes)


def _wait_for(rule: Rule, cause: Cause) -> float:
    """How long one cause must hold before it is told: none when confirmed; a server that left the
    rule's ``left_wait`` (a clean restart is back before it); anything else the rule's ``for``."""
    if cause.confirmed:
        return 0.0
    return rule.left_wait if cause.why == LEFT else rule.for_seconds


def _looked_again(rule: Rule, seen: Optional[float], since: float) -> bool:
    """Whether the poll ``seen`` (the latest still showing a server away; None: not known) was taken
    the rule's ``left_wait`` after the alert first saw it away (``since``)."""
    return seen is None or seen - since >= rule.left_wait


def _held(rule: Rule, cause: Cause, now: float) -> bool:
    """Whether one cause has held long enough to be told (``_wait_for``); a server that left, only
    once a poll taken ``left_wait`` after the alert first saw it away still shows it away."""
    since = cause.since if cause.since is not None else now
    if now - since < _wait_for(rule, cause):
        return False
    return cause.confirmed or cause.why != LEFT or _looked_again(rule, cause.seen, since)


def awaiting_poll(rules: Iterable[Rule], alerts: Mapping[tuple[str, str], Alert], last_poll: Optional[float],
                  now: float) -> bool:
    """Whether a server that left (a model's, or a peer offline) is due to be told but no poll since
    has looked again: the poller should poll now (was it a restart, back by now?) rather than at its
    next period."""
    by_name = {rule.name: rule for rule in rules}
    for (name, _), alert in alerts.items():
        rule = by_name.get(name)
        if rule is None:
            continue
        if (alert.status == PENDING and alert.state == "offline" and now - alert.since >= rule.left_wait
                and not (last_poll is not None and _looked_again(rule, last_poll, alert.since))):
            return True
        for c in alert.causes:
            if (c.why == LEFT and not c.confirmed and not c.told and c.since is not None
                    and now - c.since >= rule.left_wait and not _held(rule, c, now)):
                return True
    return False


def _confirmed_away(rule: Rule, condition: Condition, causes: tuple[Cause, ...], since: float, now: float) -> bool:
    """When a condition waits on servers that left — a peer offline, or a model whose causes are
    those (or confirmed ones) — each of them seen away by a poll late enough (``_held``); else
    nothing more to wait for."""
    if condition.state == "offline" and not condition.confirmed:
        return _looked_again(rule, condition.seen, since)
    if not causes or not all(c.why == LEFT or c.confirmed for c in causes):
        return True
    return all(_held(rule, c, now) for c in causes if c.why == LEFT and not c.confirmed)


def _wait(rule: Rule, condition: Condition, causes: tuple[Cause, ...]) -> float:
    """How long the condition must hold before it is told: none when it rests on confirmed checks;
    the rule's ``left_wait`` when the rest are servers that left (a model's) or it is a peer gone
    offline; else the rule's ``for``."""
    if condition.confirmed:
        return 0.0
    if condition.state == "offline" or (causes and all(c.confirmed or c.why == LEFT for c in causes)):
        return rule.left_wait
    return rule.for_seconds


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
    return [muting.Subject(key, alert.labels, alert.status == FIRING, tuple((c.peer, c.name) for c in alert.causes))
            for key, alert in alerts.items()]


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
# a server that left (OFFLINE, JOINING, gone from the DHT) is told once gone this long (or ``for``, if shorter):
# a restart that is back within it pages nobody, and a stop is told well within 90 s at the defaults
LEFT_HOLD = 45.0


HEARTBEAT = 60.0  # the store learns that the rules were evaluated at least this often (/alerts, /metrics)


def default_for(kind: str, scrape_period: float) -> float:
    """A rule's ``for`` unless configured: two scrape periods; none for ``monitor_stale``, whose
    ``periods`` already wait."""
    return 0.0 if kind == MONITOR_STALE else DEFAULT_FOR_PERIODS * scrape_period


def default_rules(scrape_period: float) -> tuple[Rule, ...]:
    """The rules every monitor has unless the operator turns them off or replaces one by name."""
    return tuple(Rule(name, kind, for_seconds=default_for(kind, scrape_period), repeat_seconds=DEFAULT_REPEAT,
                      left_seconds=LEFT_HOLD)
                 for name, kind in (("model-health", MODEL_DEGRADED), ("bootstrap-down", BOOTSTRAP_DOWN),
                                    ("monitor-stale", MONITOR_STALE)))

