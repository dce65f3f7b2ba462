""""Is my server OK?" in plain words: one report per peer, from what the monitor already knows.

The people who run petals servers ask four things, and the report answers each as a check with a
status (ok / warn / bad / info), a sentence and, when something is wrong, what to do:

- **visible** — is it in this swarm's DHT now? If not: never seen here, left at a given time
  (without announcing OFFLINE), announced OFFLINE, or last seen serving a model this monitor no
  longer watches (another ``dht_prefix``);
- **announced** — its state and span per model, and its petals version against the swarm's;
- **reachable** — the latest reachability check (or a live one the visitor asked for);
- **useful** — what it serves against what the swarm needs: blocks only it serves, blocks
  still missing, and where petals' own block selection would put a new server (the
  ``Recommendation`` the poller stored with each model's diagnosis);

plus its **score** and why. Pure: plain data in (``ServerFacts``), ``ServerReport`` out; no petals.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from monitor.core.common import short_peer_id
from monitor.core.assessment import CAUSE_FAILING, CAUSE_WRONG, Assessment, format_ranges, ranges
from monitor.core.scores import PeerScore
from monitor.core.snapshot import JOINING, OFFLINE, ModelInfo, ReachabilityResult, ServerRow
from monitor.core.timefmt import ago, duration, utc

OK, WARN, BAD, INFO = "ok", "warn", "bad", "info"
LOW_SCORE = 30  # below it a score is a warning (the chat's default min_peer_score)
_WORST = {OK: 0, INFO: 0, WARN: 1, BAD: 2}


@dataclass(frozen=True)
class LastAnnouncement:
    """What the peer announced for one model the last time a poll saw it (``at``: that poll; an
    hour's summary once raw rows are gone: ``hourly``, ``state`` the best it had that hour)."""

    at: float
    model: str
    state: str
    start: Optional[int] = None
    end: Optional[int] = None
    version: Optional[str] = None
    hourly: bool = False


@dataclass(frozen=True)
class ServerFacts:
    """Everything the report is made from, as the web reads it from the store."""

    peer_id: str
    now: float
    poll_at: Optional[float]  # the latest successful poll (None: no poll yet)
    models: tuple[ModelInfo, ...]  # the models of that poll
    rows: tuple[ServerRow, ...]  # the peer's rows in that poll
    versions: Mapping[str, int] = field(default_factory=dict)  # petals version -> servers in that poll
    first_seen: Optional[float] = None  # first/last poll that saw it announce; None: never
    last_seen: Optional[float] = None
    last: tuple[LastAnnouncement, ...] = ()  # when it is not in the latest poll
    reachability: Optional[ReachabilityResult] = None  # the latest reachability check (stored, or a live one)
    reachability_is_live: bool = False
    assessments: Mapping[str, Assessment] = field(default_factory=dict)
    score: Optional[PeerScore] = None


@dataclass(frozen=True)
class Check:
    name: str  # visible, announced, reachable, useful, score
    status: str  # ok / warn / bad / info
    text: str
    advice: Optional[str] = None


@dataclass(frozen=True)
class ServerReport:
    peer_id: str
    status: str  # the worst check
    headline: str
    checks: tuple[Check, ...]
    recommendations: tuple[tuple[str, str, str], ...] = ()  # (model, "--block_indices a:b", why)

    def to_dict(self) -> dict:
        return {"peer_id": self.peer_id, "status": self.status, "headline": self.headline,
                "checks": [vars(c) for c in self.checks],
                "recommendations": [{"model": m, "argument": a, "reason": r} for m, a, r in self.recommendations]}


def check(facts: ServerFacts) -> ServerReport:
    """The report for one peer."""
    names = {m.dht_prefix: m.name or m.dht_prefix for m in facts.models}
    checks = [_visible(facts, names)]
    if facts.rows:
        checks.append(_announced(facts, names))
        checks.append(_reachable(facts))
        checks.extend(_useful(facts, row, names) for row in facts.rows)
    elif facts.reachability is not None and facts.reachability_is_live:
        checks.append(_reachable(facts))
    checks.append(_score(facts))
    status = max((c.status for c in checks), key=_WORST.__getitem__)
    return ServerReport(peer_id=facts.peer_id, status=status, headline=_headline(facts, checks, names),
                        checks=tuple(checks), recommendations=_recommendations(facts, names))


def _when(at: float, now: float) -> str:
    """``3 h ago (2026-11-30 14:02 UTC)``."""
    return f"{ago(at, now)} ({utc(at, seconds=False)})"


def _other_version(version: Optional[str], versions: Mapping[str, int]) -> str:
    """A sentence when ``version`` is not the swarm's most common petals version, else ''."""
    common = Counter(versions).most_common(1)
    if version and common and common[0][0] != version:
        return f" It runs petals {version}; most servers run {common[0][0]}."
    return ""


def _span(row, names: Mapping[str, str]) -> str:
    return f"blocks {row.start}:{row.end} of {names.get(row.model, row.model)}"


# ---- the checks -----------------------------------------------------------------------------


def _visible(facts: ServerFacts, names: Mapping[str, str]) -> Check:
    if facts.poll_at is None:
        return Check("visible", INFO, "The monitor has not finished a poll of the DHT yet.",
                     "Come back in a minute.")
    if facts.rows:
        return Check("visible", OK, f"Seen in this swarm's DHT by the latest poll ({ago(facts.poll_at, facts.now)}), "
                     f"announcing {len(facts.rows)} span{'s' if len(facts.rows) != 1 else ''}.")
    watched = ", ".join(sorted(names)) or "none yet"
    if facts.first_seen is None:
        return Check(
            "visible", BAD, "Never seen in this swarm's DHT: no poll of this monitor has found this peer "
            "announcing blocks.",
            "Check that the server was started with this swarm's initial peers and that its log says it "
            f"announced its blocks; the model's DHT prefix must be one this monitor watches ({watched}). "
            "A server started in the last minute appears after the next poll.")
    when = _when(facts.last_seen, facts.now) if facts.last_seen else "some time ago"
    last = facts.last[0] if facts.last else None
    version = _other_version(last.version, facts.versions).replace("runs", "ran", 1) if last is not None else ""
    if last is not None and last.model not in names:
        return Check(
            "visible", BAD, f"Not in the latest poll. It was last seen {when}, serving {last.model}, a model "
            "this monitor does not see in the DHT any more." + version,
            f"If the server now serves another model, check its DHT prefix: this monitor watches {watched}.")
    if last is not None and last.state == OFFLINE:
        return Check("visible", BAD, f"Not in the latest poll. It announced OFFLINE {when} "
                     "(a clean shutdown, or a restart in progress)." + version,
                     "If you did not stop it, look at the end of the server's log for why it shut down.")
    return Check("visible", BAD, f"Not in the latest poll. It was last seen {when}"
                 + (f", {last.state} on {_span(last, names)}," if last is not None and last.start is not None else "")
                 + " and left without announcing OFFLINE." + version,
                 "The process stopped, crashed or lost its network: look at the server's log and restart it. "
                 "Its announcements expire from the DHT within a few minutes of its last update.")


def _announced(facts: ServerFacts, names: Mapping[str, str]) -> Check:
    parts, status = [], OK
    for row in facts.rows:
        parts.append(f"{row.state} on {_span(row, names)}")
        if row.state == JOINING:
            status = max(status, WARN, key=_WORST.__getitem__)
        elif row.state == OFFLINE:
            status = BAD
    text = "Announces " + "; ".join(parts) + "."
    advice = None
    if status == WARN:
        advice = "JOINING means it is still loading its blocks; it serves once it announces ONLINE."
    elif status == BAD:
        advice = "OFFLINE means it is shutting down or restarting; it does not serve requests."
    other = _other_version(next((row.version for row in facts.rows if row.version), None), facts.versions)
    if other:
        text += other
        if status == OK:
            status = INFO
    return Check("announced", status, text, advice)


def _reachable(facts: ServerFacts) -> Check:
    found = facts.reachability
    how = "A live check just now" if facts.reachability_is_live else "The latest reachability check"
    if found is None:
        return Check("reachable", INFO, "Not checked yet: the monitor checks every server's reachability every "
                     "minute or so.", "Use “Check now” to check it.")
    if found.ok:
        rtt = f" in {duration(found.rtt)}" if found.rtt is not None else ""
        return Check("reachable", OK, f"{how} reached it{rtt}.")
    if found.joining:
        return Check("reachable", WARN, f"{how} reached it, but it is still loading its blocks.",
                     "Wait until it announces ONLINE.")
    return Check("reachable", BAD, f"{how} could not reach it: {found.error or 'no answer'}.",
                 "Clients cannot use a server the monitor cannot reach: make sure its port is reachable "
                 "from the internet (forward it, or give --public_ip and --port), or let it use a relay.")


# What to try, by why the diagnosis does not count a server (``CAUSES``); the others have their own check.
_EXCLUDED_ADVICE = {
    CAUSE_FAILING: "It is up and reachable, but every inference step through it fails with that error, so every "
                   "client routed through it fails. Read the server's log around that error: the usual causes are "
                   "running out of GPU memory (serve fewer blocks with --num_blocks, or lower --attn_cache_tokens), "
                   "a broken GPU driver or CUDA install, and a petals, torch or transformers version that does not "
                   "match the model's. Restart the server once fixed; the monitor counts it again after its next "
                   "successful probe.",
    CAUSE_WRONG: "Its outputs differ from the model's: check that it serves the right checkpoint and revision, "
                 "and its --torch_dtype and --quant_type; restart it once fixed.",
}


def _useful(facts: ServerFacts, row: ServerRow, names: Mapping[str, str]) -> Check:
    model = names.get(row.model, row.model)
    assessment = facts.assessments.get(row.model)
    if assessment is None or not assessment.blocks:
        return Check("useful", INFO, f"{model}: not diagnosed yet.")
    excluded = assessment.excluded_peers.get(facts.peer_id)
    if excluded:
        return Check("useful", BAD, f"{model}: the monitor does not count it as serving its blocks: {excluded}.",
                     _EXCLUDED_ADVICE.get(assessment.excluded_causes.get(facts.peer_id, "")))
    blocks = [b for b in assessment.blocks if row.start <= b.index < row.end]
    others = {b.index: b.online - (1 if facts.peer_id in b.peers else 0) for b in blocks}
    sole = ranges(i for i, n in others.items() if n <= 0)
    thin = ranges(i for i, n in others.items() if n == 1)
    text = f"{model}: serves blocks {row.start}:{row.end}"
    if sole:
        text += f"; it is the only server of {format_ranges(sole)} (without it the model has a gap there)"
    elif thin:
        text += f"; one other server shares {format_ranges(thin)}"
    else:
        text += f"; every one of its blocks has at least {min(others.values(), default=0)} other servers"
    missing = [r for r in assessment.missing_ranges if r[1] <= row.start or r[0] >= row.end]
    if missing:
        text += f". The model still misses blocks {format_ranges(missing)}"
    return Check("useful", OK if sole or thin or not missing else INFO, text + ".")


def _score(facts: ServerFacts) -> Check:
    if facts.score is None:
        return Check("score", INFO, "Not scored yet: scores are computed every few minutes.")
    value = facts.score.score
    status = OK if value >= 60 else INFO if value >= LOW_SCORE else WARN
    advice = None
    if status == INFO:
        advice = ("A new server starts at 50 and earns points as polls, reachability checks, probes and chats see "
                  "it serve well.")
    elif status == WARN:
        advice = "Low scores come from the sentences above; the health-aware chat routes around such peers."
    return Check("score", status, f"Health score {value:.0f}/100: " + "; ".join(facts.score.explanation) + ".", advice)


def _recommendations(facts: ServerFacts, names: Mapping[str, str]) -> tuple[tuple[str, str, str], ...]:
    """Where petals' own block selection would put a new server, for the models this peer serves
    (or, when it serves none now, the ones it served last)."""
    served = [row.model for row in facts.rows] or [a.model for a in facts.last]
    out = []
    for model in dict.fromkeys(served):
        assessment = facts.assessments.get(model)
        if assessment is not None and assessment.recommendation is not None:
            rec = assessment.recommendation
            out.append((names.get(model, model), rec.argument, rec.reason))
    return tuple(out)


def _headline(facts: ServerFacts, checks: Sequence[Check], names: Mapping[str, str]) -> str:
    who = short_peer_id(facts.peer_id)
    bad = [c for c in checks if c.status == BAD]
    if bad:
        return f"{who}: {bad[0].text}"
    warn = [c for c in checks if c.status == WARN]
    if warn:
        return f"{who} is visible, with something to look at: {warn[0].text}"
    if facts.rows:
        return f"{who} is visible, reachable and serving " + ", ".join(
            f"{row.start}:{row.end} of {names.get(row.model, row.model)}" for row in facts.rows) + "."
    return f"{who}: {checks[0].text}"
