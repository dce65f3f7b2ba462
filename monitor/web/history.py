"""The history APIs' answers, bounded: within what the store keeps, and at most so many points.

Anyone may ask ``/api/v1/models/<m>/history`` or ``/api/v1/peers/<p>/history`` for any range, so
what one request can cost is bounded twice:

- **retention**: history older than ``rollup_retention_days`` is gone. A ``since`` before that is
  clamped to the oldest time kept, and the answer says so (``limits.since_requested`` and a note);
  a range that ends before it is a 400 (there is nothing to show).
- **points**: every series has at most ``history_max_points`` points. Series of samples (a model's
  status, block coverage, a peer's observations per model, its reachability checks — under the
  API's older key ``probes``) are downsampled by merging runs of consecutive points into one, as the
  hourly rollups do: the merged point's ``at`` is the run's first, ``samples`` says how many polls
  or checks it stands for, states are the worst (model
  status) or the most frequent (observations) with ``states`` counting each, numbers are means
  weighted by samples (minimums for redundancy and block coverage by servers). Lists of events
  (state changes, outages, chat outcomes) keep their newest ``history_max_points`` entries; narrow
  the range to see older ones. ``limits.downsampled`` / ``limits.truncated`` name the series and
  how many points they had.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, TypeVar

from monitor.core.common import DAY
from monitor.core.assessment import STATE_SEVERITY
from monitor.web.timerange import BadRange

T = TypeVar("T")
MAX_REASONS = 20  # of a merged status point, as in the hourly rollups


@dataclass
class HistoryLimits:
    """The window actually read, and what was cut from the answer (its ``limits`` object)."""

    since: float
    until: float
    oldest_kept: float
    retention_days: float
    max_points: int
    since_requested: Optional[float] = None  # set when ``since`` was clamped
    downsampled: dict[str, int] = field(default_factory=dict)  # series -> points before merging
    truncated: dict[str, int] = field(default_factory=dict)  # event list -> entries before cutting

    def notes(self) -> list[str]:
        notes = []
        if self.since_requested is not None:
            notes.append(f"since ({self.since_requested:.0f}) was before the oldest history kept "
                         f"({self.retention_days:g} days); it is clamped to {self.since:.0f}")
        for name, total in self.downsampled.items():
            notes.append(f"{name} had {total} points; runs of consecutive points are merged into at most "
                         f"{self.max_points} (see each point's samples)")
        for name, total in self.truncated.items():
            notes.append(f"{name} had {total} entries; the newest {self.max_points} are returned: narrow the "
                         f"range for older ones")
        return notes

    def to_dict(self) -> dict:
        return {"oldest_kept": self.oldest_kept, "max_points": self.max_points, "since_requested": self.since_requested,
                "downsampled": self.downsampled, "truncated": self.truncated, "notes": self.notes()}


def history_limits(since: float, until: float, *, now: float, retention_days: float, max_points: int) -> HistoryLimits:
    """The range clamped to retention; BadRange (400) when all of it is older than that."""
    oldest = now - retention_days * DAY
    if until <= oldest:
        raise BadRange(f"the range ends at {until:.0f}, before the oldest history kept ({oldest:.0f}, "
                       f"{retention_days:g} days ago); ask for a later range")
    if since < oldest:
        return HistoryLimits(oldest, until, oldest, retention_days, max_points, since_requested=since)
    return HistoryLimits(since, until, oldest, retention_days, max_points)


# ---- downsampling ------------------------------------------------------------------------------


def runs(n: int, max_points: int) -> list[range]:
    """Index ranges that cut ``n`` consecutive points into at most ``max_points`` runs of equal length."""
    size = max(1, math.ceil(n / max_points))
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def downsample(name: str, points: Sequence[T], merge: Callable[[Sequence[T]], Any], limits: HistoryLimits) -> list:
    """``points`` itself when short enough, else each run merged into one point (noted in ``limits``)."""
    if len(points) <= limits.max_points:
        return list(points)
    limits.downsampled[name] = limits.downsampled.get(name, 0) + len(points)
    return [merge([points[i] for i in run]) for run in runs(len(points), limits.max_points)]


def newest(name: str, events: Sequence[T], limits: HistoryLimits) -> list:
    """The newest ``max_points`` events (oldest first, as given); the cut is noted in ``limits``."""
    if len(events) <= limits.max_points:
        return list(events)
    limits.truncated[name] = len(events)
    return list(events[-limits.max_points:])


def _weighted_mean(points: Sequence[dict], key: str) -> Optional[float]:
    pairs = [(p[key], p.get("samples", 1)) for p in points if p.get(key) is not None]
    weight = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / weight if weight else None


def _state_counts(points: Sequence[dict]) -> dict[str, int]:
    counts: Counter = Counter()
    for p in points:
        for state, n in (p.get("states") or {p["state"]: p.get("samples", 1)}).items():
            counts[state] += n
    return dict(counts)


def merge_status(points: Sequence[dict]) -> dict:
    """Model status points (``history.model_status_history``) as one, like an hourly rollup."""
    redundancies = [p["min_redundancy"] for p in points if p.get("min_redundancy") is not None]
    return {**points[0],
            "state": max((p["state"] for p in points), key=lambda st: STATE_SEVERITY.get(st, 1)),
            "reasons": list(dict.fromkeys(r for p in points for r in p.get("reasons") or ()))[:MAX_REASONS],
            "coverage_pct": _weighted_mean(points, "coverage_pct"),
            "servers_online": _weighted_mean(points, "servers_online"),
            "min_redundancy": min(redundancies) if redundancies else None,
            "est_tokens_per_s": _weighted_mean(points, "est_tokens_per_s"),
            "samples": sum(p.get("samples", 1) for p in points), "states": _state_counts(points)}


def merge_observations(points: Sequence[dict]) -> dict:
    """One peer's observations of one model as one point: the most frequent state, counts of each."""
    states = _state_counts(points)
    seen = [p for p in points if p.get("seen", True)]
    last_seen = seen[-1] if seen else points[-1]
    return {**last_seen, "at": points[0]["at"], "state": max(states, key=states.get), "states": states,
            "seen": bool(seen), "throughput": _weighted_mean(points, "throughput"),
            "inference_rps": _weighted_mean(points, "inference_rps"),
            "samples": sum(p.get("samples", 1) for p in points)}


def merge_reachability(points: Sequence[dict]) -> dict:
    """Reachability checks as one: ok only if every one was, the mean RTT of those that answered."""
    ok = [p for p in points if p["ok"]]
    failed = [p for p in points if not p["ok"]]
    rtts = [p["rtt"] for p in ok if p.get("rtt") is not None]
    return {**points[-1], "at": points[0]["at"], "ok": not failed, "rtt": sum(rtts) / len(rtts) if rtts else None,
            "error": failed[-1]["error"] if failed else None, "joining": any(p.get("joining") for p in points),
            "samples": len(points), "ok_samples": len(ok)}


def merge_columns(times: Sequence[float], matrix: Sequence[Sequence[Optional[float]]],
                  reduce: Callable[[list[float]], float], limits: HistoryLimits, name: str) -> tuple[list, list]:
    """A blocks × time matrix with at most ``max_points`` columns: each run of columns reduced per block."""
    if len(times) <= limits.max_points:
        return list(times), [list(row) for row in matrix]
    limits.downsampled[name] = len(times)
    spans = runs(len(times), limits.max_points)

    def cell(row: Sequence[Optional[float]], run: range) -> Optional[float]:
        values = [row[i] for i in run if row[i] is not None]
        return reduce(values) if values else None

    return [times[run.start] for run in spans], [[cell(row, run) for run in spans] for row in matrix]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


# ---- the two answers ---------------------------------------------------------------------------


def model_history(raw: dict, limits: HistoryLimits) -> dict:
    """``queries.model_history``'s dict, bounded."""
    coverage = raw["block_coverage"]
    times, servers = merge_columns(coverage["times"], coverage["servers"], min, limits, "block_coverage")
    _, throughput = merge_columns(coverage["times"], coverage["throughput"], mean, limits, "block_coverage")
    return {
        "status": downsample("status", raw["status"], merge_status, limits),
        "state_changes": newest("state_changes", raw["state_changes"], limits),
        "outages": newest("outages", raw["outages"], limits),
        "block_coverage": {"times": times, "servers": servers, "throughput": throughput},
    }


def peer_history(observations: Sequence[dict], reachability: Sequence[dict], outcomes: Sequence[dict],
                 limits: HistoryLimits) -> dict:
    """A peer's records (dicts, oldest first), bounded: observations per model, reachability checks
    (under the API's key "probes"), outcomes."""
    by_model: dict[str, list[dict]] = {}
    for observation in observations:
        by_model.setdefault(observation["model"], []).append(observation)
    kept = [point for model, points in by_model.items()
            for point in downsample(f"observations[{model}]", points, merge_observations, limits)]
    return {
        "observations": sorted(kept, key=lambda p: p["at"]),
        "probes": downsample("probes", reachability, merge_reachability, limits),
        "chat_outcomes": newest("chat_outcomes", outcomes, limits),
    }
