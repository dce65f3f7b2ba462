"""The contribution ledger's tables, and its proven owners' (``schema.py`` re-exports them;
``store/contributions.py`` and ``store/owners.py`` write and read them)."""

from __future__ import annotations

from typing import Optional

import sqlalchemy as sa
from sqlmodel import Field, SQLModel


class _Earned(SQLModel):
    """What a server earned (``core/contributions.py`` ``AMOUNTS``): block-seconds announced, serving
    and verified, seconds watched and serving, its measured speed, real requests' tokens × blocks."""

    announced: float = 0.0
    serving: float = 0.0
    verified: float = 0.0
    watched: float = 0.0
    serving_seconds: float = 0.0
    speed_seconds: float = 0.0
    speed_sum: float = 0.0
    block_tokens: int = Field(default=0, sa_type=sa.BigInteger)
    requests: int = Field(default=0, sa_type=sa.BigInteger)


class ContributionHourRow(_Earned, table=True):
    """What one server earned for one model within one hour, summed as polls and requests are
    stored (revision 0026); kept two days once folded into their days, read for the last day. Peers
    by their id, not a key: the ledger outlives the peers table's pruning."""

    __tablename__ = "contribution_hours"
    __table_args__ = (sa.Index(None, "hour"),)
    peer_id: str = Field(primary_key=True, max_length=128)
    model: str = Field(primary_key=True, max_length=256)
    hour: float = Field(primary_key=True)


class ContributionDayRow(_Earned, table=True):
    """What one server earned for one model within one UTC day, its hours folded in by the hourly
    rollup once they ended (revision 0028): a week's or a month's leaderboard reads 7 or 30 rows a
    server, not 24 times as many. Kept the rollup retention, then summed into the all-time rows."""

    __tablename__ = "contribution_days"
    __table_args__ = (sa.Index(None, "day"),)
    peer_id: str = Field(primary_key=True, max_length=128)
    model: str = Field(primary_key=True, max_length=256)
    day: float = Field(primary_key=True)


class ContributionTotalRow(_Earned, table=True):
    """The days past the rollup retention, summed per server and model as they are pruned (revision
    0026; hours until revision 0028)."""

    __tablename__ = "contribution_totals"
    peer_id: str = Field(primary_key=True, max_length=128)
    model: str = Field(primary_key=True, max_length=256)
    first_hour: float
    last_hour: float


class OwnerNonceRow(SQLModel, table=True):
    """A nonce the monitor issued for a proof of running ``peer_id`` (``core/ownership.py``): single
    use, short-lived, bound to the peer id; the address it was asked from, hashed, bounds how many
    one address asks for (revision 0027)."""

    __tablename__ = "owner_nonces"
    __table_args__ = (sa.Index(None, "peer_id", "expires_at"), sa.Index(None, "address", "created_at"))
    nonce: str = Field(primary_key=True, max_length=64)
    peer_id: str = Field(max_length=128)
    address: str = Field(max_length=64)
    created_at: float
    expires_at: float
    used_at: Optional[float] = None


class OwnerRow(SQLModel, table=True):
    """A proven owner: the hash of the token their proof returned (the token itself is theirs only)."""

    __tablename__ = "owners"
    id: str = Field(primary_key=True, max_length=32)
    token_hash: str = Field(max_length=64, unique=True)
    created_at: float
    last_seen: float


class OwnerPeerRow(SQLModel, table=True):
    """A server an owner proved they run (by its key), and when."""

    __tablename__ = "owner_peers"
    __table_args__ = (sa.Index(None, "peer_id"),)
    owner: str = Field(primary_key=True, max_length=32, foreign_key="owners.id")
    peer_id: str = Field(primary_key=True, max_length=128)
    proven_at: float


class OwnerSubscriptionRow(SQLModel, table=True):
    """Where an owner hears of their own servers' troubles: an https webhook (its address must be
    public when it is called, unless the operator allows private ones); the hash of the secret that
    ends it."""

    __tablename__ = "owner_subscriptions"
    __table_args__ = (sa.Index(None, "owner"),)
    id: str = Field(primary_key=True, max_length=32)
    owner: str = Field(max_length=32, foreign_key="owners.id")
    url: str = Field(max_length=500)  # an https webhook, or "mailto:ADDRESS"
    secret_hash: str = Field(max_length=64)
    created_at: float
    confirmed_at: Optional[float] = None  # (an e-mail address: once its link was followed; a webhook: at once)
    code_hash: Optional[str] = Field(default=None, max_length=64)  # the e-mail link's code
