"""score_aggregates: what the scores count from the rollups, and peer search by public name.

The score job counts in SQL instead of reading a week of rows (``monitor/store/aggregates.py``);
the hourly rollups keep what it cannot count from their other columns: per peer, model and hour
the pairs of consecutive polls that could show it leave ONLINE and the ones that did
(``hourly_observations.flap_chances`` / ``flaps``), and per peer and hour the RTT histogram of ok
probes and the latest failure (``hourly_probes.rtt_bins`` / ``last_error``). Hours rolled up
before this revision keep NULL there; the scores count those hours from raw rows while they last.
Finding a server by its public name needs an index on ``peers.public_name``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("hourly_observations", sa.Column("flap_chances", sa.Integer(), nullable=True))
    op.add_column("hourly_observations", sa.Column("flaps", sa.Integer(), nullable=True))
    op.add_column("hourly_probes", sa.Column("rtt_bins", sa.JSON(), nullable=True))
    op.add_column("hourly_probes", sa.Column("last_error", sa.String(), nullable=True))
    op.create_index(op.f("ix_peers_public_name"), "peers", ["public_name"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_peers_public_name"), table_name="peers")
    with op.batch_alter_table("hourly_probes") as batch_op:
        batch_op.drop_column("last_error")
        batch_op.drop_column("rtt_bins")
    with op.batch_alter_table("hourly_observations") as batch_op:
        batch_op.drop_column("flaps")
        batch_op.drop_column("flap_chances")
