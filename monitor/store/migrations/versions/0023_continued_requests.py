"""continued requests: each request row says whether it was a follow-up (it came with the handle
of the answer it follows), whether it continued that answer's kept session (``chat.kept``: only its
new tokens went through the swarm) and how many tokens of its prompt the swarm did not get again.
Existing rows: none of that (false, false, 0), as the server defaults say.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from alembic import op
import sqlalchemy as sa

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:  # (added in place: no table is copied, on SQLite either)
    op.add_column("requests", sa.Column("follow_up", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("requests", sa.Column("continued", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("requests", sa.Column("tokens_not_resent", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("tokens_not_resent")
        batch.drop_column("continued")
        batch.drop_column("follow_up")
