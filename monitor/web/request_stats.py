"""Statistics from real requests, as the pages and the API show them (``core/requests.py``): read
from the stored request rows, never from a verdict of their own; computed at most once a minute
per store change (``cached``: a day of a busy chat's rows takes a second or two to read)."""

from __future__ import annotations

from monitor.core.common import DAY, MINUTE
from monitor.core.forecast import forecast_record
from monitor.core.requests import LATENCY_WINDOWS, MAX_ROWS, PERCENTILES, SUCCESS_WINDOWS, stats, stats_by_server

MAX_SERVERS = 500  # servers listed in a model's stats (those with the most requests)


def cached(d, cur, key: tuple, now: float, compute):
    """``compute()`` once per store change and minute (the figures' windows are minutes to a day)."""
    return d.cache.page(cur.marks, (*key, int(now // MINUTE)), compute)


def figures(records: list, now: float, **head) -> dict:
    """``head`` (what they are of), how many rows the figures rest on, the windows and percentiles
    named, and ``stats``: the one shape of the API's and the pages' figures."""
    return {**head, "at": now, "rows": len(records), "truncated": len(records) >= MAX_ROWS,
            "windows": {"success": [name for name, _ in SUCCESS_WINDOWS],
                        "latency": [name for name, _ in LATENCY_WINDOWS]},
            "percentiles": [f"p{q}" for q in PERCENTILES], **stats(records, now=now)}


def model_stats(store, model: str, now: float, *, servers: bool = True) -> dict:
    """The model's figures over the windows, and each server's (``servers``)."""
    records = store.requests_since(now - DAY, model=model, limit=MAX_ROWS, route=servers)
    found = figures(records, now, model=model)
    found["forecasts"] = forecast_record(records, now=now)  # how the forecasts the requests were given fared
    if servers:
        found["servers"] = stats_by_server(records, now=now, limit=MAX_SERVERS)
    return found


def peer_stats(store, peer_id: str, now: float) -> dict:
    """The figures of the requests whose route went through ``peer_id`` (every model)."""
    return figures(store.requests_through(peer_id, now - DAY, limit=MAX_ROWS), now, peer_id=peer_id)
