"""The status page (``/status``) and its Atom feed: "has this model been up this month?" at a glance.

Per model: a bar of the last ``DAYS`` UTC days, each cell coloured by the day's worst state (its
uptime, outages and maintenance on hover, on tap and on keyboard focus), the uptime over 24 h, 7 d
and 30 d, open incident notes and maintenance windows in force. The figures are ``core.uptime``'s
over the statuses the poller stored (``Store.status_points``: hourly rollups, then every poll),
with the time inside maintenance windows (``core.maintenance``) left out, and said so.

What it costs: 90 days of four models are ~9,000 hourly rows and ~12,000 polls, read in two
queries and folded once per store change and minute into the app's cache (``WebCache.page``,
keyed by the store's change marks, the minute and the maintenance windows in the range); notes
are read on each request (a few rows). ``peer_uptimes`` does the same for one peer's badges.

``/status/feed.atom``: the models' state changes and every change of a note over the last 30 days,
newest first, for feed readers and chat bots (any origin may read it: ``cors.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional
from xml.sax.saxutils import escape, quoteattr

from flask import Blueprint, Response, render_template, request, url_for
from markupsafe import Markup

from monitor.core import maintenance, uptime
from monitor.core.timefmt import clock, date, duration, iso
from monitor.core.common import DAY, MINUTE, STALE_PERIODS
from monitor.core.incidents import MODEL, PEER, SWARM, Note
from monitor.core.maintenance import MaintenanceWindow
from monitor.core.uptime import Day, Tally
from monitor.web import deps, queries, state_api
from monitor.web.render import htmx_target

bp = Blueprint("status", __name__)

DAYS = 90  # cells of the bar
FEED_DAYS = 30
FEED_ENTRIES = 100
NOTES_RESOLVED_DAYS = 7  # resolved notes stay on the status page this long


# ---- what the page and the badges read ---------------------------------------------------------


def windows_since(d, since: float) -> list[MaintenanceWindow]:
    """Maintenance windows not over before ``since`` (the range's uptime leaves them out)."""
    return list(d.store.maintenance_windows(ending_after=since))


def _fingerprint(windows) -> tuple:
    return tuple(sorted((w.id, w.starts_at, w.ends_at) for w in windows))


def model_windows(windows, dht_prefix: str) -> list[MaintenanceWindow]:
    return [w for w in windows if w.covers(models=[dht_prefix])]


def peer_windows(windows, peer_id: str, models=(), names=()) -> list[MaintenanceWindow]:
    return [w for w in windows if w.covers(models=models, peers=(peer_id, *names))]


@dataclass(frozen=True)
class StatusPageRow:
    """One model's row of the status page."""

    dht_prefix: str
    name: str
    state: str  # now: healthy | degraded | broken | unknown, or maintenance while a window is in force
    days: list[Day]
    uptimes: dict[str, Tally]  # "24h" | "7d" | "30d"
    maintenance_now: list[MaintenanceWindow] = field(default_factory=list)


def poll_hold(settings) -> float:
    """How long one stored poll stands for at most: the poller's stale rule (``STALE_PERIODS``)."""
    return STALE_PERIODS * settings.scrape_period


def model_statuses(d, cur, now: float) -> list[StatusPageRow]:
    """Every model of the latest poll, with its bar and uptimes: once per store change, minute and
    set of maintenance windows (``WebCache.page``)."""
    since = now - DAYS * DAY
    windows = windows_since(d, since)
    key = ("status", int(now // MINUTE), _fingerprint(windows))

    def build() -> list[StatusPageRow]:
        minute = (now // MINUTE) * MINUTE
        prefixes = [m.dht_prefix for m in cur.models]
        points = d.store.status_points(prefixes, since - DAY, minute, poll_hold=poll_hold(d.settings))
        found = []
        for model in cur.models:
            covering = model_windows(windows, model.dht_prefix)
            left_out = maintenance.covered_intervals(covering, since, minute)
            outages = d.store.outage_intervals(model.dht_prefix, since, minute)
            mine = uptime.compact(points.get(model.dht_prefix, []))
            in_force = maintenance.active(covering, now)
            assessment = cur.assessments.get(model.dht_prefix)
            found.append(StatusPageRow(
                dht_prefix=model.dht_prefix, name=state_api.model_name(model),
                state=uptime.MAINTENANCE if in_force else state_api.monitor_state(assessment),
                days=uptime.days(mine, minute, count=DAYS, maintenance=left_out, outages=outages),
                uptimes=uptime.uptimes(mine, minute, left_out), maintenance_now=in_force))
        return found

    return d.cache.page(cur.marks, key, build)


def peer_uptimes(d, cur, peer_id: str, now: float) -> dict[str, maintenance.Uptime]:
    """The peer's uptime over 24 h, 7 d and 30 d (``core.maintenance.uptime``: ONLINE time of the
    time observed, maintenance left out), once per store change and minute."""
    longest = max(uptime.WINDOWS.values())
    windows = windows_since(d, now - longest)
    key = ("peer-uptime", peer_id, int(now // MINUTE), _fingerprint(windows))

    def build() -> dict[str, maintenance.Uptime]:
        minute = (now // MINUTE) * MINUTE
        found = d.store.peer_history(peer_id, minute - longest, minute, merge_runs=True)
        models = sorted({o.model for o in found.observations})
        record = d.store.peer_record(peer_id)
        names = tuple(n for n in {row.public_name for row in cur.snapshot.servers if row.peer_id == peer_id}
                      | {record.public_name if record else None} if n) if cur.snapshot else ()
        left_out = maintenance.covered_intervals(peer_windows(windows, peer_id, models, names),
                                                 minute - longest, minute)
        return {name: maintenance.uptime(found.observations, minute - seconds, minute, left_out)
                for name, seconds in uptime.WINDOWS.items()}

    return d.cache.page(cur.marks, key, build)


def notes_shown(d, now: float) -> list[Note]:
    """Open notes, and those resolved within ``NOTES_RESOLVED_DAYS``, newest change first."""
    return d.store.notes(resolved_since=now - NOTES_RESOLVED_DAYS * DAY)


def overall(statuses: list[StatusPageRow]) -> tuple[str, str]:
    """(state, sentence) of the whole swarm at the top of the page."""
    states = [s.state for s in statuses]
    if not states:
        return uptime.NO_DATA, "No model is watched yet."

    def some(state: str) -> str:
        n = states.count(state)
        return f"{n} of {len(states)} model{'s' if len(states) != 1 else ''} {'is' if n == 1 else 'are'}"

    if "broken" in states:
        return "broken", f"{some('broken')} down."
    if "degraded" in states:
        return "degraded", f"{some('degraded')} degraded (still usable)."
    if uptime.MAINTENANCE in states:
        return uptime.MAINTENANCE, "Some models are under maintenance."
    if all(s == "healthy" for s in states):
        return "healthy", "All models are operational."
    return "unknown", "Some models could not be diagnosed."


# ---- the page ------------------------------------------------------------------------------------


@bp.get("/status")
def page():
    """The page; its live part (everything but the operators' forms) is rendered once per store
    change, notes, maintenance windows and ``LIVE_SECONDS`` for every visitor (``WebCache.now``:
    nothing of one visitor is in it), and is what the page's htmx refresh asks for."""
    d = deps()
    cur = queries.current(d)
    now = time.time()
    notes = notes_shown(d, now)
    windows = [w for w in windows_since(d, now) if maintenance.active([w], now) or
               (maintenance.next_start(w, now) or now + 8 * DAY) < now + 7 * DAY]

    def live() -> Markup:
        statuses = model_statuses(d, cur, now) if cur.snapshot is not None else []
        state, sentence = overall(statuses)
        return Markup(render_template(
            "partials/status_live.html", now=now, cur=cur, poll=queries.poll_info(cur, d.settings, now),
            statuses=statuses, notes=notes, windows=windows, overall_state=state, overall_sentence=sentence,
            days=DAYS, maintenance=maintenance))

    key = ("html", request.url_root, "status-live", tuple((n.id, n.updated_at) for n in notes), _fingerprint(windows))
    status_live = d.cache.now(cur.marks, now, key, live)
    if htmx_target() == "status-live":
        return status_live
    return render_template("status.html", status_live=status_live, notes=notes, days=DAYS)


# ---- the Atom feed -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    id: str
    at: float
    title: str
    text: str
    link: str
    category: str


def feed_entries(d, cur, now: float, base: str) -> list[Entry]:
    """The models' state changes and the notes' changes since ``FEED_DAYS`` ago, newest first."""
    since = now - FEED_DAYS * DAY
    names = {m.dht_prefix: state_api.model_name(m) for m in cur.models}
    entries = []
    for model in cur.models:
        for change in d.store.state_changes(model.dht_prefix, since, now):
            was = change.from_state or "first status"
            entries.append(Entry(
                id=f"{base}status#state-{model.dht_prefix}-{int(change.at * 1000)}", at=change.at,
                title=f"{names[model.dht_prefix]}: {was} → {change.to_state}",
                text="; ".join(change.reasons) or change.to_state,
                link=f"{base}models/{model.dht_prefix}", category="state-change"))
    for note, change in d.store.note_changes(since, limit=FEED_ENTRIES):
        about = "the swarm" if note.scope == SWARM else names.get(note.target, note.target) if note.scope == MODEL \
            else f"peer {note.target}"
        link = f"{base}models/{note.target}" if note.scope == MODEL else f"{base}peers/{note.target}" \
            if note.scope == PEER else f"{base}status"
        entries.append(Entry(id=f"{base}status#note-{note.id}-{int(change.at * 1000)}", at=change.at,
                             title=f"Note {change.action} on {about}", text=change.text, link=link,
                             category=f"note-{change.action}"))
    return sorted(entries, key=lambda e: e.at, reverse=True)[:FEED_ENTRIES]


def atom(entries: list[Entry], *, base: str, self_url: str, now: float) -> str:
    """The entries as an Atom 1.0 document (RFC 4287); every text escaped."""
    updated = iso(entries[0].at if entries else now)
    lines = ['<?xml version="1.0" encoding="utf-8"?>', '<feed xmlns="http://www.w3.org/2005/Atom">',
             f"  <id>{escape(base)}status</id>", "  <title>Petals swarm status</title>",
             f"  <updated>{updated}</updated>", f"  <link rel=\"self\" href={quoteattr(self_url)}/>",
             f"  <link rel=\"alternate\" type=\"text/html\" href={quoteattr(base + 'status')}/>",
             "  <author><name>Petals swarm monitor</name></author>"]
    for e in entries:
        lines += ["  <entry>", f"    <id>{escape(e.id)}</id>", f"    <title>{escape(e.title)}</title>",
                  f"    <updated>{iso(e.at)}</updated>", f"    <link href={quoteattr(e.link)}/>",
                  f"    <category term={quoteattr(e.category)}/>",
                  f"    <content type=\"text\">{escape(e.text)}</content>", "  </entry>"]
    lines.append("</feed>")
    return "\n".join(lines) + "\n"


@bp.get("/status/feed.atom")
def feed():
    d = deps()
    cur = queries.current(d)
    now = time.time()
    base = request.url_root
    body = d.cache.page(cur.marks, ("feed", base, d.store.notes_mark(), int(now // MINUTE)), lambda: atom(
        feed_entries(d, cur, now, base), base=base, self_url=url_for("status.feed", _external=True), now=now))
    response = Response(body, mimetype="application/atom+xml")
    response.headers["Cache-Control"] = "public, max-age=60"
    return response


def day_label(day: Day, now: Optional[float] = None) -> str:
    """What a day's cell says (hover, tap, screen readers): the date, state, uptime, outages and
    maintenance."""
    parts = [f"{date(day.start)}{' (today, so far)' if now is not None and day.end >= now - MINUTE else ''}: {day.state}"]
    if day.share is not None:
        parts.append(f"{uptime.percent(day.share)} up")
    if day.outages:
        spans = ", ".join(f"{clock(a)}–{clock(b)}" for a, b in day.outages[:3])
        more = f" and {len(day.outages) - 3} more" if len(day.outages) > 3 else ""
        parts.append(f"down {duration(day.outage_seconds)} ({spans}{more} UTC)")
    if day.maintenance > 0:
        parts.append(f"maintenance {duration(day.maintenance)} (left out of uptime)")
    return "; ".join(parts)


@bp.app_template_filter("uptime_percent")
def _uptime_percent(share):
    return uptime.percent(share)


@bp.app_template_global("day_label")
def _day_label(day: Day, now: Optional[float] = None) -> str:
    return day_label(day, now)
