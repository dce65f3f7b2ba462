"""Specs of the ``alertmanager`` webhook against a real Alertmanager (Debian's
``prometheus-alertmanager``, on 127.0.0.1) that takes the alert, lists it through its own API,
keeps it while it is re-sent, and resolves it — and tells its own receiver so. What is pushed to
``POST /api/v2/alerts`` (stable labels, annotations, ``startsAt``/``endsAt``, ``generatorURL``):
``test_alert_rules.py``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from monitor.app.alerter import Alerter
from monitor.core.alert_rules import CHANGED, FIRED, RESOLVED
from monitor.core.assessment import Assessment, Recommendation
from monitor.core.snapshot import ModelInfo, ServerRow, Snapshot
from monitor.harness.webhook_receiver import WebhookReceiver
from monitor.settings import Settings
from monitor.store import Store
from support import free_port, sqlite_store, unix_seconds, wait_until

PEER = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"


# ---- a real Alertmanager ---------------------------------------------------------------------------


def alertmanager_binary() -> str:
    path = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if path is None:
        pytest.fail("prometheus-alertmanager is missing: install Debian's prometheus-alertmanager package "
                    "(scripts/system-deps does)", pytrace=False)
    return path


@pytest.fixture
def alertmanager(tmp_path):
    """(API base URL, the receiver it notifies): a real Alertmanager on 127.0.0.1 with its own
    webhook receiver (group_wait 1 s, resolved notifications on), stopped after by its PID."""
    with WebhookReceiver() as receiver:
        port = free_port()
        config = tmp_path / "alertmanager.yml"
        config.write_text(f"""
route:
  receiver: hook
  group_by: ['alertname', 'subject']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {receiver.url}
        send_resolved: true
""")
        storage = tmp_path / "alertmanager-data"
        storage.mkdir()
        log = open(tmp_path / "alertmanager.log", "w")
        process = subprocess.Popen([alertmanager_binary(), f"--web.listen-address=127.0.0.1:{port}",
                                    "--cluster.listen-address=", f"--config.file={config}",
                                    f"--storage.path={storage}"], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            def ready():
                if process.poll() is not None:
                    raise RuntimeError(f"alertmanager exited: {(tmp_path / 'alertmanager.log').read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                        return response.status == 200
                except OSError:
                    return False

            assert wait_until(ready, 60), (tmp_path / "alertmanager.log").read_text()[-2000:]
            yield base, receiver
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            log.close()


def listed(base: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=10) as response:
        return [a for a in json.loads(response.read()) if a["labels"].get("source") == "petals-swarm-monitor"]


MODEL = ModelInfo("llama", 4, name="Llama 2", official=True)


def record(store: Store, at: float, state: str) -> None:
    health = Assessment(model="llama", state=state, reasons=() if state == "healthy" else ("blocks 0:4 have one server",),
                         coverage_pct=100.0, servers_online=1, min_redundancy=1, blocks=(), missing_ranges=(),
                         single_served_ranges=(), bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=2.0,
                         route=(), recommendation=Recommendation(0, 4, 4, "--block_indices 0:4", "redundancy"))
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=(
        ServerRow(peer_id=PEER, model="llama", start=0, end=4, state="ONLINE", public_name="a"),)), [health])


@pytest.mark.timeout(300)
def test_a_real_alertmanager_takes_the_alert_keeps_it_while_resent_and_resolves_it(alertmanager, tmp_path):
    base, am_receiver = alertmanager
    settings = Settings(data_dir=tmp_path, scrape_period=60, initial_peers=[], alerts={
        "dashboard_url": "http://127.0.0.1:8080", "alertmanager_resend": 10,
        "rules": [{"name": "model-health", "kind": "model_degraded", "for": 0}],
        "webhooks": [{"name": "am", "url": base, "format": "alertmanager"}]})
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    try:
        now = time.time()
        alerter = Alerter(settings, store, watching_since=now - 100)
        record(store, now, "degraded")
        assert [n.event for n in alerter.evaluate(now).notices] == [FIRED]
        assert alerter.deliver(now) == {"delivered": 1, "retry": 0, "failed": 0}
        [alert] = listed(base)
        assert alert["labels"] == {"alertname": "PetalsModelDegraded", "severity": "warning", "rule": "model-health",
                                   "kind": "model_degraded", "subject": "llama", "model": "llama",
                                   "source": "petals-swarm-monitor"}
        assert alert["annotations"]["summary"] == "Llama 2 (llama) is degraded: blocks 0:4 have one server"
        assert alert["annotations"]["dashboard_url"] == "http://127.0.0.1:8080/models/llama"
        assert alert["generatorURL"] == "http://127.0.0.1:8080/models/llama"
        assert alert["status"]["state"] == "active" and abs(unix_seconds(alert["startsAt"]) - now) < 1
        first_end = unix_seconds(alert["endsAt"])
        assert 39 < first_end - now <= 41  # four re-sends ahead
        [notified] = am_receiver.wait_for(1, 30)
        assert notified["status"] == "firing" and notified["alerts"][0]["labels"]["rule"] == "model-health"

        # while it fires, it is re-sent: Alertmanager keeps it (its endsAt moves on)
        time.sleep(1)
        later = time.time()
        alerter.deliver(later)
        assert alerter.deliver(later + 1) == {"delivered": 0, "retry": 0, "failed": 0}
        assert wait_until(lambda: (found := listed(base)) and unix_seconds(found[0]["endsAt"]) > first_end, 10)
        alerter.deliver(later + 11)
        assert unix_seconds(listed(base)[0]["endsAt"]) >= later + 11 + 39

        # broken: the warning alert is resolved, a critical one fires
        record(store, time.time(), "broken")
        assert [n.event for n in alerter.evaluate(time.time()).notices] == [CHANGED]
        alerter.deliver(time.time())
        def only_one():
            found = listed(base)
            return len(found) == 1 and found

        assert [a["labels"]["severity"] for a in wait_until(only_one, 10) or listed(base)] == ["critical"]

        # resolved: Alertmanager no longer lists it as active and tells its receiver
        record(store, time.time(), "healthy")
        assert [n.event for n in alerter.evaluate(time.time()).notices] == [RESOLVED]
        assert alerter.deliver(time.time())["delivered"] == 1
        assert wait_until(lambda: not [a for a in listed(base) if a["status"]["state"] == "active"], 15), listed(base)
        resolved = wait_until(lambda: [b for b in am_receiver.accepted() if b["status"] == "resolved"
                                       and any(a["labels"]["severity"] == "critical" for a in b["alerts"])], 30)
        assert resolved, am_receiver.accepted()
        assert resolved[0]["alerts"][0]["labels"]["alertname"] == "PetalsModelDegraded"
    finally:
        store.close()



OTHER = "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


def record_servers(store: Store, at: float, causes: dict) -> None:
    """A poll of two servers of llama, each with the cause its assessment gives it (confirmed)."""
    from dataclasses import replace

    from monitor.core.assess import lost_servers
    from monitor.core.assessment import ServerAssessment

    bad = {peer: cause for peer, cause in causes.items() if cause != "serving"}
    health = replace(
        Assessment.not_diagnosed("llama", 4, "unused"), state="degraded" if bad else "healthy",
        reasons=tuple(f"{peer[-6:]} is {cause}" for peer, cause in bad.items()) or ("every block is served",),
        excluded_peers=dict(bad), excluded_causes=dict(bad),
        servers={peer: ServerAssessment(peer, cause, confirmed=cause != "serving",
                                        failing="CUDA error" if cause == "failing" else None,
                                        wrong_outputs="returns wrong outputs" if cause == "wrong outputs" else None)
                 for peer, cause in causes.items()})
    rows = tuple(ServerRow(peer_id=peer, model="llama", start=0, end=4, state="ONLINE", public_name=name)
                 for peer, name in ((PEER, "a"), (OTHER, "b")))
    # what the model lost, as the assess step draws it (the excluded servers this poll shows ONLINE)
    health = health.with_lost(lost_servers(rows, {}, health.excluded_peers))
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=rows), [health])


@pytest.mark.timeout(300)
def test_news_of_a_second_server_reaches_alertmanager_as_an_alert_the_models_group_gains(alertmanager, tmp_path):
    base, am_receiver = alertmanager
    settings = Settings(data_dir=tmp_path, scrape_period=60, initial_peers=[], alerts={
        "rules": [{"name": "model-health", "kind": "model_degraded", "for": 0}],
        "webhooks": [{"name": "am", "url": base, "format": "alertmanager"}]})
    store = sqlite_store(tmp_path)
    try:
        now = time.time()
        alerter = Alerter(settings, store, watching_since=now - 100)
        record_servers(store, now - 30, {PEER: "serving", OTHER: "serving"})
        assert alerter.evaluate(now - 30).notices == ()
        record_servers(store, now - 20, {PEER: "failing", OTHER: "serving"})
        assert [n.event for n in alerter.evaluate(now - 20).notices] == [FIRED]
        alerter.deliver(now - 20)
        assert wait_until(lambda: len(listed(base)) == 2, 10), listed(base)  # the model's, and its server's
        assert sorted((a["labels"].get("peer", ""), a["labels"].get("cause", "")) for a in listed(base)) == [
            ("", ""), (PEER, "failing")]
        assert am_receiver.wait_for(1, 30)

        record_servers(store, now - 10, {PEER: "failing", OTHER: "wrong outputs"})
        [news] = alerter.evaluate(now - 10).notices
        assert (news.event, news.peer, news.summary) == (
            "news", OTHER, "Llama 2 (llama) is degraded: now also b returns wrong outputs")
        alerter.deliver(now - 10)
        assert wait_until(lambda: len(listed(base)) == 3, 10), listed(base)  # the group gained the news
        assert sorted((a["labels"].get("peer", ""), a["labels"].get("cause", "")) for a in listed(base)) == [
            ("", ""), (PEER, "failing"), (OTHER, "wrong outputs")]
        notified = am_receiver.wait_for(2, 30)
        assert len(notified) >= 2 and any(a["labels"].get("peer") == OTHER for a in notified[-1]["alerts"]), notified
        assert alerter.evaluate(now).notices == ()  # told once
    finally:
        store.close()
