"""poller_leases, poller_members, poller_terms: several pollers on one database, one leader.

``poller_leases`` holds the lease the pollers compete for (holder, epoch, deadline in the
database's clock), ``poller_members`` every poller as it last reported itself (leader or standby,
what it cannot reach), ``poller_terms`` every leadership term (who took over from whom, and why).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_leases",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.Column("released", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_poller_leases")),
    )
    op.create_table(
        "poller_members",
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("last_poll_at", sa.Float(), nullable=True),
        sa.Column("problem", sa.String(length=300), nullable=True),
        sa.PrimaryKeyConstraint("holder", name=op.f("pk_poller_members")),
    )
    op.create_index(op.f("ix_poller_members_seen_at"), "poller_members", ["seen_at"], unique=False)
    op.create_table(
        "poller_terms",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("previous_holder", sa.String(length=200), nullable=True),
        sa.Column("previous_host", sa.String(length=200), nullable=True),
        sa.Column("previous_pid", sa.Integer(), nullable=True),
        sa.Column("previous_deadline", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("name", "epoch", name=op.f("pk_poller_terms")),
    )
    op.create_index(op.f("ix_poller_terms_since"), "poller_terms", ["since"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_poller_terms_since"), table_name="poller_terms")
    op.drop_table("poller_terms")
    op.drop_index(op.f("ix_poller_members_seen_at"), table_name="poller_members")
    op.drop_table("poller_members")
    op.drop_table("poller_leases")
