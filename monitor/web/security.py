"""What keeps peer-announced text inert: CSP, safe links, id checks (operator auth: ``auth.py``).

Everything a peer announces (public_name, version, adapters, dht_prefix, repository) is escaped by
Jinja's autoescape; the helpers here decide the few places where such text may become a link.
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import urlsplit

from flask import abort
from markupsafe import Markup, escape

# Scripts only from our own origin: no inline script, no eval. Styles: our stylesheet, plus the
# inline style attributes plotly.js sets on the SVG it draws (styles cannot run code).
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

# libp2p peer ids in base58: "Qm..." (sha256 multihash) or "12D3KooW..." (ed25519 identity).
_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{32,128}$")
# DHT prefixes as petals builds them (repository name with dots replaced): no spaces or slashes.
_DHT_PREFIX = re.compile(r"^[A-Za-z0-9_\-\.]{1,200}$")


def is_peer_id(value: str) -> bool:
    return bool(_PEER_ID.match(value or ""))


def is_dht_prefix(value: str) -> bool:
    return bool(_DHT_PREFIX.match(value or ""))


def not_peer_id(value: str) -> str:
    return f"{value[:80]!r} is not a peer id (base58, like 12D3KooW... or Qm...)"


def not_dht_prefix(value: str) -> str:
    return f"{value[:80]!r} is not a DHT prefix (letters, digits, '.', '_', '-')"


def require_peer_id(value: str) -> None:
    """400 unless ``value`` is a peer id (for views that take one in their URL)."""
    if not is_peer_id(value):
        abort(400, description=not_peer_id(value))


def require_dht_prefix(value: str) -> None:
    """400 unless ``value`` is a DHT prefix (for views that take one in their URL)."""
    if not is_dht_prefix(value):
        abort(400, description=not_dht_prefix(value))


def http_url(value: Optional[str]) -> Optional[str]:
    """The value if it is an absolute http(s) URL with a host, else None."""
    if not value or any(ch.isspace() or ord(ch) < 32 for ch in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme.lower() in ("http", "https") and parts.netloc:
        return value
    return None


def public_name_html(name: Optional[str], max_chars: int = 32) -> Markup:
    """A contributor's public name: escaped text, a link only for http(s) URLs (nofollow)."""
    if not name:
        return Markup("")
    shown = name
    url = http_url(name)
    if url:
        shown = re.sub(r"^https?://", "", name, flags=re.I).rstrip("/")
    if len(shown) > max_chars:
        shown = shown[: max_chars - 1] + "…"
    if url:
        return Markup('<a href="{}" rel="nofollow noopener noreferrer" target="_blank">{}</a>').format(url, shown)
    return escape(shown)
