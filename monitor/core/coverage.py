"""Per-model diagnosis from one snapshot: is every block served, how well, and where to add a server.

Pure: plain rows in, plain answers out. Where petals decides the same question (the best route and
its speed; the range a new server should take) ``diagnose`` asks a ``Routing`` it is given:
``monitor.swarm.routing.PETALS_ROUTING`` runs petals' own code on the same rows (the poller, the
specs), so core imports no petals.

What counts as *serving* a block: an ONLINE server whose latest reachability check is ok, JOINING
(still loading), or missing (not checked yet). JOINING and OFFLINE servers do not serve; a server
whose reachability check failed is unreachable and does not serve either, nor does one whose
outputs the monitor found wrong (``wrong``: peer -> why, from the correctness probes,
``monitor.core.probes``). Servers compared with one another (no local weights) that disagree
with nobody outvoting either
(``disagreeing``) still serve, but each disagreement is a reason (degraded): some route computes wrong.

Speeds: where the server probes measured a server (``measured``: peer -> seconds per token per
block), the route search prices its blocks at what was measured instead of what it announces, and
the estimate says whether it rests on measurements, announcements or both. When every hop of the
best route was measured, the estimate is what a client waits per token on it: per hop, the measured
seconds per block times its blocks plus the reachability check's round trip to that server (petals' graph adds a
fixed 18 ms per hop for serialization, which on small hidden states is far above what it costs). A server measured
``SLOW_FACTOR`` times slower than it announces (or petals assumes, 1/300 s, when it announces
nothing) or than the median of the model's other measured servers is named (it makes the model
degraded: petals' default routing still trusts its announcement), and so are blocks whose fastest
measured server is ``SLOW_FACTOR`` times slower than the model's median block. Either verdict rests
on a confirmed measurement (``confirmed``: ``SLOW_CONFIRMATIONS`` probes or more), so a server's
first probe alone, noisy or not, makes no model degraded.

State: **broken** when some block has no serving server; else **degraded** when some block has a
single serving server, the best route is slower than ``min_tokens_per_s``, a server is measured
slow or returns wrong or disagreeing outputs, or some block's serving servers together have fewer
than ``min_cache_tokens`` cache tokens left (servers that do not announce their cache are assumed
to have room); else **healthy**.

Bottlenecks: served blocks whose total throughput (the sum over serving servers, as petals'
block selection sums it) is below ``BOTTLENECK_FRACTION`` of the median over served blocks —
the place where the swarm is thinnest relative to itself, even when nothing is missing.

Reasons are short sentences for people: a sentence names at most ``MAX_IN_REASON`` servers (public
name or short id) and counts the rest by cause ("blocks 0:80 have no serving server: 3 ONLINE but
failing, 119 ONLINE but unreachable — see the servers table"), and at most ``MAX_NAMED`` servers of
each kind (failing, wrong, disagreeing, slow) get a sentence, the rest counted, so a swarm of
hostile or broken servers makes a diagnosis a few lines long.

Ranges are ``start:end`` with ``end`` exclusive, as petals' ``--block_indices``. The result types
live in ``monitor.core.assessment`` (no petals there), so the web can show a stored diagnosis.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import AbstractSet, Iterable, Mapping, Optional, Protocol, Sequence

from monitor.core.assessment import (  # noqa: F401  (the result types, re-exported)
    BROKEN,
    CAUSE_FAILING,
    CAUSE_JOINING,
    CAUSE_OFFLINE,
    CAUSE_PHRASE,
    CAUSE_UNREACHABLE,
    CAUSE_WRONG,
    CAUSES,
    DEGRADED,
    HEALTHY,
    REASON_ERROR_CHARS,
    BlockCoverage,
    Assessment,
    Range,
    Recommendation,
    RouteHop,
    format_ranges,
    ranges,
)
from monitor.core.common import short_peer_id
from monitor.core.generation import GenerationCheck
from monitor.core.probes import SLOW_FACTOR, slowness
from monitor.core.snapshot import (JOINING, OFFLINE, ONLINE, ModelInfo, ReachabilityResult, ServerRow, session_room,
                                   unreachable)


BOTTLENECK_FRACTION = 0.5
MAX_NAMED = 5  # servers named per kind of reason (failing, wrong, disagreeing, slow); the rest counted
MAX_IN_REASON = 3  # servers one sentence names; beyond that they are counted by cause
GENERATION_ERROR_CHARS = 240  # a failed generation check's error, as quoted in a reason


def _blocks_phrase(spans: Sequence[Range]) -> str:
    plural = len(spans) > 1 or any(end - start > 1 for start, end in spans)
    return f"{'blocks' if plural else 'block'} {format_ranges(spans)}"


def peer_label(row: ServerRow) -> str:
    return row.public_name or short_peer_id(row.peer_id)


# ---- rows -> who serves what -----------------------------------------------------------------


def _distinct(model: ModelInfo, rows: Iterable[ServerRow]) -> list[ServerRow]:
    """This model's rows, one per peer (its best state, as petals' compute_spans keeps), clipped."""
    rank = {OFFLINE: 0, JOINING: 1, ONLINE: 2}
    best: dict[str, ServerRow] = {}
    for row in rows:
        if row.model != model.dht_prefix:
            continue
        start, end = max(row.start, 0), min(row.end, model.num_blocks)
        if start >= end:
            continue
        if (start, end) != (row.start, row.end):
            row = replace(row, start=start, end=end)
        kept = best.get(row.peer_id)
        if kept is None or rank.get(row.state, -1) > rank.get(kept.state, -1):
            best[row.peer_id] = row
    return sorted(best.values(), key=lambda r: r.peer_id)


def _cause(row: ServerRow, reachability: Mapping[str, ReachabilityResult], wrong: Mapping[str, str],
           failing: Mapping[str, str]) -> Optional[str]:
    if row.state != ONLINE:
        return CAUSE_JOINING if row.state == JOINING else CAUSE_OFFLINE
    if unreachable(reachability.get(row.peer_id)):
        return CAUSE_UNREACHABLE
    if row.peer_id in failing:
        return CAUSE_FAILING
    if row.peer_id in wrong:
        return CAUSE_WRONG
    return None


def _why_not_serving(row: ServerRow, reachability: Mapping[str, ReachabilityResult],
                     wrong: Mapping[str, str] = {}, failing: Mapping[str, str] = {}) -> Optional[str]:
    cause = _cause(row, reachability, wrong, failing)
    if cause is None:
        return None
    if cause == CAUSE_JOINING:
        return "JOINING (still loading)"
    if cause == CAUSE_UNREACHABLE:
        error = reachability[row.peer_id].error
        return "ONLINE but unreachable" + (f" (reachability check failed: {error})" if error else " (reachability check failed)")
    if cause == CAUSE_FAILING:
        return f"ONLINE but failing: {failing[row.peer_id]}"
    if cause == CAUSE_WRONG:
        return f"ONLINE but {wrong[row.peer_id]}"
    return row.state


def _serving(rows: Sequence[ServerRow], reachability: Mapping[str, ReachabilityResult],
             wrong: Mapping[str, str] = {}, failing: Mapping[str, str] = {}) -> list[ServerRow]:
    return [row for row in rows if _why_not_serving(row, reachability, wrong, failing) is None]


def block_redundancy(
    num_blocks: int, rows: Sequence[ServerRow], reachability: Mapping[str, ReachabilityResult] = {}
) -> list[tuple[int, float]]:
    """Per block: (serving servers, their total throughput). Rows must be of one model."""
    counts = [0] * num_blocks
    totals = [0.0] * num_blocks
    counted: set[tuple[str, int]] = set()  # a peer counts once per block, even if announced twice
    for row in rows:
        if _why_not_serving(row, reachability) is not None:
            continue
        for block in range(max(row.start, 0), min(row.end, num_blocks)):
            if (row.peer_id, block) not in counted:
                counted.add((row.peer_id, block))
                counts[block] += 1
                totals[block] += row.throughput or 0.0
    return list(zip(counts, totals))


def block_coverage(
    model: ModelInfo, rows: Sequence[ServerRow], reachability: Mapping[str, ReachabilityResult] = {},
    wrong: Mapping[str, str] = {}, failing: Mapping[str, str] = {},
) -> tuple[BlockCoverage, ...]:
    """Per block: the peers serving it, their throughput and cache: ``diagnose``'s ``blocks``
    without the route search (for a caller that needs them every poll, not the whole diagnosis)."""
    return tuple(_block_coverage(model.num_blocks, _serving(_distinct(model, rows), reachability, wrong, failing)))


def _block_coverage(num_blocks: int, serving: Sequence[ServerRow]) -> list[BlockCoverage]:
    blocks = []
    for index in range(num_blocks):
        here = [row for row in serving if row.start <= index < row.end]
        throughputs = [row.throughput or 0.0 for row in here]
        caches = [row.cache_tokens_left for row in here if row.cache_tokens_left is not None]
        rooms = [room for row in here if (room := session_room(row.cache_tokens_left, row.end - row.start)) is not None]
        blocks.append(
            BlockCoverage(
                index=index,
                peers=tuple(row.peer_id for row in here),
                online=len(here),
                total_throughput=float(sum(throughputs)),
                min_throughput=float(min(throughputs)) if throughputs else None,
                cache_tokens_left=sum(caches) if caches else None,
                session_room=sum(rooms) if rooms else None,
            )
        )
    return blocks


class Routing(Protocol):
    """What the diagnosis asks of petals' routing (``monitor.swarm.routing.PetalsRouting``)."""

    def fastest_path(self, num_blocks: int, rows: Sequence[ServerRow], client_rtts: Mapping[str, float],
                     cache_tokens_needed: Optional[int]) -> tuple[list[RouteHop], float]:
        """The min-latency route through ``rows`` (ONLINE, one per peer, every block served) and its
        seconds per token."""

    def choose_blocks(self, size: int, num_blocks: int, rows: Sequence[ServerRow]) -> tuple[int, int]:
        """The ``(start, end)`` a new server of ``size`` blocks would pick from these rows."""


def best_route(
    model_info: ModelInfo,
    rows: Sequence[ServerRow],
    *,
    routing: Routing,
    client_rtts: Optional[Mapping[str, float]] = None,
    cache_tokens_needed: Optional[int] = None,
    measured: Mapping[str, float] = {},
) -> tuple[list[RouteHop], float]:
    """The route petals' min-latency routing would take through ONLINE rows, and its seconds per token.

    ``client_rtts``: peer id -> RTT seconds from the client (unknown peers cost petals' default).
    ``measured``: peer id -> measured seconds per token per block, used instead of what the peer
    announces. Returns ``([], inf)`` when some block has no ONLINE server. Callers exclude
    unreachable rows.
    """
    num_blocks = model_info.num_blocks
    online = [_as_measured(row, measured) for row in _distinct(model_info, rows) if row.state == ONLINE]
    if any(count == 0 for count, _ in block_redundancy(num_blocks, online)):
        return [], math.inf
    return routing.fastest_path(num_blocks, online, dict(client_rtts or {}), cache_tokens_needed)


@dataclass(frozen=True)
class RouteSpeed:
    """The best route through some servers and what a client waits per token on it."""

    route: list[RouteHop]  # [] when some block has no ONLINE server
    seconds_per_token: float  # math.inf without a route
    source: Optional[str]  # what it rests on: measured | partly measured | announced (None: no route)


def route_speed(model_info: ModelInfo, rows: Sequence[ServerRow], *, routing: Routing,
                client_rtts: Optional[Mapping[str, float]] = None, cache_tokens_needed: Optional[int] = None,
                measured: Mapping[str, float] = {}) -> RouteSpeed:
    """The one route estimator (the assessment's speed, and the chat's price of a route a request's
    choices allow): the route petals' min-latency routing would take (``best_route``) and what a
    client waits per token on it — when every hop's speed was measured, each hop's measured seconds
    per token per block times its blocks plus the client's RTT to it; else petals' own cost of the
    route (announced speeds where not measured)."""
    rtts = dict(client_rtts or {})
    route, seconds = best_route(model_info, rows, routing=routing, client_rtts=rtts,
                                cache_tokens_needed=cache_tokens_needed, measured=measured)
    source = _speed_source(route, measured) if route else None
    if source == "measured":
        seconds = sum(measured[peer] * (end - start) + rtts.get(peer, 0.0) for peer, start, end in route)
    return RouteSpeed(route=route, seconds_per_token=seconds, source=source)


def _as_measured(row: ServerRow, measured: Mapping[str, float]) -> ServerRow:
    """The row with the speed we measured in place of the one it announces (petals' graph prices a
    block at ``1 / inference_rps``)."""
    seconds = measured.get(row.peer_id)
    return replace(row, inference_rps=1.0 / seconds) if seconds and seconds > 0 else row


def _speed_source(route: Sequence[RouteHop], measured: Mapping[str, float]) -> str:
    hops = {peer for peer, _, _ in route}
    if hops and hops <= set(measured):
        return "measured"
    return "partly measured" if hops & set(measured) else "announced"


def _named(sentences: list[str], what: str) -> list[str]:
    """At most ``MAX_NAMED`` sentences of one kind, then how many more: a swarm of hostile or
    broken servers makes a diagnosis a few lines long, not a thousand."""
    if len(sentences) <= MAX_NAMED:
        return sentences
    return sentences[:MAX_NAMED] + [f"and {len(sentences) - MAX_NAMED} more {what}"]


def _slow_peers(serving: Sequence[ServerRow], measured: Mapping[str, float], confirmed: AbstractSet[str],
                labels: Mapping[str, str]) -> list[str]:
    """Sentences for servers measured SLOW_FACTOR times slower than they announce, or than the
    other measured servers of the model, on a confirmed measurement (``confirmed``)."""
    sentences = []
    for row in serving:
        others = [seconds for peer, seconds in measured.items() if peer != row.peer_id]
        found = slowness(measured.get(row.peer_id), row.inference_rps, others, confirmed=row.peer_id in confirmed,
                         blocks=row.end - row.start)
        if found is not None and found.slow:
            sentences.append(f"{labels[row.peer_id]} ({row.start}:{row.end}) is slow: {found.describe()} "
                             f"— petals' default routing still trusts the announcement")
    return sentences


def _slow_blocks(blocks: Sequence[BlockCoverage], measured: Mapping[str, float],
                 confirmed: AbstractSet[str]) -> list[Range]:
    """Served blocks whose fastest measured server is SLOW_FACTOR times slower than the median block,
    that server's measurement confirmed (``confirmed``)."""
    fastest = {b.index: min((measured[p], p) for p in b.peers if p in measured) for b in blocks
               if any(p in measured for p in b.peers)}
    if len(fastest) < 2:
        return []
    median = statistics.median(seconds for seconds, _ in fastest.values())
    return ranges(index for index, (seconds, peer) in fastest.items()
                  if seconds >= SLOW_FACTOR * median and peer in confirmed)


# ---- the diagnosis ---------------------------------------------------------------------------


def _recommend(
    model: ModelInfo, rows: Sequence[ServerRow], serving: Sequence[ServerRow], recommend_blocks: Optional[int],
    routing: Routing,
) -> Recommendation:
    """Where a new server of K blocks adds most: petals' choose_best_blocks on the rows.

    Unreachable servers are left out (they do not serve, whatever the DHT says); JOINING ones are
    kept, as petals keeps them (they will serve soon).
    """
    num_blocks = model.num_blocks
    if recommend_blocks is None:
        lengths = [row.length for row in serving]
        recommend_blocks = statistics.median_low(lengths) if lengths else num_blocks
    size = min(max(int(recommend_blocks), 1), num_blocks)
    start, end = routing.choose_blocks(size, num_blocks, rows)
    totals = [total for _, total in block_redundancy(num_blocks, serving)]
    weakest = min(totals[start:end])
    return Recommendation(
        start=start,
        end=end,
        num_blocks=size,
        argument=f"--block_indices {start}:{end}",
        reason=(
            f"a new {size}-block server helps most at {start}:{end}, where the weakest block has total "
            f"throughput {weakest:g} (petals' own block selection on this snapshot)"
        ),
    )


def _bottlenecks(blocks: Sequence[BlockCoverage]) -> list[int]:
    served = [block.total_throughput for block in blocks if block.online]
    if not served:
        return []
    threshold = BOTTLENECK_FRACTION * statistics.median(served)
    return [block.index for block in blocks if block.online and block.total_throughput < threshold]


def _route_phrase(route: Sequence[RouteHop], labels: Mapping[str, str]) -> str:
    return " → ".join(f"{start}:{end} via {labels[peer]}" for peer, start, end in route)


@dataclass(frozen=True)
class _Served:
    """Who serves what: the model's rows (one per peer), why each non-serving one does not, and
    the per-block coverage of those that do."""

    rows: list[ServerRow]
    labels: dict[str, str]
    excluded: dict[str, str]  # peer -> why it does not serve (``_why_not_serving``)
    causes: dict[str, str]  # peer -> its cause (``CAUSES``)
    serving: list[ServerRow]
    blocks: list[BlockCoverage]


@dataclass(frozen=True)
class _Speed:
    route: list[RouteHop]
    tokens_per_s: Optional[float]
    source: Optional[str]  # what the estimate rests on: measured | partly measured | announced
    estimate: str  # e.g. "7.19 tokens/s, measured"


def _who_serves(model: ModelInfo, rows: Sequence[ServerRow], reachability: Mapping[str, ReachabilityResult],
                wrong: Mapping[str, str], failing: Mapping[str, str]) -> _Served:
    rows = _distinct(model, rows)
    excluded, causes = {}, {}
    for row in rows:
        cause = _cause(row, reachability, wrong, failing)
        if cause is not None:
            causes[row.peer_id] = cause
            excluded[row.peer_id] = _why_not_serving(row, reachability, wrong, failing) or cause
    serving = [row for row in rows if row.peer_id not in excluded]
    return _Served(rows=rows, labels={row.peer_id: peer_label(row) for row in rows}, excluded=excluded,
                   causes=causes, serving=serving, blocks=_block_coverage(model.num_blocks, serving))


def _speed(model: ModelInfo, served: _Served, reachability: Mapping[str, ReachabilityResult],
           measured: Mapping[str, float], routing: Routing) -> _Speed:
    """The best route through the serving servers and what a client waits per token on it."""
    client_rtts = {peer: p.rtt for peer, p in reachability.items() if p.ok and p.rtt is not None}
    found = route_speed(model, served.serving, routing=routing, client_rtts=client_rtts, measured=measured)
    route, seconds, source = found.route, found.seconds_per_token, found.source
    tokens_per_s = 1.0 / seconds if seconds > 0 else math.inf
    estimate = f"{tokens_per_s:.2f} tokens/s" + {
        "measured": ", measured", "partly measured": ", partly measured (the rest as announced)",
        "announced": ", as announced (not measured yet)"}.get(source or "", "")
    return _Speed(route=route, tokens_per_s=tokens_per_s, source=source, estimate=estimate)


def _cut(text: str, limit: int = REASON_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _some(labels: Sequence[str]) -> str:
    """At most ``MAX_IN_REASON`` names, then how many more."""
    shown = ", ".join(labels[:MAX_IN_REASON])
    return shown + (f" and {len(labels) - MAX_IN_REASON} more" if len(labels) > MAX_IN_REASON else "")


def _missing_reason(start: int, end: int, served: _Served, failing: Mapping[str, str]) -> str:
    """One short sentence for blocks nobody serves: who is there and why they do not serve — named
    when they are few, counted by cause when they are many (the servers table lists them all)."""
    phrase = _blocks_phrase([(start, end)])
    there = [row for row in served.rows if row.peer_id in served.excluded and row.start < end and start < row.end]
    if there and all(served.causes[row.peer_id] == CAUSE_FAILING for row in there):
        errors = sorted({failing[row.peer_id] for row in there})
        others = f" (and {len(errors) - 1} other errors)" if len(errors) > 1 else ""
        return (f"every server of {phrase} fails: {_cut(errors[0])}{others} "
                f"({_some([served.labels[row.peer_id] for row in there])}) — clients cannot run this model")
    sentence = f"{phrase} {'have' if end - start > 1 else 'has'} no serving server"
    if there and len(there) <= MAX_IN_REASON:
        sentence += " (" + "; ".join(f"{served.labels[r.peer_id]} is {_cut(served.excluded[r.peer_id])}"
                                     for r in there) + ")"
    elif there:
        counts = {cause: sum(served.causes[r.peer_id] == cause for r in there) for cause in CAUSES}
        sentence += ": " + ", ".join(f"{n} {CAUSE_PHRASE[cause]}" for cause, n in counts.items() if n)
        sentence += " — see the servers table"
    return sentence + " — clients cannot run this model"


def _degraded_reasons(served: _Served, speed: _Speed, *, measured: Mapping[str, float],
                      confirmed: AbstractSet[str], wrong: Mapping[str, str],
                      failing: Mapping[str, str], disagreeing: Mapping[str, str], single: Sequence[Range],
                      low_cache: Sequence[Range], min_tokens_per_s: float, min_cache_tokens: int) -> list[str]:
    """Every block is served: what still makes the model worse than healthy (empty: healthy)."""
    labels, blocks, excluded = served.labels, served.blocks, served.excluded
    spans = {row.peer_id: f"{row.start}:{row.end}" for row in served.rows}
    reasons = [f"{_blocks_phrase([(start, end)])} {'are' if end - start > 1 else 'is'} served only by "
               f"{labels[peer]} — if it leaves, the model breaks"
               for start, end, peer in _runs_by_sole_peer(blocks, single)]
    if speed.tokens_per_s is not None and speed.tokens_per_s < min_tokens_per_s:
        reasons.append(f"the best route runs at an estimated {speed.estimate}, below {min_tokens_per_s:g} "
                       f"tokens/s ({_route_phrase(speed.route, labels)})")
    reasons += _named([f"{labels[peer]} ({spans[peer]}) is ONLINE but failing: {_cut(error)} — not counted as "
                       "serving; the chat routes around it"
                       for peer, error in sorted(failing.items()) if served.causes.get(peer) == CAUSE_FAILING],
                      "failing servers")
    reasons += _named([f"{labels[peer]} {why} — not counted as serving; the chat routes around it"
                       for peer, why in sorted(wrong.items()) if served.causes.get(peer) == CAUSE_WRONG],
                      "servers with wrong outputs")
    reasons += _named([f"{labels[peer]} {why} — one of them computes wrong; without the model's weights the "
                       "monitor cannot tell which, so both still count as serving"
                       for peer, why in sorted(disagreeing.items()) if peer in labels and peer not in excluded],
                      "servers that disagree with others")
    reasons += _named(_slow_peers(served.serving, measured, confirmed, labels), "slow servers")
    slow_blocks = _slow_blocks(blocks, measured, confirmed)
    if slow_blocks:
        reasons.append(f"slow {_blocks_phrase(slow_blocks)}: even the fastest measured server there is at least "
                       f"{SLOW_FACTOR:g}× slower than the model's median block")
    for start, end in low_cache:
        least = min(blocks[i].cache_tokens_left or 0 for i in range(start, end))
        reasons.append(
            f"{_blocks_phrase([(start, end)])} {'have' if end - start > 1 else 'has'} as few as {least} cache "
            f"tokens left across its servers, below {min_cache_tokens} — new chat sessions may be refused"
        )
    return reasons


def diagnose(
    model: ModelInfo,
    rows: Sequence[ServerRow],
    reachability: Mapping[str, ReachabilityResult] = {},
    *,
    routing: Routing,
    min_tokens_per_s: float = 1.0,
    min_cache_tokens: int = 1024,
    recommend_blocks: Optional[int] = None,
    measured: Mapping[str, float] = {},
    confirmed: Optional[AbstractSet[str]] = None,
    wrong: Mapping[str, str] = {},
    disagreeing: Mapping[str, str] = {},
    failing: Mapping[str, str] = {},
    generation: Optional[GenerationCheck] = None,
) -> Assessment:
    """The model's state with its reasons, from a snapshot's rows and the latest reachability check
    per peer.

    Rows of other models are ignored, so a whole ``Snapshot.servers`` may be passed. ``measured``:
    peer -> seconds per token per block the server probes measured (preferred to announcements);
    ``confirmed``: the peers whose measurement rests on enough probes to call them slow
    (``probes.confirmed_peers``; None: every measured peer); ``wrong``: peer -> why its outputs
    are wrong; ``failing``: peer -> the error its own handler answered every recent probe with
    (neither counts as serving); ``disagreeing``: peer -> its
    disagreement with other servers of the same blocks that nobody outvotes (checked without the
    model's weights): a reason, each of them still serving. ``generation``: the model's newest
    generation check, if it is current: a failed one makes the model broken with its error,
    whatever its blocks look like (what a user gets is the ground truth).
    """
    if model.num_blocks < 1:
        raise ValueError(f"model {model.dht_prefix!r} has num_blocks={model.num_blocks}; it needs at least 1 block")
    served = _who_serves(model, rows, reachability, wrong, failing)
    blocks = served.blocks
    missing = ranges(b.index for b in blocks if b.online == 0)
    single = ranges(b.index for b in blocks if b.online == 1)
    low_cache = ranges(b.index for b in blocks
                       if b.online and b.cache_tokens_left is not None and b.cache_tokens_left < min_cache_tokens)
    speed = _Speed([], None, None, "") if missing else _speed(model, served, reachability, measured, routing)

    if missing:
        state, reasons = BROKEN, [_missing_reason(start, end, served, failing) for start, end in missing]
    else:
        reasons = _degraded_reasons(served, speed, measured=measured,
                                    confirmed=set(measured) if confirmed is None else confirmed,
                                    wrong=wrong, failing=failing,
                                    disagreeing=disagreeing, single=single, low_cache=low_cache,
                                    min_tokens_per_s=min_tokens_per_s, min_cache_tokens=min_cache_tokens)
        state = DEGRADED if reasons else HEALTHY
        if state == HEALTHY and (generation is None or generation.ok):
            reasons.append(f"every block is served by at least {min(b.online for b in blocks)} online servers; "
                           f"best route ≈ {speed.estimate} ({_route_phrase(speed.route, served.labels)})")
    if generation is not None and not generation.ok:
        state = BROKEN
        reasons.insert(0, f"the generation check failed: {_cut(generation.error or 'no answer', GENERATION_ERROR_CHARS)}"
                          " — a client asking now would get the same")

    # servers that do not serve whatever the DHT says are left out of the recommendation; JOINING
    # ones are kept, as petals keeps them (they will serve soon)
    candidates = [row for row in served.rows if served.causes.get(row.peer_id) not in (CAUSE_UNREACHABLE, CAUSE_FAILING)]
    return Assessment(
        model=model.dht_prefix,
        state=state,
        reasons=tuple(reasons),
        coverage_pct=100.0 * sum(1 for b in blocks if b.online) / model.num_blocks,
        servers_online=len(served.serving),
        min_redundancy=min(b.online for b in blocks),
        blocks=tuple(blocks),
        missing_ranges=tuple(missing),
        single_served_ranges=tuple(single),
        bottleneck_ranges=tuple(ranges(_bottlenecks(blocks))),
        low_cache_ranges=tuple(low_cache),
        est_tokens_per_s=speed.tokens_per_s,
        speed_source=speed.source,
        route=tuple(RouteHop(*hop) for hop in speed.route),
        recommendation=_recommend(model, candidates, served.serving, recommend_blocks, routing),
        excluded_peers=served.excluded,
        excluded_causes=served.causes,
    )


def _runs_by_sole_peer(blocks: Sequence[BlockCoverage], single: Sequence[Range]) -> list[tuple[int, int, str]]:
    """Single-served ranges split where the sole server changes, so each sentence names one peer."""
    runs: list[list] = []
    for start, end in single:
        for index in range(start, end):
            peer = blocks[index].peers[0]
            if runs and runs[-1][2] == peer and runs[-1][1] == index:
                runs[-1][1] = index + 1
            else:
                runs.append([index, index + 1, peer])
    return [tuple(run) for run in runs]
