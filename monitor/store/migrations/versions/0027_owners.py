"""owners: nonces issued for proofs of running a server (single use, short-lived, bound to a peer
id; the asking address hashed, to bound them), proven owners (the hash of their token), the
servers each proved they run (``monitor.core.ownership``) and the webhooks where each hears of
their own servers. New tables; nothing else changes.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from alembic import op
import sqlalchemy as sa

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owner_nonces",
        sa.Column("nonce", sa.String(length=64), nullable=False),
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("nonce"),
    )
    op.create_index(op.f("ix_owner_nonces_peer_id_expires_at"), "owner_nonces", ["peer_id", "expires_at"])
    op.create_index(op.f("ix_owner_nonces_address_created_at"), "owner_nonces", ["address", "created_at"])
    op.create_table(
        "owners",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash", name=op.f("uq_owners_token_hash")),
    )
    op.create_table(
        "owner_peers",
        sa.Column("owner", sa.String(length=32), nullable=False),
        sa.Column("peer_id", sa.String(length=128), nullable=False),
        sa.Column("proven_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["owner"], ["owners.id"], name=op.f("fk_owner_peers_owner_owners")),
        sa.PrimaryKeyConstraint("owner", "peer_id"),
    )
    op.create_index(op.f("ix_owner_peers_peer_id"), "owner_peers", ["peer_id"])
    op.create_table(
        "owner_subscriptions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("confirmed_at", sa.Float(), nullable=True),
        sa.Column("code_hash", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["owner"], ["owners.id"], name=op.f("fk_owner_subscriptions_owner_owners")),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_owner_subscriptions_owner"), "owner_subscriptions", ["owner"])


def downgrade() -> None:
    op.drop_index(op.f("ix_owner_subscriptions_owner"), table_name="owner_subscriptions")
    op.drop_table("owner_subscriptions")
    op.drop_index(op.f("ix_owner_peers_peer_id"), table_name="owner_peers")
    op.drop_table("owner_peers")
    op.drop_table("owners")
    op.drop_index(op.f("ix_owner_nonces_address_created_at"), table_name="owner_nonces")
    op.drop_index(op.f("ix_owner_nonces_peer_id_expires_at"), table_name="owner_nonces")
    op.drop_table("owner_nonces")
