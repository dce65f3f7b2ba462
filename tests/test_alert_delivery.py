"""Specs of alert deliveries, with a real SQLite store and a real webhook receiver on 127.0.0.1
(conftest's ``receiver``): retries with backoff, giving up, redirects and slow receivers, order,
a peer's wrong outputs, the alert tables and their pruning, the scheduler's shutdown; the alerts
page, API and overview; and the Prometheus rules reading only metrics the monitor exposes.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import sqlalchemy as sa

from monitor.app.alerter import Alerter, backoff
from monitor.core.alert_rules import RESOLVED
from monitor.core.snapshot import ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.harness.webhook_receiver import WebhookReceiver
from support import ALERT_MODEL, ALERT_PEER, alert_settings, fire_degraded, migrated_store, record_state


# ---- deliveries --------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}") as s:
        yield s


def test_a_failing_receiver_is_retried_with_backoff_and_gets_the_notice_once(store, receiver, tmp_path):
    receiver.plan[:] = [500, 503]
    now = time.time()
    alerter = fire_degraded(store, alert_settings(tmp_path, receiver.url), now)
    assert alerter.deliver(now) == {"delivered": 0, "retry": 1, "failed": 0}
    assert alerter.deliver(now + 5) == {"delivered": 0, "retry": 0, "failed": 0}  # not due for 10 s
    assert alerter.deliver(now + 10) == {"delivered": 0, "retry": 1, "failed": 0}  # then 20 s
    assert alerter.deliver(now + 25) == {"delivered": 0, "retry": 0, "failed": 0}
    assert alerter.deliver(now + 30) == {"delivered": 1, "retry": 0, "failed": 0}
    assert alerter.deliver(now + 100) == {"delivered": 0, "retry": 0, "failed": 0}
    assert [r.status for r in receiver.received] == [500, 503, 200]
    assert len({r.body["id"] for r in receiver.received}) == 1  # one notice, three attempts
    [delivery] = store.alert_deliveries()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 3, None)
    assert [backoff(n, 10) for n in (1, 2, 3, 9, 20)] == [10, 20, 40, 2560, 3600]


def test_a_receiver_that_keeps_failing_is_given_up_and_shown_to_operators(store, receiver, tmp_path):
    from monitor.web import create_app

    receiver.plan[:] = [500] * 10
    settings = alert_settings(tmp_path, receiver.url, max_attempts=2, retry_backoff=1)
    now = time.time()
    alerter = fire_degraded(store, settings, now)
    alerter.deliver(now)
    assert alerter.deliver(now + 1) == {"delivered": 0, "retry": 0, "failed": 1}
    assert alerter.deliver(now + 100) == {"delivered": 0, "retry": 0, "failed": 0}
    assert len(receiver.received) == 2
    [failed] = store.alert_deliveries(status="failed")
    assert failed.attempts == 2 and failed.last_error.startswith("HTTP 500")

    client = create_app(settings, store).test_client()
    overview = client.get("/").get_data(as_text=True)
    assert "1 alert notice\n  could not be delivered" in overview and "Active alerts" in overview
    page = client.get("/alerts").get_data(as_text=True)
    assert "Notices that could not be delivered" in page and "(operators see why)" in page
    assert "HTTP 500" not in page and receiver.url not in page
    anonymous = client.get("/api/v1/alerts").get_json()
    assert anonymous["deliveries"] == {"hook-1": {"pending": 0, "delivered": 0, "failed": 1}}
    assert "last_error" not in anonymous["events"][0]["deliveries"][0]
    token = client.application.extensions["operator_token"]
    operator = client.get("/api/v1/alerts", headers={"Authorization": f"Bearer {token}"}).get_json()
    assert operator["events"][0]["deliveries"][0]["last_error"].startswith("HTTP 500")
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'swarm_monitor_alert_deliveries{status="failed",webhook="hook-1"} 1.0' in metrics
    assert re.search(r'swarm_monitor_alert\{kind="model_degraded",rule="model-health",severity="warning",'
                     r'status="firing",subject="llama"\} 1\.0', metrics)


def test_redirects_are_not_followed_and_slow_receivers_time_out(store, tmp_path):
    with WebhookReceiver() as target, WebhookReceiver(redirect_to="") as mover, WebhookReceiver(delay=3) as slow:
        mover.redirect_to = target.url
        now = time.time()
        alerter = fire_degraded(store, alert_settings(tmp_path, mover.url, slow.url), now)
        started = time.monotonic()
        alerter.deliver(now)
        assert time.monotonic() - started < 2 * 2 + 2  # each webhook's 2 s timeout, not more
    assert target.received == [] and [r.status for r in mover.received] == [302]
    errors = {d.webhook: d.last_error for d in store.alert_deliveries()}
    assert errors["hook-1"] == "HTTP 302: the webhook redirects elsewhere (not followed; set its final URL)"
    assert errors["hook-2"] == "no answer within 2 s"


def test_a_later_notice_never_overtakes_an_earlier_one(store, receiver, tmp_path):
    receiver.plan[:] = [503]
    now = time.time()
    alerter = fire_degraded(store, alert_settings(tmp_path, receiver.url), now)
    alerter.deliver(now)  # the firing notice fails: retry in 10 s
    record_state(store, now + 1, "healthy")
    assert [n.event for n in alerter.evaluate(now + 1).notices] == [RESOLVED]
    assert alerter.deliver(now + 2) == {"delivered": 0, "retry": 0, "failed": 0}  # waits behind the firing one
    alerter.deliver(now + 10)
    assert [r.body["event"] for r in receiver.received] == ["firing", "firing", "resolved"]


def test_a_peer_the_correctness_probes_judge_wrong_fires_its_rule_until_a_correct_verdict(store, receiver, tmp_path):
    from monitor.core.probes import CORRECT, WRONG as WRONG_VERDICT, ServerProbe

    settings = alert_settings(tmp_path, receiver.url, default_rules=False,
                              rules=[{"name": "a-wrong", "kind": "peer_wrong_outputs", "peers": ["a"], "for": 0}])
    now = time.time()
    alerter = Alerter(settings, store, watching_since=now - 100)
    record_state(store, now, "healthy")
    assert alerter.evaluate(now).notices == ()

    def verdict(at: float, value: str) -> ServerProbe:
        return ServerProbe(peer_id=ALERT_PEER, model="llama", start=0, end=4, at=at, ok=True, seconds_per_token=0.1,
                           verdict=value, error_ratio=0.93 if value == WRONG_VERDICT else 1e-6, tolerance=0.0016,
                           checked_against="peers")

    def assessed_poll(at: float) -> None:  # as the poller stores a poll: with its assessment of the probes
        from monitor.app.assessing import assess_poll

        snapshot = Snapshot(taken_at=at, duration=1.0, models=(ALERT_MODEL,), servers=(
            ServerRow(peer_id=ALERT_PEER, model="llama", start=0, end=4, state="ONLINE", public_name="a"),))
        store.record_poll(snapshot, assess_poll(store, settings, snapshot, {}, now=at))

    store.record_server_probes([verdict(now + 1, WRONG_VERDICT)])
    assessed_poll(now + 2)
    [fired] = alerter.evaluate(now + 2).notices
    assert fired.summary == "peer a returns wrong outputs in correctness probes"
    assert "relative error 0.93" in fired.details[0]
    store.record_server_probes([verdict(now + 3, CORRECT)])
    assessed_poll(now + 4)
    [resolved] = alerter.evaluate(now + 4).notices
    assert resolved.summary == "peer a passes correctness probes again"


def test_the_alert_tables_match_the_models_and_old_notices_are_pruned(store, receiver, tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from monitor.store import metadata

    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert [d for d in diffs if "alert" in repr(d)] == []
    now = time.time()
    alerter = fire_degraded(store, alert_settings(tmp_path, receiver.url), now)
    alerter.deliver(now)
    assert store.prune_alerts(now - 1) == {"alert_events": 0, "alert_deliveries": 0}
    assert store.prune_alerts(now + 1) == {"alert_events": 1, "alert_deliveries": 1}
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM alerts")).scalar() == 1  # the alert itself stays


def test_a_runner_running_the_alert_jobs_shuts_down_while_rounds_end(store, tmp_path):
    """Regression: waking a job from the after-round listener (``modify_job``) deadlocked with
    ``shutdown``, which holds the job stores' lock while it waits for the thread of the round. The
    alert jobs as the table has them (every period, and after each scrape and reachability round)."""
    from monitor.app.job_context import JobContext, JobStats
    from monitor.app.job_table import BY_NAME, Every, Job
    from monitor.app.runner import Runner, with_db_retry

    stats = JobStats()
    record_state(store, time.time(), "healthy")
    for _ in range(10):
        rounds = [Job(name, "a round", lambda ctx: time.sleep(0.01), (Every(lambda s: 0.02),))
                  for name in ("scrape", "reachability")]
        ctx = JobContext(settings=alert_settings(tmp_path), store=store, stats=stats,
                         db=lambda call, job: with_db_retry(stats, call, job), assess_step=lambda ctx: False)
        runner = Runner(ctx, rounds + [BY_NAME["alerts"], BY_NAME["alert-delivery"]])
        runner.start()
        time.sleep(0.3)
        done = threading.Thread(target=runner.shutdown)
        done.start()
        done.join(15)
        assert not done.is_alive(), "the runner did not shut down"
        assert ctx.alerter.stopping()
    assert stats.runs["alerts"] >= 10 and not stats.failures


# ---- the web -----------------------------------------------------------------------------------


def test_the_alerts_page_api_and_overview_show_active_alerts_and_history(store, receiver, tmp_path):
    from monitor.web import create_app

    settings = alert_settings(tmp_path, receiver.url)
    client = create_app(settings, store).test_client()
    assert "The poller has not evaluated the rules yet" in client.get("/alerts").get_data(as_text=True)
    now = time.time()
    alerter = fire_degraded(store, settings, now)
    alerter.deliver(now)

    overview = client.get("/").get_data(as_text=True)
    assert 'href="/alerts"' in overview  # the nav link
    assert "Active alerts" in overview and "Llama 2 (llama) is degraded" in overview
    page = client.get("/alerts").get_data(as_text=True)
    assert 'data-alert="model-health/llama" data-status="firing"' in page
    assert 'data-event="firing"' in page and "hook-1: delivered" in page
    assert 'data-rule="monitor-stale"' in page and receiver.url not in page
    assert "has not evaluated the rules" not in page and "rules evaluated" in page
    partial = client.get("/alerts", headers={"HX-Request": "true", "HX-Target": "alerts-live"}).get_data(as_text=True)
    assert "<html" not in partial and 'data-alert="model-health/llama"' in partial
    api = client.get("/api/v1/alerts").get_json()
    assert [(a["rule"], a["status"], a["state"]) for a in api["active"]] == [("model-health", "firing", "degraded")]
    assert [(e["event"], e["deliveries"][0]["status"]) for e in api["events"]] == [("firing", "delivered")]
    assert {r["name"] for r in api["rules"]} == {"model-health", "bootstrap-down", "monitor-stale"}
    assert client.get("/api/v1/alerts?since=yesterday").status_code == 400
    assert client.get("/alerts?hours=5").status_code == 400

    record_state(store, now + 1, "healthy")
    alerter.evaluate(now + 1)
    assert "Active alerts" not in client.get("/").get_data(as_text=True)


# ---- Prometheus --------------------------------------------------------------------------------


def test_the_prometheus_rules_use_only_metrics_the_monitor_exposes(store, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.prometheus import rules_path
    from monitor.web import create_app

    settings = alert_settings(tmp_path, "http://127.0.0.1:9/unused")
    now = time.time()
    fire_degraded(store, settings, now)
    Alerter(settings, store).deliver(now)
    boot = "/ip4/127.0.0.1/tcp/1/p2p/QmBootstrapPeer000000000000000000000000000001"
    store.record_reachability(ReachabilityBatch(now, 0.1, (ReachabilityResult(boot.rsplit("/", 1)[1], "bootstrap", False, address=boot),)))
    client = create_app(settings.model_copy(update={"initial_peers": [boot]}), store).test_client()
    exposed = {f.name for f in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))}
    used = set(re.findall(r"\b(swarm_monitor_[a-z0-9_]+)", rules_path().read_text()))
    assert used and used <= exposed, used - exposed
