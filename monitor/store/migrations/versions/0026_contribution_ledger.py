"""the contribution ledger: what every server earned per model and hour (block-seconds announced,
serving and verified, seconds watched and serving, measured speed, real requests' tokens × blocks;
``monitor.core.contributions``), the hours older than the rollup retention summed per server and
model, and per poll what each server earns until the next (``polls.ledger_basis``). All start empty:
the ledger counts from the first poll stored after this revision (the assessments it is made from
are kept an hour only).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from alembic import op
import sqlalchemy as sa

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

FLOATS = ("announced", "serving", "verified", "watched", "serving_seconds", "speed_seconds", "speed_sum")


def _amounts() -> list:
    return [sa.Column(name, sa.Float(), nullable=False) for name in FLOATS] + [
        sa.Column("block_tokens", sa.BigInteger(), nullable=False), sa.Column("requests", sa.BigInteger(), nullable=False)]


def upgrade() -> None:
    op.add_column("polls", sa.Column("ledger_basis", sa.JSON(none_as_null=True), nullable=True))
    op.create_table(
        "contribution_hours",
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("hour", sa.Float(), nullable=False),
        *_amounts(),
        sa.PrimaryKeyConstraint("peer_id", "model", "hour"),
    )
    op.create_index(op.f("ix_contribution_hours_hour"), "contribution_hours", ["hour"])
    op.create_table(
        "contribution_totals",
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("first_hour", sa.Float(), nullable=False),
        sa.Column("last_hour", sa.Float(), nullable=False),
        *_amounts(),
        sa.PrimaryKeyConstraint("peer_id", "model"),
    )


def downgrade() -> None:
    with op.batch_alter_table("polls") as batch:
        batch.drop_column("ledger_basis")
    op.drop_table("contribution_totals")
    op.drop_index(op.f("ix_contribution_hours_hour"), table_name="contribution_hours")
    op.drop_table("contribution_hours")
