"""Notices as webhook payloads (generic JSON, Slack, Discord, Alertmanager), and one bounded HTTP POST.

The edge where alerts leave the monitor. Webhook URLs are operator configuration; what goes into a
payload comes partly from peers (public names, model names inside reasons), so it is cut to size
and made inert for each chat service: Slack's control sequences (``<!channel>``, ``<url|text>``)
escaped, Discord's mentions disabled and its markdown escaped. Sending uses the standard library's
HTTP client with a timeout, never follows a redirect (a webhook that moved is a configuration
error the operator should see, not a reason to post alerts wherever the answer points), and
reads at most a little of the answer.

Notices that go to one webhook together (``alerts.group_wait``: the same evaluation, or within that
wait) are one message listing them (``group_payload``). An Alertmanager gets the list of alerts its
``POST /api/v2/alerts`` takes: stable labels (``alertname``, ``severity``, ``rule``, ``kind``,
``subject``, ``model``, ``peer``), annotations (``summary``, ``description``, ``dashboard_url``),
``startsAt``, ``endsAt`` (a firing alert's a few re-sends ahead: it is re-sent while it fires;
a resolved one's when it resolved) and ``generatorURL``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Optional, Sequence
from urllib.parse import quote, urlsplit

from monitor.core.alert_rules import (
    CHANGED, DETAIL_CHARS, FIRED, MAX_DETAILS, MODEL_KINDS, NEWS, REPEATED, RESOLVED, SUMMARY_CHARS, Notice, severity_for,
)
from monitor.core.common import short_error
from monitor.core.timefmt import iso, utc

log = logging.getLogger(__name__)

SOURCE = "petals-swarm-monitor"
MAX_PAYLOAD_BYTES = 16 * 1024  # what we send; notices are far smaller (summary and details are cut)
MAX_ANSWER_BYTES = 1024  # what we read of a webhook's answer (for the error message)
DISCORD_CONTENT_CHARS = 2000  # Discord's limit on a message
MAX_GROUP = 20  # notices in one grouped message (more go in the next one)
MAX_CAUSE_ALERTS = 20  # an Alertmanager gets at most this many servers' alerts per model alert
USER_AGENT = "petals-swarm-monitor-alerts/1"


class DeliveryError(Exception):
    """A webhook did not take a notice; the message says why (shown to operators, stored)."""


@dataclass(frozen=True)
class Message:
    """One notice for people: a headline and its detail lines."""

    headline: str
    lines: tuple[str, ...]


_EVENT_WORDS = {FIRED: "FIRING", CHANGED: "CHANGED", NEWS: "NEW CAUSE", REPEATED: "STILL FIRING", RESOLVED: "RESOLVED"}
_ICONS = {FIRED: "\N{LARGE RED CIRCLE}", CHANGED: "\N{LARGE ORANGE CIRCLE}", NEWS: "\N{LARGE ORANGE CIRCLE}",
          REPEATED: "\N{CLOCKWISE RIGHTWARDS AND LEFTWARDS OPEN CIRCLE ARROWS}", RESOLVED: "\N{LARGE GREEN CIRCLE}"}


def message(notice: Notice, dashboard_url: Optional[str] = None) -> Message:
    """What a person reads, whatever the service."""
    word = _EVENT_WORDS.get(notice.event, notice.event.upper())
    if notice.event in (FIRED, NEWS):
        word = f"{word} [{notice.severity}]"
    elif notice.event == CHANGED:
        word = f"{word} {notice.previous_state} → {notice.state} [{notice.severity}]"
    headline = f"{word} {notice.rule}: {notice.summary}"
    lines = list(notice.details) if notice.event != RESOLVED else []
    if notice.event in (REPEATED, RESOLVED):
        lines.append(f"since {utc(notice.since, seconds=False)}" if notice.event == REPEATED
                     else f"it started {utc(notice.since, seconds=False)}")
    if dashboard_url:
        lines.append(f"{dashboard_url}/alerts")
    return Message(headline, tuple(lines))


def generic_payload(notice: Notice, notice_id: int, dashboard_url: Optional[str] = None) -> dict:
    """Our own JSON: every field of the notice, for scripts and alert routers. ``id`` is the same
    for every attempt of one notice: a receiver can drop a repeat delivery by it."""
    return {
        "id": notice_id, "source": SOURCE, "event": notice.event,
        "status": "resolved" if notice.event == RESOLVED else "firing",
        "rule": notice.rule, "kind": notice.kind, "subject": notice.subject, "label": notice.label,
        "state": notice.state, "previous_state": notice.previous_state, "severity": notice.severity,
        "summary": notice.summary, "details": list(notice.details), "since": notice.since, "at": notice.at,
        "url": f"{dashboard_url}/alerts" if dashboard_url else None,
    }


def _slack_escape(text: str) -> str:
    """Slack's three escapes: no ``<!channel>``, no ``<url|text>`` from a peer's name."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(notice: Notice, dashboard_url: Optional[str] = None) -> dict:
    """Slack incoming webhooks (and Mattermost's, which take the same ``text``)."""
    msg = message(notice, dashboard_url)
    icon = _ICONS.get(notice.event, "")
    text = f"{icon} *{_slack_escape(msg.headline)}*"
    if msg.lines:
        text += "\n" + "\n".join(f"• {_slack_escape(line)}" for line in msg.lines)
    return {"text": text}


_DISCORD_MARKUP = re.compile(r"([\\*_~`|\[\]()<>#@])")


def _discord_escape(text: str) -> str:
    return _DISCORD_MARKUP.sub(r"\\\1", text)


def discord_payload(notice: Notice, dashboard_url: Optional[str] = None) -> dict:
    """Discord webhooks: one message of at most 2000 characters, no mentions."""
    msg = message(notice, dashboard_url)
    return _discord_message(f"{_ICONS.get(notice.event, '')} ", msg)


def _discord_message(prefix: str, msg: Message) -> dict:
    """One Discord message: ``prefix`` and the bold headline, then as many of the lines as fit in
    ``DISCORD_CONTENT_CHARS``; mentions off."""
    content = f"{prefix}**{_discord_escape(msg.headline)}**"
    for line in msg.lines:
        addition = f"\n- {_discord_escape(line)}"
        if len(content) + len(addition) > DISCORD_CONTENT_CHARS:
            break
        content += addition
    return {"content": content[:DISCORD_CONTENT_CHARS], "allowed_mentions": {"parse": []}}


# ---- Alertmanager ------------------------------------------------------------------------------


def subject_url(notice: Notice, dashboard_url: Optional[str]) -> Optional[str]:
    """The dashboard's page of what the notice is about (its model, its peer), else /alerts."""
    if not dashboard_url:
        return None
    if notice.kind.startswith("model_"):
        return f"{dashboard_url}/models/{quote(notice.subject, safe='')}"
    if notice.peer:
        return f"{dashboard_url}/peers/{quote(notice.peer, safe='')}"
    return f"{dashboard_url}/alerts"


def alertmanager_labels(notice: Notice, severity: Optional[str] = None) -> dict[str, str]:
    """Labels that stay the same while the alert lasts (Alertmanager tells alerts apart by them);
    a peer's public name, which it may change, is an annotation."""
    found = {"alertname": notice.labels["alertname"][0], "severity": severity or notice.severity,
             "rule": notice.rule, "kind": notice.kind, "subject": notice.subject,
             "model": ",".join(sorted(notice.models)), "peer": notice.peer or "", "source": SOURCE}
    return {name: short_error(value, 200) for name, value in found.items() if value}


def alertmanager_payload(notice: Notice, dashboard_url: Optional[str], *, now: float, ttl: float) -> list[dict]:
    """The alerts to push for one notice: firing (``endsAt`` ``ttl`` ahead) or resolved (``endsAt``
    its time); a change of severity resolves the alert of the old one (its labels differ).

    A model's notice is the model's alert and one per server behind it that its receivers were told
    of (labels ``peer`` and ``cause``): a server that is news makes the model's group gain an alert,
    so Alertmanager notifies (it does not when only an alert's text changes); one no longer behind
    it is not re-sent and ends after ``ttl``; the model's recovery ends them all."""
    url = subject_url(notice, dashboard_url)
    resolved = notice.event == RESOLVED
    # a recovery carries the severity of what it ends ("ok" would be another alert to Alertmanager)
    severity = severity_for(notice.kind, notice.previous_state) if resolved and notice.previous_state else None
    model = notice.kind in MODEL_KINDS

    def one(labels: dict[str, str], peer_name: Optional[str]) -> dict:
        annotations = {"summary": notice.summary, "description": "\n".join(notice.details),
                       "dashboard_url": url or "", "label": notice.label, "peer_name": peer_name or ""}
        alert = {"labels": labels, "startsAt": iso(notice.since, milliseconds=True),
                 "endsAt": iso(notice.at if resolved else now + ttl, milliseconds=True),
                 "annotations": {name: value for name, value in annotations.items() if value}}
        if url:
            alert["generatorURL"] = url
        return alert

    alert = one(alertmanager_labels(replace(notice, peer=None) if model else notice, severity), notice.peer_name)
    alerts = [alert]
    if model:
        alerts += [one({**alertmanager_labels(replace(notice, peer=peer), severity), "cause": short_error(why or "?", 64)},
                       name) for peer, name, why in notice.causes[:MAX_CAUSE_ALERTS]]
    if notice.event == CHANGED and notice.previous_state:
        before = severity_for(notice.kind, notice.previous_state)
        if before != notice.severity:
            alerts.insert(0, {**alert, "labels": alertmanager_labels(notice, before),
                              "endsAt": iso(notice.at, milliseconds=True)})
    return alerts


# ---- one body per message -----------------------------------------------------------------------


def bounded_notice(notice: Notice, details: bool = True) -> Notice:
    return replace(notice, label=short_error(notice.label, SUMMARY_CHARS), summary=short_error(notice.summary, SUMMARY_CHARS),
                   details=tuple(short_error(line, DETAIL_CHARS) for line in notice.details[:MAX_DETAILS])
                   if details else ())


def group_message(notices: Sequence[Notice], dashboard_url: Optional[str]) -> Message:
    firing = sum(n.event != RESOLVED for n in notices)
    headline = f"{len(notices)} alert notices: {firing} firing, {len(notices) - firing} resolved"
    lines = [message(n).headline for n in notices]
    if dashboard_url:
        lines.append(f"{dashboard_url}/alerts")
    return Message(headline, tuple(lines))


def _body(items: Sequence[tuple[int, Notice]], fmt: str, dashboard_url: Optional[str], now: float,
          ttl: float):
    if fmt == "alertmanager":
        return [alert for _, notice in items for alert in alertmanager_payload(notice, dashboard_url, now=now, ttl=ttl)]
    if len(items) == 1:
        notice_id, notice = items[0]
        if fmt == "slack":
            return slack_payload(notice, dashboard_url)
        if fmt == "discord":
            return discord_payload(notice, dashboard_url)
        return generic_payload(notice, notice_id, dashboard_url)
    notices = [notice for _, notice in items]
    if fmt in ("slack", "discord"):
        msg = group_message(notices, dashboard_url)
        if fmt == "slack":
            return {"text": f"*{_slack_escape(msg.headline)}*\n" + "\n".join(f"• {_slack_escape(line)}" for line in msg.lines)}
        return _discord_message("", msg)
    firing = any(n.event != RESOLVED for n in notices)
    return {"source": SOURCE, "group": True, "ids": [notice_id for notice_id, _ in items],
            "status": "firing" if firing else "resolved", "count": len(items),
            "summary": group_message(notices, None).headline,
            "notices": [generic_payload(notice, notice_id, dashboard_url) for notice_id, notice in items],
            "url": f"{dashboard_url}/alerts" if dashboard_url else None}


def group_payload(items: Sequence[tuple[int, Notice]], fmt: str, dashboard_url: Optional[str] = None, *,
                  now: Optional[float] = None, ttl: float = 240.0) -> bytes:
    """The body to POST for notices (``(id, notice)``, at most ``MAX_GROUP``) that go to one webhook
    as one message, as JSON, at most ``MAX_PAYLOAD_BYTES`` (details dropped if need be). One
    notice is the format's own payload; an Alertmanager's ``now`` and ``ttl`` set ``endsAt``."""
    if not items or len(items) > MAX_GROUP:
        raise ValueError(f"a message lists 1 to {MAX_GROUP} notices, not {len(items)}")
    now = time.time() if now is None else now
    for details in (True, False):
        bounded = [(notice_id, bounded_notice(notice, details)) for notice_id, notice in items]
        data = json.dumps(_body(bounded, fmt, dashboard_url, now, ttl), ensure_ascii=False).encode()
        if len(data) <= MAX_PAYLOAD_BYTES:
            return data
    raise DeliveryError(f"the notice{'s do' if len(items) > 1 else ' does'} not fit in {MAX_PAYLOAD_BYTES} bytes")


def payload(notice: Notice, notice_id: int, fmt: str, dashboard_url: Optional[str] = None) -> bytes:
    """The body to POST for one notice (``group_payload`` of one)."""
    return group_payload([(notice_id, notice)], fmt, dashboard_url)


def resend_payload(notices: Sequence[Notice], dashboard_url: Optional[str], *, now: float, ttl: float) -> bytes:
    """An Alertmanager's re-send of the alerts still firing (as ``alertmanager_payload``), bounded
    like every payload: the alerts that do not fit wait for the next re-send."""
    alerts: list[dict] = []
    size = 2
    for notice in notices:
        for alert in alertmanager_payload(bounded_notice(notice), dashboard_url, now=now, ttl=ttl):
            encoded = len(json.dumps(alert, ensure_ascii=False).encode()) + 1
            if size + encoded > MAX_PAYLOAD_BYTES:
                break
            alerts.append(alert)
            size += encoded
    return json.dumps(alerts, ensure_ascii=False).encode()


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not an instruction: never post an alert to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError with the 3xx code


_OPENER = urllib.request.build_opener(NoRedirects())


def send(url: str, body: bytes, *, timeout: float, headers: Optional[dict[str, str]] = None,
         opener: Optional[urllib.request.OpenerDirector] = None) -> None:
    """POST ``body`` to ``url`` (through ``opener``: ours, which follows no redirect, by default);
    returns on a 2xx answer, else raises DeliveryError saying why (no URL in the message: it may
    carry a secret)."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        **(headers or {}), "Content-Type": "application/json", "User-Agent": USER_AGENT})
    try:
        with (opener or _OPENER).open(request, timeout=timeout) as response:
            response.read(MAX_ANSWER_BYTES)
            return
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            target = urlsplit(e.headers.get("Location") or "").hostname or "another address"
            log.warning("a webhook answered %s, a redirect to %s: not followed", e.code, target)
            raise DeliveryError(f"HTTP {e.code}: the webhook redirects elsewhere (not followed; set its final URL)") \
                from None
        answer = _answer_text(e)
        raise DeliveryError(f"HTTP {e.code} {e.reason}{': ' + answer if answer else ''}") from None
    except urllib.error.URLError as e:
        reason = e.reason if isinstance(e.reason, BaseException) else str(e.reason)
        raise DeliveryError(f"could not connect: {short_error(reason)}") from None
    except (TimeoutError, OSError) as e:
        raise DeliveryError(f"no answer within {timeout:g} s" if isinstance(e, TimeoutError)
                            else short_error(e)) from None


def _answer_text(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the status already says enough
        return ""
    return short_error(text, 120) if text.strip() else ""
