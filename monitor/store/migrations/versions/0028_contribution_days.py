"""the contribution ledger by UTC day beside its hours: a week's or a month's leaderboard reads a few
rows per server instead of 24 times as many (``store/contributions.py``); filled here from the hours
kept. From now on the days past the rollup retention are what is summed into the all-time rows
(each once), and older hours are dropped. A downgrade keeps the hours (and the all-time rows) as
they are then: the days they no longer hold are lost.

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

DAY = 86400.0
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
    for row in op.get_bind().execute(sa.select(hours)).mappings():  # (streamed; one row per server and day kept)
        key = (row["peer_id"], row["model"], math.floor(row["hour"] / DAY) * DAY)
        kept = summed.setdefault(key, {name: 0 for name in FLOATS + INTS})
        for name in FLOATS + INTS:
            kept[name] += row[name] or 0
    rows = [{"peer_id": peer, "model": model, "day": day, **amounts} for (peer, model, day), amounts in summed.items()]
    for i in range(0, len(rows), BATCH):
        op.bulk_insert(days, rows[i:i + BATCH])


def downgrade() -> None:
    op.drop_index(op.f("ix_contribution_days_day"), table_name="contribution_days")
    op.drop_table("contribution_days")
