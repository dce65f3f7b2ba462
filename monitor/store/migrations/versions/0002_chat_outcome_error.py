"""chat_outcomes.error: why a chat request failed on that peer (shown in the peer's score).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: existing outcomes keep their rows and get NULL (SQLite adds it in place).
    op.add_column("chat_outcomes", sa.Column("error", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chat_outcomes") as batch_op:
        batch_op.drop_column("error")
