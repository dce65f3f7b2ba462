"""incident notes: what operators tell visitors beside a model's, a peer's or the swarm's state.

``incident_notes`` (each note as it reads now: scope, target, text, who, when posted, updated and
resolved) and ``incident_note_updates`` (every change with its text then: the note's history and
the status page's Atom feed).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "incident_notes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=True),
        sa.Column("text", sa.String(length=1000), nullable=False),
        sa.Column("author", sa.String(length=80), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_notes")),
    )
    op.create_index(op.f("ix_incident_notes_resolved_at"), "incident_notes", ["resolved_at"], unique=False)
    op.create_index(op.f("ix_incident_notes_updated_at"), "incident_notes", ["updated_at"], unique=False)
    op.create_table(
        "incident_note_updates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("note_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("text", sa.String(length=1000), nullable=False),
        sa.Column("author", sa.String(length=80), nullable=False),
        sa.Column("via", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(["note_id"], ["incident_notes.id"],
                                name=op.f("fk_incident_note_updates_note_id_incident_notes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_note_updates")),
    )
    op.create_index(op.f("ix_incident_note_updates_note_id"), "incident_note_updates", ["note_id"], unique=False)
    op.create_index(op.f("ix_incident_note_updates_at"), "incident_note_updates", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_incident_note_updates_at"), table_name="incident_note_updates")
    op.drop_index(op.f("ix_incident_note_updates_note_id"), table_name="incident_note_updates")
    op.drop_table("incident_note_updates")
    op.drop_index(op.f("ix_incident_notes_updated_at"), table_name="incident_notes")
    op.drop_index(op.f("ix_incident_notes_resolved_at"), table_name="incident_notes")
    op.drop_table("incident_notes")
