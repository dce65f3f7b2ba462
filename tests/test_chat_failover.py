"""Specs of the chat when servers break: answers survive a killed server, and routing learns to
avoid a slow server that petals' own routing keeps choosing."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM

from chat.engine import ChatEngine, Delta, Finished, GenerationParams
from chat.policy import PeerWeight, RoutingSettings, weights_from_outcomes
from monitor.harness.local_swarm import ServerSpec
from monitor.settings import ModelConfig
from monitor.core.snapshot import Observation, PeerHistory, ReachabilityResult
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from support import score_swarm

PROMPT = "Petals runs large language models"


def local_greedy(tiny_model, input_ids, n):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    with torch.no_grad():
        return model.generate(torch.tensor([input_ids]), max_new_tokens=n, do_sample=False)[0, len(input_ids):].tolist()


REQUEST_TIMEOUT = 8  # how long a step may wait on a server that died without closing its streams


def answer_while_killing(s, engine, ids, n, names):
    """Stream an answer; after 5 tokens kill the server serving its first span. Returns
    (name of the killed server, the Finished event), once the answer went on at once: a killed
    server's connection closes, so the next token does not wait out REQUEST_TIMEOUT (hivemind's
    stream waited for it: ``monitor.compat``)."""
    tokens_before_kill, killed, finished, gap, killed_at = 0, None, None, None, 0.0
    with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=n)) as answer:
        for event in answer:
            if isinstance(event, Delta):
                if killed is not None and gap is None:
                    gap = time.monotonic() - killed_at
                tokens_before_kill += killed is None
                if killed is None and tokens_before_kill >= 5:
                    killed = names[answer.session.route()[0].peer_id]
                    s.kill(killed)
                    killed_at = time.monotonic()
            elif isinstance(event, Finished):
                finished = event
    assert killed is not None and tokens_before_kill < n, "the server was not killed mid-answer"
    assert gap < REQUEST_TIMEOUT / 2, f"the answer waited {gap:.1f} s after the kill"
    return killed, finished


def test_killing_the_serving_server_mid_answer_does_not_break_the_answer(make_swarm, tiny_model):
    s = make_swarm([ServerSpec("a", 0, TINY_NUM_BLOCKS), ServerSpec("b", 0, TINY_NUM_BLOCKS)])
    names = {s.peer_id(n): n for n in ("a", "b")}
    outcomes = []
    engine = ChatEngine(s.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                        outcome_sink=outcomes.append, request_timeout=REQUEST_TIMEOUT)
    ids = engine.encode(TINY_DHT_PREFIX, PROMPT)

    killed, finished = answer_while_killing(s, engine, ids, 120, names)

    assert list(finished.token_ids) == local_greedy(tiny_model, ids, 120)  # complete, and correct
    survivor = "b" if killed == "a" else "a"
    assert [names[hop.peer_id] for hop in finished.route] == [survivor]
    assert any(o.peer_id == s.peer_id(killed) and not o.ok for o in outcomes), "the failure was not reported"
    assert any(o.peer_id == s.peer_id(survivor) and o.ok for o in outcomes)


def test_a_server_replaced_mid_route_hands_over_only_new_tokens_to_the_next_one(make_swarm, tiny_model):
    """petals 2.2 breaks here (petals#587): the replacement for the first hop must replay the
    prefix, and the second hop, which keeps its cache, must get only the new token."""
    s = make_swarm([ServerSpec("a1", 0, 4), ServerSpec("a2", 0, 4), ServerSpec("b", 4, TINY_NUM_BLOCKS)])
    names = {s.peer_id(n): n for n in ("a1", "a2", "b")}
    engine = ChatEngine(s.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], request_timeout=REQUEST_TIMEOUT)
    ids = engine.encode(TINY_DHT_PREFIX, PROMPT)

    killed, finished = answer_while_killing(s, engine, ids, 60, names)

    assert killed in ("a1", "a2")
    assert [names[hop.peer_id] for hop in finished.route] == ["a2" if killed == "a1" else "a1", "b"]
    assert list(finished.token_ids) == local_greedy(tiny_model, ids, 60)


def weights_from_scores(outcomes, peers, started):
    """PeerWeights as the monitor computes them: monitor.core.scores over what it saw of each peer
    since ``started`` (online at every 10 s poll, reachability checks ok: all three servers are up) and the
    chat outcomes."""
    now = time.time()
    polls = [started + i * 10 for i in range(int((now - started) // 10) + 1)]
    histories = [
        PeerHistory(
            peer,
            observations=tuple(Observation(at=t, model=TINY_DHT_PREFIX, state="ONLINE") for t in polls),
            reachability=tuple((t, ReachabilityResult(peer, "server", True, rtt=0.002)) for t in polls),
            outcomes=tuple(o for o in outcomes if o.peer_id == peer),
            first_seen=started,
        )
        for peer in peers
    ]
    scores = {peer: score.score for peer, score in score_swarm(histories, now).items()}
    return weights_from_outcomes(outcomes, scores=scores, now=now)


def answer(engine, ids, n=16) -> Finished:
    with engine.answer(TINY_DHT_PREFIX, ids, GenerationParams(max_new_tokens=n)) as events:
        return [e for e in events if isinstance(e, Finished)][0]


def test_health_aware_routing_escapes_the_slow_server_trap(make_swarm, tiny_model):
    """A 0:4, B 4:8, C 0:8 with C throttled: petals prefers C (one hop) and stays there; the
    health-aware router measures C, and routes new requests via A→B."""
    s = make_swarm([ServerSpec("A", 0, 4), ServerSpec("B", 4, 8), ServerSpec("C", 0, 8)])
    started = time.time()
    names = {s.peer_id(n): n for n in "ABC"}
    s.throttle("C", duty=0.9, period=0.5)  # stopped 90% of the time: clearly slower than A→B
    config = [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)]

    plain = ChatEngine(s.dht, config, routing=RoutingSettings(mode="default"))
    outcomes = []
    weights: dict[str, PeerWeight] = {}
    # a 10 s refresh: one ping lost under load makes petals treat a peer as 5 s away until the next one
    health = ChatEngine(s.dht, config, routing=RoutingSettings(mode="health"), score_source=lambda: weights,
                        outcome_sink=outcomes.append, client_config={"update_period": 10})
    ids = plain.encode(TINY_DHT_PREFIX, PROMPT)

    trapped = [answer(plain, ids) for _ in range(2)]
    assert all([names[h.peer_id] for h in a.route] == ["C"] for a in trapped), "petals did not pick C: no trap"

    routes = []
    for _ in range(10):
        result = answer(health, ids)
        routes.append(([names[h.peer_id] for h in result.route], result))
        weights.clear()
        weights.update(weights_from_scores(outcomes, list(names), started))
        if routes[-1][0] == ["A", "B"] and len(routes) >= 2 and routes[-2][0] == ["A", "B"]:
            break
    assert routes[0][0] == ["C"], "with no evidence the health router should route like petals"
    assert [r for r, _ in routes[-2:]] == [["A", "B"], ["A", "B"]], (
        f"routes taken: {[(r, round(a.tokens_per_second or 0, 1)) for r, a in routes]}; weights: "
        f"{ {names[p]: (w.score, w.seconds_per_token_per_block) for p, w in weights.items()} }")
    escaped = routes[-1][1]
    slow = sum(a.tokens_per_second for a in trapped) / len(trapped)
    print(f"\nslow-server trap: petals' routing via C: {slow:.1f} tokens/s; "
          f"health-aware via A→B: {escaped.tokens_per_second:.1f} tokens/s "
          f"(after {len(routes)} requests; C measured "
          f"{weights[s.peer_id('C')].seconds_per_token_per_block * 1000:.1f} ms/token/block, score "
          f"{weights[s.peer_id('C')].score:.0f})")
    assert escaped.tokens_per_second > 2 * slow


def test_the_chat_page_says_why_a_token_took_long_when_a_server_was_replaced(make_swarm, tiny_model, tmp_path):
    """The chat page's answer notes a server replaced mid-answer ("note" event), and the answer is
    whole: the page's user knows why the pause was."""
    from flask import Flask

    from chat.http import create_blueprint
    from support import read_sse, serve
    import re
    import requests

    s = make_swarm([ServerSpec("a", 0, TINY_NUM_BLOCKS), ServerSpec("b", 0, TINY_NUM_BLOCKS)])
    names = {s.peer_id(n): n for n in ("a", "b")}
    engine = ChatEngine(s.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)], request_timeout=REQUEST_TIMEOUT)
    app = Flask(__name__)
    app.secret_key = "spec"
    app.register_blueprint(create_blueprint(engine))
    with serve(app) as url:
        web = requests.Session()
        turn = web.post(f"{url}/chat/turns", data={"model": TINY_DHT_PREFIX, "message": PROMPT, "temperature": "0",
                                                    "max_new_tokens": "120"}, timeout=30)
        assert turn.status_code == 200, turn.text
        stream = re.search(r'data-chat-stream="([^"]+)"', turn.text).group(1)
        events, killed = [], None
        for event, data in read_sse(web.get(url + stream, stream=True, timeout=120)):
            events.append((event, data))
            if event == "token" and killed is None and sum(e == "token" for e, _ in events) >= 5:
                serving = [peer for peer in engine.server_load.in_flight() if peer in names]
                killed = names[serving[0]]
                s.kill(killed)
    engine.close()
    kinds = [event for event, _ in events]
    assert killed is not None and kinds.index("status") < kinds.index("token")  # the steps before the first token
    before = [data for event, data in events[:kinds.index("token")] if event == "status"]
    assert any(f"…{peer[-8:]} (blocks 0:{TINY_NUM_BLOCKS})" in text for text in before for peer in names), before
    notes = [data for event, data in events if event == "note"]
    assert notes and "failed while answering" in notes[0] and "went on through another" in notes[0], kinds
    assert kinds[-2:] == ["rendered", "done"] and "reached max new tokens" in events[-1][1]
