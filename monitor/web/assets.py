"""The browser's third-party files: htmx, plotly.js (its cartesian bundle) and Swagger UI, vendored
from their npm packages into ``static/vendor/<package>/`` at the versions ``static/vendor/vendor.json``
locks (``scripts/vendor_assets.py`` fetches, checks and upgrades them), so the dashboard works with
no internet access. Flask's static route serves them; ``vendored`` names one in a template, with the
package's version in the address so that a browser never keeps an old copy past an upgrade."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from flask import url_for


@cache
def _lock(static: str) -> dict:
    return json.loads((Path(static) / "vendor" / "vendor.json").read_text())


def vendored(package: str, filename: str) -> str:
    """The address of one vendored file (a template global)."""
    from flask import current_app

    entry = _lock(current_app.static_folder)[package]
    if filename not in entry["files"].values():
        raise KeyError(f"{package} has no vendored {filename}")
    return url_for("static", filename=f"vendor/{package}/{filename}", v=entry["version"])
