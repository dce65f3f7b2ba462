"""compute_checks: one token through one block of each server, every compute_check_period; kept an
hour (monitor/core/compute_checks.py). alerts.clear_since: an alert told on confirmation waits out a
flap before it resolves (monitor/core/alert_rules.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compute_checks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("peer", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("duration", sa.Float(), nullable=True),
        sa.Column("error", sa.String(length=300), nullable=True),
        sa.Column("error_kind", sa.String(length=16), nullable=True),
        sa.Column("requested_by", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["peer"], ["peers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_compute_checks_at"), "compute_checks", ["at"], unique=False)
    op.create_index(op.f("ix_compute_checks_peer_at"), "compute_checks", ["peer", "at"], unique=False)
    op.add_column("alerts", sa.Column("clear_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("clear_since")
    op.drop_index(op.f("ix_compute_checks_peer_at"), table_name="compute_checks")
    op.drop_index(op.f("ix_compute_checks_at"), table_name="compute_checks")
    op.drop_table("compute_checks")
