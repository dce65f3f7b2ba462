"""chat_visitors and chat_conversations: the chat page's conversations, kept per visitor (the one
place the monitor keeps text: chat/conversations.py), with a retention and bounds of their own.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chat_visitors",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_chat_visitors_address_created_at"), "chat_visitors", ["address", "created_at"])
    op.create_index(op.f("ix_chat_visitors_last_seen"), "chat_visitors", ["last_seen"])
    op.create_table(
        "chat_conversations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("visitor", sa.String(length=64), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("system", sa.Text(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=True),
        sa.Column("search_text", sa.Text(), nullable=False),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_chat_conversations_visitor_updated_at"), "chat_conversations", ["visitor", "updated_at"])
    op.create_index(op.f("ix_chat_conversations_updated_at"), "chat_conversations", ["updated_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_chat_conversations_updated_at"), table_name="chat_conversations")
    op.drop_index(op.f("ix_chat_conversations_visitor_updated_at"), table_name="chat_conversations")
    op.drop_table("chat_conversations")
    op.drop_index(op.f("ix_chat_visitors_last_seen"), table_name="chat_visitors")
    op.drop_index(op.f("ix_chat_visitors_address_created_at"), table_name="chat_visitors")
    op.drop_table("chat_visitors")
