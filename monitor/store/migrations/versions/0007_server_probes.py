"""server_probes: speed and correctness probes: every probe of a server's span, with the
seconds per token it measured and, when checked, whether its outputs were right.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_probes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("peer", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("end", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("seconds_per_token", sa.Float(), nullable=True),
        sa.Column("rtt", sa.Float(), nullable=True),
        sa.Column("prefill_seconds", sa.Float(), nullable=True),
        sa.Column("duration", sa.Float(), nullable=True),
        sa.Column("error", sa.String(length=300), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=True),
        sa.Column("error_ratio", sa.Float(), nullable=True),
        sa.Column("tolerance", sa.Float(), nullable=True),
        sa.Column("checked_against", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.String(length=300), nullable=True),
        sa.ForeignKeyConstraint(["peer"], ["peers.id"], name=op.f("fk_server_probes_peer_peers")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_probes")),
    )
    op.create_index(op.f("ix_server_probes_at"), "server_probes", ["at"], unique=False)
    op.create_index(op.f("ix_server_probes_peer_at"), "server_probes", ["peer", "at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_server_probes_peer_at"), table_name="server_probes")
    op.drop_index(op.f("ix_server_probes_at"), table_name="server_probes")
    op.drop_table("server_probes")
