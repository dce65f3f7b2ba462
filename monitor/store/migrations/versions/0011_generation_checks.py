"""generation_checks: every generation check of every model (a few tokens end to end through the
chat's own engine): success or the error, time to first token, tokens per second, the answer and
whether it matched the model's expected pattern, and the route it took.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "generation_checks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.String(length=300), nullable=True),
        sa.Column("answer", sa.String(length=300), nullable=True),
        sa.Column("expect", sa.String(length=200), nullable=True),
        sa.Column("matched", sa.Boolean(), nullable=True),
        sa.Column("time_to_first_token", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("duration", sa.Float(), nullable=True),
        sa.Column("route", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_generation_checks")),
    )
    op.create_index(op.f("ix_generation_checks_at"), "generation_checks", ["at"], unique=False)
    op.create_index(op.f("ix_generation_checks_model_at"), "generation_checks", ["model", "at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_generation_checks_model_at"), table_name="generation_checks")
    op.drop_index(op.f("ix_generation_checks_at"), table_name="generation_checks")
    op.drop_table("generation_checks")
