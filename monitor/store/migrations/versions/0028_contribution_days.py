"""the contribution ledger by UTC day beside its hours: a week's or a month's leaderboard reads a few
rows per server instead of 24 times as many (``store/contributions.py``); filled here from the hours
kept, which are then marked folded (``store_meta.ledger_folded_until``: from now on the hourly
rollup folds each hour into its day once it has ended). The days past the rollup retention are
what is summed into the all-time rows (each once), and hours are kept two days. A downgrade keeps
the hours (and the all-time rows) as they are then: the days they no longer hold are lost.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

import math

from alembic import op
import sqlalchemy as sa

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

DAY, HOUR = 86400.0, 3600.0
FOLDED = "ledger_folded_until"
FLOATS = ("announced", "serving", "verified", "watched", "serving_seconds", "speed_seconds", "speed_sum")
INTS = ("block_tokens", "requests")
BATCH = 2000


def upgrade() -> None:
    days = op.create_table(
        "contribution_days",
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("day", sa.Float(), nullable=False),
        *[sa.Column(name, sa.Float(), nullable=False) for name in FLOATS],
        *[sa.Column(name, sa.BigInteger(), nullable=False) for name in INTS],
        sa.PrimaryKeyConstraint("peer_id", "model", "day"),
    )
    op.create_index(op.f("ix_contribution_days_day"), "contribution_days", ["day"])
    hours = sa.table("contribution_hours", sa.column("peer_id"), sa.column("model"), sa.column("hour"),
                     *[sa.column(name) for name in FLOATS + INTS])
    summed: dict[tuple, dict] = {}
    latest = None
    for row in op.get_bind().execute(sa.select(hours)).mappings():  # (streamed; one row per server and day kept)
        latest = row["hour"] if latest is None else max(latest, row["hour"])
        key = (row["peer_id"], row["model"], math.floor(row["hour"] / DAY) * DAY)
        kept = summed.setdefault(key, {name: 0 for name in FLOATS + INTS})
        for name in FLOATS + INTS:
            kept[name] += row[name] or 0
    rows = [{"peer_id": peer, "model": model, "day": day, **amounts} for (peer, model, day), amounts in summed.items()]
    for i in range(0, len(rows), BATCH):
        op.bulk_insert(days, rows[i:i + BATCH])
    if latest is not None:  # every hour kept is in the days now; an hour that goes on growing is added to both
        meta = sa.table("store_meta", sa.column("key"), sa.column("value"))
        op.execute(meta.delete().where(meta.c.key == FOLDED))
        op.bulk_insert(meta, [{"key": FOLDED, "value": repr(latest + HOUR)}])


def downgrade() -> None:
    meta = sa.table("store_meta", sa.column("key"), sa.column("value"))
    op.execute(meta.delete().where(meta.c.key == FOLDED))
    op.drop_index(op.f("ix_contribution_days_day"), table_name="contribution_days")
    op.drop_table("contribution_days")
