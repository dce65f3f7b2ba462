"""One duration syntax for every time setting: ``"90s"``, ``"5m"``, ``"2h"``, ``"30d"`` (also ``"ms"``),
or a plain number in the setting's own unit (seconds, or days for the ``*_days`` settings).

It sits at the top of the package, beside ``settings``, so that every settings module (the main
one, ``alert_settings``) parses durations with this one function.
"""

from __future__ import annotations

import re
from typing import Any

DAY = 86400.0
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DAY_SUFFIXES = ("_days",)
_SECOND_SUFFIXES = ("_period", "_seconds", "_timeout", "_lifetime", "_wait", "_backoff", "_resend")


def parse_duration(value: Any, unit: float = 1.0) -> Any:
    """``value`` in ``unit`` seconds (1: seconds, DAY: days): a number is already in that unit; a
    string is a number with an optional unit suffix (ms, s, m, h, d; none: the field's own unit).
    Anything else (None, a bool) goes through unchanged, for the field's own validation."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration: give a number, or one with ms, s, m, h or d "
                             f"(\"90s\", \"5m\", \"2h\", \"30d\")")
        number, suffix = float(match.group(1)), match.group(2)
        return number if suffix is None else number * UNITS[suffix] / unit
    return value


def unit_of(name: str) -> float | None:
    """The unit of a setting named ``name`` by its suffix (seconds, days), None: not a duration."""
    if name.endswith(_DAY_SUFFIXES):
        return DAY
    if name.endswith(_SECOND_SUFFIXES):
        return 1.0
    return None


def days(value: Any) -> Any:
    return parse_duration(value, DAY)
