"""htmx (with its sse/ws extensions) and plotly.js, served from their installed Python packages,
so the dashboard works with no internet access."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from flask import Blueprint, send_from_directory

bp = Blueprint("assets", __name__)

HTMX_DIR = Path(str(files("js_lib_htmx") / "static" / "htmx"))  # django-js-lib-htmx: htmx 2
PLOTLY_DIR = Path(str(files("plotly") / "package_data"))
ASSET_MAX_AGE = 24 * 3600


@bp.get("/static/htmx/<path:filename>")
def htmx(filename: str):
    return send_from_directory(HTMX_DIR, filename, max_age=ASSET_MAX_AGE)


@bp.get("/static/plotly.min.js")
def plotly():
    return send_from_directory(PLOTLY_DIR, "plotly.min.js", max_age=ASSET_MAX_AGE)
