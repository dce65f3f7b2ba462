"""Plain-text report of a poll, for ``swarm-monitor report`` (pure: strings from data)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from monitor.core.snapshot import ServerRow, Snapshot
from monitor.core.timefmt import duration, utc

BAR_WIDTH = 40
_STATE_MARK = {"ONLINE": "█", "JOINING": "▒", "OFFLINE": "·"}


def span_bar(num_blocks: int, start: int, end: int, state: str, width: int = BAR_WIDTH) -> str:
    """One server's span as an ASCII bar over the model's blocks, like health.petals.dev's rows."""
    if num_blocks <= 0:
        return ""
    cells = min(width, num_blocks)
    mark = _STATE_MARK.get(state, "?")
    out = []
    for cell in range(cells):
        lo = cell * num_blocks / cells
        hi = (cell + 1) * num_blocks / cells
        out.append(mark if start < hi and end > lo else " ")
    return "|" + "".join(out) + "|"


def _peer_label(row: ServerRow) -> str:
    name = row.public_name or ""
    return f"{name[:18]:<18} {row.peer_id[-8:]}" if name else f"{'':<18} {row.peer_id[-8:]}"


def model_report(model, assessment, rows: Sequence[ServerRow], scores: Mapping[str, Any] = {}) -> str:
    lines = [f"{model.name or model.dht_prefix} ({model.dht_prefix}, {model.num_blocks} blocks): "
             f"{assessment.state.upper()}"]
    for reason in assessment.reasons:
        lines.append(f"  - {reason}")
    if assessment.est_tokens_per_s:
        lines.append(f"  best route: ~{assessment.est_tokens_per_s:.1f} tokens/s")
    if assessment.recommendation is not None:
        lines.append(f"  a new server helps most with: {assessment.recommendation.argument}")
    for row in sorted(rows, key=lambda r: (r.start, r.end, r.peer_id)):
        score = scores.get(row.peer_id)
        score_text = f" score {score.score:3.0f}" if score is not None else ""
        speed = f" {row.throughput:7.1f} tok/s" if row.throughput is not None else ""
        lines.append(f"  {_peer_label(row)} {span_bar(model.num_blocks, row.start, row.end, row.state)} "
                     f"{row.start:>3}:{row.end:<3} {row.state:<7}{speed}{score_text}")
    if not rows:
        lines.append("  (no servers)")
    return "\n".join(lines)


def poll_report(snapshot: Snapshot, assessments: Mapping[str, object], scores: Mapping[str, object] = {}) -> str:
    head = (f"Poll at {utc(snapshot.taken_at)}: {len(snapshot.models)} models, {len(snapshot.servers)} server rows, "
            f"took {duration(snapshot.duration)}, {snapshot.invalid_records} invalid records")
    parts = [head] + [f"  error: {e}" for e in snapshot.errors]
    for model in snapshot.models:
        parts.append("")
        parts.append(model_report(model, assessments[model.dht_prefix], snapshot.rows_for(model.dht_prefix), scores))
    return "\n".join(parts)
