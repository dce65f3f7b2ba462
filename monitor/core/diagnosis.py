"""A model's diagnosis as plain data: what ``coverage.diagnose`` returns, what the poller stores
with each poll, and what the dashboard shows.

Kept apart from ``coverage`` (which asks petals' own routing and block selection) so that a web
worker can read a stored diagnosis without importing petals and torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional

from monitor.core.common import jsonable

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


def cause_of(why: str) -> str:
    """The cause (``CAUSES``) of an ``excluded_peers`` text (diagnoses stored before causes were)."""
    for cause in (CAUSE_FAILING, CAUSE_UNREACHABLE):
        if why.startswith(CAUSE_PHRASE[cause]):
            return cause
    if why.startswith("ONLINE but"):
        return CAUSE_WRONG
    return CAUSE_JOINING if why.startswith("JOINING") else CAUSE_OFFLINE


Range = tuple[int, int]  # blocks [start, end), as petals' --block_indices
RouteHop = tuple[str, int, int]  # (peer id, start, end)


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


@dataclass(frozen=True)
class Recommendation:
    start: int
    end: int
    num_blocks: int
    argument: str  # exactly what to pass to petals.cli.run_server, e.g. "--block_indices 4:8"
    reason: str


@dataclass(frozen=True)
class ModelHealth:
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

    @classmethod
    def not_diagnosed(cls, model: str, num_blocks: int, error: str) -> "ModelHealth":
        """What is stored when diagnosing the model failed: the failure, for every reader to show."""
        return cls(model=model, state=NOT_DIAGNOSED, reasons=(f"not diagnosed: {error}",), coverage_pct=0.0,
                   servers_online=0, min_redundancy=0, blocks=(), missing_ranges=(), single_served_ranges=(),
                   bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=None, route=(), recommendation=None)

    def to_dict(self) -> dict:
        """JSON-ready: tuples become lists, non-finite numbers None (``common.jsonable``)."""
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping) -> "ModelHealth":
        """The inverse of ``to_dict`` (a stored diagnosis back as the poller made it)."""
        def spans(key):
            return tuple(tuple(span) for span in data[key])

        return cls(
            model=data["model"], state=data["state"], reasons=tuple(data["reasons"]),
            coverage_pct=data["coverage_pct"], servers_online=data["servers_online"],
            min_redundancy=data["min_redundancy"],
            blocks=tuple(BlockCoverage(**{**b, "peers": tuple(b["peers"])}) for b in data["blocks"]),
            missing_ranges=spans("missing_ranges"), single_served_ranges=spans("single_served_ranges"),
            bottleneck_ranges=spans("bottleneck_ranges"), low_cache_ranges=spans("low_cache_ranges"),
            est_tokens_per_s=data["est_tokens_per_s"], route=spans("route"),
            recommendation=Recommendation(**data["recommendation"]) if data.get("recommendation") else None,
            excluded_peers=dict(data.get("excluded_peers") or {}),
            excluded_causes=dict(data.get("excluded_causes")
                                 or {peer: cause_of(why) for peer, why in (data.get("excluded_peers") or {}).items()}),
            speed_source=data.get("speed_source"),
        )
