"""rollup_hour_indexes: the score job reads the last day or week of the hourly rollups by hour.

``monitor/store/aggregates.py`` selects ``hourly_observations`` and ``hourly_probes`` by ``hour``
(the last week, the last day), and pruning drops old hours the same way: without an index on
``hour`` each of those reads scans the whole rollup (30 days × every peer), which made the score
job's time grow with retention rather than with the swarm. ``if_not_exists``: databases migrated
by a development build of 0008 may have them already.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_hourly_observations_hour"), "hourly_observations", ["hour"], unique=False,
                    if_not_exists=True)
    op.create_index(op.f("ix_hourly_probes_hour"), "hourly_probes", ["hour"], unique=False, if_not_exists=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_hourly_probes_hour"), table_name="hourly_probes")
    op.drop_index(op.f("ix_hourly_observations_hour"), table_name="hourly_observations")
