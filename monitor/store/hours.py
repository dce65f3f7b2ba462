"""Hours and watermarks: what the rollups, the history readers and the score aggregates share.

The rollups (``rollups.py``) aggregate whole hours and prune raw rows; the history readers
(``history.py``) and the scores' SQL counts (``aggregates.py``) read rollup hours where no raw rows
are left. All three need the same hour arithmetic and the same two watermarks kept in
``store_meta``, so those live here, below all three, and none of them imports another for them:

- ``rolled_up_until``: hours before it are rolled up. A write into an hour already rolled up moves
  it back (``follow_writes``), so the next rollup redoes that hour with every row;
- ``raw_pruned_until``: raw rows before it are gone (a write that old is not rolled up: its hour's
  other raw rows are gone).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.common import HOUR
from monitor.store.engine import insert
from monitor.store.schema import Poll, StoreMetaRow

WATERMARK = "rolled_up_until"  # store_meta key: hours before it are rolled up
PRUNED = "raw_pruned_until"  # store_meta key: raw rows before it are gone


def floor_hour(t: float) -> float:
    return math.floor(t / HOUR) * HOUR


def mean(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def raw_start(conn: Connection, column=None) -> Optional[float]:
    """The oldest raw row still kept: rollups are used only for hours that end before it."""
    return conn.execute(sa.select(sa.func.min(column if column is not None else Poll.__table__.c.at))).scalar()


def rollup_window(hour_column, since: float, until: float, raw_from: Optional[float]) -> list:
    """Conditions on a rollup table: hours overlapping [since, until] that end before the raw rows."""
    conditions = [hour_column + HOUR > since, hour_column <= until]
    if raw_from is not None:
        conditions.append(hour_column + HOUR <= raw_from)
    return conditions


# ---- the watermarks --------------------------------------------------------------------------


def rolled_up_until(conn: Connection, *, lock: bool = False) -> Optional[float]:
    """The watermark: hours before it are rolled up (None: nothing rolled up yet). ``lock``: see
    ``meta_float``."""
    return meta_float(conn, WATERMARK, lock=lock)


def raw_pruned_until(conn: Connection) -> Optional[float]:
    """Raw rows before it are gone (None: none pruned yet)."""
    return meta_float(conn, PRUNED)


def follow_writes(conn: Connection, at: float) -> None:
    """Called in the transaction that stores rows at time ``at``: if their hour is already rolled
    up, move the watermark back to it so that the next rollup redoes the hour with them. Rows older
    than the raw rows already pruned are not rolled up (their hour's raw rows are gone)."""
    done = rolled_up_until(conn, lock=True)
    hour = floor_hour(at)
    if done is None or hour >= done:
        return
    pruned = raw_pruned_until(conn)
    if pruned is not None and hour < pruned:
        return
    set_meta(conn, WATERMARK, repr(hour))


def meta_float(conn: Connection, key: str, *, lock: bool = False) -> Optional[float]:
    """A number kept in ``store_meta``; ``lock``: hold its row until the transaction ends (PostgreSQL;
    SQLite's writers are serialised anyway), so that a rollup and a late write see each other."""
    t = StoreMetaRow.__table__.c
    query = sa.select(t.value).where(t.key == key)
    value = conn.execute(query.with_for_update() if lock else query).scalar()
    return float(value) if value is not None else None


def set_meta(conn: Connection, key: str, value: str) -> None:
    stmt = insert(conn, StoreMetaRow.__table__).values(key=key, value=value)
    conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": stmt.excluded.value}))
