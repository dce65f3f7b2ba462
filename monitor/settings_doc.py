"""README's configuration reference, generated from the settings object: a table per section
(setting, default, environment variable, meaning), from each field's ``section`` and ``description``
(monitor/settings.py) and, for ``[alerts]``, AlertSettings' fields.

``scripts/settings_reference.py`` writes it into README.md between the markers; a spec
(tests/test_settings_sections.py) fails when the README's block differs from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from monitor.alert_settings import AlertSettings
from monitor.durations import DAY, unit_of
from monitor.demo_settings import DEMO_SETTINGS
from monitor.settings import ENV_PREFIX, SECTIONS, ModelConfig, Settings, fields_in

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"

_TITLES = {
    "swarm": "the swarm to watch",
    "models": "the models to watch, one `[[models]]` table each (`models` in Python)",
    "poller": "reading the swarm, scoring, diagnosis thresholds, high availability",
    "probes": "compute checks, speed and correctness probes, generation checks",
    "store": "where history is kept, and how long",
    "web": "the dashboard and the APIs",
    "logs": "what every process logs, and how",
    "security": "tokens, hosts, origins, proxies, rate limits",
    "chat": "routing, chat capacity (slots, queue, sessions) and limits",
    "alerts": "`alerts` in Python: rules and webhooks (`[[alerts.rules]]`, `[[alerts.webhooks]]`, `[[alerts.inhibit_rules]]`: see Alerts)",
}


def _number(value: float) -> str:
    return f"{value:,.10g}".replace(",", " ") if abs(value) >= 10_000 else f"{value:g}"


def shown_default(name: str, field: FieldInfo) -> str:
    """The default as the reference shows it; the demo's own value beside it if it overrides it."""
    shown = _default(name, field)
    demo = next((value for setting, _, value in DEMO_SETTINGS if setting == name), None)
    return shown if demo is None else f"{shown} (demo: {_value(name, demo)})"


def _value(name: str, value: float) -> str:
    unit = unit_of(name)
    if unit == DAY:
        return f"{_number(value)} d"
    if unit is not None:
        return f"{_number(value)} s"
    return _number(value)


def _default(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    if field.is_required():
        return "(required)"
    value: Any = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(below)"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (int, float)):
        return _value(name, value)
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _row(name: str, field: FieldInfo, env: str) -> str:
    description = (field.description or "").replace("|", "\\|").replace("\n", " ")
    return f"| `{name}` | {shown_default(name, field)} | {env} | {description} |"


def render() -> str:
    """The reference, in markdown, without the markers."""
    lines = ["Time settings (`*_period`, `*_seconds`, `*_timeout`, `*_days`, ...) take `\"90s\"`, `\"5m\"`, `\"2h\"`, "
             "`\"30d\"`, or a plain number in their own unit (seconds; days for `*_days`). In the environment, "
             "lists are comma-separated and the tables `models` and `alerts` are JSON.", ""]
    for section in SECTIONS:
        header = f"[[{section}]]" if section == "models" else f"[{section}]"
        lines += [f"**`{header}`** — {_TITLES[section]}", ""]
        lines += ["| setting | default | environment | meaning |", "|---|---|---|---|"]
        if section == "models":
            for name, field in ModelConfig.model_fields.items():
                lines.append(_row(name, field, f"in `{ENV_PREFIX}MODELS`"))
        elif section == "alerts":
            for name, field in AlertSettings.model_fields.items():
                lines.append(_row(name, field, f"in `{ENV_PREFIX}ALERTS`"))
        else:
            for name in fields_in(section):
                lines.append(_row(name, Settings.model_fields[name], f"`{ENV_PREFIX}{name.upper()}`"))
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def block(text: str) -> str:
    """The text between the markers of ``text`` (README.md's); ValueError: no markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n") + "\n"


def with_reference(text: str) -> str:
    """``text`` with the generated reference between its markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + render() + text[end:]
