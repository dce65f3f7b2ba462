"""reachability tables: a reachability check is not a probe (README: Glossary), so the tables that
hold them are named for what they hold. ``probe_results``, ``latest_probes`` and ``hourly_probes``
become ``reachability_results``, ``latest_reachability`` and ``hourly_reachability`` (ALTER TABLE
... RENAME: every row stays, nothing is copied), with their indexes; on PostgreSQL their primary and
foreign key constraints and the id sequence too (SQLite keeps a constraint's name inside the
table's text, where nothing reads it). The score components the reachability checks make,
``probe_success`` and ``probe_rtt``, are ``reachability_success`` and ``reachability_rtt`` in each
peer's stored score (``peer_scores.components``). Downgrade undoes both.

One transaction, like every revision: the pollers upgrade as the README says (stop the standbys,
migrate, start), and no version that reads the new names runs before it is committed.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# old name -> (new name, its indexes' columns: ``ix_<table>_<columns>``, as the naming convention has them)
TABLES = {
    "probe_results": ("reachability_results", (("at",), ("peer", "at"))),
    "latest_probes": ("latest_reachability", ()),
    "hourly_probes": ("hourly_reachability", (("hour",),)),
}
SEQUENCES = ("probe_results", "reachability_results")  # (PostgreSQL: the BIGSERIAL ``<table>_id_seq``)
COMPONENTS = {"probe_success": "reachability_success", "probe_rtt": "reachability_rtt"}

_SCORES = sa.table("peer_scores", sa.column("peer", sa.Integer()), sa.column("components", sa.JSON(none_as_null=True)))


def _rename(names: dict[str, tuple[str, tuple[tuple[str, ...], ...]]]) -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for old, (new, indexes) in names.items():
        op.rename_table(old, new)
        for columns in indexes:
            suffix = "_".join(columns)
            if postgresql:
                op.execute(f"ALTER INDEX ix_{old}_{suffix} RENAME TO ix_{new}_{suffix}")
            else:  # (SQLite cannot rename an index: it is made again, under the new table's name)
                op.drop_index(f"ix_{old}_{suffix}", table_name=new)
                op.create_index(f"ix_{new}_{suffix}", new, list(columns))
        if postgresql:
            op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT pk_{old} TO pk_{new}")
            op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT fk_{old}_peer_peers TO fk_{new}_peer_peers")
            if old in SEQUENCES:
                op.execute(f"ALTER SEQUENCE IF EXISTS {old}_id_seq RENAME TO {new}_id_seq")


def _rename_components(names: dict[str, str]) -> None:
    """Each stored score's components under their new names, in their order (``peer_scores`` keeps
    each peer's latest score only: a row per peer; its sentences name no component)."""
    t = _SCORES.c
    conn = op.get_bind()
    for peer, components in conn.execute(sa.select(t.peer, t.components).where(t.components.isnot(None))).all():
        if isinstance(components, dict) and names.keys() & components.keys():
            renamed = {names.get(name, name): value for name, value in components.items()}
            conn.execute(_SCORES.update().where(t.peer == peer).values(components=renamed))


def upgrade() -> None:
    _rename(TABLES)
    _rename_components(COMPONENTS)


def downgrade() -> None:
    _rename({new: (old, indexes) for old, (new, indexes) in TABLES.items()})
    _rename_components({new: old for old, new in COMPONENTS.items()})
