"""The status page's reads: every model's stored statuses over a range, as ``core.uptime``'s
points, in two queries whatever the number of models.

Where raw rows are kept every poll is a point; before that every rolled-up hour is one (with its
polls per state), as in ``history.model_status_history`` — but only the columns the uptime needs
(no reasons, no figures), since 90 days of four models are ~9,000 hourly rows and ~12,000 polls.
"""

from __future__ import annotations

from typing import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR
from monitor.core.uptime import StatusPoint
from monitor.store.hours import raw_start, rollup_window
from monitor.store.schema import HourlyModelStatusRow, ModelStatusRow


def status_points(conn: Connection, models: Iterable[str], since: float, until: float,
                  poll_hold: float) -> dict[str, list[StatusPoint]]:
    """model -> its points in [since, until], oldest first: hourly rows (each standing for its hour)
    before the raw rows, then each poll (standing until the next, at most ``poll_hold`` seconds)."""
    wanted = sorted(set(models))
    found: dict[str, list[StatusPoint]] = {model: [] for model in wanted}
    if not wanted:
        return found
    h, s = HourlyModelStatusRow.__table__.c, ModelStatusRow.__table__.c
    hourly = conn.execute(sa.select(h.model, h.hour, h.states, h.worst_state, h.samples).where(
        h.model.in_(wanted), *rollup_window(h.hour, since, until, raw_start(conn))).order_by(h.hour))
    for model, hour, states, worst, samples in hourly:
        found[model].append(StatusPoint(at=hour, states=dict(states) if states else {worst: samples}, hold=HOUR))
    raw = conn.execute(sa.select(s.model, s.at, s.state).where(
        s.model.in_(wanted), s.at >= since - poll_hold, s.at <= until).order_by(s.at, s.id))
    for model, at, state in raw:  # (a window function finding runs of polls costs SQLite more than this)
        found[model].append(StatusPoint(at=at, states={state: 1}, hold=poll_hold))
    return found
