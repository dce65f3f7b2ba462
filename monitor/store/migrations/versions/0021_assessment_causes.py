"""assessments: every stored assessment names the cause of each server it does not count
(``excluded_causes``). Diagnoses stored before causes were (kept as assessments by 0015) have only
the reasons' text; the cause that text begins with is stored here, once, so readers take the
stored cause instead of parsing English on every read. Every row is kept; downgrade leaves the
causes in place (older versions read them too).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# what each cause's reason began with (``monitor.core.assessment.CAUSE_PHRASE`` as it was then),
# most specific first; anything else was OFFLINE
_BEGINNINGS = (("ONLINE but failing", "failing"), ("ONLINE but unreachable", "unreachable"),
               ("ONLINE but", "wrong outputs"), ("JOINING", "JOINING"))

_ASSESSMENTS = sa.table("assessments", sa.column("poll_id", sa.BigInteger()), sa.column("model", sa.String()),
                        sa.column("assessment", sa.JSON(none_as_null=True)))


def cause_of(why: str) -> str:
    """The cause an ``excluded_peers`` reason of those days names."""
    return next((cause for beginning, cause in _BEGINNINGS if str(why).startswith(beginning)), "OFFLINE")


def upgrade() -> None:
    t = _ASSESSMENTS.c
    conn = op.get_bind()
    # Only rows without the key come into Python. The key as a key is `"excluded_causes"`; the same
    # words inside a string value (a server's error quoted in a reason) are escaped as
    # `\"excluded_causes\"`, which this pattern does not match.
    missing = sa.cast(t.assessment, sa.Text()).notlike('%"excluded/_causes"%', escape="/")
    rows = conn.execute(sa.select(t.poll_id, t.model, t.assessment).where(t.assessment.isnot(None), missing)).all()
    for poll_id, model, data in rows:
        if not isinstance(data, dict) or "excluded_causes" in data:
            continue
        causes = {peer: cause_of(why) for peer, why in (data.get("excluded_peers") or {}).items()}
        conn.execute(_ASSESSMENTS.update().where(t.poll_id == poll_id, t.model == model)
                     .values(assessment={**data, "excluded_causes": causes}))


def downgrade() -> None:
    """Nothing to undo: the versions before this one read a stored ``excluded_causes`` first."""
