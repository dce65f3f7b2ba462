"""job_requests: a request that a poller job run soon ("scrape now", "check this server now"),
written by any process and carried out by the leader, so that jobs talk through the store.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_requests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("by", sa.String(length=64), nullable=False),
        sa.Column("why", sa.String(length=300), nullable=True),
        sa.Column("done_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_job_requests_done_at_at"), "job_requests", ["done_at", "at"], unique=False)
    op.create_index(op.f("ix_job_requests_job_target_at"), "job_requests", ["job", "target", "at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_requests_job_target_at"), table_name="job_requests")
    op.drop_index(op.f("ix_job_requests_done_at_at"), table_name="job_requests")
    op.drop_table("job_requests")
