"""poll_robustness: hostile peers: what a poll had to bound and could not store.

``polls.clamped_values``: announced values beyond what we store, bounded at the DHT edge (or nulled
by the store: NaN, infinities); ``polls.dropped_rows``: rows of the poll the database refused
(named in ``polls.errors``). Existing polls get 0 for both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOT NULL with a server default: SQLite adds such a column in place, existing rows get 0.
    op.add_column("polls", sa.Column("clamped_values", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("polls", sa.Column("dropped_rows", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("polls") as batch_op:
        batch_op.drop_column("dropped_rows")
        batch_op.drop_column("clamped_values")
