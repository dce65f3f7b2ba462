"""Rendering a page or, for htmx, the one part of it a request refreshes.

An htmx request (a part of a page refreshing itself) names the element it will swap in its
``HX-Target`` header; it gets only that element's partial, so the rest of the page — scroll
position, open rows — stays as the reader left it. A full load, or htmx restoring its history,
gets the whole page. Every page with live parts (overview, model, peer, alerts, search) renders
through here.
"""

from __future__ import annotations

from typing import Mapping, Optional

from flask import current_app, render_template


def htmx_target() -> Optional[str]:
    """The id of the element an htmx request will swap, or None for a full page load."""
    htmx = current_app.htmx  # flask-htmx, set up by create_app
    if not htmx or htmx.history_restore_request:
        return None
    return htmx.target


def render(page: str, partials: Mapping[str, str], **context) -> str:
    """``page``, or the partial ``partials`` names for the request's htmx target."""
    partial = partials.get(htmx_target() or "")
    return render_template(partial or page, **context)
