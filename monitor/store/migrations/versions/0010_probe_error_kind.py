"""probe_error_kind: why a server probe failed, so that a server failing with its own error is told
apart from the monitor's own timeouts.

``server_probes.error_kind`` is ``server`` (the server answered with an error of its own: its
handler raised, its cache is full, it refused the session), ``timeout`` or ``client`` (the monitor
gave up or could not run the probe); NULL for probes that succeeded and for probes stored before
this revision (which never count as the server's fault).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("server_probes") as batch:
        batch.add_column(sa.Column("error_kind", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_probes") as batch:
        batch.drop_column("error_kind")
