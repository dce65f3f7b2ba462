"""Proven owners in SQL (``core/ownership.py``): the nonces issued for proofs, the owners (by the
hash of their token) and the servers each proved they run. Every function takes a connection inside
a transaction the caller opened; bounds are checked here, inside it.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.store.schema import OwnerNonceRow, OwnerPeerRow, OwnerRow, OwnerSubscriptionRow

NONCE_TTL = 300.0  # seconds a nonce may be used within
NONCES_PER_ADDRESS = 20  # nonces one address may ask for per hour
NONCES_PER_PEER = 5  # unused, unexpired nonces of one peer id at once
PEERS_PER_OWNER = 64  # servers one owner may link
SUBSCRIPTIONS_PER_OWNER = 5  # webhooks one owner may have


class OwnersFull(Exception):
    """A bound was reached (its words say which, and when to come back)."""


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def issue_nonce(conn: Connection, peer_id: str, address: str, now: float) -> tuple[str, float]:
    """A new nonce for a proof of running ``peer_id``, and when it expires; ``OwnersFull`` past the
    bounds (per asking address and hour, per peer id at once)."""
    t = OwnerNonceRow.__table__
    conn.execute(sa.delete(t).where(t.c.created_at < now - 3600, t.c.expires_at < now))  # (old ones go)
    asked = conn.execute(sa.select(sa.func.count()).where(t.c.address == _hash(address)[:64],
                                                          t.c.created_at >= now - 3600)).scalar_one()
    if asked >= NONCES_PER_ADDRESS:
        raise OwnersFull(f"at most {NONCES_PER_ADDRESS} nonces an hour from one address: try again later")
    open_ = conn.execute(sa.select(sa.func.count()).where(t.c.peer_id == peer_id, t.c.used_at.is_(None),
                                                          t.c.expires_at >= now)).scalar_one()
    if open_ >= NONCES_PER_PEER:
        raise OwnersFull(f"at most {NONCES_PER_PEER} unused nonces of one server at once: use one, or wait "
                         f"{NONCE_TTL:.0f} s")
    nonce = secrets.token_urlsafe(24)
    conn.execute(sa.insert(t).values(nonce=nonce, peer_id=peer_id, address=_hash(address)[:64], created_at=now,
                                     expires_at=now + NONCE_TTL))
    return nonce, now + NONCE_TTL


def spend_nonce(conn: Connection, nonce: str, now: float) -> Optional[str]:
    """The peer id an unused, unexpired ``nonce`` was issued for, marking it used (once: a second
    spend gets None); None for any other."""
    t = OwnerNonceRow.__table__
    row = conn.execute(sa.update(t).where(t.c.nonce == nonce[:64], t.c.used_at.is_(None), t.c.expires_at >= now)
                       .values(used_at=now).returning(t.c.peer_id)).first()
    return row.peer_id if row is not None else None


def owner_of(conn: Connection, token: Optional[str], now: Optional[float] = None) -> Optional[str]:
    """The owner a token names (None: no such owner)."""
    if not token:
        return None
    t = OwnerRow.__table__
    found = conn.execute(sa.select(t.c.id).where(t.c.token_hash == _hash(token))).scalar()
    if found is not None and now is not None:
        conn.execute(sa.update(t).where(t.c.id == found).values(last_seen=now))
    return found


def link(conn: Connection, owner: Optional[str], peer_id: str, now: float) -> tuple[str, Optional[str]]:
    """``peer_id`` linked to ``owner`` (None: a new owner); (owner id, its new token when new)."""
    token = None
    if owner is None:
        owner, token = secrets.token_hex(16), secrets.token_urlsafe(32)
        conn.execute(sa.insert(OwnerRow.__table__).values(id=owner, token_hash=_hash(token), created_at=now,
                                                          last_seen=now))
    t = OwnerPeerRow.__table__
    known = conn.execute(sa.select(t.c.peer_id).where(t.c.owner == owner)).scalars().all()
    if peer_id not in known and len(known) >= PEERS_PER_OWNER:
        raise OwnersFull(f"an owner links at most {PEERS_PER_OWNER} servers")
    if peer_id in known:
        conn.execute(sa.update(t).where(t.c.owner == owner, t.c.peer_id == peer_id).values(proven_at=now))
    else:
        conn.execute(sa.insert(t).values(owner=owner, peer_id=peer_id, proven_at=now))
    return owner, token


def peers_of(conn: Connection, owner: str) -> list[dict]:
    t = OwnerPeerRow.__table__
    return [{"peer_id": r.peer_id, "proven_at": r.proven_at}
            for r in conn.execute(sa.select(t).where(t.c.owner == owner).order_by(t.c.proven_at))]


def proven(conn: Connection, peer_id: str) -> Optional[float]:
    """When someone last proved they run ``peer_id`` (None: nobody has)."""
    t = OwnerPeerRow.__table__
    return conn.execute(sa.select(sa.func.max(t.c.proven_at)).where(t.c.peer_id == peer_id)).scalar()


def subscribe(conn: Connection, owner: str, url: str, now: float, *, pending: bool = False) -> tuple[str, str]:
    """A new subscription of ``owner``'s (a webhook; or "mailto:ADDRESS", ``pending`` until the link
    the alert job sends it is followed): (its id, the secret that ends it, shown once)."""
    t = OwnerSubscriptionRow.__table__
    if conn.execute(sa.select(sa.func.count()).where(t.c.owner == owner)).scalar_one() >= SUBSCRIPTIONS_PER_OWNER:
        raise OwnersFull(f"an owner has at most {SUBSCRIPTIONS_PER_OWNER} subscriptions: end one first")
    sid, secret = secrets.token_hex(8), secrets.token_urlsafe(24)
    conn.execute(sa.insert(t).values(id=sid, owner=owner, url=url, secret_hash=_hash(secret), created_at=now,
                                     confirmed_at=None if pending else now))
    return sid, secret


def to_confirm(conn: Connection, now: float) -> list[tuple[str, str, str]]:
    """(id, address, code) of each pending e-mail subscription whose link is not sent yet: a code is
    made for each now (its hash kept), for the alert job to send."""
    t = OwnerSubscriptionRow.__table__
    found = []
    for sid, url in conn.execute(sa.select(t.c.id, t.c.url).where(t.c.confirmed_at.is_(None), t.c.code_hash.is_(None))):
        code = secrets.token_urlsafe(24)
        conn.execute(sa.update(t).where(t.c.id == sid).values(code_hash=_hash(code)))
        found.append((sid, url.removeprefix("mailto:"), code))
    return found


def confirm(conn: Connection, sid: str, code: str, now: float) -> bool:
    """An e-mail subscription's link followed: confirmed (once; a wrong code confirms nothing)."""
    t = OwnerSubscriptionRow.__table__
    return bool(conn.execute(sa.update(t).where(t.c.id == sid[:32], t.c.code_hash == _hash(code),
                                                t.c.confirmed_at.is_(None)).values(confirmed_at=now)).rowcount)


def unsubscribe(conn: Connection, sid: str, *, owner: Optional[str] = None, secret: Optional[str] = None) -> bool:
    """Ends subscription ``sid`` for its owner, or for whoever holds its secret; False otherwise."""
    t = OwnerSubscriptionRow.__table__
    whose = t.c.owner == owner if owner is not None else t.c.secret_hash == _hash(secret or secrets.token_hex(8))
    return bool(conn.execute(sa.delete(t).where(t.c.id == sid[:32], whose)).rowcount)


def not_sent(conn: Connection, sid: str, now: float) -> None:
    """A confirmation link that could not be sent: sent again later, or the subscription ends after a day."""
    t = OwnerSubscriptionRow.__table__
    conn.execute(sa.update(t).where(t.c.id == sid).values(code_hash=None))
    conn.execute(sa.delete(t).where(t.c.id == sid, t.c.confirmed_at.is_(None), t.c.created_at < now - 86400))


def subscriptions_of(conn: Connection, owner: str) -> list[dict]:
    t = OwnerSubscriptionRow.__table__
    return [{"id": r.id, "url": r.url, "created_at": r.created_at, "confirmed": r.confirmed_at is not None}
            for r in conn.execute(sa.select(t).where(t.c.owner == owner).order_by(t.c.created_at))]


def subscribed(conn: Connection) -> dict[str, list[str]]:
    """peer id -> the subscriptions whose owner proved they run it (the alert job's one read)."""
    s, p = OwnerSubscriptionRow.__table__, OwnerPeerRow.__table__
    found: dict[str, list[str]] = {}
    for peer_id, sid in conn.execute(sa.select(p.c.peer_id, s.c.id).join(s, s.c.owner == p.c.owner)
                                     .where(s.c.confirmed_at.is_not(None))):
        found.setdefault(peer_id, []).append(sid)
    return found


def subscription_url(conn: Connection, sid: str) -> Optional[str]:
    t = OwnerSubscriptionRow.__table__
    return conn.execute(sa.select(t.c.url).where(t.c.id == sid)).scalar()
