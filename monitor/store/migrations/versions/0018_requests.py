"""requests: one row per request the chat served (no text): its model, API, route, wait for a
slot, time to first token, tokens, decode speed, failovers and outcome (monitor/core/requests.py);
request_hops: one row per server of its route, so that a server's figures are read by its index.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("api", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("waited", sa.Float(), nullable=True),
        sa.Column("time_to_first_token", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("failovers", sa.Integer(), nullable=False),
        sa.Column("route", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_requests_at"), "requests", ["at"], unique=False)
    op.create_index(op.f("ix_requests_model_at"), "requests", ["model", "at"], unique=False)
    op.create_table(
        "request_hops",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("peer", sa.Integer(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("end", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["request"], ["requests.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["peer"], ["peers.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_request_hops_peer_at"), "request_hops", ["peer", "at"], unique=False)
    op.create_index(op.f("ix_request_hops_request"), "request_hops", ["request"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_request_hops_request"), table_name="request_hops")
    op.drop_index(op.f("ix_request_hops_peer_at"), table_name="request_hops")
    op.drop_table("request_hops")
    op.drop_index(op.f("ix_requests_model_at"), table_name="requests")
    op.drop_index(op.f("ix_requests_at"), table_name="requests")
    op.drop_table("requests")
