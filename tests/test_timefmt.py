"""Spec: moments and durations as text, in one style (``monitor.core.timefmt``), and no other module
of the product formatting a time itself (read from the source, like ``test_layers.py``).

Pure: no store, no app, no swarm.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from monitor.core import timefmt

ROOT = Path(__file__).resolve().parent.parent
AT = 1764943387.25  # 2025-12-05 14:03:07.250 UTC


def test_a_moment_in_utc():
    assert timefmt.utc(AT) == "2025-12-05 14:03:07 UTC"
    assert timefmt.utc(AT, seconds=False) == "2025-12-05 14:03 UTC"
    assert timefmt.utc(AT, zone=False) == "2025-12-05 14:03:07"  # plotly's date axis
    assert timefmt.utc(None) == "—"
    assert (timefmt.date(AT), timefmt.clock(AT), timefmt.short(AT)) == ("2025-12-05", "14:03", "12-05 14:03")


def test_machines_read_rfc_3339():
    assert timefmt.iso(AT) == "2025-12-05T14:03:07Z"  # Atom's <updated>
    assert timefmt.iso(AT, milliseconds=True) == "2025-12-05T14:03:07.250Z"  # Alertmanager's startsAt
    assert timefmt.iso(0) == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("seconds, text", [
    (None, "—"), (float("nan"), "—"), (float("inf"), "—"), (-5, "0 s"), (0, "0 s"),
    (0.0005, "0.5 ms"), (0.004, "4 ms"), (0.12, "120 ms"),
    (1, "1 s"), (4.25, "4.2 s"), (42, "42 s"), (90, "90 s"), (119, "119 s"),  # a setting of 90 s stays 90 s
    (120, "2 min"), (150, "2.5 min"), (45 * 60, "45 min"), (90 * 60, "90 min"),
    (2 * 3600, "2 h"), (2.5 * 3600, "2.5 h"), (24 * 3600, "24 h"), (36 * 3600, "36 h"),
    (2 * 86400, "2 d"), (3.5 * 86400, "3.5 d"), (30 * 86400, "30 d"),
])
def test_a_duration_in_the_unit_of_which_there_are_at_least_two(seconds, text):
    assert timefmt.duration(seconds) == text


@pytest.mark.parametrize("delta, text", [
    (0, "0 s ago"), (0.4, "0 s ago"), (-3, "0 s ago"), (42, "42 s ago"), (119, "119 s ago"),
    (120, "2 min ago"), (300, "5 min ago"), (7199, "120 min ago"),
    (3 * 3600, "3 h ago"), (2.6 * 3600, "3 h ago"), (47 * 3600, "47 h ago"), (2 * 86400, "2 d ago"),
])
def test_ago_in_whole_units_of_the_same_choice(delta, text):
    assert timefmt.ago(1000.0, 1000.0 + delta) == text
    assert timefmt.ago(None, 1000.0) == "never"


# ---- no other module formats a time itself ------------------------------------------------------------

FORMATTERS = {"strftime", "gmtime", "isoformat"}  # (``fromisoformat`` parses: it is allowed)
DIRECTIVE = re.compile(r"%[aAbBdHIjmMpSyYzZ]")  # a strftime directive in an f-string's format spec


def display_calls(source: str, name: str) -> list[str]:
    """Where ``source`` formats a moment itself: calls of ``strftime``, ``time.gmtime`` or
    ``isoformat``, and f-strings with a strftime directive (``f"{moment:%H:%M}"``)."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in FORMATTERS:
                found.append(f"{name}:{node.lineno} {called}()")
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = "".join(part.value for part in ast.walk(node.format_spec)
                           if isinstance(part, ast.Constant) and isinstance(part.value, str))
            if DIRECTIVE.search(spec):
                found.append(f"{name}:{node.lineno} f-string {spec!r}")
    return found


def test_no_module_but_timefmt_formats_a_time():
    wrong = []
    for package in ("monitor", "chat"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path == ROOT / "monitor" / "core" / "timefmt.py":
                continue
            wrong += display_calls(path.read_text(), str(path.relative_to(ROOT)))
    assert not wrong, "format times with monitor.core.timefmt:\n" + "\n".join(wrong)


# a format handed to ``|utc`` or a strftime of a template's own (``'%d' % id`` is a number: fine)
TEMPLATE_FORMAT = re.compile(r"\|\s*utc\(\s*['\"]|strftime|%[YHMS]")


def test_no_template_passes_a_format_of_its_own():
    """The pages' filters are timefmt's (``|utc``, ``|utc(seconds=False)``, ``|date``, ``|clock``,
    ``|short``, ``|ago(now)``, ``|duration``): a strftime format in a template is a style of its own."""
    wrong = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "templates").rglob("*.html"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if TEMPLATE_FORMAT.search(line)]
    assert not wrong, wrong
    assert TEMPLATE_FORMAT.search("{{ at|utc('%m-%d %H:%M') }}") and not TEMPLATE_FORMAT.search("'End %d' % id")


def test_the_rule_reads_what_it_should():
    """The checks above can fail: each way of formatting a time by hand is found."""
    source = ("import time\nfrom datetime import datetime\n"
              "a = time.strftime('%H', time.gmtime(0))\n"
              "b = datetime.now().isoformat()\n"
              "c = f'{datetime.now():%Y-%m-%d}'\n"
              "d = datetime.fromisoformat('2026-01-01')\n"  # parsing: fine
              "e = f'{3.14159:.2f}'\n")  # a number: fine
    found = sorted(f.split(" ", 1)[1] for f in display_calls(source, "x.py"))
    assert found == ["f-string '%Y-%m-%d'", "gmtime()", "isoformat()", "strftime()"]
