"""Per-peer health score 0–100, with the sentences that explain it, from counts over time windows.

Pure: ``PeerAggregates`` in (plain counts and histograms per peer), ``PeerScore`` out. The score is
a weighted sum of six qualities in [0, 1]; each quality is pulled towards 0.5 ("don't know yet")
by how little evidence it rests on, so a new peer starts at 50 rather than 100, and a peer earns a
high score only by being observed to be good for a while. The formula is the constant
``FORMULA`` (the dashboard shows it), built from the very constants the code uses and appended to
this docstring at import, so text and code cannot drift apart.

The aggregates come from SQL in production (``Store.peer_aggregates``: the store counts, nothing
is materialized per observation) or from a ``PeerHistory`` here (``aggregate``: every observation
in Python, the specification the SQL must match; the specs score small histories with it,
``tests/support.py``). Medians are estimated from log-scale histograms (``monitor.core.quantiles``),
so both ways compute them alike.

Speed is judged relative to the swarm: ``score_all`` takes the swarm median of seconds per token
per block over all peers' successful chat outcomes and scores each peer against it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from monitor.core.common import DAY, HOUR, WEEK
from monitor.core.quantiles import MAX_RELATIVE_ERROR, Histogram, histogram
from monitor.core.probes import SPEED_SAMPLES  # the probes a measured speed rests on
from monitor.core.snapshot import ONLINE, Observation, PeerHistory

NEUTRAL = 0.5

# name -> (weight in points, prior strength k in samples). The names are stored with every score and
# shown by the API and the peer page ("reachability_*" were "probe_*" before revision 0022)
WEIGHTS = {
    "uptime": 30,
    "reachability_success": 15,
    "reachability_rtt": 10,
    "stability": 15,
    "chat_success": 15,
    "chat_speed": 15,
}
PRIOR = {"uptime": 5, "reachability_success": 4, "reachability_rtt": 4, "stability": 10, "chat_success": 3,
         "chat_speed": 3}
UPTIME_WINDOWS = ((HOUR, 0.5, "1 h"), (DAY, 0.3, "24 h"), (WEEK, 0.2, "7 d"))
REACHABILITY_WINDOW, FLAP_WINDOW, CHAT_WINDOW = DAY, DAY, WEEK
SCORE_WINDOW = max(w for w, _, _ in UPTIME_WINDOWS)  # the oldest evidence any component looks at
_FLAP_UPTIME = [w for w, _, _ in UPTIME_WINDOWS].index(FLAP_WINDOW)  # the uptime window that counts its polls
RTT_REFERENCE = 0.100  # seconds: a 100 ms median RTT scores 0.5
FLAP_SCALE = 3.0  # flaps: 3 flaps in 24 h score e^-1 ≈ 0.37

FORMULA = f"""\
score = sum of weight × quality over six components (weights sum to {sum(WEIGHTS.values())}); every quality is in [0, 1].
Each quality is shrunk towards 0.5 by its evidence: quality = (n × measured + k × 0.5) / (n + k),
n = the component's sample count, k = its prior strength. No evidence: 0.5, so a new peer scores 50.

uptime                {WEIGHTS['uptime']:>2}  share of polls that saw the peer ONLINE (a poll that did not see it counts as
                          down), over the last 1 h, 24 h and 7 d, weighted 0.5 / 0.3 / 0.2 (windows without
                          polls are left out); each window shrunk with k = {PRIOR['uptime']} polls
reachability success  {WEIGHTS['reachability_success']:>2}  ok / all reachability checks in the last 24 h (JOINING answers are
                          not counted), k = {PRIOR['reachability_success']}
reachability RTT      {WEIGHTS['reachability_rtt']:>2}  1 / (1 + median RTT / {RTT_REFERENCE * 1000:.0f} ms) over ok reachability checks in
                          the last 24 h, k = {PRIOR['reachability_rtt']}
stability             {WEIGHTS['stability']:>2}  exp(−flaps / {FLAP_SCALE:g}); a flap = leaving ONLINE between two consecutive polls of
                          one model, in the last 24 h; n = polls in the last 24 h that followed an ONLINE poll,
                          k = {PRIOR['stability']}
chat success          {WEIGHTS['chat_success']:>2}  ok / all chat outcomes in the last 7 d, k = {PRIOR['chat_success']}
chat speed            {WEIGHTS['chat_speed']:>2}  min(1, swarm median ÷ peer median) of seconds per token per block over ok chat
                          outcomes in the last 7 d (swarm median = median over peers of each peer's median),
                          k = {PRIOR['chat_speed']}; 0.5 while there is no swarm reference
Speed probes: where they measured the peer (the median of its newest 3 probes' one-token steps per
                          block), that figure judges its speed instead of the chats' (n = 3), and the swarm
                          median is taken over each peer's probe figure, or its chat median if it was not probed.
Wrong outputs: a peer whose latest correctness probe found its outputs wrong scores 0.
Medians are estimated from log-scale histograms with buckets 1/16 octave wide (the mean of the middle
bucket): within {MAX_RELATIVE_ERROR * 100:.1f} % of the exact median, so they can be counted in SQL.
"""


@dataclass(frozen=True)
class PeerScore:
    """A peer's score: what ``score`` computes, the store keeps and the views show."""

    peer_id: str
    score: float  # 0–100, one decimal
    components: dict[str, tuple[float, float, float]]  # name -> (quality 0–1, weight, points)
    explanation: tuple[str, ...]
    at: Optional[float] = None  # when it was computed (unix seconds)

    def to_dict(self) -> dict:
        return {
            "peer_id": self.peer_id,
            "at": self.at,
            "score": self.score,
            "components": {
                name: {"value": round(value, 4), "weight": weight, "points": round(points, 2)}
                for name, (value, weight, points) in self.components.items()
            },
            "explanation": list(self.explanation),
        }


# ---- what the score is computed from ---------------------------------------------------------


@dataclass(frozen=True)
class Uptime:
    """One uptime window: polls (per model served) that saw the peer ONLINE, of those that could have."""

    online: int = 0
    polls: int = 0


@dataclass(frozen=True)
class PeerAggregates:
    """Everything the score needs about one peer at one time, as counts: what SQL can sum."""

    peer_id: str
    uptime: tuple[Uptime, ...] = tuple(Uptime() for _ in UPTIME_WINDOWS)  # one per UPTIME_WINDOWS
    flaps: int = 0  # left ONLINE between consecutive polls of one model, in FLAP_WINDOW
    flap_chances: int = 0  # polls in FLAP_WINDOW that followed an ONLINE poll of the same model
    reachability_ok: int = 0  # in REACHABILITY_WINDOW
    reachability_failed: int = 0  # not ok and not JOINING
    reachability_joining: int = 0  # not ok, answered JOINING (still loading)
    reachability_rtt: Histogram = Histogram()  # RTTs of ok reachability checks
    last_reachability_error: Optional[str] = None  # of the latest failed reachability check (not JOINING)
    chats_ok: int = 0  # in CHAT_WINDOW
    chats_failed: int = 0
    chat_speed: Histogram = Histogram()  # seconds per token per block of ok chat outcomes
    last_chat_error: Optional[str] = None  # of the latest failed outcome
    advertised_inference_rps: Optional[float] = None  # the latest announced


def _up(observation: Observation) -> bool:
    return observation.seen and observation.state == ONLINE


def aggregate(history: PeerHistory, now: float) -> PeerAggregates:
    """The aggregates of a history, observation by observation (what the store's SQL counts)."""
    uptime = []
    for window, _, _ in UPTIME_WINDOWS:
        # A row may stand for many polls (an hourly rollup, a merged run): weigh by `samples`.
        polls = [o for o in history.observations if o.at >= now - window]
        uptime.append(Uptime(online=sum(o.samples for o in polls if _up(o)), polls=sum(o.samples for o in polls)))
    flaps, chances = _flaps(history, now)
    checks = [result for at, result in history.reachability if at >= now - REACHABILITY_WINDOW]
    failed_checks = [r for r in checks if not r.ok and not r.joining]
    chats = [o for o in history.outcomes if o.at >= now - CHAT_WINDOW]
    failed_chats = [o for o in chats if not o.ok]
    return PeerAggregates(
        peer_id=history.peer_id,
        uptime=tuple(uptime),
        flaps=flaps,
        flap_chances=chances,
        reachability_ok=sum(1 for r in checks if r.ok),
        reachability_failed=len(failed_checks),
        reachability_joining=sum(1 for r in checks if r.joining and not r.ok),
        reachability_rtt=histogram(r.rtt for r in checks if r.ok and r.rtt is not None),
        last_reachability_error=failed_checks[-1].error if failed_checks else None,
        chats_ok=sum(1 for o in chats if o.ok),
        chats_failed=len(failed_chats),
        chat_speed=histogram(o.seconds_per_token_per_block for o in chats if o.ok),
        last_chat_error=failed_chats[-1].error if failed_chats else None,
        advertised_inference_rps=next(
            (o.inference_rps for o in reversed(history.observations) if o.inference_rps), None),
    )


def _flaps(history: PeerHistory, now: float) -> tuple[int, int]:
    """(flaps, chances) over consecutive observations of each model whose later one is in FLAP_WINDOW."""
    by_model: dict[str, list[Observation]] = {}
    for observation in history.observations:
        by_model.setdefault(observation.model, []).append(observation)
    flaps = chances = 0
    for observations in by_model.values():
        observations.sort(key=lambda o: o.at)
        for before, after in zip(observations, observations[1:]):
            if after.at >= now - FLAP_WINDOW and _up(before):
                chances += before.samples
                flaps += not _up(after)
    return flaps, chances


# ---- components: each returns (quality, sentence) --------------------------------------------


def _shrink(measured: float, n: int, k: float) -> float:
    return (n * measured + k * NEUTRAL) / (n + k) if n > 0 else NEUTRAL


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%"


def _uptime(agg: PeerAggregates) -> tuple[float, str]:
    weighted, weights, ratios = 0.0, 0.0, {}
    for (_, weight, label), counts in zip(UPTIME_WINDOWS, agg.uptime):
        if counts.polls <= 0:
            continue
        ratio = counts.online / counts.polls
        ratios[label] = ratio
        weighted += weight * _shrink(ratio, counts.polls, PRIOR["uptime"])
        weights += weight
    if not ratios:
        return NEUTRAL, "online: no polls seen yet"
    if "24 h" in ratios:
        others = ", ".join(f"{label}: {_pct(r)}" for label, r in ratios.items() if label != "24 h")
        sentence = f"online {_pct(ratios['24 h'])} of the last 24 h" + (f" ({others})" if others else "")
    else:
        sentence = f"online {_pct(ratios['7 d'])} of the last 7 d (not polled in the last 24 h)"
    return weighted / weights, sentence


def _reachability(agg: PeerAggregates) -> tuple[float, float, str]:
    counted = agg.reachability_ok + agg.reachability_failed
    success = _shrink(agg.reachability_ok / counted, counted, PRIOR["reachability_success"]) if counted else NEUTRAL
    if not counted and not agg.reachability_joining:
        return success, NEUTRAL, "reachability checks: none in the last 24 h"
    sentence = f"reachability checks ok {agg.reachability_ok}/{counted}"
    rtt_quality = NEUTRAL
    median_rtt = agg.reachability_rtt.median()
    if median_rtt is not None:
        rtt_quality = _shrink(1 / (1 + median_rtt / RTT_REFERENCE), agg.reachability_rtt.count,
                              PRIOR["reachability_rtt"])
        sentence += f", median RTT {median_rtt * 1000:.0f} ms"
    if agg.reachability_joining:
        sentence += f", {agg.reachability_joining} answered JOINING (still loading)"
    if agg.reachability_failed and agg.last_reachability_error:
        sentence += f" (last error: {agg.last_reachability_error})"
    return success, rtt_quality, sentence


def _stability(agg: PeerAggregates) -> tuple[float, str]:
    if not agg.uptime[_FLAP_UPTIME].polls:
        return NEUTRAL, "state flaps: no polls in the last 24 h"
    if not agg.flap_chances:
        why = "never ONLINE" if not agg.uptime[_FLAP_UPTIME].online else "ONLINE in the last poll only"
        return NEUTRAL, f"0 state flaps in 24 h ({why}, nothing to judge)"
    flaps, chances = agg.flaps, agg.flap_chances
    quality = _shrink(math.exp(-flaps / FLAP_SCALE), chances, PRIOR["stability"])
    return quality, f"{flaps} state flap{'' if flaps == 1 else 's'} in 24 h (left ONLINE; {chances} polls while ONLINE)"


def _chat(agg: PeerAggregates, reference: Optional[float]) -> tuple[float, float, str]:
    total = agg.chats_ok + agg.chats_failed
    if not total:
        return NEUTRAL, NEUTRAL, "chat: no outcomes in the last 7 d"
    success = _shrink(agg.chats_ok / total, total, PRIOR["chat_success"])
    sentence = f"chat: {agg.chats_ok}/{total} ok"
    speed = NEUTRAL
    median = agg.chat_speed.median()
    if median is not None:
        sentence += f", {median:.3g} s/token/block"
        if reference and reference > 0:
            ratio = median / reference
            speed = _shrink(min(1.0, 1 / ratio) if ratio > 0 else 1.0, agg.chat_speed.count, PRIOR["chat_speed"])
            if ratio > 1.1:
                sentence += f" — {ratio:.1f}× slower than the swarm median"
            elif ratio < 1 / 1.1:
                sentence += f" — {1 / ratio:.1f}× faster than the swarm median"
            else:
                sentence += " — about the swarm median"
        else:
            sentence += " — no swarm reference to compare with yet"
    if agg.advertised_inference_rps:
        sentence += f"; advertises {1 / agg.advertised_inference_rps:.3g} s/token/block"
    if agg.chats_failed and agg.last_chat_error:
        sentence += f" (last error: {agg.last_chat_error})"
    return success, speed, sentence


# ---- the score -------------------------------------------------------------------------------


def _probe_speed(measured: float, reference: Optional[float]) -> tuple[float, str]:
    """Speed as the speed probes measured it (they measure every server, chats only some)."""
    text = f"speed probes measure {measured:.3g} s/token/block"
    if not reference or reference <= 0 or measured <= 0:
        return NEUTRAL, text + " — no swarm reference to compare with yet"
    ratio = measured / reference
    quality = _shrink(min(1.0, 1 / ratio), SPEED_SAMPLES, PRIOR["chat_speed"])
    if ratio > 1.1:
        return quality, text + f" — {ratio:.1f}× slower than the swarm median"
    return quality, text + (f" — {1 / ratio:.1f}× faster than the swarm median" if ratio < 1 / 1.1
                            else " — about the swarm median")


def score(agg: PeerAggregates, now: float, *, reference_sec_per_block: Optional[float] = None,
          measured_sec_per_block: Optional[float] = None, wrong_outputs: Optional[str] = None,
          failing: Optional[str] = None) -> PeerScore:
    """The score: the one scoring function. Pass the swarm's median speed (``swarm_median``) to judge speed;
    the speed probes' measurement of the peer, which judges its speed instead of chats', and
    why its outputs are wrong if the correctness probes found them so, and the error it answers
    every recent probe with if it fails them (either makes the score 0: a client gets nothing of it)."""
    uptime, uptime_text = _uptime(agg)
    reachable, rtt, reachability_text = _reachability(agg)
    stability, flap_text = _stability(agg)
    chat_success, chat_speed, chat_text = _chat(agg, reference_sec_per_block)
    if measured_sec_per_block is not None:
        chat_speed, speed_text = _probe_speed(measured_sec_per_block, reference_sec_per_block)
        chat_text += "; " + speed_text
    qualities = {
        "uptime": uptime,
        "reachability_success": reachable,
        "reachability_rtt": rtt,
        "stability": stability,
        "chat_success": chat_success,
        "chat_speed": chat_speed,
    }
    components = {name: (q, float(WEIGHTS[name]), WEIGHTS[name] * q) for name, q in qualities.items()}
    total = round(sum(points for _, _, points in components.values()), 1)
    explanation: tuple[str, ...] = (uptime_text, reachability_text, flap_text, chat_text)
    if wrong_outputs:
        total = 0.0
        explanation += (f"outputs: {wrong_outputs} — score 0 until a probe finds them correct",)
    if failing:
        total = 0.0
        explanation += (f"inference: fails every probe with its own error ({failing}) — score 0 until a probe "
                        "succeeds",)
    return PeerScore(
        peer_id=agg.peer_id,
        score=min(100.0, max(0.0, total)),
        components=components,
        explanation=explanation,
        at=now,
    )


def swarm_median(aggregates: Iterable[PeerAggregates]) -> Optional[float]:
    """The swarm median of seconds per token per block: the median over peers of each peer's median."""
    medians = [m for agg in aggregates if (m := agg.chat_speed.median()) is not None]
    return statistics.median(medians) if medians else None


def score_all(aggregates: Iterable[PeerAggregates], now: float, *, measured: Mapping[str, float] = {},
              wrong: Mapping[str, str] = {}, failing: Mapping[str, str] = {}) -> dict[str, PeerScore]:
    """Every peer's score, with speed judged against the swarm median. ``measured``: peer ->
    seconds per token per block the speed probes measured (their figure replaces the chats' in the
    peer's speed and in the swarm median); ``wrong``: peer -> why its outputs are wrong; ``failing``:
    peer -> the error it fails every recent probe with."""
    aggregates = list(aggregates)
    reference = swarm_median(aggregates)
    if measured:
        figures = [f for agg in aggregates if (f := measured.get(agg.peer_id) or agg.chat_speed.median()) is not None]
        reference = statistics.median(figures) if figures else reference
    return {agg.peer_id: score(agg, now, reference_sec_per_block=reference,
                               measured_sec_per_block=measured.get(agg.peer_id), wrong_outputs=wrong.get(agg.peer_id),
                               failing=failing.get(agg.peer_id))
            for agg in aggregates}


__doc__ += "\nThe formula\n\n" + FORMULA
