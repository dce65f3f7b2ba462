#!/usr/bin/env python
"""A plain petals user's script: load a model, optionally ``route_with`` a monitor, generate.

    .venv/bin/python scripts/plain_petals.py --path DIR --peer MADDR [--monitor URL] [--requests 4] [--tokens 16]

Nothing of the monitor's service runs in this process but ``swarm_monitor_client``: petals' own
``AutoDistributedModelForCausalLM`` and greedy ``generate``. Two lines are this machine's, not a
user's: ``monitor.compat`` (petals 2.2 on our hivemind 1.1.12; a user's petals brings its own
hivemind) and the DHT kept on loopback (hivemind's defaults would also try NAT port mapping and
relays). Prints a JSON line per request: the tokens, the route petals logged for each inference
session, the steps petals retried after a server failed, time to first token and tokens/s; and a
line ``token`` per generated token as it comes (``--progress``), for a caller that acts mid-answer.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path


class Routes(logging.Handler):
    """petals' own log lines: "Route found: 0:4 via …abc123 => …", and its retries after a failure."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.routes: list[str] = []
        self.retries = 0

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Route found:"):
            self.routes.append(message.split(":", 1)[1].strip())
        elif "Caught exception" in message or "retry in" in message:
            self.retries += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", required=True, help="the model's local client files (config, tokenizer, embeddings)")
    parser.add_argument("--peer", action="append", required=True, help="an initial peer's multiaddr")
    parser.add_argument("--monitor", help="route_with this monitor (its base URL); petals' own routing without")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompt", default="A quick brown fox")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from monitor import compat  # noqa: F401  (this machine: petals 2.2 on hivemind 1.1.12)

    import hivemind
    import torch
    from petals import AutoDistributedModelForCausalLM
    from petals.client.routing import sequence_manager
    from transformers import AutoTokenizer

    from bench_common import TokenTimes  # (this folder: a streamer that notes each token's time)

    # this machine: every DHT on loopback only (petals' client makes its own with hivemind's defaults)
    class LoopbackDHT(hivemind.DHT):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False,
                             use_relay=False, use_auto_relay=False)

    sequence_manager.DHT = LoopbackDHT
    routes = Routes()
    logging.getLogger("petals").addHandler(routes)
    logging.getLogger("petals").setLevel(logging.INFO)

    config = json.loads((Path(args.path) / "config.json").read_text())
    model = AutoDistributedModelForCausalLM.from_pretrained(args.path, initial_peers=args.peer, torch_dtype=torch.float32,
                                                            dht_prefix=config.get("dht_prefix"))
    view = None
    if args.monitor:
        from swarm_monitor_client import route_with

        started = time.perf_counter()
        view = route_with(model, args.monitor)
        print(json.dumps({"route_with_seconds": time.perf_counter() - started, "routed": view is not None}), flush=True)
    tokenizer = AutoTokenizer.from_pretrained(args.path)
    input_ids = torch.tensor([tokenizer(args.prompt).input_ids])

    for _ in range(args.requests):
        streamer = TokenTimes(on_token=(lambda: print("token", flush=True)) if args.progress else None)
        times = streamer.times

        seen_routes, seen_retries = len(routes.routes), routes.retries
        gc.disable()  # petals closes sessions in __del__: collected here, after generating (bench_chat.py)
        started = time.perf_counter()
        try:
            output = model.generate(input_ids, max_new_tokens=args.tokens, do_sample=False, streamer=streamer)
            error = None
        except Exception as e:  # noqa: BLE001 - a failed request is a result
            output, error = None, repr(e)[:300]
        end = time.perf_counter()
        gc.enable()
        gc.collect()
        tokens = output[0, input_ids.shape[1]:].tolist() if output is not None else []
        first = times[0] if times else end
        print(json.dumps({
            "ok": error is None, "error": error, "tokens": tokens, "routes": routes.routes[seen_routes:],
            "retries": routes.retries - seen_retries, "ttft": first - started,
            "tokens_per_s": (len(tokens) - 1) / (end - first) if len(tokens) > 1 and end > first else None,
            "weights": len(view()) if view is not None else None,
        }), flush=True)
    if view is not None:
        view.close()
    for module in model.modules():  # petals' own DHT process (and its p2pd) ends with the script
        manager = getattr(module, "sequence_manager", None)
        if manager is not None:
            manager.shutdown()
            manager.dht.shutdown()
            break


if __name__ == "__main__":
    main()
