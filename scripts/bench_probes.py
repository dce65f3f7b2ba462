#!/usr/bin/env python
"""Figures: measured, not announced — speed and correctness probes, side by side in one run.

    .venv/bin/python scripts/bench_probes.py [--models tiny demo] [--period 20] [--honest-probes 180]
    .venv/bin/python scripts/bench_probes.py --only throttle --models demo   # re-measure 2. alone

Per model, the demo's swarm on 127.0.0.1 (3 servers: server-1 all blocks, server-2 the first
half, server-3 the second half) and a `swarm-monitor serve` of its own (own process, own empty
store, the demo's probe settings: speed_probe_period ``--period`` s, speed_probe_max_share as the
demo's, ``demo_swarm.DEMO_SPEED_PROBE_MAX_SHARE``):

1. **estimate**: the model's estimated tokens/s as the monitor states it (from the probes, nobody
   having chatted) against what the chat then measures (median of ``--requests`` streamed greedy
   completions through the OpenAI API); with the announced-only estimate of the same snapshot
   (petals' routing-graph arithmetic over announcements, what the monitor said before it probed servers);
2. **throttle**: server-1 throttled as the demo's panel does (compute stopped 80 % of every
   0.25 s), just after one of its probes ended (the worst case: its next probe is a period away);
   seconds until the monitor's diagnosis names it slow, with no chat traffic; ``--throttle-runs``
   times, each after it is measured at its own speed again. ``--only throttle`` runs this alone and
   replaces only these figures (and a note saying so) in BENCHMARKS.md's probes section;
3. **corrupt**: server-3 made to perturb its outputs; seconds until it is flagged "wrong outputs";
4. **honest** (tiny model, its own run): ``--honest-probes`` probes of each honest server at a
   short period (an hour of the demo's 20 s period is 180), counting verdicts that flagged one;
5. **share**: the probes' share of each server's time (steps' time / wall time) in that run.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

import bench_common as bc
from bench_chat import PROMPTS, model_setup, wait_chat_ready

from monitor import compat  # noqa: F401  (must precede petals)

ESTIMATE_TOLERANCE = 0.30
THROTTLE_PERIODS = 2
CORRUPT_PERIODS = 1


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=30) as response:
        return json.loads(response.read())


def diagnosis(base: str, prefix: str) -> dict:
    try:
        return api(base, f"/api/v1/models/{prefix}").get("diagnosis") or {}
    except OSError:
        return {}


def wait_for(condition, timeout: float, step: float = 1.0):
    """Poll ``condition()`` until it returns something truthy; (seconds waited, value) or (None, None)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        value = condition()
        if value:
            return time.monotonic() - started, value
        time.sleep(step)
    return None, None


def store_of(svc):
    from monitor.store import Store

    return Store(f"sqlite:///{svc['workdir'] / 'monitor.db'}")


def announced_estimate(store, prefix: str) -> float:
    """The diagnosis of the latest snapshot from announcements only (as the monitor made it before)."""
    from monitor.swarm.routing import diagnose

    snapshot = store.latest_snapshot()
    model = next(m for m in snapshot.models if m.dht_prefix == prefix)
    return diagnose(model, snapshot.rows_for(prefix), store.latest_reachability()).est_tokens_per_s


def max_share() -> float:
    from monitor.harness.demo_swarm import DEMO_SPEED_PROBE_MAX_SHARE

    return DEMO_SPEED_PROBE_MAX_SHARE


def service_env(period: float) -> dict:
    return {"SWARM_MONITOR_SPEED_PROBE_PERIOD": str(period), "SWARM_MONITOR_SPEED_PROBE_MAX_SHARE": str(max_share()),
            "SWARM_MONITOR_SCRAPE_PERIOD": "5", "SWARM_MONITOR_REACHABILITY_PERIOD": "5",
            "SWARM_MONITOR_SCORE_PERIOD": "30"}


def measure_estimate(swarm, store, base: str, prefix: str, *, period: float, requests: int, tokens: int) -> dict:
    """1. the estimate, from probes alone, then what the chat measures."""
    names = {swarm.peer_id(n): n for n in swarm.servers}
    waited, health = wait_for(lambda: (d := diagnosis(base, prefix)).get("speed_source") == "measured"
                              and d, timeout=10 * period + 120)
    if health is None:
        raise RuntimeError(f"{prefix}: the estimate never rested on measurements")
    result = {"measured_after": waited, "first_estimate": health["est_tokens_per_s"],
              "announced": announced_estimate(store, prefix)}
    time.sleep(2 * period)  # each server's measured speed is the median of its 3 newest probes
    wait_chat_ready(base, prefix, PROMPTS[0])
    estimates, runs = [], []
    for _ in range(requests):  # the estimate as it stands, then what a chat measures
        estimates.append(diagnosis(base, prefix).get("est_tokens_per_s"))
        runs.append(bc.stream_completion(base, prefix, PROMPTS[0], tokens))
        time.sleep(period / 2)
    result["estimate"] = bc.median([e for e in estimates if e])
    result["chat"] = bc.median([r["tokens_per_s"] for r in runs if r["ok"] and r["tokens_per_s"]])
    result["chat_routes"] = sorted({"+".join(names.get(h.get("peer_id"), "?") for h in
                                             ((r.get("petals") or {}).get("route") or ())) for r in runs})
    return result


def measure_throttle(swarm, store, base: str, prefix: str, *, period: float, runs: int) -> list:
    """2. seconds from throttling server-1 until the diagnosis names it slow, ``runs`` times (None:
    not within the timeout). Each run throttles it as soon as one of its probes is stored (the worst
    case: its next probe is a period away), and ends once it is measured at its own speed again."""
    first, label = swarm.peer_id("server-1"), swarm.specs["server-1"].public_name

    def named_slow() -> bool:
        return any(r.startswith(f"{label} (") and " is slow" in r for r in diagnosis(base, prefix).get("reasons", ()))

    def next_probe() -> None:
        since = time.time()
        wait_for(lambda: store.recent_server_probes(since, peer_id=first), timeout=3 * period + 60, step=0.1)

    peers = [swarm.peer_id(n) for n in swarm.servers]  # steady state first: 3 probes of every server
    wait_for(lambda: all(len(store.recent_server_probes(0, peer_id=p)) >= 3 for p in peers), timeout=6 * period + 120)
    times = []
    for _ in range(runs):
        next_probe()  # (not a confirmation: the server's probes agree with its measured speed)
        swarm.throttle("server-1", duty=0.8, period=0.25)
        try:
            waited, _ = wait_for(named_slow, timeout=(THROTTLE_PERIODS + 3) * period + 60, step=0.25)
        finally:
            swarm.unthrottle("server-1")
        times.append(waited)
        print(f"throttled server named slow after {waited} s")
        wait_for(lambda: not named_slow(), timeout=6 * period + 60)
        next_probe()  # the probe after that one confirms its own speed: the next run starts from the steady state
    return times


def run_model(name: str, *, data_dir: Path, period: float, requests: int, tokens: int, throttle_runs: int,
              only: str = "") -> dict:
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm

    path, prefix, num_blocks = model_setup(name, data_dir)
    result: dict = {"model": f"{name} ({num_blocks} blocks)", "period": period}
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start(demo_layout(num_blocks, 3))
        with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"], env=service_env(period)) as svc:
            base, store = svc["base"], store_of(svc)
            try:
                if not only:
                    result.update(measure_estimate(swarm, store, base, prefix, period=period, requests=requests,
                                                   tokens=tokens))
                # 2. throttle server-1: named slow by the diagnosis, without chat traffic
                result["throttle_runs"] = measure_throttle(swarm, store, base, prefix, period=period,
                                                           runs=throttle_runs)
                done = [t for t in result["throttle_runs"] if t is not None]
                result["throttle_s"] = max(done) if len(done) == len(result["throttle_runs"]) else None
                result["throttle_median_s"] = bc.median(done)
                if only:
                    return result

                # 3. corrupt server-3: flagged "wrong outputs"
                third = swarm.peer_id("server-3")
                swarm.corrupt("server-3")
                corrupted_at = time.time()
                try:
                    result["corrupt_s"], _ = wait_for(
                        lambda: any(p.peer_id == third and p.verdict == "wrong"
                                    for p in store.recent_server_probes(corrupted_at)),
                        timeout=(CORRUPT_PERIODS + 3) * period + 60, step=0.5)
                    result["corrupt_in_diagnosis_s"], _ = wait_for(
                        lambda: third in (diagnosis(base, prefix).get("excluded_peers") or {}),
                        timeout=(CORRUPT_PERIODS + 3) * period + 60, step=0.5)
                    if result["corrupt_in_diagnosis_s"] is not None:
                        result["corrupt_in_diagnosis_s"] += result["corrupt_s"] or 0
                finally:
                    swarm.uncorrupt("server-3")
            finally:
                store.close()
    return result


def run_honest(*, data_dir: Path, probes: int, period: float) -> dict:
    """The tiny model's honest servers, probed ``probes`` times each: verdicts and time share."""
    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm

    path, prefix, num_blocks = model_setup("tiny", data_dir)
    with LocalSwarm(path, prefix, update_period=10) as swarm:
        swarm.start(demo_layout(num_blocks, 3))
        peers = {swarm.peer_id(n) for n in swarm.servers}
        with bc.service(swarm.initial_peers, models=[f"{prefix}:{num_blocks}:{path}"], env=service_env(period)) as svc:
            store = store_of(svc)
            started = time.time()
            try:
                def enough():
                    found = store.recent_server_probes(started, model=prefix)
                    counts = {peer: sum(p.peer_id == peer for p in found) for peer in peers}
                    return found if min(counts.values()) >= probes else None

                _, found = wait_for(enough, timeout=probes * period * 3 + 300, step=5)
                elapsed = time.time() - started
                found = found or store.recent_server_probes(started, model=prefix)
            finally:
                store.close()
    checked = [p for p in found if p.verdict is not None]
    flags = {samples: false_slow_flags(found, samples, period) for samples in (3, 1)}
    shares = {}
    for peer in peers:
        mine = sorted((p for p in found if p.peer_id == peer), key=lambda p: p.at)
        if len(mine) >= 2:
            shares[peer] = sum(p.duration or 0 for p in mine[:-1]) / (mine[-1].at - mine[0].at)
    return {
        "probes": len(found), "per_server": min(sum(p.peer_id == peer for p in found) for peer in peers),
        "checked": len(checked), "flagged": sum(p.verdict != "ok" for p in checked),
        "failed": sum(not p.ok for p in found), "elapsed": elapsed, "period": period,
        "share_max": max(shares.values()) if shares else float("nan"),
        "share_median": bc.median(list(shares.values())),
        "duration_median": bc.median([p.duration for p in found if p.ok and p.duration]),
        "max_error": max((p.error_ratio for p in checked), default=float("nan")),
        "tolerance": min((p.tolerance for p in checked), default=float("nan")),
        "slow_flags": flags,
    }


def false_slow_flags(probes: list, samples: int, period: float) -> tuple[int, int]:
    """Replays the honest run: after every probe, would the diagnosis have named a server slow if
    a server's speed were the median of its newest ``samples`` probes? -> (flags, judgements)."""
    from monitor.core.probes import MAX_AGE_PERIODS, recent_per_peer, slowness

    ordered = sorted(probes, key=lambda p: p.at)
    flags = judged = 0
    for i, probe in enumerate(ordered):
        seen = ordered[:i + 1]
        speeds = {peer: bc.median([p.seconds_per_token_per_block for p in kept]) for peer, kept in
                  recent_per_peer(seen, now=probe.at, max_age=MAX_AGE_PERIODS * period, samples=samples).items()}
        mine = speeds.get(probe.peer_id)
        others = [v for peer, v in speeds.items() if peer != probe.peer_id]
        if mine is None or not others:
            continue
        judged += 1
        flags += slowness(mine, None, others).slow
    return flags, judged


def fmt(value, unit: str = "", digits: int = 1) -> str:
    return "—" if value is None or value != value else f"{value:.{digits}f}{unit}"


def throttle_cells(r: dict) -> list[str]:
    """The detection table's throttle cells: the slowest run (median, runs), target, verdict."""
    ok = r["throttle_s"] is not None and r["throttle_s"] <= THROTTLE_PERIODS * r["period"]
    runs = r["throttle_runs"]
    figure = f"**{fmt(r['throttle_s'], ' s')}**"
    if len(runs) > 1:
        figure += f" (median {fmt(r['throttle_median_s'], ' s')}, {len(runs)} runs)"
    return [figure, f"≤ {THROTTLE_PERIODS} periods", bc.verdict(ok)]


THROTTLE_NOTE = "_Throttle re-run"


def replace_throttle_figures(results: list[dict], machine: str) -> None:
    """``--only throttle``: in BENCHMARKS.md's probes section, each re-run model's throttle cells
    (its row of the detection table) and a note that says when and how they were re-measured."""
    start, end = "<!-- bench:probes -->", "<!-- /bench:probes -->"
    text = bc.BENCHMARKS_MD.read_text()
    if start not in text or end not in text:
        raise SystemExit("BENCHMARKS.md has no probes section to update: run the whole benchmark first")
    head, rest = text.split(start, 1)
    section, tail = rest.split(end, 1)
    lines = [line for line in section.split("\n") if not line.startswith(THROTTLE_NOTE)]
    for r in results:
        found = False
        for i, line in enumerate(lines):
            cells = line.split(" | ")
            # the detection table's row: | model | period | throttle | target | verdict | corrupt ...
            if line.startswith(f"| {r['model']} | ") and len(cells) == 9:
                cells[1:5] = [fmt(r["period"], " s", 0), *throttle_cells(r)]
                lines[i], found = " | ".join(cells), True
        if not found:
            raise SystemExit(f"no detection row for {r['model']} in the probes section: run the whole benchmark")
    stamp = bc.stamp()
    models = ", ".join(r["model"] for r in results)
    note = (f"{THROTTLE_NOTE} {stamp}_ ({machine}): the throttle figures of {models} re-measured alone "
            f"(`scripts/bench_probes.py --only throttle`), speed_probe_max_share {max_share():g}, each run begun "
            "as soon as a probe of the server was stored (the worst case: its next probe is a period away); "
            "the table's other figures are from the run above.")
    while lines and not lines[-1].strip():
        lines.pop()
    section = "\n".join(lines + ["", note, ""])
    bc.BENCHMARKS_MD.write_text(head + start + section + end + tail)
    print(f"\nreplaced the throttle figures of {models} in {bc.BENCHMARKS_MD}")


def report(results: list[dict], honest: dict) -> str:
    rows, checks = [], []
    for r in results:
        ratio = r["estimate"] / r["chat"] if r.get("chat") else float("nan")
        within = abs(ratio - 1) <= ESTIMATE_TOLERANCE
        rows.append([r["model"], fmt(r["announced"]), f"**{fmt(r['estimate'])}**", fmt(r["chat"]),
                     f"**{ratio:.2f}×**", bc.verdict(within), ", ".join(r["chat_routes"]),
                     f"{fmt(r['measured_after'], ' s', 0)} ({fmt(r['first_estimate'])})"])
        corrupt_ok = r["corrupt_s"] is not None and r["corrupt_s"] <= CORRUPT_PERIODS * r["period"]
        checks.append([r["model"], fmt(r["period"], " s", 0), *throttle_cells(r),
                       f"**{fmt(r['corrupt_s'], ' s')}**", f"≤ {CORRUPT_PERIODS} period", bc.verdict(corrupt_ok),
                       fmt(r.get("corrupt_in_diagnosis_s"), " s")])
    estimate = bc.table(["model", "announced estimate, tokens/s", "measured estimate, tokens/s",
                         "chat measures, tokens/s", "estimate / chat", f"target ±{ESTIMATE_TOLERANCE:.0%}",
                         "chat routes", "measured after (first estimate)"], rows)
    detection = bc.table(["model", "probe period", "throttled server named slow after", "target", "",
                          "corrupting server flagged after", "target", "", "…and in the diagnosis after"], checks)
    hour = 3600 / 20  # probes per server in an hour at the demo's 20 s period
    honest_table = bc.table(
        ["probes per server", "target", "", "verdicts", "honest servers flagged", "target", "",
         "largest error / tolerance", "honest servers named slow: median of 3 / newest probe alone",
         "probe's server time (median)", "share of server time (max)", "bound"],
        [[f"**{honest['per_server']}**", f"≥ {hour:.0f} (1 h at 20 s)", bc.verdict(honest["per_server"] >= hour),
          honest["checked"], f"**{honest['flagged']}**", "0", bc.verdict(honest["flagged"] == 0),
          f"{honest['max_error']:.2g} / {honest['tolerance']:.2g}",
          "{} of {} / {} of {}".format(*honest["slow_flags"][3], *honest["slow_flags"][1]),
          bc.ms(honest["duration_median"]),
          f"**{honest['share_max']:.1%}**", f"≤ {max_share():.0%} (setting)"]])
    return (
        f"{estimate}\n\n{detection}\n\n{honest_table}\n\n"
        "Swarm: the demo's layout (server-1 all blocks, server-2 the first half, server-3 the second half) on "
        "127.0.0.1, with `swarm-monitor serve` in its own process (own empty store; speed_probe_period as "
        f"shown, speed_probe_max_share {max_share():g}, the demo's). *Announced estimate*: the same snapshot diagnosed from "
        "announcements only (petals' routing graph, what the overview said before the probes). *Measured "
        "estimate*: read from `/api/v1/models/<prefix>` before each chat request (median), starting two probe "
        "periods after its speed source first became `measured` (nobody chatted before: the first estimate "
        "and when it came are in the last column); *chat*: median decode tokens/s of the streamed greedy "
        "completions, one after each reading. Throttle: as the demo's "
        "panel (compute stopped 80 % of every 0.25 s), begun as soon as a probe of the server was stored (the "
        "worst case: its next probe is a period away); the slowest run, with the median; 'named slow': the diagnosis has the sentence "
        "'<server> (…) is slow'. Corrupt: the harness's flag file (outputs + noise as large as the outputs); "
        "'flagged': a stored probe with verdict wrong. Honest run: the tiny model at a "
        f"{honest['period']:g} s probe period for {honest['elapsed'] / 60:.0f} min ({honest['probes']} probes, "
        f"{honest['failed']} failed) — an hour of probing at the demo's 20 s period, scaled down in time, "
        "not in count."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "demo"], choices=["tiny", "demo"])
    parser.add_argument("--only", choices=["throttle"], default="",
                        help="measure only this part, and replace only its figures in BENCHMARKS.md")
    parser.add_argument("--throttle-runs", type=int, default=3, help="throttles per model (each from the steady state)")
    parser.add_argument("--period", type=float, default=20.0, help="speed_probe_period of the detection runs (the demo's)")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--honest-probes", type=int, default=180)
    parser.add_argument("--honest-period", type=float, default=2.0)
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "petals-swarm-monitor-tests")
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave BENCHMARKS.md alone")
    args = parser.parse_args()
    machine = bc.machine()  # (the load as the run begins)
    print(machine)
    results = []
    for name in args.models:
        r = run_model(name, data_dir=args.data_dir, period=args.period, requests=args.requests, tokens=args.tokens,
                      throttle_runs=args.throttle_runs, only=args.only)
        print(r)
        results.append(r)
    if args.only:
        print("\n".join(" | ".join([r["model"], *throttle_cells(r)]) for r in results))
        if not args.no_write:
            replace_throttle_figures(results, machine)
        return
    honest = run_honest(data_dir=args.data_dir, probes=args.honest_probes, period=args.honest_period)
    print(honest)
    markdown = report(results, honest)
    print(markdown)
    if not args.no_write:
        bc.write_section("probes", markdown)


if __name__ == "__main__":
    main()
