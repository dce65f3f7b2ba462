"""The contribution ledger's tables (``schema.py`` re-exports them; ``store/contributions.py``
writes and reads them)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Field, SQLModel


class ContributionHourRow(SQLModel, table=True):
    """What one server earned for one model within one hour (``core/contributions.py``: block-seconds
    announced, serving and verified, seconds watched and serving, its measured speed, real requests'
    tokens × blocks), summed as polls and requests are stored; kept the rollup retention (revision 0026).
    Peers by their id, not a key: the ledger outlives the peers table's pruning."""

    __tablename__ = "contribution_hours"
    __table_args__ = (sa.Index(None, "hour"),)
    peer_id: str = Field(primary_key=True, max_length=128)
    model: str = Field(primary_key=True, max_length=256)
    hour: float = Field(primary_key=True)
    announced: float = 0.0
    serving: float = 0.0
    verified: float = 0.0
    watched: float = 0.0
    serving_seconds: float = 0.0
    speed_seconds: float = 0.0
    speed_sum: float = 0.0
    block_tokens: int = Field(default=0, sa_type=sa.BigInteger)
    requests: int = Field(default=0, sa_type=sa.BigInteger)


class ContributionTotalRow(SQLModel, table=True):
    """The same, over all time: one row per server and model, never pruned (revision 0026)."""

    __tablename__ = "contribution_totals"
    peer_id: str = Field(primary_key=True, max_length=128)
    model: str = Field(primary_key=True, max_length=256)
    first_hour: float
    last_hour: float
    announced: float = 0.0
    serving: float = 0.0
    verified: float = 0.0
    watched: float = 0.0
    serving_seconds: float = 0.0
    speed_seconds: float = 0.0
    speed_sum: float = 0.0
    block_tokens: int = Field(default=0, sa_type=sa.BigInteger)
    requests: int = Field(default=0, sa_type=sa.BigInteger)
