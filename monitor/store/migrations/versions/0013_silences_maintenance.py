"""silences and maintenance windows: what holds alerts back, and who said so.

``silences`` (matchers over alert labels, start, end, who and why), ``maintenance_windows``
(one-off or recurring by weekdays and a time, or by cron, in a time zone; global, per model or
per peer) and ``mute_changes`` (every creation and ending: who, when, how, why). ``alerts`` and
``alert_events`` learn what an alert concerns (``models``, ``peer``, ``peer_name``: its labels),
why it is held (``held``), what its receivers were told (``announced_state``: firing alerts of
before this revision were told their state) and, for a model's, the servers it lost (``causes``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _json():
    return sa.JSON(none_as_null=True)


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("models", _json(), nullable=True))
        batch.add_column(sa.Column("peer", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("peer_name", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("held", _json(), nullable=True))
        batch.add_column(sa.Column("announced_state", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("causes", _json(), nullable=True))
    op.execute("UPDATE alerts SET announced_state = state WHERE status = 'firing'")
    with op.batch_alter_table("alert_events") as batch:
        batch.add_column(sa.Column("models", _json(), nullable=True))
        batch.add_column(sa.Column("peer", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("peer_name", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("held", sa.String(length=300), nullable=True))
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("matchers", _json(), nullable=True),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=False),
        sa.Column("comment", sa.String(length=500), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("ended_by", sa.String(length=100), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_index(op.f("ix_silences_ends_at"), "silences", ["ends_at"], unique=False)
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=True),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("duration", sa.Float(), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=True),
        sa.Column("weekdays", _json(), nullable=True),
        sa.Column("at_time", sa.String(length=5), nullable=True),
        sa.Column("cron", sa.String(length=100), nullable=True),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("ended_by", sa.String(length=100), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_windows")),
    )
    op.create_index(op.f("ix_maintenance_windows_ends_at"), "maintenance_windows", ["ends_at"], unique=False)
    op.create_table(
        "mute_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("by", sa.String(length=100), nullable=False),
        sa.Column("via", sa.String(length=32), nullable=False),
        sa.Column("why", sa.String(length=500), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mute_changes")),
    )
    op.create_index(op.f("ix_mute_changes_kind_item_id"), "mute_changes", ["kind", "item_id"], unique=False)
    op.create_index(op.f("ix_mute_changes_at"), "mute_changes", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_mute_changes_at"), table_name="mute_changes")
    op.drop_index(op.f("ix_mute_changes_kind_item_id"), table_name="mute_changes")
    op.drop_table("mute_changes")
    op.drop_index(op.f("ix_maintenance_windows_ends_at"), table_name="maintenance_windows")
    op.drop_table("maintenance_windows")
    op.drop_index(op.f("ix_silences_ends_at"), table_name="silences")
    op.drop_table("silences")
    with op.batch_alter_table("alert_events") as batch:
        for column in ("held", "peer_name", "peer", "models"):
            batch.drop_column(column)
    with op.batch_alter_table("alerts") as batch:
        for column in ("causes", "announced_state", "held", "peer_name", "peer", "models"):
            batch.drop_column(column)
