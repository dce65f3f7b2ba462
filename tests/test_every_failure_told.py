"""Spec: every failure reaches the operator, whatever came before — on the session swarm (every
block served twice), watched by a poller at scaled periods (a poll, a reachability check and a
probe every 2 s; the model-health rule at its default ``for`` of two scrape periods, 4 s).

- a server fails: one "firing" notice naming it;
- while that alert still fires, another server answers wrong: a "news" notice naming it (one alert
  per model used to send nothing when its cause changed);
- both healed: one recovery;
- a server refuses every session as "cache full" while announcing its whole cache free: named
  failing with that reason, and notified.

The pure rules (a left server's hold, a healthy model that lost a server, what a new leader
repeats) are in tests/test_alert_rules.py; a busy server is never failing in
tests/test_busy_servers.py.
"""

from __future__ import annotations

import pytest

from monitor.app.jobs import Poller
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.harness.webhook_receiver import WebhookReceiver
from support import sqlite_store, tiny_settings, wait_until

FAILS, CORRUPTS, REFUSES = "first-half", "second-half", "full"


def events(bodies) -> list[tuple[str, str]]:
    return [(body["event"], body["state"]) for body in bodies]


@pytest.mark.timeout(600)
def test_a_second_failure_while_the_alert_fires_is_news_and_a_server_refusing_every_session_is_named(
        swarm, tiny_model, tmp_path):
    with WebhookReceiver() as ops:
        settings = tiny_settings(
            swarm, tmp_path, tiny_model, scrape_period=2, reachability_period=2, reachability_timeout=2,
            speed_probe_period=2, speed_probe_max_share=0.5, speed_probe_timeout=10, score_period=600,
            alerts={"check_period": 1, "default_rules": False, "webhooks": [{"name": "ops", "url": ops.url}],
                    "rules": [{"name": "model-health", "kind": "model_degraded"}]})
        store = sqlite_store(tmp_path)
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: (store.latest_assessments().get(TINY_DHT_PREFIX) is not None and
                                       store.latest_assessments()[TINY_DHT_PREFIX].state == "healthy"), 90)

            swarm.fail(FAILS)
            [fired] = ops.wait_for(1, 90)
            assert events([fired]) == [("firing", "degraded")], fired
            assert any(FAILS in line and "failing" in line for line in fired["details"]), fired

            swarm.corrupt(CORRUPTS)  # the alert still fires for the first: the second is news
            [_, news] = ops.wait_for(2, 120)
            assert events([news]) == [("news", "degraded")], news
            assert news["summary"] == f"{TINY_DHT_PREFIX} is degraded: now also {CORRUPTS} returns wrong outputs", news

            swarm.unfail(FAILS)
            swarm.uncorrupt(CORRUPTS)
            [*_, resolved] = ops.wait_for(3, 120)
            assert events([resolved]) == [("resolved", "ok")], resolved

            swarm.refuse(REFUSES)  # every session refused as "cache full", its whole cache announced free
            [*_, refusing] = ops.wait_for(4, 120)
            assert events([refusing]) == [("firing", "degraded")], refusing
            assert any(REFUSES in line and "refuses every session as cache full while announcing room" in line
                       for line in refusing["details"]), refusing
            assessment = store.latest_assessments()[TINY_DHT_PREFIX]
            peer = next(p for p, s in assessment.servers.items() if s.failing and "refuses every session" in s.failing)
            assert assessment.excluded_causes[peer] == "failing"  # routed around, as every failing server

            swarm.unrefuse(REFUSES)
            [*_, back] = ops.wait_for(5, 120)
            assert events(ops.accepted()) == [("firing", "degraded"), ("news", "degraded"), ("resolved", "ok"),
                                              ("firing", "degraded"), ("resolved", "ok")], ops.accepted()
        finally:
            swarm.unfail(FAILS)
            swarm.uncorrupt(CORRUPTS)
            swarm.unrefuse(REFUSES)
            poller.shutdown()
            store.close()
