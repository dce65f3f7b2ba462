"""A model's assessment as plain data: the one stored verdict per model and poll that every reader
reads (pages, state API, /metrics, alerts, the chat's refusal and routing weights, scores).

``monitor.core.assess.assess`` makes it, at one ``now``, from a poll's snapshot, the latest
reachability checks, the probes of the recent window (``core.probes.recent_window``) and the
model's generation check: the model's state and reasons, its coverage and best route (the
diagnosis, ``coverage.diagnose``) and, per announced server, its cause and what the probes
measured of it (``ServerAssessment``). The poller stores it with the poll (``Store.record_poll``)
and again whenever a later input of the same poll is stored (``Store.record_assessments``);
readers take the newest (``Store.latest_assessments``) and never draw a verdict from raw rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Iterator, Mapping, Optional

from monitor.core.compute_checks import ComputeCheck
from monitor.core.common import jsonable
from monitor.core.probes import WRONG, ServerProbe, Slowness, describe_verdict
from monitor.core.snapshot import ReachabilityResult

HEALTHY, DEGRADED, BROKEN = "healthy", "degraded", "broken"
NOT_DIAGNOSED = "unknown"  # the diagnosis itself failed: stored and shown as such, never as healthy
STATE_SEVERITY = {HEALTHY: 0, DEGRADED: 1, BROKEN: 2}  # worst first when states are merged (an hour, a day)

# Why an announced server does not serve, by cause: the servers table and the reasons group by it.
CAUSE_OFFLINE, CAUSE_JOINING = "OFFLINE", "JOINING"
CAUSE_UNREACHABLE, CAUSE_FAILING, CAUSE_WRONG = "unreachable", "failing", "wrong outputs"
CAUSES = (CAUSE_FAILING, CAUSE_WRONG, CAUSE_UNREACHABLE, CAUSE_JOINING, CAUSE_OFFLINE)
CAUSE_PHRASE = {CAUSE_OFFLINE: "OFFLINE", CAUSE_JOINING: "JOINING", CAUSE_UNREACHABLE: "ONLINE but unreachable",
                 CAUSE_FAILING: "ONLINE but failing", CAUSE_WRONG: "ONLINE but returning wrong outputs"}
REASON_ERROR_CHARS = 120  # a server's own error, as quoted in a reason (the servers table has it whole)


# A server's cause when it does serve: as announced, or measured slow (it still serves: the chat routes
# around it where it can, petals' default routing does not).
CAUSE_SERVING, CAUSE_SLOW = "serving", "slow"


Range = tuple[int, int]  # blocks [start, end), as petals' --block_indices


@dataclass(frozen=True)
class RouteHop:
    """One hop of a route: the peer that runs blocks [start, end) of it. The best route of an
    assessment and a request's route carry just that; the route an answer of the chat took also how
    the peer did (its score, the seconds per token measured on this span). Unpacks as
    ``(peer_id, start, end)``, the form routes are stored in."""

    peer_id: str
    start: int
    end: int
    score: Optional[float] = None
    seconds_per_token: Optional[float] = None  # measured for this span during the answer

    def __iter__(self) -> Iterator:
        return iter((self.peer_id, self.start, self.end))

    def to_dict(self) -> dict:
        """As the chat's answers show it (``done.route``, the APIs' ``route``)."""
        return asdict(self)


def ranges(blocks: Iterable[int]) -> list[Range]:
    """Consecutive block indices merged into ``(start, end)`` ranges, end exclusive."""
    merged: list[list[int]] = []
    for block in sorted(set(blocks)):
        if merged and merged[-1][1] == block:
            merged[-1][1] = block + 1
        else:
            merged.append([block, block + 1])
    return [(start, end) for start, end in merged]


def format_ranges(spans: Iterable[Range]) -> str:
    """``[(0, 4), (6, 7)]`` -> ``"0:4, 6:7"``."""
    return ", ".join(f"{start}:{end}" for start, end in spans)


@dataclass(frozen=True)
class BlockCoverage:
    index: int
    peers: tuple[str, ...]  # serving peer ids
    online: int
    total_throughput: float
    min_throughput: Optional[float]
    cache_tokens_left: Optional[int]  # sum over serving servers that announce it; None if none do
    # tokens of one session its servers have room for (``snapshot.session_room`` of each over its
    # whole span, summed); None if none announces it (or an assessment stored before it was kept)
    session_room: Optional[int] = None


@dataclass(frozen=True)
class Recommendation:
    start: int
    end: int
    num_blocks: int
    argument: str  # exactly what to pass to petals.cli.run_server, e.g. "--block_indices 4:8"
    reason: str


@dataclass(frozen=True)
class ServerAssessment:
    """One announced server of one model as its assessment judged it: its cause, and what the
    probes of the recent window measured of it."""

    peer_id: str
    cause: str  # CAUSE_SERVING | CAUSE_SLOW | one of CAUSES
    measured: Optional[float] = None  # seconds per token per block, compute (``probes.measured_speeds``)
    round_trip: Optional[float] = None  # the same, round trip included: the chat's measure of a span
    measured_at: Optional[float] = None  # the newest timed probe the measurement rests on
    slowness: Optional[Slowness] = None  # its ``confirmed``: rests on ``SLOW_CONFIRMATIONS`` probes
    verdict: Optional[ServerProbe] = None  # the newest probe checked for correctness
    last: Optional[ServerProbe] = None  # the newest probe, ok or not
    probes: int = 0  # probes in the window
    failing: Optional[str] = None  # the server's own error, when its newest probes all failed with it
    wrong_outputs: Optional[str] = None  # why its outputs are wrong (its newest verdict says so)
    disagreeing: Optional[str] = None  # its disagreement with other servers nobody outvotes
    checked: Optional[ComputeCheck] = None  # its newest compute check (``core.compute_checks``)
    confirmed: bool = False  # its cause rests on confirming checks (two failed ones, a verdict on its outputs)
    back_at: Optional[float] = None  # the end of its last time away, when its failed reachability check was older

    @property
    def slow(self) -> bool:
        return self.slowness is not None and self.slowness.slow

    @property
    def wrong(self) -> bool:
        return self.verdict is not None and self.verdict.verdict == WRONG

    @property
    def verdict_text(self) -> str:
        return describe_verdict(self.verdict) if self.verdict is not None else "not checked yet"

    @classmethod
    def from_dict(cls, data: Mapping) -> "ServerAssessment":
        def probe(key):
            return ServerProbe(**data[key]) if data.get(key) else None

        return cls(**{**data, "slowness": Slowness(**data["slowness"]) if data.get("slowness") else None,
                      "verdict": probe("verdict"), "last": probe("last"),
                      "checked": ComputeCheck(**data["checked"]) if data.get("checked") else None})


@dataclass(frozen=True)
class Assessment:
    model: str
    state: str  # HEALTHY | DEGRADED | BROKEN | NOT_DIAGNOSED
    reasons: tuple[str, ...]
    coverage_pct: float
    servers_online: int
    min_redundancy: int
    blocks: tuple[BlockCoverage, ...]
    missing_ranges: tuple[Range, ...]
    single_served_ranges: tuple[Range, ...]
    bottleneck_ranges: tuple[Range, ...]
    low_cache_ranges: tuple[Range, ...]
    est_tokens_per_s: Optional[float]  # None when no route exists
    route: tuple[RouteHop, ...]
    recommendation: Optional[Recommendation]  # None only when not diagnosed
    excluded_peers: dict[str, str] = field(default_factory=dict)  # announced but not serving: why
    excluded_causes: dict[str, str] = field(default_factory=dict)  # the same peers: their cause (CAUSES)
    # what est_tokens_per_s rests on: "measured", "partly measured", "announced"; None without a route
    speed_source: Optional[str] = None
    # per announced server of the model: its cause and what the probes measured (``assess``)
    servers: dict[str, ServerAssessment] = field(default_factory=dict)
    assessed_at: Optional[float] = None  # the one ``now`` every window was read at
    poll_at: Optional[float] = None  # the poll it describes (``Snapshot.taken_at``)
    # the servers the model lost: served it within ``LOST_WITHIN`` and do not now (peer id -> its public
    # name), and whether the state rests on confirmed verdicts only (``confirmed``): what the alerts
    # and /metrics read, so that every reader — and a standby that takes over — says the same
    lost: dict[str, Optional[str]] = field(default_factory=dict)
    trouble_confirmed: bool = False
    # each of its servers' reachability as this assessment judged it (``assess.assessed_reachability``:
    # what the pages and alerts show, not the raw round); a server absent has none to show; None: an
    # assessment stored before it was kept (readers judge those from the raw rounds, as then)
    reachability: Optional[dict[str, ReachabilityResult]] = None

    def flagged(self, cause: str) -> dict[str, str]:
        """peer -> why, for the servers of this cause: CAUSE_FAILING (their own error), CAUSE_WRONG
        (why their outputs are wrong), CAUSE_UNREACHABLE (announced, but no answer)."""
        if cause == CAUSE_FAILING:
            return {peer: s.failing for peer, s in self.servers.items() if s.failing is not None}
        if cause == CAUSE_WRONG:
            return {peer: s.wrong_outputs for peer, s in self.servers.items() if s.wrong_outputs is not None}
        if cause == CAUSE_UNREACHABLE:
            return {peer: CAUSE_PHRASE[cause] for peer, s in self.servers.items() if s.cause == cause}
        raise ValueError(f"no reasons are kept for cause {cause!r}")

    def confirmed(self, troubled: Iterable[str]) -> bool:
        """Whether the model's state rests on confirmed verdicts only: every server it lost
        (``troubled``: recent servers not serving now) is excluded for a confirmed cause, and every
        slow one is confirmed slow — told at once by the alerts. A server that left or stopped
        (OFFLINE, gone from the DHT) is not: a clean restart is back before ``for`` is over."""
        troubled = set(troubled)
        if self.state == HEALTHY or not (troubled or any(s.cause == CAUSE_SLOW for s in self.servers.values())):
            return False
        if any(peer not in self.servers or not self.servers[peer].confirmed for peer in troubled):
            return False
        return all(s.confirmed for s in self.servers.values() if s.cause == CAUSE_SLOW)

    def with_lost(self, lost: Mapping[str, Optional[str]]) -> "Assessment":
        """This assessment with the servers the model lost (``lost_servers``) and whether its state
        rests on confirmed verdicts only: the one place that is decided."""
        return replace(self, lost=dict(lost), trouble_confirmed=self.confirmed(lost))

    @classmethod
    def not_diagnosed(cls, model: str, num_blocks: int, error: str) -> "Assessment":
        """What is stored when diagnosing the model failed: the failure, for every reader to show."""
        return cls(model=model, state=NOT_DIAGNOSED, reasons=(f"not diagnosed: {error}",), coverage_pct=0.0,
                   servers_online=0, min_redundancy=0, blocks=(), missing_ranges=(), single_served_ranges=(),
                   bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=None, route=(), recommendation=None)

    def to_dict(self) -> dict:
        """JSON-ready: tuples become lists, non-finite numbers None (``common.jsonable``); the route's
        hops ``[peer_id, start, end]``."""
        return jsonable({**asdict(self), "route": [list(hop) for hop in self.route]})

    @classmethod
    def from_dict(cls, data: Mapping) -> "Assessment":
        """The inverse of ``to_dict`` (a stored diagnosis back as the poller made it)."""
        def spans(key):
            return tuple(tuple(span) for span in data[key])

        assessment = cls(
            model=data["model"], state=data["state"], reasons=tuple(data["reasons"]),
            coverage_pct=data["coverage_pct"], servers_online=data["servers_online"],
            min_redundancy=data["min_redundancy"],
            blocks=tuple(BlockCoverage(**{**b, "peers": tuple(b["peers"])}) for b in data["blocks"]),
            missing_ranges=spans("missing_ranges"), single_served_ranges=spans("single_served_ranges"),
            bottleneck_ranges=spans("bottleneck_ranges"), low_cache_ranges=spans("low_cache_ranges"),
            est_tokens_per_s=data["est_tokens_per_s"], route=tuple(RouteHop(*hop) for hop in data["route"]),
            recommendation=Recommendation(**data["recommendation"]) if data.get("recommendation") else None,
            excluded_peers=dict(data.get("excluded_peers") or {}),
            excluded_causes=dict(data.get("excluded_causes") or {}),  # (older rows: migration 0021)
            speed_source=data.get("speed_source"),
            servers={peer: ServerAssessment.from_dict(s) for peer, s in (data.get("servers") or {}).items()},
            assessed_at=data.get("assessed_at"), poll_at=data.get("poll_at"),
            lost=dict(data.get("lost") or {}), trouble_confirmed=bool(data.get("trouble_confirmed")),
            reachability=None if data.get("reachability") is None else {
                peer: ReachabilityResult(**result) for peer, result in data["reachability"].items()},
        )
        if "trouble_confirmed" not in data:  # (rows stored before it was: what /metrics then said)
            assessment = replace(assessment, trouble_confirmed=assessment.confirmed(assessment.excluded_peers))
        return assessment
