"""the cache room a probed server announced, and the servers a model notice told of.

Each speed probe keeps the attention-cache tokens its server announced when it was probed, so that a
server refusing every session as "cache full" while announcing room for it is named failing
(``core.probes.failing_servers``); existing rows: unknown (NULL), which never counts as room. Each
alert event keeps the servers behind a model's notice that it told of ([[peer id, name, cause]]), so
that its delivery to an Alertmanager carries one alert per server; existing rows: none (NULL).

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
    op.add_column("alert_events", sa.Column("causes", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alert_events") as batch:
        batch.drop_column("causes")
    with op.batch_alter_table("server_probes") as batch:
        batch.drop_column("room")
