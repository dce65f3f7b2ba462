"""peer_policies: peers an operator pinned or blocked for the chat's routing, from the dashboard.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "peer_policies",
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("policy", sa.String(length=16), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("peer_id"),
    )


def downgrade() -> None:
    op.drop_table("peer_policies")
