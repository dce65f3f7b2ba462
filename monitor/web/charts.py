"""Plotly figures for the dashboard, built in Python from plain data (pure: no store, no Flask).

Each function returns a figure dict in plotly.js's own schema (``{"data": [...], "layout": {...}}``),
written as plain dicts: plotly.py's graph objects validate every property on construction, which
cost ~50 ms per sparkline and ~0.5 s per heatmap.  ``figure_json`` turns it into JSON that is safe inside a
``<script type="application/json">`` block, which ``static/charts.js`` hands to ``Plotly.react``.
Colours name states; the page's text colour and background come from CSS (light/dark) in the JS.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Iterable, Optional, Sequence


from monitor.core import timefmt

COLORS = {
    "online": "#2e9d57",
    "healthy": "#2e9d57",
    "joining": "#d49a16",
    "degraded": "#d49a16",
    "offline": "#8a8f98",
    "unreachable": "#d64545",
    "broken": "#d64545",
    "accent": "#3b7dd8",
}
STATE_LEVEL = {"OFFLINE": 0, "JOINING": 1, "ONLINE": 2}
MAX_COLUMNS = 288  # heatmap time columns: enough for 5-minute steps over a day


def axis_time(ts: float) -> str:
    """Unix seconds as the text plotly reads on a date axis: UTC, without a zone (the hover text
    adds " UTC")."""
    return timefmt.utc(ts, zone=False)


def time_range(times: Sequence[float], since: float, until: float) -> list[str]:
    """The x range of a time chart: the window, but starting near the first data point when the
    data is younger than the window (a new monitor's 24 h chart is not a dot at the right edge)."""
    start = since
    if times:
        first = min(times)
        if first > since:
            start = max(since, first - max(60.0, 0.03 * (until - first)))
    return [axis_time(start), axis_time(until)]


def _layout(height: int, **extra) -> dict:
    layout = dict(
        height=height,
        margin=dict(l=48, r=16, t=8, b=36),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        showlegend=False,
        hovermode="closest",
        font=dict(size=12),
    )
    layout.update(extra)
    return layout


def _figure(data: Sequence[dict], layout: dict) -> dict:
    return {"data": list(data), "layout": layout}


def figure_json(figure: dict) -> str:
    """JSON for a chart's ``data-figure`` attribute (plain text: the template escapes it as every
    attribute). An attribute, not a ``<script type="application/json">`` block: htmx drops every
    script element of what it swaps in (``allowScriptTags`` is off), which left refreshed charts
    empty."""
    return json.dumps(figure, separators=(",", ":"), allow_nan=False, default=str)


def plain(text: object) -> str:
    """Text for a plotly label: plotly renders a little HTML in labels, so peer-announced text
    loses its angle brackets and ampersands first."""
    return str(text).replace("&", "+").replace("<", "‹").replace(">", "›")


def _clean(values: Iterable[Optional[float]]) -> list[Optional[float]]:
    return [None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v for v in values]


# ---- overview --------------------------------------------------------------------------------


def sparkline(times: Sequence[float], values: Sequence[Optional[float]], *, state: str = "healthy",
              since: Optional[float] = None, until: Optional[float] = None) -> dict:
    """A small coverage-% line over the last day (no axes; hover shows time and value)."""
    trace = dict(
        type="scatter",
        x=[axis_time(t) for t in times], y=_clean(values), mode="lines" if len(times) > 2 else "lines+markers",
        line=dict(width=2, color=COLORS.get(state, COLORS["accent"])), marker=dict(size=4),
        fill="tozeroy", hovertemplate="%{x} UTC<br>%{y:.0f}% covered<extra></extra>",
    )
    xrange = time_range(times, since, until) if since is not None and until is not None else None
    layout = _layout(
        36, margin=dict(l=0, r=0, t=2, b=2),
        xaxis=dict(visible=False, range=xrange, fixedrange=True),
        yaxis=dict(visible=False, range=[0, 105], fixedrange=True),
    )
    return _figure([trace], layout)


# ---- model page ------------------------------------------------------------------------------


def redundancy_chart(blocks: Sequence[dict]) -> dict:
    """Per block: how many servers serve it online (bars) and their total throughput (line)."""
    index = [b["index"] for b in blocks]
    counts = [b["online"] for b in blocks]
    colors = [COLORS["broken"] if c == 0 else COLORS["degraded"] if c == 1 else COLORS["healthy"] for c in counts]
    bars = dict(
        type="bar",
        x=index, y=counts, marker=dict(color=colors), name="servers online",
        hovertemplate="block %{x}: %{y} servers online<extra></extra>",
    )
    line = dict(
        type="scatter",
        x=index, y=_clean(b.get("throughput") for b in blocks), yaxis="y2", mode="lines+markers",
        line=dict(color=COLORS["accent"], width=2, shape="hvh"), marker=dict(size=4), name="throughput",
        hovertemplate="block %{x}: %{y:.1f} tokens/s in total<extra></extra>",
    )
    layout = _layout(
        240, showlegend=True, legend=dict(orientation="h", y=1.12, x=0),
        margin=dict(l=48, r=56, t=28, b=40),
        xaxis=dict(title=dict(text="block"), dtick=max(1, len(index) // 20) if index else 1, fixedrange=True),
        # headroom above both, so the line does not sit on the bars' tops
        yaxis=dict(title=dict(text="servers online"), range=[0, max(counts, default=0) * 1.25 + 0.5], dtick=1,
                   fixedrange=True),
        yaxis2=dict(title=dict(text="tokens/s"), overlaying="y", side="right", showgrid=False, fixedrange=True,
                    range=[0, max((b.get("throughput") or 0 for b in blocks), default=0) * 1.1 or 1]),
        bargap=0.15,
    )
    return _figure([bars, line], layout)


def _downsample(times: Sequence[float], matrix: Sequence[Sequence[Optional[float]]], columns: int):
    """Keep at most ``columns`` time columns; each keeps its bucket's worst (lowest) value, so a
    short outage stays visible."""
    if len(times) <= columns:
        return list(times), [list(row) for row in matrix]
    step = math.ceil(len(times) / columns)
    new_times = [times[i] for i in range(0, len(times), step)]
    new_rows = []
    for row in matrix:
        cells = []
        for i in range(0, len(times), step):
            bucket = [v for v in row[i:i + step] if v is not None]
            cells.append(min(bucket) if bucket else None)
        new_rows.append(cells)
    return new_times, new_rows


def _cells(times: Sequence[float], rows: list[list], until: float) -> tuple[list[float], list[list]]:
    """Cell edges for a heatmap: each poll's column lasts until the next poll; a gap of more than
    three usual poll intervals (the poller was down) is left empty instead of stretched."""
    if not times:
        return [], rows
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    step = statistics.median(gaps) if gaps else 60.0
    edges = [times[0]]
    out: list[list] = [[] for _ in rows]
    for i, start in enumerate(times):
        end = times[i + 1] if i + 1 < len(times) else max(min(until, start + step), start + 1)
        if end - start > 3 * step:
            edges.append(start + step)
            for row, cells in zip(rows, out):
                cells.append(row[i])
            edges.append(end)
            for cells in out:
                cells.append(None)
        else:
            edges.append(end)
            for row, cells in zip(rows, out):
                cells.append(row[i])
    return edges, out


def coverage_heatmap(times: Sequence[float], matrix: Sequence[Sequence[Optional[float]]], *,
                     since: float, until: float, columns: int = MAX_COLUMNS) -> dict:
    """Blocks × time: how many servers served each block online (0 red, 1 amber, 2+ green)."""
    times, matrix = _downsample(times, matrix, columns)
    edges, z = _cells(times, [_clean(row) for row in matrix], until)
    heat = dict(
        type="heatmap",
        x=[axis_time(t) for t in edges], y=list(range(len(z))), z=z, zmin=0, zmax=3,
        colorscale=[[0, COLORS["broken"]], [0.25, COLORS["broken"]], [0.25, COLORS["degraded"]],
                    [0.5, COLORS["degraded"]], [0.5, "#7cc191"], [0.75, "#7cc191"],
                    [0.75, COLORS["healthy"]], [1, COLORS["healthy"]]],
        colorbar=dict(title=dict(text="servers"), tickvals=[0.4, 1.1, 1.9, 2.6], ticktext=["0", "1", "2", "3+"],
                      thickness=10, len=0.9),
        hovertemplate="block %{y} at %{x} UTC: %{z} servers online<extra></extra>",
        hoverongaps=False,
    )
    layout = _layout(
        max(160, min(480, 60 + 10 * len(z))), margin=dict(l=48, r=16, t=8, b=36),
        xaxis=dict(range=time_range(times, since, until), type="date", fixedrange=True),
        yaxis=dict(title=dict(text="block"), autorange="reversed", fixedrange=True),
    )
    return _figure([heat], layout)


# ---- peer page -------------------------------------------------------------------------------


def _peer_layout(traces: Sequence[dict], times: Sequence[float], since: float, until: float, *, yaxis: dict) -> dict:
    """The peer page's time charts: one height, a legend when there is more than one trace."""
    return _layout(
        170, showlegend=len(traces) > 1, legend=dict(orientation="h", y=1.2, x=0),
        xaxis=dict(range=time_range(times, since, until), type="date", fixedrange=True),
        yaxis=dict(yaxis, fixedrange=True),
    )


def _by_model(observations: Sequence) -> dict[str, list]:
    found: dict[str, list] = {}
    for o in sorted(observations, key=lambda o: o.at):
        found.setdefault(o.model, []).append(o)
    return dict(sorted(found.items()))


def run_ends(observations: Sequence, latest: Optional[float]) -> list[float]:
    """When each of one model's observations (oldest first; merged runs) stops holding: at the
    next one, and the last at ``latest`` (the latest observation's time: the last poll that saw
    or missed the peer), so a series runs to its latest observation instead of stopping at the
    peer's last change."""
    ends = [following.at for following in observations[1:]]
    if observations:
        last = observations[-1].at
        ends.append(max(last, latest) if latest is not None else last)
    return ends


def peer_state_timeline(observations: Sequence, *, since: float, until: float,
                        latest: Optional[float] = None) -> dict:
    """The peer's announced state per model over time (a step line: offline / joining / online),
    each model's line running to ``latest`` (``run_ends``)."""
    traces = []
    for model, obs in _by_model(observations).items():
        x = [axis_time(o.at) for o in obs]
        y = [STATE_LEVEL.get(o.state, 0) for o in obs]
        text = [o.state.lower() + ("" if o.seen else " (not announced)") for o in obs]
        end = run_ends(obs, latest)[-1]
        if end > obs[-1].at:  # the last state holds to the latest observation
            x.append(axis_time(end))
            y.append(y[-1])
            text.append(text[-1] + ", as of the latest poll")
        traces.append(dict(
            type="scatter",
            x=x, y=y, name=plain(model),
            mode="lines+markers", line=dict(shape="hv", width=2), marker=dict(size=4),
            text=text,
            hovertemplate="%{x} UTC: %{text}<extra>" + plain(model) + "</extra>",
        ))
    states = dict(tickvals=[0, 1, 2], ticktext=["offline", "joining", "online"], range=[-0.3, 2.3])
    times = [o.at for o in observations] + ([latest] if latest is not None and observations else [])
    return _figure(traces, _peer_layout(traces, times, since, until, yaxis=states))


def _held(observations: Sequence, value, latest: Optional[float]) -> tuple[list, list]:
    """(x, y) of a value announced while the peer was seen, each model's runs held until they end
    (``run_ends``), a gap (None) where the peer was not seen or announced no value."""
    x: list = []
    y: list = []
    for obs in _by_model(observations).values():
        if x:
            x.append(x[-1])
            y.append(None)
        for o, end in zip(obs, run_ends(obs, latest)):
            v = value(o) if o.seen else None
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                if y and y[-1] is not None:
                    x.append(axis_time(o.at))
                    y.append(None)
                continue
            x += [axis_time(o.at), axis_time(end)] if end > o.at else [axis_time(o.at)]
            y += [v, v] if end > o.at else [v]
    return x, y


def peer_throughput(observations: Sequence, *, since: float, until: float, latest: Optional[float] = None) -> dict:
    """Announced throughput (tokens/s) and measured inference RPS over time, each value held
    while it was announced and the last one to ``latest`` (``run_ends``)."""
    x, y = _held(observations, lambda o: o.throughput, latest)
    traces = [dict(
        type="scatter",
        x=x, y=y, name="announced throughput",
        mode="lines+markers", line=dict(color=COLORS["accent"], width=2), marker=dict(size=3),
        hovertemplate="%{x} UTC: %{y:.1f} tokens/s<extra></extra>",
    )]
    rx, ry = _held(observations, lambda o: o.inference_rps, latest)
    if any(v is not None for v in ry):
        traces.append(dict(
            type="scatter",
            x=rx, y=ry, name="inference rps",
            mode="lines", line=dict(color=COLORS["online"], width=1, dash="dot"),
            hovertemplate="%{x} UTC: %{y:.1f} inference rps<extra></extra>",
        ))
    seen = [o.at for o in observations if o.seen and o.throughput is not None]
    return _figure(traces, _peer_layout(traces, seen + ([latest] if latest is not None and seen else []), since,
                                        until, yaxis=dict(title=dict(text="tokens/s"), rangemode="tozero")))


def peer_reachability(checks: Sequence[tuple], *, since: float, until: float) -> dict:
    """Reachability check round-trip times (ms); failed checks as red crosses on the axis."""
    ok = [(at, p) for at, p in checks if p.ok and p.rtt is not None]
    failed = [(at, p) for at, p in checks if not p.ok]
    traces = [dict(
        type="scatter",
        x=[axis_time(at) for at, _ in ok], y=[p.rtt * 1000 for _, p in ok], name="reachable",
        mode="lines+markers", line=dict(color=COLORS["online"], width=1), marker=dict(size=4),
        hovertemplate="%{x} UTC: %{y:.1f} ms<extra></extra>",
    )]
    if failed:
        traces.append(dict(
            type="scatter",
            x=[axis_time(at) for at, _ in failed], y=[0] * len(failed), name="unreachable",
            mode="markers", marker=dict(symbol="x", size=9, color=COLORS["unreachable"]),
            text=[plain(("joining: " if p.joining else "") + (p.error or "failed")) for _, p in failed],
            hovertemplate="%{x} UTC: %{text}<extra></extra>",
        ))
    return _figure(traces, _peer_layout(traces, [at for at, _ in checks], since, until,
                                        yaxis=dict(title=dict(text="RTT, ms"), rangemode="tozero")))


def peer_chat_outcomes(outcomes: Sequence, *, since: float, until: float) -> dict:
    """Chat requests through this peer: seconds per token per block (ok) and failures."""
    ok = [o for o in outcomes if o.ok and o.seconds_per_token_per_block is not None]
    failed = [o for o in outcomes if not o.ok]
    traces = [dict(
        type="scatter",
        x=[axis_time(o.at) for o in ok], y=[o.seconds_per_token_per_block * 1000 for o in ok], name="succeeded",
        mode="markers", marker=dict(color=COLORS["online"], size=6),
        hovertemplate="%{x} UTC: %{y:.1f} ms per token per block<extra></extra>",
    )]
    if failed:
        traces.append(dict(
            type="scatter",
            x=[axis_time(o.at) for o in failed], y=[0] * len(failed), name="failed", mode="markers",
            marker=dict(symbol="x", size=9, color=COLORS["broken"]),
            text=[plain(o.error or "failed") for o in failed], hovertemplate="%{x} UTC: %{text}<extra></extra>",
        ))
    return _figure(traces, _peer_layout(traces, [o.at for o in outcomes], since, until,
                                        yaxis=dict(title=dict(text="ms/token/block"), rangemode="tozero")))


# ---- model page: generation checks ------------------------------------------------------------------


def generation_checks(checks: Sequence, *, since: float, until: float) -> dict:
    """The model's generation checks: tokens/s and time to first token of each that succeeded
    (two axes), and each failure as a red cross on the axis with its error on hover."""
    ok = [c for c in checks if c.ok]
    failed = [c for c in checks if not c.ok]
    traces = [
        dict(type="scatter", x=[axis_time(c.at) for c in ok], y=_clean(c.tokens_per_second for c in ok), name="tokens/s",
             mode="lines+markers", line=dict(color=COLORS["online"], width=2), marker=dict(size=4),
             hovertemplate="%{x} UTC: %{y:.1f} tokens/s<extra></extra>"),
        dict(type="scatter", x=[axis_time(c.at) for c in ok], y=_clean(c.time_to_first_token for c in ok),
             name="first token, s", yaxis="y2", mode="lines+markers",
             line=dict(color=COLORS["accent"], width=1, dash="dot"), marker=dict(size=3),
             hovertemplate="%{x} UTC: first token after %{y:.2f} s<extra></extra>"),
    ]
    if failed:
        traces.append(dict(
            type="scatter", x=[axis_time(c.at) for c in failed], y=[0] * len(failed), name="failed", mode="markers",
            marker=dict(symbol="x", size=9, color=COLORS["broken"]),
            text=[plain(c.error or "failed") for c in failed], hovertemplate="%{x} UTC: %{text}<extra></extra>",
        ))
    layout = _peer_layout(traces, [c.at for c in checks], since, until,
                          yaxis=dict(title=dict(text="tokens/s"), rangemode="tozero"))
    layout["yaxis2"] = dict(title=dict(text="first token, s"), overlaying="y", side="right", rangemode="tozero",
                            fixedrange=True, showgrid=False)
    return _figure(traces, layout)


# ---- model page: real requests per hour -----------------------------------------------------------


def request_hours(rows: Sequence[dict], *, since: float, until: float) -> dict:
    """A model's real requests per hour (``store.requests.hourly``): answered, failed and left
    requests as stacked bars, and the hour's median time to first token and decode tokens/s as
    lines on a second axis pair (seconds on the right, tokens/s hidden but on hover)."""
    x = [axis_time(r["hour"] + 1800) for r in rows]  # each bar at the middle of its hour
    bars = [("answered", "ok", COLORS["online"]), ("failed", "error", COLORS["broken"]),
            ("left by the client", "cancelled", COLORS["offline"])]
    traces = [dict(type="bar", x=x, y=[r[key] for r in rows], name=name, marker=dict(color=color), width=3_000_000,
                   hovertemplate=f"%{{x}} UTC: %{{y}} {name}<extra></extra>") for name, key, color in bars]
    median = lambda r, name: (r.get("quantiles") or {}).get(name, {}).get("p50")  # noqa: E731
    traces.append(dict(type="scatter", x=x, y=_clean(median(r, "time_to_first_token") for r in rows),
                       name="first token p50, s", yaxis="y2", mode="lines+markers",
                       line=dict(color=COLORS["accent"], width=2), marker=dict(size=4),
                       text=[f"{median(r, 'tokens_per_second'):.1f} tokens/s" if median(r, "tokens_per_second")
                             is not None else "" for r in rows],
                       hovertemplate="%{x} UTC: first token after %{y:.2f} s (median), %{text}<extra></extra>"))
    layout = _layout(200, barmode="stack", showlegend=True, legend=dict(orientation="h", y=-0.25),
                     xaxis=dict(type="date", range=time_range([r["hour"] for r in rows], since, until),
                                fixedrange=True),
                     yaxis=dict(title=dict(text="requests"), rangemode="tozero", fixedrange=True))
    layout["yaxis2"] = dict(title=dict(text="first token, s"), overlaying="y", side="right", rangemode="tozero",
                            fixedrange=True, showgrid=False)
    layout["margin"] = dict(l=48, r=48, t=8, b=60)
    return _figure(traces, layout)
