"""alerts: the alert rules' state, their notices and deliveries.

``alerts``: each pending or firing alert (one per rule and subject), so a restarted poller neither
repeats nor forgets a notice; ``alert_events``: every notice (the history); ``alert_deliveries``:
one row per notice and webhook (the outbox: pending, delivered or failed, with attempts).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("rule", sa.String(length=100), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=400), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.String(length=400), nullable=False),
        sa.Column("details", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=True),
        sa.Column("notified_at", sa.Float(), nullable=True),
        sa.Column("next_state", sa.String(length=32), nullable=True),
        sa.Column("next_since", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("rule", "subject", name=op.f("pk_alerts")),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("rule", sa.String(length=100), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=400), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("previous_state", sa.String(length=32), nullable=True),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.String(length=400), nullable=False),
        sa.Column("details", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_events")),
    )
    op.create_index(op.f("ix_alert_events_at"), "alert_events", ["at"], unique=False)
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("webhook", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=True),
        sa.Column("last_attempt_at", sa.Float(), nullable=True),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.String(length=300), nullable=True),
        sa.ForeignKeyConstraint(["event_id"], ["alert_events.id"],
                                name=op.f("fk_alert_deliveries_event_id_alert_events")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
    )
    op.create_index(op.f("ix_alert_deliveries_status_next_attempt_at"), "alert_deliveries",
                    ["status", "next_attempt_at"], unique=False)
    op.create_index(op.f("ix_alert_deliveries_event_id"), "alert_deliveries", ["event_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_alert_deliveries_event_id"), table_name="alert_deliveries")
    op.drop_index(op.f("ix_alert_deliveries_status_next_attempt_at"), table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index(op.f("ix_alert_events_at"), table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_table("alerts")
