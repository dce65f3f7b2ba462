"""Notices as webhook payloads (generic JSON, Slack, Discord), and one bounded HTTP POST to send one.

The edge where alerts leave the monitor. Webhook URLs are operator configuration; what goes into a
payload comes partly from peers (public names, model names inside reasons), so it is cut to size
and made inert for each chat service: Slack's control sequences (``<!channel>``, ``<url|text>``)
escaped, Discord's mentions disabled and its markdown escaped. Sending uses the standard library's
HTTP client with a timeout, never follows a redirect (a webhook that moved is a configuration
error the operator should see, not a reason to post alerts wherever the answer points), and
reads at most a little of the answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Optional
from urllib.parse import urlsplit

from monitor.core.alert_rules import (
    CHANGED, DETAIL_CHARS, FIRED, MAX_DETAILS, REPEATED, RESOLVED, SUMMARY_CHARS, Notice,
)
from monitor.core.common import short_error

log = logging.getLogger(__name__)

SOURCE = "petals-swarm-monitor"
MAX_PAYLOAD_BYTES = 16 * 1024  # what we send; notices are far smaller (summary and details are cut)
MAX_ANSWER_BYTES = 1024  # what we read of a webhook's answer (for the error message)
DISCORD_CONTENT_CHARS = 2000  # Discord's limit on a message
USER_AGENT = "petals-swarm-monitor-alerts/1"


class DeliveryError(Exception):
    """A webhook did not take a notice; the message says why (shown to operators, stored)."""


@dataclass(frozen=True)
class Message:
    """One notice for people: a headline and its detail lines."""

    headline: str
    lines: tuple[str, ...]


_EVENT_WORDS = {FIRED: "FIRING", CHANGED: "CHANGED", REPEATED: "STILL FIRING", RESOLVED: "RESOLVED"}
_ICONS = {FIRED: "\N{LARGE RED CIRCLE}", CHANGED: "\N{LARGE ORANGE CIRCLE}",
          REPEATED: "\N{CLOCKWISE RIGHTWARDS AND LEFTWARDS OPEN CIRCLE ARROWS}", RESOLVED: "\N{LARGE GREEN CIRCLE}"}


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def message(notice: Notice, dashboard_url: Optional[str] = None) -> Message:
    """What a person reads, whatever the service."""
    word = _EVENT_WORDS.get(notice.event, notice.event.upper())
    if notice.event == FIRED:
        word = f"{word} [{notice.severity}]"
    elif notice.event == CHANGED:
        word = f"{word} {notice.previous_state} → {notice.state} [{notice.severity}]"
    headline = f"{word} {notice.rule}: {notice.summary}"
    lines = list(notice.details) if notice.event != RESOLVED else []
    if notice.event in (REPEATED, RESOLVED):
        lines.append(f"since {_utc(notice.since)}" if notice.event == REPEATED
                     else f"it started {_utc(notice.since)}")
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
    icon = _ICONS.get(notice.event, "")
    content = f"{icon} **{_discord_escape(msg.headline)}**"
    for line in msg.lines:
        addition = f"\n- {_discord_escape(line)}"
        if len(content) + len(addition) > DISCORD_CONTENT_CHARS:
            break
        content += addition
    return {"content": content[:DISCORD_CONTENT_CHARS], "allowed_mentions": {"parse": []}}


def payload(notice: Notice, notice_id: int, fmt: str, dashboard_url: Optional[str] = None) -> bytes:
    """The body to POST, as JSON, at most ``MAX_PAYLOAD_BYTES`` (details dropped if need be)."""
    bounded = replace(notice, label=short_error(notice.label, SUMMARY_CHARS),
                      summary=short_error(notice.summary, SUMMARY_CHARS),
                      details=tuple(short_error(line, DETAIL_CHARS) for line in notice.details[:MAX_DETAILS]))
    for attempt in (bounded, replace(bounded, details=())):
        if fmt == "slack":
            body = slack_payload(attempt, dashboard_url)
        elif fmt == "discord":
            body = discord_payload(attempt, dashboard_url)
        else:
            body = generic_payload(attempt, notice_id, dashboard_url)
        data = json.dumps(body, ensure_ascii=False).encode()
        if len(data) <= MAX_PAYLOAD_BYTES:
            return data
    raise DeliveryError(f"the notice does not fit in {MAX_PAYLOAD_BYTES} bytes")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not an instruction: never post an alert to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError with the 3xx code


_OPENER = urllib.request.build_opener(_NoRedirects())


def send(url: str, body: bytes, *, timeout: float, headers: Optional[dict[str, str]] = None) -> None:
    """POST ``body`` to ``url``; returns on a 2xx answer, else raises DeliveryError saying why
    (no URL in the message: it may carry a secret)."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        **(headers or {}), "Content-Type": "application/json", "User-Agent": USER_AGENT})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
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
