"""Jinja filters for numbers, times and peer-announced names (escaping stays Jinja's job)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Optional

from monitor.core import common, generation
from monitor.core.common import short_peer_id
from monitor.web.security import public_name_html


def utc(ts: Optional[float], fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime(fmt)


def ago(ts: Optional[float], now: Optional[float] = None) -> str:
    """``42 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago`` (``core.common.ago``; now by default)."""
    return common.ago(ts, now if isinstance(now, (int, float)) else time.time())  # (a template may lack ``now``)


def seconds(value: Optional[float]) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.0f} min"


def num(value: Optional[float], digits: int = 1, none: str = "—") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return none
    return f"{value:,.{digits}f}"


def precision(torch_dtype: Optional[str], quant_type: Optional[str]) -> str:
    dtype = (torch_dtype or "").replace("torch.", "").replace("float", "f") or "—"
    quant = (quant_type or "").replace("QuantType.", "").lower()
    return f"{dtype} ({quant})" if quant and quant != "none" else dtype


def register(app) -> None:
    from monitor.core.assessment import format_ranges
    from monitor.web.charts import figure_json

    app.jinja_env.filters.update(
        utc=utc, ago=ago, seconds=seconds, num=num, short_peer=short_peer_id, public_name=public_name_html,
        precision=precision, figure_json=figure_json, generation_summary=generation.summary,
    )
    app.jinja_env.globals.update(format_ranges=format_ranges)
