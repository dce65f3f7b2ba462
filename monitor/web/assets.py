"""The browser's third-party files: htmx, plotly.js (its cartesian bundle) and Swagger UI, vendored
from their npm packages into ``static/vendor/<package>/`` at the versions ``static/vendor/vendor.json``
locks (``scripts/vendor_assets.py`` fetches, checks and upgrades them), so the dashboard works with
no internet access. Flask's static route serves them; ``vendored`` (a template global, made once per
app from the lock) names one, with the package's version in the address so that a browser never
keeps an old copy past an upgrade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from flask import url_for


def vendored_urls(static_dir: Path) -> Callable[[str, str], str]:
    """``vendored(package, filename)``: the address of one vendored file."""
    lock = json.loads((static_dir / "vendor" / "vendor.json").read_text())

    def vendored(package: str, filename: str) -> str:
        entry = lock[package]
        if filename not in entry["files"].values():
            raise KeyError(f"{package} has no vendored {filename}")
        return url_for("static", filename=f"vendor/{package}/{filename}", v=entry["version"])

    return vendored
