"""chat workers: each chat worker's own report of itself every few seconds (alive, its slots, queue,
open sessions, servers its requests go through, draining), for the overview's panel. A new table; nothing else
changes.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

from alembic import op
import sqlalchemy as sa

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chat_workers",
        sa.Column("worker", sa.String(length=120), nullable=False),
        sa.Column("tag", sa.String(length=32), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("beat_at", sa.Float(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("busy", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("sessions_open", sa.Integer(), nullable=False),
        sa.Column("servers_used", sa.Integer(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("worker"),
    )
    op.create_index(op.f("ix_chat_workers_beat_at"), "chat_workers", ["beat_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_chat_workers_beat_at"), table_name="chat_workers")
    op.drop_table("chat_workers")
