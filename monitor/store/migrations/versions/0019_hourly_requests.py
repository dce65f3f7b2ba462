"""hourly_requests: an hour of a model's request rows rolled up (counts by outcome, that hour's
exact percentiles and histogram bins: monitor/core/requests.py hour_figures), kept the rollup
retention after the raw rows go.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hourly_requests",
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("hour", sa.Float(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Integer(), nullable=False),
        sa.Column("error", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Integer(), nullable=False),
        sa.Column("failovers", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("quantiles", sa.JSON(), nullable=True),
        sa.Column("bins", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("model", "hour"),
    )


def downgrade() -> None:
    op.drop_table("hourly_requests")
