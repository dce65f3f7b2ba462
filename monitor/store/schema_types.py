"""What every table module of the schema shares: the naming convention, the id and JSON column types."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = SQLModel.metadata  # what Alembic compares against (migrations/env.py)

PEER_POLICIES = ("pinned", "blocked")  # the values of peer_policies.policy

# BIGINT ids on PostgreSQL; on SQLite the id must be "INTEGER PRIMARY KEY" to alias the rowid.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json_field() -> Any:
    return Field(default=None, sa_type=sa.JSON(none_as_null=True), nullable=True)
