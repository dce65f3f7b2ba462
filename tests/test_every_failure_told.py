"""Spec: every failure reaches the operator, whatever came before — on the session swarm (every
block served twice), watched by a poller at scaled periods (a poll, a reachability check and a
probe every 2 s; the model-health rule waiting 15 s, ``for`` and ``left_for`` alike), faults in a row:

- a server stops cleanly; the poller that saw it is replaced before the notice is due (a take-over):
  the next one tells it, as the same alert, naming the server that left;
- it restarts: one recovery; then it answers wrong: one "firing" notice naming it;
- while that alert still fires, another server fails: a "news" notice naming it (one alert per
  model used to send nothing when its cause changed);
- both healed: one recovery;
- a server refuses every session as "cache full" while announcing its whole cache free: named
  failing with that reason, routed around, and notified;
- and the contribution ledger (#50), across the take-over, credited each server its serving time
  and none of the stretches its faults were named for (``ledger_holds_what_the_harness_did``).

The pure rules (a left server's hold, a healthy model that lost a server, what a new leader
repeats) are in tests/test_alert_rules.py; a busy server is never failing in
tests/test_busy_servers.py.
"""

from __future__ import annotations

import time

import pytest

from monitor.app.jobs import Poller
from monitor.harness.tiny_model import TINY_DHT_PREFIX
from monitor.harness.webhook_receiver import WebhookReceiver
from support import sqlite_store, tiny_settings, wait_until

STOPS = CORRUPTS = "second-half"  # stopped cleanly, restarted, then corrupting
FAILS, REFUSES = "first-half", "full"
WAIT = 15  # the rule's `for` and `left_for`: the window in which the poller is replaced


def events(bodies) -> list[tuple[str, str]]:
    return [(body["event"], body["state"]) for body in bodies]


def text(body) -> str:
    return " ".join([body["summary"], *body["details"]])


def prove_and_subscribe(store, swarm, name: str, url: str) -> None:
    """The owner of server ``name`` proves it with the server's own identity file (its key's
    signature over the statement, as ``swarm-monitor-client prove`` makes it; the HTTP side is
    tests/test_owners.py) and subscribes ``url``."""
    from monitor.core.ownership import Claim, check
    from monitor.store import owners
    from support import owner_signature

    peer, now = swarm.peer_id(name), time.time()
    with store.db.write("a spec's owner") as conn:
        nonce, expires = owners.issue_nonce(conn, peer, "127.0.0.1", now)
        claim = Claim("http://monitor.test", peer, nonce, int(expires))
        key, signature = owner_signature(swarm.workdir / f"{name}.id", claim)
        check(claim, key, signature, origin="http://monitor.test", now=now, nonce_peer=owners.spend_nonce(conn, nonce, now))
        owner, _ = owners.link(conn, None, peer, now)
        owners.subscribe(conn, owner, url, now)


def ledger_holds_what_the_harness_did(store, faults: dict, poll: float, warmup: float) -> None:
    """The contribution ledger (#50) over the run, across the take-over: each server earned no
    serving time from when a notice named it until the harness healed it, and all of it but the
    stretches from each fault until the notice that told it healthy again (and the start, before
    the model was first assessed healthy); the corrupting server nothing verified while it answered
    wrong; nobody more verified than serving, nor serving than announced."""
    by_name: dict = {}
    for c in store.contributions(None):
        by_name.setdefault(c.name, []).append(c)  # (a restart keeps its identity; summed either way)
    for name, stretches in faults.items():
        found = by_name[name]
        watched = sum(c.watched_hours for c in found) * 3600
        serving = sum((c.uptime or 0.0) * c.watched_hours for c in found) * 3600
        verified = sum(c.verified_block_hours for c in found)
        assert verified <= sum(c.serving_block_hours for c in found) + 1e-9
        assert sum(c.serving_block_hours for c in found) <= sum(c.announced_block_hours for c in found) + 1e-9
        surely_out = sum(healed - named for _, named, healed, _ in stretches)
        at_most_out = sum(told - faulted for faulted, _, _, told in stretches)
        assert watched - serving >= surely_out - 2 * poll, (name, watched, serving, stretches)
        assert watched - serving <= at_most_out + warmup + 2 * poll, (name, watched, serving, stretches)
    wrong_from, healed = faults[CORRUPTS][1][1], faults[CORRUPTS][1][2]  # the corrupting stretch, once named
    corrupting = by_name[CORRUPTS]
    watched = sum(c.watched_hours for c in corrupting) * 3600
    assert sum(c.verified_block_hours for c in corrupting) * 3600 <= 4 * (watched - (healed - wrong_from) + 2 * poll)


@pytest.mark.timeout(900)
def test_every_failure_in_a_row_is_told_across_a_take_over_and_while_another_fires(swarm, tiny_model, tmp_path):
    with WebhookReceiver() as ops, WebhookReceiver() as owner_fails, WebhookReceiver() as owner_refuses:
        settings = tiny_settings(
            swarm, tmp_path, tiny_model, scrape_period=2, reachability_period=2, reachability_timeout=2,
            speed_probe_period=2, speed_probe_max_share=0.5, speed_probe_timeout=10, score_period=600,
            alerts={"check_period": 1, "default_rules": False, "webhooks": [{"name": "ops", "url": ops.url}],
                    "owner_webhooks_private": True,  # (the owners' receivers are on 127.0.0.1)
                    "rules": [{"name": "model-health", "kind": "model_degraded", "for": WAIT, "left_for": WAIT}]})
        store = sqlite_store(tmp_path)
        owned = {FAILS: owner_fails, REFUSES: owner_refuses}
        for name, receiver in owned.items():  # each server's owner proves it with its identity file, subscribes
            prove_and_subscribe(store, swarm, name, receiver.url)
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        started = time.time()
        faults: dict[str, list] = {}  # server -> [(faulted, named by a notice, healed, told healthy)], from the harness and notices
        try:
            assert wait_until(lambda: (store.latest_assessments().get(TINY_DHT_PREFIX) is not None and
                                       store.latest_assessments()[TINY_DHT_PREFIX].state == "healthy"), 90)
            warmup = time.time() - started  # (until the model is first assessed healthy, a server may not be serving)

            # a clean stop, seen by one poller, told by the next one (a take-over before its notice)
            stopped = time.time()
            swarm.stop(STOPS)
            assert wait_until(lambda: ("model-health", TINY_DHT_PREFIX) in store.alerts(), 60), store.alerts()
            pending = store.alerts()[("model-health", TINY_DHT_PREFIX)]
            assert pending.status == "pending" and {(c.name, c.why) for c in pending.causes} == {(STOPS, "left")}
            poller.shutdown()
            taken_over = time.time()
            poller = Poller(settings, store, swarm.dht)
            poller.start()
            [fired] = ops.wait_for(1, 90)
            assert events([fired]) == [("firing", "degraded")] and ops.received[0].at > taken_over, fired
            assert f"{STOPS} left (OFFLINE, or gone from the DHT)" in text(fired), fired
            assert fired["since"] == pending.since  # the same alert, carried over

            restarted = time.time()
            swarm.restart(STOPS)  # back: the recovery
            [*_, resolved] = ops.wait_for(2, 120)
            assert events([resolved]) == [("resolved", "ok")], resolved
            faults[STOPS] = [(stopped, ops.received[0].at, restarted, ops.received[1].at)]

            corrupted_at = time.time()
            swarm.corrupt(CORRUPTS)  # the restarted server answers wrong
            [*_, corrupted] = ops.wait_for(3, 120)
            assert events([corrupted]) == [("firing", "degraded")], corrupted
            assert f"{CORRUPTS}" in text(corrupted) and "wrong" in text(corrupted), corrupted

            failed_at = time.time()
            swarm.fail(FAILS)  # while the alert fires for the first, a second server fails: news
            [*_, news] = ops.wait_for(4, 120)
            assert events([news]) == [("news", "degraded")], news
            assert news["summary"] == f"{TINY_DHT_PREFIX} is degraded: now also {FAILS} is failing", news

            healed = time.time()
            swarm.unfail(FAILS)
            swarm.uncorrupt(CORRUPTS)
            [*_, resolved] = ops.wait_for(5, 120)
            assert events([resolved]) == [("resolved", "ok")], resolved
            faults[STOPS].append((corrupted_at, ops.received[2].at, healed, ops.received[4].at))  # (CORRUPTS)
            faults[FAILS] = [(failed_at, ops.received[3].at, healed, ops.received[4].at)]

            refused_at = time.time()
            swarm.refuse(REFUSES)  # every session refused as "cache full", its whole cache announced free
            [*_, refusing] = ops.wait_for(6, 120)
            assert events([refusing]) == [("firing", "degraded")], refusing
            assert any(REFUSES in line and "refuses every session as cache full while announcing room" in line
                       for line in refusing["details"]), refusing
            assessment = store.latest_assessments()[TINY_DHT_PREFIX]
            peer = next(p for p, s in assessment.servers.items() if s.failing and "refuses every session" in s.failing)
            assert assessment.excluded_causes[peer] == "failing"  # routed around, as every failing server

            unrefused = time.time()
            swarm.unrefuse(REFUSES)
            ops.wait_for(7, 120)
            assert events(ops.accepted()) == [
                ("firing", "degraded"), ("resolved", "ok"), ("firing", "degraded"), ("news", "degraded"),
                ("resolved", "ok"), ("firing", "degraded"), ("resolved", "ok")], ops.accepted()
            faults[REFUSES] = [(refused_at, ops.received[5].at, unrefused, ops.received[6].at)]
            ledger_holds_what_the_harness_did(store, faults, settings.scrape_period, warmup)
            # each owner heard of their own server's troubles, and of nobody else's alone (#50)
            assert events(owner_fails.wait_for(2, 60)) == [("news", "degraded"), ("resolved", "ok")]
            assert FAILS in text(owner_fails.accepted()[0])
            assert events(owner_refuses.wait_for(2, 60)) == [("firing", "degraded"), ("resolved", "ok")]
            assert REFUSES in text(owner_refuses.accepted()[0])  # (the others named in its reasons, not told to them)
        finally:
            swarm.unfail(FAILS)
            swarm.uncorrupt(CORRUPTS)
            swarm.unrefuse(REFUSES)
            poller.shutdown()
            store.close()
