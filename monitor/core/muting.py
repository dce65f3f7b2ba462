"""What holds an alert's notices back: silences, maintenance windows and inhibition, as pure functions.

A held (muted) alert keeps its state: it is pending, firing and resolved as the rules say, the
dashboard shows it with why it is held, but no notice of it goes out (``alert_rules.evaluate``
decides what is then told, and when). Three things hold an alert, as in Prometheus' Alertmanager:

- a **silence**: matchers over the alert's labels, from a start to an end, with who made it and
  why (an operator silences a rule, a model, a peer, or anything its labels match);
- a **maintenance window** (``core/maintenance.py``) in force that covers the alert's model or peer
  (or the whole swarm);
- **inhibition**: while a *source* alert fires, *target* alerts that share the ``equal`` labels
  with it are held. The default rule holds the per-peer alerts of a model's servers while one of
  the model's alerts fires: one cause, one notice.

A model's alert is also held when everything it lost is held: every server of the model that
served it lately and does not now (its *causes*) is under a silence or a maintenance window (an
operator who silences server-2 and stops it hears nothing of the model degrading because of it;
a second server failing meanwhile is not silenced, and the model's alert goes out).

Labels (what matchers see; ``labels``): ``alertname`` (``Petals`` + the kind, as the Prometheus
rules name them), ``rule``, ``kind``, ``severity``, ``subject``, ``model`` (the model; for a peer
alert every model the peer serves), ``peer`` (its id when known) and ``peer_name``. A label may
have several values (a server of two models): ``=`` and ``=~`` match when one of them does, ``!=``
and ``!~`` when none does; an absent label is the empty string, as in Alertmanager.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping, Optional, Sequence

from monitor.core.maintenance import MaintenanceWindow, active as windows_in_force

LABEL_NAMES = ("alertname", "rule", "kind", "severity", "subject", "model", "peer", "peer_name")
OPERATORS = ("=~", "!~", "!=", "=")  # longest first (parsing)
MAX_MATCHERS = 20
MAX_VALUE_CHARS = 256
ALERTNAMES = {"model_degraded": "PetalsModelDegraded", "model_broken": "PetalsModelBroken",
              "bootstrap_down": "PetalsBootstrapPeerDown", "monitor_stale": "PetalsMonitorStale",
              "peer_offline": "PetalsPeerOffline", "peer_unreachable": "PetalsPeerUnreachable",
              "peer_wrong_outputs": "PetalsPeerWrongOutputs", "peer_failing": "PetalsPeerFailing",
              "peer_score_below": "PetalsPeerScoreBelow"}

Labels = Mapping[str, tuple[str, ...]]

SILENCE, MAINTENANCE, INHIBITED = "silence", "maintenance", "inhibited"  # kinds of hold


def alertname(kind: str) -> str:
    return ALERTNAMES.get(kind, "Petals" + "".join(part.title() for part in kind.split("_")))


def labels(*, rule: str, kind: str, severity: str, subject: str, models: Iterable[str] = (),
           peer: Optional[str] = None, peer_name: Optional[str] = None) -> dict[str, tuple[str, ...]]:
    """An alert's labels (every value a tuple; absent labels left out)."""
    found = {"alertname": (alertname(kind),), "rule": (rule,), "kind": (kind,), "severity": (severity,),
             "subject": (subject,), "model": tuple(sorted(set(m for m in models if m))),
             "peer": (peer,) if peer else (), "peer_name": (peer_name,) if peer_name else ()}
    return {name: values for name, values in found.items() if values}


# ---- matchers -----------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


@dataclass(frozen=True)
class Matcher:
    """``name op value``: ``=`` equal, ``!=`` not equal, ``=~`` matches the regular expression
    (anchored, as in Alertmanager), ``!~`` does not."""

    name: str
    op: str
    value: str

    def matches(self, found: Labels) -> bool:
        values = found.get(self.name) or ("",)
        if self.op == "=":
            return self.value in values
        if self.op == "!=":
            return self.value not in values
        pattern = _compiled(self.value)
        hit = any(pattern.fullmatch(v) for v in values)
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


_MATCHER = re.compile(r'^\s*([a-z_]+)\s*(=~|!~|!=|=)\s*(.*?)\s*$', re.S)


def matcher(name: str, op: str, value: str) -> Matcher:
    """A checked matcher; ValueError saying what is wrong."""
    if name not in LABEL_NAMES:
        raise ValueError(f"unknown label {name[:40]!r}; labels are {', '.join(LABEL_NAMES)}")
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op[:4]!r}; use =, !=, =~ or !~")
    if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or any(ord(c) < 32 for c in value):
        raise ValueError(f"the value of {name} must be one line of at most {MAX_VALUE_CHARS} characters")
    if op in ("=~", "!~"):
        try:
            _compiled(value)
        except re.error as e:
            raise ValueError(f"{name}{op}{value[:60]!r}: not a regular expression ({e})") from None
    return Matcher(name, op, value)


def parse_matcher(text: str) -> Matcher:
    """``model="llama"``, ``peer_name=~"gpu-.*"``, ``kind!=peer_offline`` (quotes optional)."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS + 40:
        raise ValueError("a matcher is one short line like model=\"llama\"")
    found = _MATCHER.match(text)
    if not found:
        raise ValueError(f"{text[:60]!r} is not a matcher like model=\"llama\" or peer_name=~\"gpu-.*\"")
    name, op, value = found.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return matcher(name, op, value)


def matches_all(matchers: Sequence[Matcher], found: Labels) -> bool:
    return all(m.matches(found) for m in matchers)


# ---- silences and inhibition --------------------------------------------------------------------


@dataclass(frozen=True)
class Silence:
    """Alerts matching every matcher send nothing from ``starts_at`` to ``ends_at`` (an operator
    who ends it early sets ``ends_at`` to then: ``ended_at``)."""

    id: int
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    created_at: float
    ended_at: Optional[float] = None
    ended_by: Optional[str] = None

    def active(self, at: float) -> bool:
        return self.starts_at <= at < self.ends_at

    def matches(self, found: Labels) -> bool:
        return matches_all(self.matchers, found)

    def describe(self) -> str:
        return ", ".join(str(m) for m in self.matchers)


@dataclass(frozen=True)
class InhibitRule:
    """While an alert matching ``source`` fires, alerts matching ``target`` that share a value of
    every ``equal`` label with it are held (an alert never inhibits itself)."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


# the documented default: a model's alert holds the per-peer alerts of the model's servers
PEERS_OF_A_FIRING_MODEL = InhibitRule(source=(Matcher("kind", "=~", "model_.*"),),
                                      target=(Matcher("kind", "=~", "peer_.*"),), equal=("model",))


@dataclass(frozen=True)
class Mutes:
    """Everything that may hold alerts back now: the silences and windows the store holds (the
    evaluator picks the ones in force) and the inhibition rules in force."""

    silences: tuple[Silence, ...] = ()
    windows: tuple[MaintenanceWindow, ...] = ()
    inhibit: tuple[InhibitRule, ...] = ()


@dataclass(frozen=True)
class Subject:
    """One alert as muting sees it: its key, labels, and whether it fires."""

    key: tuple[str, str]
    labels: Labels
    firing: bool
    causes: tuple[tuple[str, Optional[str]], ...] = ()  # a model alert's lost servers: (peer id, name)


def _shares(a: Labels, b: Labels, names: Sequence[str]) -> bool:
    return all(set(a.get(n) or ("",)) & set(b.get(n) or ("",)) for n in names)


def holds(subjects: Sequence[Subject], mutes: Mutes, now: float) -> dict[tuple[str, str], tuple[str, ...]]:
    """key -> why each held alert is held ("silence 3: …", "maintenance 2: …", "inhibited by
    model-health/llama"); alerts not held are left out. Silences and windows count while in force
    at ``now``; a source inhibits while it fires, held or not (as in Alertmanager)."""
    silences = [s for s in mutes.silences if s.active(now)]
    windows = windows_in_force(mutes.windows, now) if mutes.windows else []
    sources = [(rule, s) for rule in mutes.inhibit for s in subjects if s.firing and matches_all(rule.source, s.labels)]
    def silenced_or_maintained(found: Labels) -> list[str]:
        why = [f"{SILENCE} {s.id}: {s.comment}" for s in silences if s.matches(found)]
        return why + [f"{MAINTENANCE} {w.id}: {w.reason}" for w in windows if w.covers(
            models=found.get("model", ()), peers=(*found.get("peer", ()), *found.get("peer_name", ())))]

    held: dict[tuple[str, str], tuple[str, ...]] = {}
    for subject in subjects:
        found = subject.labels
        why = silenced_or_maintained(found)
        for rule, source in sources:
            if source.key != subject.key and matches_all(rule.target, found) and _shares(source.labels, found,
                                                                                         rule.equal):
                why.append(f"{INHIBITED} by {source.key[0]}/{source.key[1]}")
                break
        if not why and subject.causes:
            per_cause = [silenced_or_maintained({"model": found.get("model", ()), "peer": (peer,),
                                                 **({"peer_name": (name,)} if name else {})})
                         for peer, name in subject.causes]
            if all(per_cause):
                names = ", ".join(name or peer for peer, name in subject.causes)
                why = [f"{reasons[0]} (what the model lost: {names})" for reasons in per_cause[:1]]
        if why:
            held[subject.key] = tuple(why)
    return held


def hold_kind(reason: str) -> str:
    """silence | maintenance | inhibited, from one of ``holds``' reasons."""
    return reason.split(" ", 1)[0]
