#!/usr/bin/env python
"""Benchmarks of ground truth: how soon a server that fails every inference step is seen, what the
generation check measures against the chat, and what the checks cost the swarm.

One run of this script, on the demo's layout (3 servers: the full span and two halves) and the
demo's settings (scrape and reachability every 10 s, speed probes every 20 s, generation checks
every 30 s), with a webhook receiver on 127.0.0.1 and the default ``model-health`` rule:

- ``chaos fail server-2`` (ONLINE, reachable, every step raises) at a random moment of the probe
  cycle: seconds until ``/api/v1/state`` says the model is degraded naming server-2 as failing,
  and until the webhook has the "degraded" notice; ``unfail``, then back to healthy (``--runs``);
- the generation check's tokens/s and first-token time against ``/v1/chat/completions`` streamed
  through the same service with the same prompt and length (the chat's own figures, client-side),
  on the same swarm, alternating;
- the checks' share of the swarm's work: a check's duration over the period, and tokens per period.

Default settings are not run (a probe period of 300 s makes one run ~10 min): their bound follows
from the same schedule and is printed from the code's own constants.

    python scripts/bench_ground_truth.py [--demo] [--runs 3] [--chats 6]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402

VICTIM, LABEL = "server-2", "server-2"  # its name in the harness, its public name (the same)


def run(args) -> dict:
    from monitor.app.service import Service
    from monitor.harness.demo_swarm import (DEMO_GENERATION_CHECK_PERIOD, DEMO_SPEED_PROBE_MAX_SHARE,
                                            DEMO_SPEED_PROBE_PERIOD, demo_expect, demo_layout, prepare_model)
    from monitor.harness.local_swarm import LocalSwarm
    from monitor.harness.webhook_receiver import WebhookReceiver
    from monitor.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-ground-truth-") as tmp, WebhookReceiver() as hook:
        data_dir = Path(tmp)
        model_path, prefix, num_blocks, name = prepare_model(data_dir, tiny=not args.demo)
        with LocalSwarm(model_path, prefix, update_period=10) as swarm:
            swarm.start(demo_layout(num_blocks, 3))
            settings = Settings(
                data_dir=data_dir, initial_peers=swarm.initial_peers, discover_models=False,
                models=[{"dht_prefix": prefix, "num_blocks": num_blocks, "path": str(model_path), "name": name,
                         "expect": demo_expect(not args.demo, "What is the capital of France?")}],
                scrape_period=10, reachability_period=10, score_period=10,
                speed_probe_period=DEMO_SPEED_PROBE_PERIOD, speed_probe_max_share=DEMO_SPEED_PROBE_MAX_SHARE,
                generation_check_period=DEMO_GENERATION_CHECK_PERIOD,
                alerts={"webhooks": [{"name": "bench", "url": hook.url}]},
            )
            svc = Service(settings).start()
            base = f"http://127.0.0.1:{svc.serve_in_thread('127.0.0.1', 0)}"
            client = svc.app.test_client()

            def report():
                state = client.get("/api/v1/state").get_json()
                return next((r for r in state.get("model_reports", ()) if r["dht_prefix"] == prefix), None)

            def named_failing():
                r = report()
                return r and r["monitor_state"] == "degraded" and any(
                    LABEL in reason and "failing" in reason for reason in r["reasons"])

            def notices(event):
                return [r for r in hook.received if r.body and r.body.get("event") == event and 200 <= r.status < 300]

            try:
                if not bc.wait(lambda: (r := report()) and r["monitor_state"] == "healthy"
                            and (r.get("generation_check") or {}).get("ok"), 300):
                    raise SystemExit(f"the model never became healthy with a generation check: {report()}")
                hold = {r.name: r for r in settings.alerts.rules_in_force(settings.scrape_period)}["model-health"].for_seconds
                runs = []
                for i in range(args.runs):
                    time.sleep(random.uniform(0, DEMO_SPEED_PROBE_PERIOD))
                    fired = len(notices("firing"))
                    failed = time.time()
                    swarm.fail(VICTIM)
                    seen = bc.wait(lambda: time.time() if named_failing() else None, 240)
                    bc.wait(lambda: len(notices("firing")) > fired, 240)
                    notice = notices("firing")[fired:]
                    swarm.unfail(VICTIM)
                    back = time.time()
                    healthy = bc.wait(lambda: time.time() if report()["monitor_state"] == "healthy" else None, 240)
                    runs.append({"dashboard": seen - failed if seen else None,
                                 "webhook": notice[0].at - failed if notice else None,
                                 "healthy": healthy - back if healthy else None})
                    print(f"  run {i + 1}: dashboard {bc.fmt(runs[-1]['dashboard'])}, webhook {bc.fmt(runs[-1]['webhook'])}, "
                          f"healthy again {bc.fmt(runs[-1]['healthy'])} after unfail", flush=True)
                    bc.wait(lambda: len(notices("resolved")) >= len(notices("firing")), 240)

                # the generation check against the chat, alternating on the same swarm
                checks, chats = [], []
                for _ in range(args.chats):
                    seen_at = time.time()
                    check = bc.wait(lambda: (c := svc.store.latest_generation_checks().get(prefix)) and c.at > seen_at
                                 and c.duration and c, DEMO_GENERATION_CHECK_PERIOD * 3)
                    if check and check.ok:
                        checks.append(check)
                    chat = bc.stream_completion(base, prefix, settings.generation_check_prompt,
                                                settings.generation_check_tokens, chat=True)
                    if chat["ok"]:
                        chats.append(chat)
                if not checks or not chats:
                    raise SystemExit(f"no figures: {len(checks)} checks, {len(chats)} chats")
                figures = {
                    "check_tps": statistics.median(c.tokens_per_second for c in checks if c.tokens_per_second),
                    "chat_tps": statistics.median(c["tokens_per_s"] for c in chats if c["tokens_per_s"]),
                    "check_ttft": statistics.median(c.time_to_first_token for c in checks if c.time_to_first_token),
                    "chat_ttft": statistics.median(c["ttft"] for c in chats if c["ttft"]),
                    "check_duration": statistics.median(c.duration for c in checks),
                    "check_tokens": statistics.median(c.tokens for c in checks),
                    "prompt_tokens": None,
                }
            finally:
                svc.close()
    return {"runs": runs, "hold": hold, "model": name, **figures, "settings": settings}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="the demo's SmolLM2-135M (default: the tiny random Llama)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chats", type=int, default=6)
    args = parser.parse_args(argv)
    from monitor.core.probes import CONFIRM_AFTER, FAILING_CONFIRMATIONS
    from monitor.core.alert_rules import DEFAULT_FOR_PERIODS
    from monitor.settings import Settings

    print(f"ground truth on the {'demo model' if args.demo else 'tiny model'}: {args.runs} runs, {bc.machine()}", flush=True)
    result = run(args)
    s = result["settings"]
    runs = result["runs"]
    dash = [r["dashboard"] for r in runs if r["dashboard"] is not None]
    hook = [r["webhook"] for r in runs if r["webhook"] is not None]
    # the schedule's worst case: the server fails just after a probe; its next probe comes a period
    # later, the confirming one CONFIRM_AFTER of a period after that, then the rediagnosis; the
    # notice waits the rule's ``for`` (DEFAULT_FOR_PERIODS scrape periods) on top, and then the
    # first evaluation after it (the rules run after every scrape: one scrape period at most)
    def bound(period, scrape):
        return period * (1 + CONFIRM_AFTER * (FAILING_CONFIRMATIONS - 1)), (DEFAULT_FOR_PERIODS + 1) * scrape
    demo_state, demo_for = bound(s.speed_probe_period, s.scrape_period)
    defaults = Settings()
    default_state, default_for = bound(defaults.speed_probe_period, defaults.scrape_period)
    ratio = result["check_tps"] / result["chat_tps"]
    share = result["check_duration"] / s.generation_check_period
    default_share = result["check_duration"] / defaults.generation_check_period
    rows = [
        ["`chaos fail server-2` → dashboard degraded, naming it failing", f"{bc.fmt(min(dash)) if dash else '—'} / "
         f"{bc.fmt(statistics.median(dash)) if dash else '—'} / {bc.fmt(max(dash)) if dash else '—'}",
         f"≤ {demo_state:.0f} s (probe schedule)", bc.verdict(bool(dash) and max(dash) <= demo_state)],
        ["→ webhook \"degraded\" notice", f"{bc.fmt(min(hook)) if hook else '—'} / {bc.fmt(statistics.median(hook)) if hook else '—'}"
         f" / {bc.fmt(max(hook)) if hook else '—'}", f"≤ {demo_state + demo_for:.0f} s (+ the rule's `for` and one "
         f"evaluation, {demo_for:.0f} s)", bc.verdict(bool(hook) and max(hook) <= demo_state + demo_for)],
        ["default settings (300 s probes, 60 s scrapes), from the same schedule", "not run",
         f"≤ {default_state:.0f} s dashboard, ≤ {default_state + default_for:.0f} s notice", "—"],
        ["generation check tokens/s vs the chat's (streamed /v1/chat/completions, same prompt and length)",
         f"{result['check_tps']:.1f} vs {result['chat_tps']:.1f} = {ratio:.2f}×", "0.8–1.2×", bc.verdict(0.8 <= ratio <= 1.2)],
        ["generation check first token vs the chat's", f"{result['check_ttft']:.2f} s vs {result['chat_ttft']:.2f} s", "—", "—"],
        ["the checks' share of the swarm's time (a check's duration / period)",
         f"{share * 100:.2f} % at {s.generation_check_period:g} s; {default_share * 100:.3f} % at the default "
         f"{defaults.generation_check_period:g} s", "a few tokens per period", "—"],
    ]
    text = (f"{result['model']}, demo layout (3 servers), {bc.machine()}; {len(runs)} runs of `chaos fail` "
            f"(min / median / max). A check generates {s.generation_check_tokens} tokens "
            f"({result['check_duration']:.2f} s median, route and prompt included).\n\n"
            + bc.table(["what", "measured", "target", ""], rows))
    print(text)
    bc.write_section("ground-truth" + ("-demo" if args.demo else ""), "## Ground truth\n\n" + text + "\n")


if __name__ == "__main__":
    main()
