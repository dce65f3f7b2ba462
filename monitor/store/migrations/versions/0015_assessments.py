"""assessments: each model's assessment per poll (the one stored verdict every reader reads),
replacing latest_diagnoses (the latest poll's only). The latest poll's diagnoses are kept as that
poll's assessments; an older version reads them back (downgrade) as its latest diagnoses.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "assessments",
        sa.Column("poll_id", BIG_ID, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("assessment", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("poll_id", "model"),
    )
    op.create_index("ix_assessments_at", "assessments", ["at"])
    op.execute("INSERT INTO assessments (poll_id, model, at, assessment) "
               "SELECT poll_id, model, at, diagnosis FROM latest_diagnoses")
    op.drop_table("latest_diagnoses")


def downgrade() -> None:
    op.create_table(
        "latest_diagnoses",
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("poll_id", BIG_ID, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("diagnosis", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("model"),
    )
    op.execute("INSERT INTO latest_diagnoses (model, poll_id, at, diagnosis) "
               "SELECT model, poll_id, at, assessment FROM assessments "
               "WHERE poll_id = (SELECT MAX(poll_id) FROM assessments)")
    op.drop_index("ix_assessments_at", table_name="assessments")
    op.drop_table("assessments")
