"""The settings the demo overrides, and why: its servers are ours, so it polls, checks and probes
them far more often than a monitor of someone else's swarm would. ``swarm-monitor demo`` prints
each one it changes at start (name, your value, the demo's), then runs with the demo's.

A light module (no petals): the CLI and the specs read it without starting a swarm.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from monitor.durations import unit_of

# The demo polls, checks reachability and scores at least every 10 s (a chaos control's stop or
# start is polled at once besides: ``DemoControls.on_change``).
DEMO_ROUND_PERIOD = 10.0
# The demo's servers are ours: they are measured often. A throttled one (the panel stops its
# compute 80 % of the time) is named slow after two slow probes (a server's measured speed is the
# low median of its newest three); throttled just after a probe, its first slow probe comes a period
# later, so the second must come within about half a period for it to be named slow within two
# (the confirmation, ``core.probes.worth_confirming``). The share bound lets it come d / share
# after the first, where d is the time its steps took: 4–5 s on all 30 blocks, throttled, on the
# 2-core benchmark machine (BENCHMARKS.md, probes) -> 4 s / 0.4 = 10 s = half of 20 s (a loaded
# machine's longer probes push the confirmation later, and with it the verdict). The bound still
# holds: each probe takes at most 40 % of a demo server's time until the next (a healthy one's
# take 2–6 %; at the default, 2 %, probes of a server that slow would come every 200 s).
DEMO_SPEED_PROBE_PERIOD = 20.0
DEMO_SPEED_PROBE_MAX_SHARE = 0.4
# The generation check (a few tokens end to end through the chat's engine) every 30 s instead of
# 300 s: the demo's servers are ours, and its overview should tell within half a minute whether a
# user can generate. Its cost: one short session (the prompt and 8 tokens) per 30 s.
DEMO_GENERATION_CHECK_PERIOD = 30.0
# A compute check (one token through a server's first block) every 5 s instead of 20 s: a killed,
# frozen or failing demo server is named within seconds (its cost stays far below 1 % of its time).
DEMO_COMPUTE_CHECK_PERIOD = 5.0


class DemoOverride(NamedTuple):
    name: str
    yours: Any
    demos: Any


# (setting, how the demo's value and yours combine, the demo's value): the demo only ever makes
# its rounds more frequent and its probes' share larger, never the other way
DEMO_SETTINGS: tuple[tuple[str, Callable[[Any, Any], Any], Any], ...] = (
    ("scrape_period", min, DEMO_ROUND_PERIOD),
    ("reachability_period", min, DEMO_ROUND_PERIOD),
    ("score_period", min, DEMO_ROUND_PERIOD),
    # the demo's servers are ours: measure them often (a throttled one named slow within two
    # periods, see above), up to 40 % of their time
    ("speed_probe_period", min, DEMO_SPEED_PROBE_PERIOD),
    ("speed_probe_max_share", max, DEMO_SPEED_PROBE_MAX_SHARE),
    ("generation_check_period", min, DEMO_GENERATION_CHECK_PERIOD),
    ("compute_check_period", min, DEMO_COMPUTE_CHECK_PERIOD),
)


def demo_overrides(settings) -> list[DemoOverride]:
    """The settings the demo changes: each one whose value it replaces, with yours and its own."""
    rows = []
    for name, combine, demo_value in DEMO_SETTINGS:
        yours = getattr(settings, name)
        demos = combine(yours, demo_value)
        if demos != yours:
            rows.append(DemoOverride(name, yours, demos))
    return rows


def describe_overrides(rows: list[DemoOverride]) -> list[str]:
    """The lines ``swarm-monitor demo`` prints at start (none when it overrides nothing)."""
    if not rows:
        return []
    width = max(len(row.name) for row in rows)
    return ["The demo overrides these settings (yours -> the demo's; its servers are ours, measured often):",
            *(f"  {row.name:<{width}}  {_shown(row.name, row.yours)} -> {_shown(row.name, row.demos)}" for row in rows)]


def _shown(name: str, value: Any) -> str:
    return f"{value:g} s" if unit_of(name) == 1.0 else f"{value:g}"
