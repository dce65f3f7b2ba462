#!/usr/bin/env python
"""Figure: truth within a minute at the settings people run — every kind of broken server, applied
and healed one after another, timed on the dashboard and at the webhook; and honest churn that
must raise no alarm.

    .venv/bin/python scripts/bench_churn.py [--runs 5] [--kinds stop kill freeze fail throttle corrupt]
    .venv/bin/python scripts/bench_churn.py --in-a-row 2   # besides: 2 passes of faults in a row
    .venv/bin/python scripts/bench_churn.py --honest 60      # minutes of clean restarts, joins, leaves

Swarm: a bootstrap peer and 4 servers of the tiny model (every block served twice), started by the
swarm harness on 127.0.0.1, announcing every 60 s as petals' servers do. The monitor is
``swarm-monitor serve`` in its own process at the **default** settings: the config names only the
swarm, the model (its local checkpoint: the correctness reference) and one webhook (a receiver on
127.0.0.1). Each run faults one server (in turn), then:

- *named*: until the model page (the dashboard, read every second over HTTP) gives that server a
  cause other than serving, or flags it slow;
- *notified*: until the webhook has a "firing" (or "changed") notice of the default rule;
- the fault is healed; *healthy*: from the server being healthy again (ONLINE in the DHT after a
  restart; at once for the others) to the page calling it serving again.

In a row (``--in-a-row N``, after the runs one at a time on the same swarm): N passes of
``ROW`` — a clean stop, then (once the stopped server is back) a failing server, the restarted one
corrupting, a throttled one, a killed one, a frozen one — each healed before the next and the next
applied as soon as the page shows the healed server serving, without waiting for the previous
alert's recovery: every notice must still come, as news of an alert that still fires. A notice
counts for a fault when it names the faulted server.

Kinds: ``stop`` (a clean stop: the server announces OFFLINE and leaves; then a restart with the same
identity), ``kill`` (SIGKILL, then a restart with the same identity), ``freeze`` (SIGSTOP of the whole
server, then SIGCONT), ``fail`` (every step raises), ``throttle`` (its compute paused 80 % of the
time: 5× slower), ``corrupt`` (fast, wrong outputs). False alarms: a server that is not faulted
named anything but serving, a notice outside a fault (and its heal). Cost: the compute checks' and
probes' time on each server over the run (from the monitor's store), and the monitor's CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402

KINDS = ("stop", "kill", "freeze", "fail", "throttle", "corrupt")
BOUNDS = {  # kind -> (named, notified) in seconds (#31, #52)
    "stop": (60, 90), "kill": (60, 90), "freeze": (60, 90), "fail": (60, 90), "throttle": (180, 240),
    "corrupt": (180, 240)}
# in a row (#52): kind, and which server (index into the sorted names; the stopped one is corrupted)
ROW = (("stop", 1), ("fail", 2), ("corrupt", 1), ("throttle", 0), ("kill", 3), ("freeze", 2))
HEALTHY_BOUND = 60
GIVE_UP = 600  # seconds a run waits for a figure before recording it as missed
SETTLE = 15  # seconds between runs (after the previous alert resolved)
_ROW = re.compile(r'data-peer-id="([^"]+)" data-state="[^"]*" data-cause="([^"]+)"(.*?)</tr>', re.S)


class Watch:
    """Reads the model page every second on a thread: peer -> cause, with when each was first seen."""

    def __init__(self, base: str, prefix: str):
        self.url = f"{base}/models/{prefix}"
        self.causes: dict[str, str] = {}
        self.history: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                page = urllib.request.urlopen(self.url, timeout=10).read().decode()
                # a slow server still serves (its cause column says so); its speed cell says "slow"
                self.causes = {peer: "slow" if cause == "serving" and 'class="badge slow"' in cells else cause
                               for peer, cause, cells in _ROW.findall(page)}
                self.history.append((time.time(), dict(self.causes)))
            except OSError:
                pass
            self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)


def config(tmp: Path, swarm, model_path: Path, prefix: str, blocks: int, hook_url: str, port: int) -> Path:
    path = tmp / "monitor.toml"
    peers = ", ".join(json.dumps(p) for p in swarm.initial_peers)
    path.write_text(f"""data_dir = {json.dumps(str(tmp / "data"))}
port = {port}
initial_peers = [{peers}]
discover_models = false

[[models]]
dht_prefix = {json.dumps(prefix)}
num_blocks = {blocks}
path = {json.dumps(str(model_path))}

[alerts]
webhooks = [{{ name = "bench", url = {json.dumps(hook_url)} }}]
""")
    return path


def apply(swarm, kind: str, name: str) -> None:
    import os
    import signal

    if kind == "stop":
        swarm.stop(name)
    elif kind == "kill":
        swarm.kill(name)
    elif kind == "freeze":
        os.kill(swarm.pid(name), signal.SIGSTOP)
    elif kind == "fail":
        swarm.fail(name)
    elif kind == "throttle":
        swarm.throttle(name, duty=0.8, period=0.25)
    elif kind == "corrupt":
        swarm.corrupt(name)


def heal(swarm, kind: str, name: str) -> None:
    import os
    import signal

    if kind in ("kill", "stop"):
        swarm.restart(name)  # returns once it is ONLINE in the DHT
    elif kind == "freeze":
        os.kill(swarm.pid(name), signal.SIGCONT)
    elif kind == "fail":
        swarm.unfail(name)
    elif kind == "throttle":
        swarm.unthrottle(name)
    elif kind == "corrupt":
        swarm.uncorrupt(name)


def firing_after(hook, since: float, naming: str | None = None) -> list:
    """Notices of trouble (firing, changed, news) received since ``since``; ``naming``: only those
    whose summary or details name that server (in a row, an earlier fault's notice may come late)."""
    def names(body) -> bool:
        return naming is None or naming in " ".join([body.get("summary") or "", *(body.get("details") or [])])

    return [r for r in hook.received if r.at >= since and r.body and 200 <= r.status < 300
            and r.body.get("event") in ("firing", "changed", "news") and names(r.body)]


def named_now(watch, peer: str) -> bool:
    """The page gives the server a cause other than serving, or no longer lists it (gone)."""
    return bool(watch.causes) and watch.causes.get(peer, "gone") != "serving"


def run(args) -> dict:
    import psutil

    from monitor.harness.demo_swarm import demo_layout
    from monitor.harness.local_swarm import LocalSwarm
    from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS, ensure_tiny_model
    from monitor.harness.webhook_receiver import WebhookReceiver
    from monitor.store import Store

    with tempfile.TemporaryDirectory(prefix="bench-churn-") as tmp_name, WebhookReceiver() as hook:
        tmp = Path(tmp_name)
        model_path = ensure_tiny_model(tmp / "models")
        with LocalSwarm(model_path, TINY_DHT_PREFIX, update_period=60) as swarm:
            swarm.start(demo_layout(TINY_NUM_BLOCKS, 4))
            names = sorted(swarm.servers)
            port = bc.free_port()
            cfg = config(tmp, swarm, model_path, TINY_DHT_PREFIX, TINY_NUM_BLOCKS, hook.url, port)
            base = f"http://127.0.0.1:{port}"
            args_ = [str(Path(sys.executable).parent / "swarm-monitor"), "--config", str(cfg), "serve"]
            with bc.process(args_, tmp / "serve.log") as proc:
                bc.wait_http(base, proc, tmp / "serve.log", 180)
                watch = Watch(base, TINY_DHT_PREFIX)
                ids = {name: swarm.peer_id(name) for name in names}
                if not bc.wait(lambda: len(watch.causes) == len(names) and
                               set(watch.causes.values()) == {"serving"}, 300, step=1):
                    raise SystemExit(f"the servers never all served: {watch.causes}")
                time.sleep(SETTLE)
                monitor = psutil.Process(proc.pid)
                cpu0, wall0 = sum(monitor.cpu_times()[:2]), time.time()
                started = time.time()
                store_url = f"sqlite:///{tmp / 'data' / 'monitor.db'}"

                def progress(results):  # the section so far, after every run (a long run keeps what it measured)
                    if args.no_write:
                        return
                    store = Store(store_url)
                    try:
                        share = cost(store, ids, started, time.time())
                    finally:
                        store.close()
                    cpu_now = (sum(monitor.cpu_times()[:2]) - cpu0) / max(1.0, time.time() - wall0)
                    partial = {"results": results, "cpu": cpu_now, "share": share, "honest": args.honest}
                    bc.write_section("churn", report(partial) + f"\n\n(In progress: {len(results)} of "
                                     f"{args.runs * len(args.kinds)} runs.)")

                if args.honest:
                    results = honest(args, swarm, names, ids, watch, hook)
                else:
                    results = faults(args, swarm, names, ids, watch, hook, progress) if args.runs else []
                    if args.in_a_row:
                        results += in_a_row(args, swarm, names, ids, watch, hook, progress, results)
                cpu = (sum(monitor.cpu_times()[:2]) - cpu0) / max(1.0, time.time() - wall0)
                watch.close()
                store = Store(store_url)
                try:
                    share = cost(store, ids, started, time.time())
                finally:
                    store.close()
        return {"results": results, "cpu": cpu, "share": share, "honest": args.honest}


def one_fault(swarm, kind: str, victim: str, names, ids, watch, hook) -> dict:
    """Apply one fault, time it named (on the page) and notified (a notice naming the server), heal
    it, time it healthy again (on the page); which other servers were named meanwhile."""
    peer = ids[victim]
    at = time.time()
    apply(swarm, kind, victim)
    named = bc.wait(lambda: named_now(watch, peer), GIVE_UP, step=0.2)
    named_at = time.time() if named else None
    cause = watch.causes.get(peer, "gone")
    notified = bc.wait(lambda: firing_after(hook, at, victim), max(1, GIVE_UP - (time.time() - at)), step=0.2)
    first = firing_after(hook, at, victim)[0] if notified else None
    false_named = sorted(n for n in names if n != victim and named_now(watch, ids[n]))
    heal(swarm, kind, victim)
    healed_at = time.time()
    back = bc.wait(lambda: watch.causes.get(peer) == "serving", GIVE_UP, step=0.2)
    return {"kind": kind, "victim": victim, "cause": cause, "event": first.body.get("event") if first else None,
            "named": named_at - at if named_at else None, "notified": first.at - at if first else None,
            "healthy": time.time() - healed_at if back else None, "false_named": false_named,
            "healed_at": healed_at}


def said(result: dict, prefix: str = "") -> str:
    return (f"{prefix}{result['kind']:9s} {result['victim']}: named {bc.fmt(result['named'])} ({result['cause']}), "
            f"notified {bc.fmt(result['notified'])} ({result['event']}), healthy {bc.fmt(result['healthy'])}"
            + (f", also named: {result['false_named']}" if result["false_named"] else ""))


def resolved_after(hook, since: float, wait: float = 300) -> float | None:
    """Seconds from ``since`` to the first recovery notice after it (None: none within ``wait``)."""
    if not bc.wait(lambda: any(r.body and r.body.get("event") == "resolved" and r.at >= since for r in hook.received),
                   wait, step=0.5):
        return None
    return min(r.at for r in hook.received if r.body and r.body.get("event") == "resolved" and r.at >= since) - since


def faults(args, swarm, names, ids, watch, hook, progress=None) -> list[dict]:
    results = []
    order = [(kind, run) for run in range(args.runs) for kind in args.kinds]
    for index, (kind, _) in enumerate(order):
        victim = names[index % len(names)]
        time.sleep(random.uniform(0, 20))  # a random moment of the checks' cycle
        results.append(one_fault(swarm, kind, victim, names, ids, watch, hook))
        print(said(results[-1]), flush=True)
        results[-1]["resolved"] = resolved_after(hook, results[-1]["healed_at"])
        print(f"  resolved notice {bc.fmt(results[-1]['resolved'])} after the heal" if results[-1]["resolved"]
              is not None else "  (no resolved notice within 300 s)", flush=True)
        if progress is not None:
            progress(results)
        time.sleep(SETTLE)
    return results


def in_a_row(args, swarm, names, ids, watch, hook, progress, before: list[dict]) -> list[dict]:
    """``ROW`` ``--in-a-row`` times on the same swarm, each fault healed before the next, the next
    applied once the page shows the healed server serving (no settling, no waiting for a recovery)."""
    results = []
    for _ in range(args.in_a_row):
        for kind, which in ROW:
            results.append({**one_fault(swarm, kind, names[which % len(names)], names, ids, watch, hook), "row": True})
            print(said(results[-1], "in a row: "), flush=True)
            if progress is not None:
                progress(before + results)
    if results:
        results[-1]["resolved"] = resolved_after(hook, time.time())
    return results


def honest(args, swarm, names, ids, watch, hook) -> list[dict]:
    """Honest churn for ``--honest`` minutes, an event every 1–3 minutes, in turn: a clean restart
    of a random server (it stops, announcing OFFLINE, and is back within a minute), or a new server
    joining (a span of its own) — which leaves cleanly at the next join. Every server named
    anything but serving (a restarting, joining or leaving one: OFFLINE or JOINING too) and every
    notice is a false alarm."""
    from monitor.harness.local_swarm import ServerSpec
    from monitor.harness.tiny_model import TINY_NUM_BLOCKS

    deadline = time.time() + args.honest * 60
    events, false_named = [], set()
    moments: list[str] = []  # each false naming: when, how long after that server's last event
    last_event: dict[str, float] = {}
    began = time.time()
    notices_before = len(hook.received)
    watched = dict(ids)
    changing: set[str] = set()
    joined: list[str] = []
    turn = 0
    while time.time() < deadline:
        turn += 1
        at = time.time()
        if turn % 2:  # a clean restart
            victim = random.choice(names)
            changing = {victim}
            swarm.stop(victim)
            time.sleep(random.uniform(5, 30))
            swarm.restart(victim)
            last_event[victim] = time.time()
            events.append({"kind": "restart", "server": victim, "down": time.time() - at})
            print(f"clean restart of {victim}: down {time.time() - at:.0f} s", flush=True)
        else:  # the last joiner leaves, a new one joins
            changing = set(joined)
            for name in joined:
                swarm.stop(name)
                events.append({"kind": "leave", "server": name})
                print(f"{name} left", flush=True)
            start = random.randrange(0, TINY_NUM_BLOCKS - 1)
            name = f"joiner-{turn}"
            watched[name] = swarm.add_server(ServerSpec(name, start, random.randrange(start + 1, TINY_NUM_BLOCKS + 1),
                                                        throughput=100.0))
            joined = [name]
            last_event[name] = time.time()
            changing.add(name)
            events.append({"kind": "join", "server": name})
            print(f"{name} joined ({swarm.specs[name].block_indices}) after {time.time() - at:.0f} s", flush=True)
        until = time.time() + random.uniform(60, 180)
        while time.time() < min(until, deadline):
            for name, peer in watched.items():
                cause = watch.causes.get(peer, "serving")
                allowed = ("serving", "OFFLINE", "JOINING") if name in changing or name not in names + joined \
                    else ("serving",)
                if cause not in allowed:
                    if (name, cause) not in false_named:
                        since = time.time() - last_event[name] if name in last_event else None
                        moments.append(f"{name} {cause} at {time.time() - began:.0f} s into the run"
                                       + (f", {since:.0f} s after its last restart or join" if since is not None
                                          else ", never restarted"))
                        print("FALSE NAMING: " + moments[-1], flush=True)
                    false_named.add((name, cause))
            time.sleep(1)
    # a server that left for good while others serve its blocks is an info notice by design (#52): told,
    # never an alarm; every other notice is one
    notices = [r.body.get("event") for r in hook.received[notices_before:] if r.body and r.body.get("severity") != "info"]
    told = [f"{r.body.get('event')} {r.body.get('severity')}: {r.body.get('summary')} ({r.at - began:.0f} s in)"
            for r in hook.received[notices_before:] if r.body and r.body.get("severity") != "info"]
    for line in told:  # every notice an operator would take for an alarm, said whole
        print("NOTICE: " + line, flush=True)
    return [{"restarts": sum(e["kind"] == "restart" for e in events), "joins": sum(e["kind"] == "join" for e in events),
             "leaves": sum(e["kind"] == "leave" for e in events), "false_named": sorted(false_named),
             "moments": moments,
             "notices": notices, "told": told}]


def cost(store, ids: dict, since: float, until: float) -> dict:
    """peer name -> (compute checks' share, probes' share) of its time over the run."""
    checks = store.recent_compute_checks(since)
    probes = store.recent_server_probes(since)
    span = max(1.0, until - since)
    found = {}
    for name, peer in ids.items():
        c = sum(x.duration or 0 for x in checks if x.peer_id == peer)
        p = sum(x.duration or 0 for x in probes if x.peer_id == peer)
        found[name] = (c / span, p / span, sum(1 for x in checks if x.peer_id == peer))
    return found


def resolved_cell(values: list) -> str:
    """The resolved notices' times (after the flap hold, ``RESOLVE_HOLD``); no bound of their own."""
    known = [v for v in values if v is not None]
    missing = len(values) - len(known)
    if not known:  # (in a row, only the last fault's recovery is waited for: the next fault comes first)
        return "—" if not missing else f"none in 300 s ({missing})"
    text = f"{bc.fmt(statistics.median(known))} / {bc.fmt(max(known))}"
    return text + (f", {missing} none in 300 s" if missing else "")


def report(out: dict) -> str:
    share = out["share"]
    cost_line = (f"Cost over the run: compute checks {max(s[0] for s in share.values()) * 100:.3f} % of a server's "
                 f"time at most ({max(s[2] for s in share.values())} checks), speed and correctness probes "
                 f"{max(s[1] for s in share.values()) * 100:.2f} % at most; the monitor's process (poller, "
                 f"web, reference model) {out['cpu'] * 100:.0f} % of one core.")
    if out["honest"]:
        (r,) = out["results"]
        return (f"Honest churn, {out['honest']:.0f} min at the defaults: {r['restarts']} clean restarts (a server "
                f"stops, announcing OFFLINE, and is back within a minute), {r['joins']} servers joining and "
                f"{r['leaves']} leaving cleanly. False alarms: "
                f"{len(r['false_named'])} servers named ({r['false_named'] or 'none'}"
                + (f": {'; '.join(r.get('moments', []))}" if r.get("moments") else "") + "), "
                f"{len(r['notices'])} notices other than info ({'; '.join(r.get('told') or []) or 'none'}).\n\n{cost_line}")
    rows = []
    for (kind, row) in [(k, False) for k in KINDS] + [(k, True) for k in KINDS]:
        runs = [r for r in out["results"] if r["kind"] == kind and bool(r.get("row")) == row]
        if not runs:
            continue
        bound_named, bound_notified = BOUNDS[kind]

        def column(key):
            values = [r[key] for r in runs]
            missed = sum(v is None for v in values)
            known = [v for v in values if v is not None]
            return known, missed

        named, missed_named = column("named")
        notified, missed_notified = column("notified")
        healthy, missed_healthy = column("healthy")
        worst = lambda values, missed: "missed" if missed else bc.fmt(max(values))  # noqa: E731
        ok = (not missed_named and max(named) <= bound_named and not missed_notified
              and max(notified) <= bound_notified and not missed_healthy and max(healthy) <= HEALTHY_BOUND)
        rows.append([f"{kind}, in a row" if row else kind, len(runs), ", ".join(sorted({r["cause"] or "?" for r in runs})),
                     f"{bc.fmt(statistics.median(named)) if named else '—'} / **{worst(named, missed_named)}**",
                     f"{bc.fmt(statistics.median(notified)) if notified else '—'} / **{worst(notified, missed_notified)}**",
                     f"{bc.fmt(statistics.median(healthy)) if healthy else '—'} / **{worst(healthy, missed_healthy)}**",
                     f"≤ {bound_named} s / ≤ {bound_notified} s / ≤ {HEALTHY_BOUND} s",
                     resolved_cell([r["resolved"] for r in runs if "resolved" in r]),
                     sum(len(r["false_named"]) for r in runs), bc.verdict(ok)])
    table = bc.table(["fault", "runs", "named as", "named (median / worst)", "notified (median / worst)",
                      "healthy again (median / worst)", "bounds", "resolved notice after the heal (median / worst)",
                      "false alarms", ""], rows)
    in_row = [r for r in out["results"] if r.get("row")]
    sequence = " → ".join(f"{r['kind']} {r['victim']}" for r in in_row[:len(ROW)])
    row_line = (f"\n\nIn a row: {len(in_row)} faults ({sequence}"
                f"{' …' if len(in_row) > len(ROW) else ''}), each applied as soon as the page showed the one before "
                f"healed; the notices that told them: {', '.join(str(r.get('event')) for r in in_row)}."
                if in_row else "")
    return (f"{table}{row_line}\n\nDefault settings (`swarm-monitor serve` with only the swarm, the model and a webhook "
            f"configured); 4 tiny-Llama servers, every block served twice, announcing every 60 s. Which check "
            f"names each kind: stop — the poll (it announces OFFLINE, then leaves the DHT; told after `left_for`, "
            f"45 s); kill and freeze — the compute checks (no answer, twice); fail — the compute checks "
            f"(the server's own error, twice); throttle — the speed probes (two slow probes); corrupt — the "
            f"correctness probe (one wrong output against the monitor's own blocks).\n\n{cost_line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--honest", type=float, default=0, help="minutes of honest churn instead of faults")
    parser.add_argument("--in-a-row", type=int, default=0, help="passes of the faults in a row, after the runs")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(bc.machine(), flush=True)
    out = run(args)
    text = report(out)
    print(text)
    if not args.no_write:
        bc.write_section("churn-honest" if args.honest else "churn", text)


if __name__ == "__main__":
    bc.run_and_exit(main)
