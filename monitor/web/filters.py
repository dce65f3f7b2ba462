"""Jinja filters for numbers, times and peer-announced names (escaping stays Jinja's job). Times and
durations are ``monitor.core.timefmt``'s, the same words the notices and reports use: ``utc``
(``|utc(seconds=False)``), ``date``, ``clock``, ``short``, ``ago(now)``, ``duration``."""

from __future__ import annotations

import math
import time
from typing import Optional

from monitor.core import generation, timefmt
from monitor.core.common import short_peer_id
from monitor.web.security import public_name_html


def ago(at: Optional[float], now: Optional[float] = None) -> str:
    """``timefmt.ago``, from now when the template passes no ``now`` (a template may lack it)."""
    return timefmt.ago(at, now if isinstance(now, (int, float)) else time.time())


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
        utc=timefmt.utc, date=timefmt.date, clock=timefmt.clock, short=timefmt.short, ago=ago,
        duration=timefmt.duration, num=num, short_peer=short_peer_id, public_name=public_name_html,
        precision=precision, figure_json=figure_json, generation_summary=generation.summary,
    )
    app.jinja_env.globals.update(format_ranges=format_ranges)
