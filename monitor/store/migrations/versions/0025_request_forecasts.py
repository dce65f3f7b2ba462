"""request forecasts: each request row keeps the forecast it was given at admission — for its wait,
time to first token and tokens/s the median, the range it was told and the range the requests alike
gave before calibration, with the load it would meet and what the forecast rested on
(``monitor.core.calibration.Given``) — the record the ranges are calibrated on and judged by.
Existing rows: none (NULL), which no calibration or record counts.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from alembic import op
import sqlalchemy as sa

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:  # (added in place: no table is copied, on SQLite either)
    op.add_column("requests", sa.Column("forecast", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("forecast")
