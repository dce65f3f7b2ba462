"""Notices through Apprise: one URL per target — e-mail by SMTP (``mailto://``, ``mailtos://``),
Telegram (``tgram://``), Matrix, ntfy, Gotify, Pushover, Teams, PagerDuty, Opsgenie and the rest of
what Apprise speaks — as plain text, through the alert job's outbox like every webhook (one delivery
per notice, retried with backoff, its state on the Alerts page).

A transport only: ``text`` renders notices as people read them (``webhooks.message``), ``send``
hands one message to Apprise and raises ``webhooks.DeliveryError`` with Apprise's own reason when
the target did not take it. The URL often carries a password or a token: it is never logged or
shown, and the reason is scrubbed of its secret parts. Apprise's own logger is kept quiet (its
words reach operators only as the reason of a failed delivery).
"""

from __future__ import annotations

import logging
import re
from typing import Optional, Sequence
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from monitor.alert_settings import quiet_apprise
from monitor.app.webhooks import DeliveryError, bounded_notice, group_message, message
from monitor.core.alert_rules import Notice
from monitor.core.common import short_error

REASON_CHARS = 300
TITLE_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def with_defaults(url: str, timeout: float) -> str:
    """The URL with what the monitor asks of every target unless the operator said otherwise:
    plain text (``format=text``) and the delivery's timeout for connecting and reading
    (``cto``, ``rto``)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key, value in (("format", "text"), ("cto", f"{timeout:g}"), ("rto", f"{timeout:g}")):
        query.setdefault(key, value)
    return urlunsplit(parts._replace(query=urlencode(query)))


def to(url: str, address: str) -> str:
    """The Apprise e-mail URL ``url`` (the operator's ``owner_email``) sending to ``address`` alone."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query["to"] = address
    return urlunsplit(parts._replace(query=urlencode(query)))


def _line(text: str) -> str:
    """One line, whatever a peer announced: no CR/LF or other control characters (no header of an
    e-mail or a line of a message can be made from a public name)."""
    return " ".join(_CONTROL.sub(" ", text).split())


def text(notices: Sequence[Notice], dashboard_url: Optional[str]) -> tuple[str, str]:
    """(title, body) of one message for ``notices``: one notice's headline and details, or a group's
    count and one line per notice. Every line is one line of plain text."""
    bounded = [bounded_notice(n) for n in notices]
    msg = message(bounded[0], dashboard_url) if len(bounded) == 1 else group_message(bounded, dashboard_url)
    title = short_error(_line(msg.headline), TITLE_CHARS)
    body = "\n".join(line for line in map(_line, (msg.headline, *msg.lines)) if line)
    return title, body


def _secrets(url: str) -> list[str]:
    """The parts of an Apprise URL that may be secret: its password, user, token-like path parts."""
    parts = urlsplit(url)
    found = [parts.password, parts.username, unquote(parts.password or ""), url]
    found += [segment for segment in parts.path.split("/") if len(segment) >= 8]
    found += [value for _, value in parse_qsl(parts.query) if len(value) >= 8]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(reason: str, url: str) -> str:
    for secret in _secrets(url):
        reason = reason.replace(secret, "…")
    return short_error(_line(reason), REASON_CHARS)


def send(url: str, title: str, body: str, *, timeout: float) -> None:
    """Give one message to the Apprise target at ``url``; returns when it took it, else raises
    DeliveryError saying why (scrubbed of the URL's secrets)."""
    import apprise

    quiet_apprise()
    target = apprise.Apprise()
    if not target.add(with_defaults(url, timeout)):
        raise DeliveryError("not a URL Apprise can send to (check its scheme and fields)")
    with apprise.LogCapture(level=logging.DEBUG, fmt="%(levelname)s %(message)s") as captured:
        try:
            ok = target.notify(title=title, body=body, body_format=apprise.NotifyFormat.TEXT)
        except Exception as e:  # noqa: BLE001 - a plugin's own failure is this delivery's failure
            raise DeliveryError(scrub(f"{type(e).__name__}: {e}", url)) from None
        said = captured.getvalue().splitlines()
    if not ok:
        raise DeliveryError(scrub(reason(said), url))


_TELLING = re.compile(r"exception|error|refused|denied|timed? ?out|unauthori[sz]ed|forbidden|\b[45]\d\d\b", re.I)


def reason(lines: Sequence[str]) -> str:
    """Why Apprise's target did not take a message, from what it logged: the last detail that says
    what the other side answered (a socket error, an SMTP or HTTP code), else its last warning."""
    warnings = [line.split(" ", 1)[1] for line in lines if line.startswith(("WARNING ", "ERROR ")) and " " in line]
    details = [line.split(" ", 1)[1] for line in lines if line.startswith("DEBUG ") and _TELLING.search(line)]
    said = details[-1] if details else warnings[-1] if warnings else "no reason given"
    return f"the target did not take the message: {said}"
