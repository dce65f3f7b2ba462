"""latest_diagnoses: each model's whole diagnosis for the latest poll, written by the poller, so web
workers show it without importing petals (and torch).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "latest_diagnoses",
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("poll_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("diagnosis", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("model"),
    )


def downgrade() -> None:
    op.drop_table("latest_diagnoses")
