"""the cache room a probed server announced: each speed probe keeps the attention-cache tokens its
server announced when it was probed, so that a server refusing every session as "cache full" while
announcing room for it is named failing (``core.probes.failing_servers``). Existing rows: unknown
(NULL), which never counts as room.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from alembic import op
import sqlalchemy as sa

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:  # (added in place: no table is copied, on SQLite either)
    op.add_column("server_probes", sa.Column("room", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_probes") as batch:
        batch.drop_column("room")
