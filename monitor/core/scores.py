"""Per-peer health score 0–100, with the sentences that explain it, from the peer's history.

Pure: ``PeerHistory`` rows in (as the store hands them over), ``PeerScore`` out. The score is a
weighted sum of six qualities in [0, 1]; each quality is pulled towards 0.5 ("don't know yet")
by how little evidence it rests on, so a new peer starts at 50 rather than 100, and a peer earns a
high score only by being observed to be good for a while. The formula is the constant
``FORMULA`` (the dashboard shows it), built from the very constants the code uses and appended to
this docstring at import, so text and code cannot drift apart.

Speed is judged relative to the swarm: ``score_swarm`` computes the swarm median of seconds per
token per block over all peers' successful chat outcomes and scores each peer against it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

from monitor.core.common import DAY, HOUR, WEEK
from monitor.core.snapshot import ONLINE, Observation, PeerHistory

NEUTRAL = 0.5

# name -> (weight in points, prior strength k in samples)
WEIGHTS = {
    "uptime": 30,
    "probe_success": 15,
    "probe_rtt": 10,
    "stability": 15,
    "chat_success": 15,
    "chat_speed": 15,
}
PRIOR = {"uptime": 5, "probe_success": 4, "probe_rtt": 4, "stability": 10, "chat_success": 3, "chat_speed": 3}
UPTIME_WINDOWS = ((HOUR, 0.5, "1 h"), (DAY, 0.3, "24 h"), (WEEK, 0.2, "7 d"))
PROBE_WINDOW, FLAP_WINDOW, CHAT_WINDOW = DAY, DAY, WEEK
RTT_REFERENCE = 0.100  # seconds: a 100 ms median RTT scores 0.5
FLAP_SCALE = 3.0  # flaps: 3 flaps in 24 h score e^-1 ≈ 0.37

FORMULA = f"""\
score = sum of weight × quality over six components (weights sum to {sum(WEIGHTS.values())}); every quality is in [0, 1].
Each quality is shrunk towards 0.5 by its evidence: quality = (n × measured + k × 0.5) / (n + k),
n = the component's sample count, k = its prior strength. No evidence: 0.5, so a new peer scores 50.

uptime         {WEIGHTS['uptime']:>2}  share of polls that saw the peer ONLINE (a poll that did not see it counts as down),
                   over the last 1 h, 24 h and 7 d, weighted 0.5 / 0.3 / 0.2 (windows without polls are left out);
                   each window shrunk with k = {PRIOR['uptime']} polls
probe success  {WEIGHTS['probe_success']:>2}  ok probes / probes in the last 24 h (JOINING answers are not counted), k = {PRIOR['probe_success']}
probe RTT      {WEIGHTS['probe_rtt']:>2}  1 / (1 + median RTT / {RTT_REFERENCE * 1000:.0f} ms) over ok probes in the last 24 h, k = {PRIOR['probe_rtt']}
stability      {WEIGHTS['stability']:>2}  exp(−flaps / {FLAP_SCALE:g}); a flap = leaving ONLINE between two consecutive polls of one model,
                   in the last 24 h; n = polls in the last 24 h that followed an ONLINE poll, k = {PRIOR['stability']}
chat success   {WEIGHTS['chat_success']:>2}  ok / all chat outcomes in the last 7 d, k = {PRIOR['chat_success']}
chat speed     {WEIGHTS['chat_speed']:>2}  min(1, swarm median ÷ peer median) of seconds per token per block over ok chat outcomes
                   in the last 7 d (swarm median = median over peers of each peer's median), k = {PRIOR['chat_speed']};
                   0.5 while there is no swarm reference
"""


@dataclass(frozen=True)
class PeerScore:
    """A peer's score: what ``score_peer`` computes, the store keeps and the views show."""

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


def _shrink(measured: float, n: int, k: float) -> float:
    return (n * measured + k * NEUTRAL) / (n + k) if n > 0 else NEUTRAL


def _up(observation: Observation) -> bool:
    return observation.seen and observation.state == ONLINE


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%"


# ---- components: each returns (quality, sentence) --------------------------------------------


def _uptime(history: PeerHistory, now: float) -> tuple[float, str]:
    weighted, weights, ratios = 0.0, 0.0, {}
    for window, weight, label in UPTIME_WINDOWS:
        polls = [o for o in history.observations if o.at >= now - window]
        if not polls:
            continue
        # A row may stand for many polls (an hourly rollup, a merged run): weigh by `samples`.
        samples = sum(o.samples for o in polls)
        ratio = sum(o.samples for o in polls if _up(o)) / samples
        ratios[label] = ratio
        weighted += weight * _shrink(ratio, samples, PRIOR["uptime"])
        weights += weight
    if not ratios:
        return NEUTRAL, "online: no polls seen yet"
    if "24 h" in ratios:
        others = ", ".join(f"{label}: {_pct(r)}" for label, r in ratios.items() if label != "24 h")
        sentence = f"online {_pct(ratios['24 h'])} of the last 24 h" + (f" ({others})" if others else "")
    else:
        sentence = f"online {_pct(ratios['7 d'])} of the last 7 d (not polled in the last 24 h)"
    return weighted / weights, sentence


def _probes(history: PeerHistory, now: float) -> tuple[float, float, str]:
    recent = [result for at, result in history.probes if at >= now - PROBE_WINDOW]
    joining = sum(1 for r in recent if r.joining and not r.ok)
    counted = [r for r in recent if r.ok or not r.joining]
    ok = [r for r in counted if r.ok]
    rtts = [r.rtt for r in ok if r.rtt is not None]
    success = _shrink(len(ok) / len(counted), len(counted), PRIOR["probe_success"]) if counted else NEUTRAL
    if not recent:
        return success, NEUTRAL, "probe: none in the last 24 h"
    sentence = f"probe ok {len(ok)}/{len(counted)}"
    rtt_quality = NEUTRAL
    if rtts:
        median_rtt = statistics.median(rtts)
        rtt_quality = _shrink(1 / (1 + median_rtt / RTT_REFERENCE), len(rtts), PRIOR["probe_rtt"])
        sentence += f", median RTT {median_rtt * 1000:.0f} ms"
    if joining:
        sentence += f", {joining} answered JOINING (still loading)"
    failed = [r for r in counted if not r.ok]
    if failed and failed[-1].error:
        sentence += f" (last error: {failed[-1].error})"
    return success, rtt_quality, sentence


def _flaps(history: PeerHistory, now: float) -> tuple[float, str]:
    by_model: dict[str, list[Observation]] = {}
    for observation in history.observations:
        by_model.setdefault(observation.model, []).append(observation)
    flaps = polls = chances = 0
    for observations in by_model.values():
        observations.sort(key=lambda o: o.at)
        for before, after in zip(observations, observations[1:]):
            if after.at < now - FLAP_WINDOW:
                continue
            polls += before.samples
            if _up(before):
                chances += before.samples
                flaps += not _up(after)
    if not polls:
        return NEUTRAL, "state flaps: no polls in the last 24 h"
    if not chances:
        return NEUTRAL, "0 state flaps in 24 h (never ONLINE, nothing to judge)"
    quality = _shrink(math.exp(-flaps / FLAP_SCALE), chances, PRIOR["stability"])
    return quality, f"{flaps} state flap{'' if flaps == 1 else 's'} in 24 h (left ONLINE; {chances} polls while ONLINE)"


def peer_sec_per_block(history: PeerHistory, now: float) -> Optional[float]:
    """Median seconds per token per block over the peer's ok chat outcomes in the chat window."""
    speeds = [
        o.seconds_per_token_per_block
        for o in history.outcomes
        if o.ok and o.at >= now - CHAT_WINDOW and o.seconds_per_token_per_block is not None
    ]
    return statistics.median(speeds) if speeds else None


def _chat(history: PeerHistory, now: float, reference: Optional[float]) -> tuple[float, float, str]:
    recent = [o for o in history.outcomes if o.at >= now - CHAT_WINDOW]
    if not recent:
        return NEUTRAL, NEUTRAL, "chat: no outcomes in the last 7 d"
    ok = [o for o in recent if o.ok]
    success = _shrink(len(ok) / len(recent), len(recent), PRIOR["chat_success"])
    sentence = f"chat: {len(ok)}/{len(recent)} ok"
    speed = NEUTRAL
    median = peer_sec_per_block(history, now)
    if median is not None:
        sentence += f", {median:.3g} s/token/block"
        samples = sum(1 for o in ok if o.seconds_per_token_per_block is not None)
        if reference and reference > 0:
            ratio = median / reference
            speed = _shrink(min(1.0, 1 / ratio) if ratio > 0 else 1.0, samples, PRIOR["chat_speed"])
            if ratio > 1.1:
                sentence += f" — {ratio:.1f}× slower than the swarm median"
            elif ratio < 1 / 1.1:
                sentence += f" — {1 / ratio:.1f}× faster than the swarm median"
            else:
                sentence += " — about the swarm median"
        else:
            sentence += " — no swarm reference to compare with yet"
    advertised = next((o.inference_rps for o in reversed(history.observations) if o.inference_rps), None)
    if advertised:
        sentence += f"; advertises {1 / advertised:.3g} s/token/block"
    failed = [o for o in recent if not o.ok]
    if failed and failed[-1].error:
        sentence += f" (last error: {failed[-1].error})"
    return success, speed, sentence


# ---- the score -------------------------------------------------------------------------------


def score_peer(history: PeerHistory, now: float, *, reference_sec_per_block: Optional[float] = None) -> PeerScore:
    """The peer's score at ``now``; pass the swarm's median speed (see ``score_swarm``) to judge speed."""
    uptime, uptime_text = _uptime(history, now)
    probe_success, probe_rtt, probe_text = _probes(history, now)
    stability, flap_text = _flaps(history, now)
    chat_success, chat_speed, chat_text = _chat(history, now, reference_sec_per_block)
    qualities = {
        "uptime": uptime,
        "probe_success": probe_success,
        "probe_rtt": probe_rtt,
        "stability": stability,
        "chat_success": chat_success,
        "chat_speed": chat_speed,
    }
    components = {name: (q, float(WEIGHTS[name]), WEIGHTS[name] * q) for name, q in qualities.items()}
    score = round(sum(points for _, _, points in components.values()), 1)
    return PeerScore(
        peer_id=history.peer_id,
        score=min(100.0, max(0.0, score)),
        components=components,
        explanation=(uptime_text, probe_text, flap_text, chat_text),
        at=now,
    )


def swarm_reference(histories: Iterable[PeerHistory], now: float) -> Optional[float]:
    """The swarm median of seconds per token per block: the median over peers of each peer's median."""
    medians = [m for h in histories if (m := peer_sec_per_block(h, now)) is not None]
    return statistics.median(medians) if medians else None


def score_swarm(histories: Iterable[PeerHistory], now: float) -> dict[str, PeerScore]:
    """Every peer's score, with speed judged against the swarm median."""
    histories = list(histories)
    reference = swarm_reference(histories, now)
    return {h.peer_id: score_peer(h, now, reference_sec_per_block=reference) for h in histories}


__doc__ += "\nThe formula\n\n" + FORMULA
