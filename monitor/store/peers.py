"""Reads about one peer or a few: find a server by its id, a prefix of it or its public name, and
what the store remembers of a peer that is not in the latest poll (when it was last seen, what it
announced last).

Both answer "is my server OK?" (``monitor.core.server_check``) and the search box; each is a few
indexed queries: ``peers.peer_id`` is unique (a prefix is a range on that index), names are
matched on ``peers.public_name`` (indexed; a case-insensitive substring match scans the peers
table, a few thousand rows), announcements come from the ``(peer, at)`` index of the observations.
Every function takes a connection inside a read transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from monitor.core.server_check import LastAnnouncement
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE
from monitor.store.schema import HourlyObservationsRow, Peer, Poll, ServerObservationRow

SUFFIX_MARKS = ("…", "...")  # how short peer ids are shown ("…abc123"); a query starting so matches the end


@dataclass(frozen=True)
class PeerMatch:
    peer_id: str
    public_name: Optional[str]
    first_seen: Optional[float]  # None: never announced itself (only checked or chatted with)
    last_seen: Optional[float]
    matched: str  # "peer id", "peer id prefix", "peer id suffix", "public name"


@dataclass(frozen=True)
class PeerRecord:
    peer_id: str
    first_seen: Optional[float]
    last_seen: Optional[float]
    public_name: Optional[str]


def search(conn: Connection, query: str, limit: int) -> list[PeerMatch]:
    """Peers whose id is ``query``, starts with it (or ends with it, after ``…``), or whose public
    name contains it (case-insensitive); exact matches first, at most ``limit``. ``query`` must be
    stripped and bounded by the caller."""
    t = Peer.__table__.c
    columns = (t.peer_id, t.public_name, t.first_seen, t.last_seen)
    found: dict[str, PeerMatch] = {}

    def add(rows, matched: str) -> None:
        for peer_id, name, first, last in rows:
            if peer_id not in found and len(found) < limit:
                found[peer_id] = PeerMatch(peer_id, name, first, last, matched)

    suffix = next((query[len(mark):] for mark in SUFFIX_MARKS if query.startswith(mark)), None)
    if suffix:  # (LIKE ignores case on SQLite: the exact check is ``endswith``)
        rows = conn.execute(sa.select(*columns).where(t.peer_id.like("%" + _escape(suffix), escape="\\"))
                            .order_by(t.last_seen.desc().nulls_last()).limit(4 * limit))
        add((r for r in rows if r[0].endswith(suffix)), "peer id suffix")
        return list(found.values())
    add(conn.execute(sa.select(*columns).where(t.peer_id == query)), "peer id")
    if query.isascii() and query.isalnum():  # a prefix is a range of the unique index
        after = query[:-1] + chr(ord(query[-1]) + 1)
        add(conn.execute(sa.select(*columns).where(
            t.peer_id >= query, t.peer_id < after, sa.func.substr(t.peer_id, 1, len(query)) == query)
            .order_by(t.last_seen.desc().nulls_last()).limit(limit)), "peer id prefix")
    add(conn.execute(sa.select(*columns).where(t.public_name == query).order_by(t.last_seen.desc().nulls_last())
                     .limit(limit)),
        "public name")
    add(conn.execute(sa.select(*columns).where(t.public_name.ilike("%" + _escape(query) + "%", escape="\\"))
                     .order_by(t.last_seen.desc().nulls_last()).limit(limit + len(found))), "public name")
    return list(found.values())


def _escape(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern (escape character ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def record(conn: Connection, peer_id: str) -> Optional[PeerRecord]:
    t = Peer.__table__.c
    row = conn.execute(sa.select(t.first_seen, t.last_seen, t.public_name).where(t.peer_id == peer_id)).first()
    return None if row is None else PeerRecord(peer_id, row[0], row[1], row[2])


def last_announcements(conn: Connection, peer_id: str, *, models: int = 16) -> list[LastAnnouncement]:
    """The latest announcement per model (at most ``models``), newest first: from the raw
    observations, else (raw rows pruned) from the latest hourly rollup of each model."""
    key = conn.execute(sa.select(Peer.__table__.c.id).where(Peer.__table__.c.peer_id == peer_id)).scalar()
    if key is None:
        return []
    o = ServerObservationRow.__table__.c
    latest: dict[str, LastAnnouncement] = {}
    for at, model, state, start, end, version in conn.execute(
            sa.select(o.at, o.model, o.state, o.start, o.end, o.version).where(o.peer == key)
            .order_by(o.at.desc()).limit(20 * models)):
        if model not in latest and len(latest) < models:
            latest[model] = LastAnnouncement(at, model, state, start, end, version)
    if latest:
        return list(latest.values())
    h = HourlyObservationsRow.__table__.c
    for hour, model, online, joining, start, end in conn.execute(
            sa.select(h.hour, h.model, h.online, h.joining, h.min_start, h.max_end).where(h.peer == key)
            .order_by(h.hour.desc()).limit(20 * models)):
        if model not in latest and len(latest) < models:
            state = ONLINE if online else JOINING if joining else OFFLINE
            latest[model] = LastAnnouncement(hour, model, state, start, end, hourly=True)
    return list(latest.values())


def serving_since(conn: Connection, since: float, *, limit: int = 20_000) -> list[tuple[str, Optional[str], str, float]]:
    """(peer id, public name, model, the newest poll that saw it ONLINE) of every server a poll saw
    serving since ``since``: what the assess step draws the servers a model lost from
    (``app.assessing.served_lately``), so that a poller that takes over knows who left."""
    observations, peers = ServerObservationRow.__table__, Peer.__table__
    o, p, polls = observations.c, peers.c, Poll.__table__.c
    recent = sa.select(polls.id).where(polls.at >= since).scalar_subquery()
    query = (sa.select(p.peer_id, p.public_name, o.model, sa.func.max(o.at))
             .select_from(observations.join(peers, p.id == o.peer)).where(o.poll_id.in_(recent), o.state == ONLINE)
             .group_by(p.peer_id, p.public_name, o.model).limit(limit))
    return [(peer, name, model, at) for peer, name, model, at in conn.execute(query)]
