"""What the monitor measured of each server (speed and correctness probes), and the verdicts drawn
from it: plain data and pure functions, no I/O.

A *server probe* runs a few real tokens through one server's span of blocks in an inference
session, as a petals client does (``monitor/swarm/speed.py``): the first step sends
``PREFILL_TOKENS`` tokens, then ``DECODE_STEPS`` steps of one token each (what a chat waits per
generated token), then ``EMPTY_STEPS`` steps of zero tokens, which the server answers without
computing anything (the network and handler round trip). Steps are spaced by a random pause of up
to ``STEP_GAP`` seconds, as a chat's steps are spaced by the other spans and its own work: a server
that is slow only part of the time (a busy machine, a duty-cycled process) is sampled at random
moments, not once and then in one burst. From those:

- ``seconds_per_token``: the median one-token step, round trip included (what the chat measures
  per span, ``chat.sequence.SpanRecorder``);
- ``rtt``: the median empty step;
- ``seconds_per_token_per_block``: (``seconds_per_token`` − ``rtt``) / blocks — the compute a
  block costs per token, comparable with what the server announces (``1 / inference_rps``).

A *correctness check* compares the span's outputs for a fixed input with a trusted computation of
the same blocks (the monitor's own, where it has the model's weights) or with other servers' outputs
for the same blocks and input. The comparison is the relative L2 error ``‖out − ref‖ / ‖ref‖``,
judged against ``tolerance(dtype, quant_type, blocks)``.

A probe that fails says something only when the *server* answered with an error of its own (its
handler raised — out of memory, a broken driver, a version or architecture mismatch —, or it
refused the session): ``error_kind`` ``SERVER_ERROR``. A server whose attention cache has no room
now (``BUSY``, ``core.common.cache_full``) is serving other sessions: busy, not failing. A server whose
newest ``FAILING_CONFIRMATIONS`` probes, all within the recent window, failed that way is
**failing** (``failing_servers``): it is up, announced and reachable, but a client's every step
through it fails, so it serves nothing. So is one whose newest ``REFUSING_CONFIRMATIONS`` probes were
all refused as "cache full" while it announced room for them (``refused_with_room``): a busy server
soon announces less room, or serves some of the sessions it is asked for. When the monitor itself gave up (``TIMEOUT``: no answer
within the probe's timeout) or could not run the probe (``CLIENT_ERROR``), or the server was busy,
nothing is learnt of
the server's health: a slow server is judged by its speed, an absent one by its reachability.

Every verdict reads the same window, ``recent_window(speed_probe_period)``: the diagnosis, the
pages, the alerts and the chat's router. A verdict older than that no longer counts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from monitor.core.snapshot import session_room

PREFILL_TOKENS = 8
DECODE_STEPS = 4
EMPTY_STEPS = 2
STEP_GAP = 0.2  # seconds, the longest random pause between two steps

# Verdicts of a correctness check.
CORRECT, WRONG, DISAGREES = "ok", "wrong", "disagrees"
BY_REFERENCE, BY_PEERS = "reference", "peers"

# A server measured this many times slower than it announces (or than the other servers' median) is
# flagged "slow" (pages, diagnosis).
SLOW_FACTOR = 3.0
# ... and only when that costs a route through it at least this much more per token over its span.
# A step has a fixed cost on the server besides its blocks' compute (its session and tensors: about
# 5 ms on this 2-core machine, against 1.1 ms per block of the tiny model — bench_churn --honest's
# probes), which the empty step does not take away: a one-block server's "compute per block" is
# mostly that cost, 3–7× the others' per block, and at 5 ms such servers were named slow twice in
# an honest hour. No server anyone waits for is slow by less than this; any real slow one is far
# slower (a throttled tiny server: ~80 ms more; a 3× slow demo server of 15 blocks: ~60 ms more).
MIN_SLOW_EXCESS = 0.02  # seconds per token
PETALS_DEFAULT_SECONDS_PER_BLOCK = 1 / 300  # petals' default_inference_rps, for servers that announce none
# Measurements older than this many probe periods no longer count (the server may have changed).
MAX_AGE_PERIODS = 4.0
SPEED_SAMPLES = 3  # a server's measured speed is the low median of its newest this many probes
SLOW_CONFIRMATIONS = 2  # fresh probes a "slow" verdict rests on, at least: one noisy probe calls no server slow
CONFIRM_AFTER = 0.5  # of a period: a probe that would change a server's verdict is confirmed this soon
RECOVERY_AFTER = 0.25  # of a period: a server judged slow, wrong or failing is probed this often (its recovery seen soon)
RECOVERY_CONFIRM_AFTER = 0.05  # of a period: such a server's probe that would clear it is confirmed this soon
RECOVERY_SHARE_FACTOR = 2.5  # such a server's probes may take this many times speed_probe_max_share (5 % at the defaults)

# Why a probe failed (``ServerProbe.error_kind``).
SERVER_ERROR, TIMEOUT, CLIENT_ERROR, BUSY = "server", "timeout", "client", "busy"
FAILURE_KINDS = (SERVER_ERROR, TIMEOUT, CLIENT_ERROR, BUSY)
FAILING_CONFIRMATIONS = 2  # newest probes that must all fail with the server's own error: one flaky step changes nothing
# newest probes that must all be refused as "cache full" while the server announced room for them: a
# server busy with sessions announces less room soon, so only one that keeps refusing while claiming
# room is failing (it serves nobody, and petals' clients would keep trying it)
REFUSING_CONFIRMATIONS = 3
PROBE_TOKENS = PREFILL_TOKENS + DECODE_STEPS  # a probe session's length: the room it needs


def recent_window(speed_probe_period: float) -> float:
    """Seconds of probes every verdict reads: ``MAX_AGE_PERIODS`` probe periods."""
    return MAX_AGE_PERIODS * speed_probe_period

# Relative L2 error one block may add, by the precision it computes in (the reference is float32).
# float32 against float32 differs only by summation order (~1e-6); half precisions round every
# activation to 8 or 11 bits of mantissa; quantized weights differ from the checkpoint itself.
_BLOCK_ERROR = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}
_QUANT_ERROR = {"int8": 5e-2, "nf4": 1.5e-1}
_UNKNOWN_DTYPE_ERROR = 2e-2
MAX_TOLERANCE = 0.5  # beyond this an output is wrong whatever the precision: half its size is off


@dataclass(frozen=True)
class ServerProbe:
    """One speed (and maybe correctness) probe of one server's span [start, end) of one model."""

    peer_id: str
    model: str
    start: int
    end: int
    at: float  # unix seconds, when the session started
    ok: bool  # the session ran to the end
    seconds_per_token: Optional[float] = None  # median 1-token step, round trip included
    rtt: Optional[float] = None  # median empty step (no compute)
    prefill_seconds: Optional[float] = None  # the first step, PREFILL_TOKENS tokens
    duration: Optional[float] = None  # the steps' total time: the server's time this probe took (pauses not counted)
    error: Optional[str] = None  # why it failed (short)
    error_kind: Optional[str] = None  # SERVER_ERROR | TIMEOUT | CLIENT_ERROR | BUSY when it failed
    verdict: Optional[str] = None  # CORRECT | WRONG | DISAGREES; None: not checked
    error_ratio: Optional[float] = None  # relative L2 error of the outputs
    tolerance: Optional[float] = None  # what error_ratio was judged against
    checked_against: Optional[str] = None  # BY_REFERENCE | BY_PEERS
    detail: Optional[str] = None  # e.g. which peers it disagrees with
    room: Optional[int] = None  # the server's announced ``cache_tokens_left`` when it was probed (see ``room_tokens``)

    @property
    def blocks(self) -> int:
        return self.end - self.start

    @property
    def seconds_per_token_per_block(self) -> Optional[float]:
        """Compute per block per token: the one-token step without the round trip, per block."""
        if not self.ok or self.seconds_per_token is None or self.blocks <= 0:
            return None
        compute = self.seconds_per_token - (self.rtt or 0.0)
        # never below a tenth of the step: an empty step that was slower than a real one is jitter
        return max(compute, 0.1 * self.seconds_per_token) / self.blocks

    @property
    def round_trip_per_block(self) -> Optional[float]:
        """The one-token step per block, round trip included (the chat's measure of a span)."""
        if not self.ok or self.seconds_per_token is None or self.blocks <= 0:
            return None
        return self.seconds_per_token / self.blocks


# ---- correctness ---------------------------------------------------------------------------------


def tolerance(torch_dtype: Optional[str], quant_type: Optional[str], blocks: int) -> float:
    """The relative L2 error a correct server of this precision may show over ``blocks`` blocks.

    Per-block errors are independent roundings, so they add up like a random walk (√blocks);
    quantization adds its own per-block error. Never above ``MAX_TOLERANCE``."""
    dtype = (torch_dtype or "").replace("torch.", "").lower()
    per_block = _BLOCK_ERROR.get(dtype, _UNKNOWN_DTYPE_ERROR)
    quant = (quant_type or "none").lower()
    per_block += _QUANT_ERROR.get(quant, 0.0 if quant in ("none", "") else _QUANT_ERROR["nf4"])
    return min(MAX_TOLERANCE, per_block * math.sqrt(max(1, blocks)) * 4)


def judge(error_ratio: Optional[float], allowed: float) -> str:
    """CORRECT when the error is within tolerance, else WRONG (a NaN or missing error is WRONG)."""
    if error_ratio is None or not math.isfinite(error_ratio):
        return WRONG
    return CORRECT if error_ratio <= allowed else WRONG


def cross_check(errors: Mapping[tuple[str, str], float], allowed: Mapping[tuple[str, str], float]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Servers of the same blocks, given the same input, compared with one another.

    ``errors``: (peer a, peer b) -> relative error between their outputs (each pair once);
    ``allowed``: the same pairs -> tolerance. Returns peer -> (verdict, the peers it disagrees
    with): WRONG for a peer that disagrees with a strict majority of the others while those agree
    among themselves; DISAGREES for a peer in a disagreement nobody outvotes (e.g. two servers);
    CORRECT for a peer that agrees with every other.
    """
    peers = sorted({p for pair in errors for p in pair})
    disagree: dict[str, set[str]] = {p: set() for p in peers}
    for (a, b), error in errors.items():
        if judge(error, allowed.get((a, b), allowed.get((b, a), 0.0))) == WRONG:
            disagree[a].add(b)
            disagree[b].add(a)
    def outvoted(peer: str) -> bool:
        against = disagree[peer]
        # at least two others, a strict majority, agreeing with one another
        return (len(against) >= 2 and len(against) * 2 > len(peers) - 1
                and all(not (disagree[x] - {peer}) for x in against))

    wrong = {peer for peer in peers if disagree[peer] and outvoted(peer)}
    result: dict[str, tuple[str, tuple[str, ...]]] = {}
    for peer in peers:
        against = tuple(sorted(disagree[peer]))
        if peer in wrong:
            result[peer] = (WRONG, against)
        elif not disagree[peer] - wrong:  # it disagrees with nobody, or only with outvoted servers
            result[peer] = (CORRECT, ())
        else:
            result[peer] = (DISAGREES, against)
    return result


# ---- speed -----------------------------------------------------------------------------------------


def latest_per_peer(probes: Iterable[ServerProbe], model: Optional[str] = None) -> dict[str, ServerProbe]:
    """Each peer's newest probe (of ``model``, if given)."""
    latest: dict[str, ServerProbe] = {}
    for probe in probes:
        if model is not None and probe.model != model:
            continue
        kept = latest.get(probe.peer_id)
        if kept is None or probe.at >= kept.at:
            latest[probe.peer_id] = probe
    return latest


def recent_per_peer(probes: Iterable[ServerProbe], *, now: float, max_age: float, model: Optional[str] = None,
                    samples: int = SPEED_SAMPLES) -> dict[str, list[ServerProbe]]:
    """peer -> its newest ``samples`` successful timed probes no older than ``max_age``, oldest first."""
    found: dict[str, list[ServerProbe]] = {}
    for probe in sorted(probes, key=lambda p: p.at):
        if (probe.ok and probe.at >= now - max_age and probe.seconds_per_token is not None
                and (model is None or probe.model == model)):
            found.setdefault(probe.peer_id, []).append(probe)
    return {peer: kept[-samples:] for peer, kept in found.items()}


def measured_speeds(probes: Iterable[ServerProbe], *, now: float, max_age: float,
                    model: Optional[str] = None) -> dict[str, float]:
    """peer -> seconds per token per block (compute): the low median of its newest ``SPEED_SAMPLES``
    successful probes no older than ``max_age`` seconds (of three, the middle one; of two, the
    faster), so a speed far from the rest counts only once two probes say so: one noisy probe
    moves nothing, two slow ones do. What ``coverage.diagnose`` takes as ``measured``."""
    return {peer: statistics.median_low(values)
            for peer, kept in recent_per_peer(probes, now=now, max_age=max_age, model=model).items()
            if (values := _present(p.seconds_per_token_per_block for p in kept))}


def _present(values: Iterable[Optional[float]]) -> list[float]:
    """(a timed probe's figures are there: ``recent_per_peer`` keeps timed probes only)"""
    return [v for v in values if v is not None]


def confirmed_peers(probes: Iterable[ServerProbe], *, now: float, max_age: float,
                    model: Optional[str] = None) -> set[str]:
    """The peers whose measured speed rests on at least ``SLOW_CONFIRMATIONS`` fresh probes: the only
    ones a "slow" verdict is drawn for. A server's first probe alone (after the monitor starts, or
    a new leader takes over) calls it slow nowhere; it is confirmed or overturned after
    ``CONFIRM_AFTER`` of a period (``worth_confirming``). What ``coverage.diagnose`` takes as
    ``confirmed``."""
    return {peer for peer, kept in recent_per_peer(probes, now=now, max_age=max_age, model=model).items()
            if len(kept) >= SLOW_CONFIRMATIONS}


def wrong_outputs(probes: Iterable[ServerProbe], *, now: float, max_age: float,
                  model: Optional[str] = None) -> dict[str, str]:
    """peer -> why its outputs are wrong, from its newest correctness verdict no older than
    ``max_age`` (a newer correct verdict clears an older wrong one)."""
    checked = [p for p in probes if p.verdict is not None and p.at >= now - max_age]
    return {peer: describe_verdict(probe) for peer, probe in latest_per_peer(checked, model).items()
            if probe.verdict == WRONG}


def disagreeing_outputs(probes: Iterable[ServerProbe], *, now: float, max_age: float,
                        model: Optional[str] = None) -> dict[str, str]:
    """peer -> its disagreement with other servers of the same blocks (servers compared with one
    another, nobody outvoting either: one of them computes wrong, the monitor cannot tell which),
    where its newest verdict no older than ``max_age`` on some segment is DISAGREES. Per segment: a
    server cross-checked on two segments in turn agrees on one and disagrees on the other, and its
    agreement on one does not clear its disagreement on the other."""
    checked = [p for p in probes if p.verdict is not None and p.at >= now - max_age
               and (model is None or p.model == model)]
    newest: dict[tuple[str, str, int, int], ServerProbe] = {}
    for probe in sorted(checked, key=lambda p: p.at):
        newest[(probe.peer_id, probe.model, probe.start, probe.end)] = probe
    found: dict[str, str] = {}
    for (peer, _, _, _), probe in sorted(newest.items(), key=lambda item: item[0]):
        if probe.verdict == DISAGREES and peer not in found:
            found[peer] = describe_verdict(probe)
    return found


def failing_servers(probes: Iterable[ServerProbe], *, now: float, max_age: float,
                    model: Optional[str] = None) -> dict[str, str]:
    """peer -> the server's own error, where its newest ``FAILING_CONFIRMATIONS`` probes no older
    than ``max_age`` (of ``model``, if given) all failed with ``SERVER_ERROR`` (the newest error is
    the one told). A probe that succeeds, or fails for a reason of the monitor's (a timeout), ends it."""
    newest: dict[str, list[ServerProbe]] = {}
    for probe in sorted(probes, key=lambda p: p.at, reverse=True):
        if probe.at < now - max_age or (model is not None and probe.model != model):
            continue
        kept = newest.setdefault(probe.peer_id, [])
        if len(kept) < max(FAILING_CONFIRMATIONS, REFUSING_CONFIRMATIONS):
            kept.append(probe)
    found = {}
    for peer, kept in newest.items():
        errors = kept[:FAILING_CONFIRMATIONS]
        refusals = kept[:REFUSING_CONFIRMATIONS]
        if len(errors) == FAILING_CONFIRMATIONS and all(not p.ok and p.error_kind == SERVER_ERROR for p in errors):
            found[peer] = kept[0].error or "the server answered with an error"
        elif len(refusals) == REFUSING_CONFIRMATIONS and all(refused_with_room(p) for p in refusals):
            found[peer] = (f"refuses every session as cache full while announcing room for "
                           f"{min(room_tokens(p) or 0 for p in refusals)} tokens ({kept[0].error or 'no room'})")
    return found


def room_tokens(probe: ServerProbe) -> Optional[int]:
    """How long a session over the probe's span the server's announced room holds. petals announces
    ``cache_tokens_left`` as its free cache over one block's keys (``bytes_left`` / (hidden size ×
    dtype size / key-value groups)): a session of T tokens over B blocks takes 2 × B × T of them."""
    return session_room(probe.room, probe.blocks)


def refused_with_room(probe: ServerProbe) -> bool:
    """The server refused the probe's session for want of cache room (``BUSY``) while it announced
    room enough for it."""
    tokens = room_tokens(probe)
    return not probe.ok and probe.error_kind == BUSY and tokens is not None and tokens >= PROBE_TOKENS


def first_server_error(probe: ServerProbe, before: Optional[ServerProbe]) -> bool:
    """Whether ``probe`` is a server error that is not confirmed yet (the one ``before`` it was not):
    worth probing again soon, so that a failing server is named within one period."""
    if probe.ok or probe.error_kind != SERVER_ERROR:
        return False
    return before is None or before.ok or before.error_kind != SERVER_ERROR


def describe_verdict(probe: ServerProbe) -> str:
    """One phrase for pages and the diagnosis, e.g. "returns wrong outputs (error 0.93 > 0.0016 …)"."""
    if probe.verdict is None:
        return "not checked"
    against = "the monitor's own computation" if probe.checked_against == BY_REFERENCE else "other servers"
    numbers = ""
    if probe.error_ratio is not None and probe.tolerance is not None:
        numbers = f"relative error {probe.error_ratio:.3g} vs tolerance {probe.tolerance:.2g}, "
    if probe.verdict == CORRECT:
        return f"outputs match {against} ({numbers}blocks {probe.start}:{probe.end})"
    detail = f"; {probe.detail}" if probe.detail else ""
    if probe.verdict == DISAGREES:
        return f"outputs disagree with {against} ({numbers}blocks {probe.start}:{probe.end}{detail})"
    return f"returns wrong outputs ({numbers}against {against}, blocks {probe.start}:{probe.end}{detail})"


def announced_seconds_per_block(announced_rps: Optional[float]) -> float:
    """What petals' routing assumes a block costs on a server: ``1 / inference_rps``, or petals'
    default when the server announces none."""
    return 1.0 / announced_rps if announced_rps and announced_rps > 0 else PETALS_DEFAULT_SECONDS_PER_BLOCK


@dataclass(frozen=True)
class Slowness:
    """How a server's measured speed compares: with what it announces (or petals assumes) and with
    the other measured servers of its model (their median)."""

    measured: float  # seconds per token per block
    announced: float  # seconds per block petals' routing assumes for it
    announces: bool  # False: it announces nothing, ``announced`` is petals' default
    vs_announced: float
    vs_others: Optional[float]  # None: no other server measured
    confirmed: bool = True  # False: one probe so far (``SLOW_CONFIRMATIONS``), a verdict not drawn yet
    blocks: Optional[int] = None  # its span's blocks, when known (``MIN_SLOW_EXCESS``)

    def _costs(self, ratio: float) -> bool:
        """Whether being ``ratio`` times a reference costs a route through its span MIN_SLOW_EXCESS."""
        return self.blocks is None or self.measured * (1 - 1 / ratio) * self.blocks >= MIN_SLOW_EXCESS

    @property
    def beyond_factor(self) -> bool:
        """SLOW_FACTOR times what it announces, or the others' median (petals' default assumption
        is no announcement: a server that announces nothing is judged against the others only),
        costing a route through its span at least ``MIN_SLOW_EXCESS`` per token."""
        return ((self.announces and self.vs_announced >= SLOW_FACTOR and self._costs(self.vs_announced))
                or (self.vs_others is not None and self.vs_others >= SLOW_FACTOR and self._costs(self.vs_others)))

    @property
    def slow(self) -> bool:
        """Beyond the factor on a confirmed measurement."""
        return self.confirmed and self.beyond_factor

    def describe(self) -> str:
        """e.g. "measured 16.6 ms per token per block: 5.0× what it announces (3.33 ms), 4.6× the
        median of the other servers"."""
        said = "what it announces" if self.announces else "what petals assumes (it announces no speed)"
        text = (f"measured {self.measured * 1000:.3g} ms per token per block: {self.vs_announced:.1f}× {said} "
                f"({self.announced * 1000:.3g} ms)")
        if self.vs_others is not None:
            text += f", {self.vs_others:.1f}× the median of the other servers"
        if self.beyond_factor and not self.confirmed:
            text += f" — one probe so far: called slow once {SLOW_CONFIRMATIONS} agree"
        return text


def slowness(measured: Optional[float], announced_rps: Optional[float], others: Sequence[float], *,
             confirmed: bool = True, blocks: Optional[int] = None) -> Optional[Slowness]:
    """None when the server was not measured; ``others``: the other servers' measured speeds;
    ``confirmed``: whether ``measured`` rests on ``SLOW_CONFIRMATIONS`` probes (``confirmed_peers``);
    ``blocks``: its span's length."""
    if not measured or measured <= 0:
        return None
    announced = announced_seconds_per_block(announced_rps)
    reference = median_or_none(others)
    return Slowness(measured=measured, announced=announced, announces=bool(announced_rps and announced_rps > 0),
                    vs_announced=measured / announced, vs_others=measured / reference if reference else None,
                    confirmed=confirmed, blocks=blocks)


def median_or_none(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else None


def next_probe_delay(duration: Optional[float], period: float, max_share: float, *, confirm: bool = False,
                     recovering: bool = False) -> float:
    """Seconds until a server may be probed again: ``period`` (``CONFIRM_AFTER`` of it when the last
    probe is worth confirming, ``worth_confirming``), or longer when its last probe took so long that
    a probe that soon would exceed ``max_share`` of its time: a probe whose steps took ``d`` seconds is
    never followed by another before ``d / max_share`` (a slow server is probed less often, and
    probes never take more than ``max_share`` of its time).

    ``recovering``: the server is judged slow, wrong or failing (our routing sends it nothing), so
    its recovery is what is worth knowing: probed every ``RECOVERY_AFTER`` of a period, a probe that
    would clear it confirmed after ``RECOVERY_CONFIRM_AFTER``, within ``RECOVERY_SHARE_FACTOR``
    times ``max_share`` of its time (a throttled server's probe takes several times a healthy one's:
    at ``max_share`` alone its recovery would wait for minutes). A probe worth confirming gets the
    same relaxed share for its one confirming probe: a server that just slowed down is named slow
    after half a period, not after ``duration / max_share`` (75 s for a 1.5 s probe at 2 %)."""
    if recovering:
        wait = (RECOVERY_CONFIRM_AFTER if confirm else RECOVERY_AFTER) * period
        max_share = min(0.5, max_share * RECOVERY_SHARE_FACTOR)
    else:
        wait = CONFIRM_AFTER * period if confirm else period
        if confirm:
            max_share = min(0.5, max_share * RECOVERY_SHARE_FACTOR)
    if not duration or duration <= 0:
        return wait
    return max(wait, duration / max_share)


def worth_confirming(speed: Optional[float], before: Optional[float], announced_rps: Optional[float],
                     others: Sequence[float], blocks: Optional[int] = None) -> bool:
    """Whether a probe that measured ``speed`` (seconds per token per block) should be confirmed
    sooner than a period: alone, it would change whether the server is slow (``slowness``: against
    what it announces and the ``others``' median) from what its measured speed so far (``before``;
    None: never measured) says, or it departs from that speed ``SLOW_FACTOR``-fold either way.

    A server's measured speed is the low median of its newest ``SPEED_SAMPLES`` probes, and a
    "slow" verdict needs ``SLOW_CONFIRMATIONS`` of them, so one such probe changes nothing and the
    second decides (a first probe too: it alone calls no server slow): probed at the period, a
    server throttled just after a probe would be named slow only after two periods *plus* the
    second probe's own time; confirmed within half a period, within two periods."""
    if speed is None or speed <= 0:
        return False
    alone, earlier = slowness(speed, announced_rps, others, blocks=blocks), slowness(before, announced_rps, others,
                                                                                     blocks=blocks)
    if alone is None:  # (not for a speed > 0)
        return False
    if earlier is None or before is None:
        return alone.beyond_factor
    if alone.beyond_factor != earlier.beyond_factor:
        return True
    return max(speed / before, before / speed) >= SLOW_FACTOR


class RecentProbes:
    """Every verdict drawn from the recent probes (``recent_window``), read once per round: the
    diagnosis, the scores, the alerts and the pages ask the same object the same questions."""

    def __init__(self, probes: Sequence[ServerProbe], now: float, max_age: float):
        self.probes, self.now, self.max_age = list(probes), now, max_age

    def speeds(self, model: Optional[str] = None) -> dict[str, float]:
        return measured_speeds(self.probes, now=self.now, max_age=self.max_age, model=model)

    def confirmed(self, model: Optional[str] = None) -> set[str]:
        return confirmed_peers(self.probes, now=self.now, max_age=self.max_age, model=model)

    def round_trip_speeds(self, model: Optional[str] = None) -> dict[str, float]:
        """peer -> the median of its newest probes' one-token steps per block, round trip included
        (the chats' own measure, what the scores compare with chats)."""
        return {peer: statistics.median(values)
                for peer, kept in recent_per_peer(self.probes, now=self.now, max_age=self.max_age, model=model).items()
                if (values := _present(p.round_trip_per_block for p in kept))}

    def wrong(self, model: Optional[str] = None) -> dict[str, str]:
        return wrong_outputs(self.probes, now=self.now, max_age=self.max_age, model=model)

    def disagreeing(self, model: Optional[str] = None) -> dict[str, str]:
        return disagreeing_outputs(self.probes, now=self.now, max_age=self.max_age, model=model)

    def failing(self, model: Optional[str] = None) -> dict[str, str]:
        return failing_servers(self.probes, now=self.now, max_age=self.max_age, model=model)
