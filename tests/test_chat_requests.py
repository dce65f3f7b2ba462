"""Spec: the chat's own requests on the session swarm leave their rows (``RequestLog``,
``StoreRequests``): real answers through the chat's engine and the OpenAI and chat.petals.dev APIs,
read back through ``GET /api/v1/models/<prefix>/stats``; and the forecast before each request comes
from what real requests got. The statistics themselves, over rows made by hand:
``test_request_stats.py``.
"""

from __future__ import annotations

import json
import time

import pytest

from chat.engine import GenerationParams
from monitor.core.assessment import RouteHop
from monitor.core.requests import CANCELLED, OK, percentile
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.settings import ModelConfig
from support import chat_app, wait_until


@pytest.fixture(scope="module")
def chat(swarm, tiny_model, tmp_path_factory):
    with chat_app(swarm, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model)],
                  tmp_path_factory.mktemp("request-rows"), forecasts=True,  # refreshed by the specs
                  slots=1, queue_size=1, queue_timeout=5, retry_after=1) as chat:
        yield chat


def test_every_request_the_chat_serves_leaves_one_row(chat, swarm):
    engine, store, rows, app = chat
    started = time.time()
    params = GenerationParams(max_new_tokens=6)
    with engine.answer(TINY_DHT_PREFIX, [1, 2, 3], params) as answer:
        finished = list(answer)[-1]
    client = app.test_client()
    done = client.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "Hello", "max_tokens": 4})
    assert done.status_code == 200, done.get_data(as_text=True)
    assert client.post("/api/v1/generate", data={"model": TINY_DHT_PREFIX, "inputs": "Hi",
                                                 "max_new_tokens": 3}).status_code == 200
    bad = client.post("/v1/completions", json={"model": TINY_DHT_PREFIX, "prompt": "x", "max_tokens": -5})
    assert bad.status_code == 400  # the client's own mistake: no row
    with engine.answer(TINY_DHT_PREFIX, [1, 2, 3], GenerationParams(max_new_tokens=30)) as left:
        next(iter(left))  # the client leaves after its first event
    rows.flush()
    found = wait_until(lambda: [r for r in store.requests_since(started - 1, model=TINY_DHT_PREFIX)], 10)
    assert [(r.api, r.outcome) for r in found] == [("openai", OK), ("openai", OK), ("petals", OK),
                                                    ("openai", CANCELLED)], found
    first = found[0]
    assert first.tokens == finished.completion_tokens and first.time_to_first_token == finished.time_to_first_token
    assert first.route == tuple(RouteHop(hop.peer_id, hop.start, hop.end) for hop in finished.route)
    assert first.waited is not None and 0 <= first.waited < 1 and first.failovers == 0
    assert {peer for r in found[:3] for peer, _, _ in r.route} <= {swarm.peer_id(n) for n in swarm.servers}
    text = json.dumps([{**r.__dict__, "route": [list(hop) for hop in r.route],
                        "forecast": r.forecast.to_json() if r.forecast else None} for r in found])
    assert "Hello" not in text and "Hi" not in text  # no prompt, no answer
    # /metrics: the same requests as histograms of this chat process (label values bounded)
    metrics = client.get("/metrics").get_data(as_text=True)
    counted = {api: sum(1 for r in found if r.api == api and r.outcome == OK) for api in ("openai", "petals")}
    for api, count in counted.items():
        line = f'swarm_monitor_chat_requests_total{{api="{api}",model="{TINY_DHT_PREFIX}",outcome="ok"}} {float(count)}'
        assert line in metrics, line
    answered = [r.time_to_first_token for r in found if r.outcome == OK]
    count_line = f'swarm_monitor_chat_request_first_token_seconds_count{{model="{TINY_DHT_PREFIX}"}} {float(len(answered))}'
    assert count_line in metrics, count_line
    inf = f'swarm_monitor_chat_request_first_token_seconds_bucket{{le="+Inf",model="{TINY_DHT_PREFIX}"}} {float(len(answered))}'
    assert inf in metrics
    within = sum(1 for t in answered if t <= 1.0)
    assert f'swarm_monitor_chat_request_first_token_seconds_bucket{{le="1.0",model="{TINY_DHT_PREFIX}"}} {float(within)}' in metrics
    assert 'model="other"' not in metrics


def test_a_forecast_before_each_request_from_what_real_requests_got(chat):
    engine, store, rows, app = chat
    client = app.test_client()
    body = {"model": TINY_DHT_PREFIX, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6}
    before = client.post("/v1/estimate", json=body)
    assert before.status_code == 200, before.get_data(as_text=True)
    first = before.get_json()
    assert first["object"] == "estimate" and first["max_tokens"] == 6 and first["prompt_tokens"] > 0
    assert first["petals"]["served"] and first["petals"]["forecast"]["wait"] == 0.0
    hops = first["petals"]["planned_route"]  # the route it would take now, over every block
    assert hops and hops[0]["start"] == 0 and all(a["end"] == b["start"] for a, b in zip(hops, hops[1:]))
    for _ in range(6):  # real requests, then the forecast rests on them
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    rows.flush()
    engine.forecast_source.refresh()
    estimate = client.post("/v1/estimate", json=body).get_json()["petals"]
    forecast = estimate["forecast"]
    done = [r for r in store.requests_since(time.time() - 1800, model=TINY_DHT_PREFIX) if r.outcome == OK]
    # one after another, each alone on the servers: the evidence is those of them on the route the
    # router would take now, if five or more took it, else all of them
    planned = [peer for peer, _, _ in engine.admission.planned_route(TINY_DHT_PREFIX, 64)]
    assert [hop["peer_id"] for hop in estimate["planned_route"]] == planned
    same_route = [r for r in done if [peer for peer, _, _ in r.route] == planned]
    evidence = same_route if len(same_route) >= 5 else done
    assert forecast["source"] == "requests" and forecast["based_on"] == len(evidence) and len(done) >= 6
    assert forecast["tokens_per_second"] == pytest.approx(percentile([r.tokens_per_second for r in evidence], 50),
                                                          rel=1e-3)
    assert forecast["time_to_first_token"] == pytest.approx(percentile([r.time_to_first_token for r in evidence], 50),
                                                            rel=1e-3)
    low, high = forecast["tokens_per_second_range"]  # what eight in ten of the evidence got
    assert low <= forecast["tokens_per_second"] <= high
    assert [low, high] == pytest.approx([percentile([r.tokens_per_second for r in evidence], q) for q in (10, 90)],
                                        rel=1e-3)
    assert forecast["total"] == pytest.approx(forecast["wait"] + forecast["time_to_first_token"]
                                              + 5 / forecast["tokens_per_second"], rel=1e-2)
    stored = len(store.requests_since(0, model=TINY_DHT_PREFIX))
    card = client.get(f"/v1/models/{TINY_DHT_PREFIX}").get_json()["petals"]["forecast"]
    assert card["max_tokens"] == 256 and card["source"] == "requests"
    bad = client.post("/v1/estimate", json={**body, "max_tokens": -1})
    assert bad.status_code == 400 and "max_tokens" in bad.get_json()["error"]["message"]
    shown = client.get(f"/chat/forecast?model={TINY_DHT_PREFIX}&max_new_tokens=6").get_data(as_text=True)
    assert 'data-forecast-source="requests"' in shown and f"from the last {len(done)} answers" in shown
    assert " tokens/s</strong>" in shown and "6 tokens in" in shown
    assert shown.count("what 8 in 10 answers like this one got") == 2  # beside the speed and the first token
    assert "/chat/forecast" in client.get("/chat").get_data(as_text=True)  # the page asks for it before Send
    rows.flush()
    assert len(store.requests_since(0, model=TINY_DHT_PREFIX)) == stored  # estimates generate nothing, leave no row
    # the request right after an estimate keeps, in its row, the forecast the estimate told (#49)
    said = client.post("/v1/estimate", json=body).get_json()["petals"]["forecast"]
    answered = client.post("/v1/chat/completions", json=body)
    assert answered.status_code == 200 and answered.get_json()["petals"]["waited"] >= 0
    rows.flush()
    kept = store.requests_since(0, model=TINY_DHT_PREFIX)[-1].forecast
    assert kept is not None and kept.source == said["source"] and kept.based_on == said["based_on"]
    assert kept.load == said["load"] and kept.calibrated_on == said["calibrated_on"]
    for name in ("wait", "time_to_first_token", "tokens_per_second"):
        told = getattr(kept, name)
        assert told.median == pytest.approx(said[name], rel=1e-3)
        assert (list(told.range) if told.range else None) == (pytest.approx(said[f"{name}_range"], rel=1e-3)
                                                              if said[f"{name}_range"] else None)
