"""Spec: notices through Apprise, by e-mail to a real SMTP server on 127.0.0.1 (aiosmtpd): a firing
and a resolved notice arrive as plain-text messages through the alert job's outbox; a public name
carrying CR/LF, a header and markup arrives inert; a server that refuses the message or cannot be
reached is a failed delivery that is retried, never a lost notice; a URL Apprise does not know
stops start-up with a clear message, and no URL is ever shown."""

from __future__ import annotations

import time
import pytest

from dataclasses import replace

from monitor.app import apprise_notify
from monitor.app.alerter import Alerter
from monitor.core.alert_rules import FIRED, RESOLVED
from monitor.core.assessment import Assessment
from monitor.core.snapshot import ModelInfo, ServerRow, Snapshot
from monitor.settings import Settings
from monitor.store import Store
from monitor.swarm.announce import clean_text
from support import Smtp, sqlite_store

MODEL = ModelInfo("llama", 4, name="Llama 2", official=True)
RAW = "evil\r\nBcc: victim@example.org\r\n<b onclick=x>bold</b>"  # a public name as announced
HOSTILE = clean_text(RAW)  # as the monitor keeps it (control characters dropped at the edge)
MARKUP = "<b onclick=x>bold</b> Bcc: victim@example.org"


@pytest.fixture
def smtp():
    server = Smtp()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def record(store: Store, at: float, state: str) -> None:
    reasons = () if state == "healthy" else (f"{HOSTILE} (0:4) is ONLINE but failing: CUDA error",
                                             f"{MARKUP} (0:4) is slow")
    health = replace(Assessment.not_diagnosed("llama", 4, "unused"), state=state, reasons=reasons)
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=(
        ServerRow(peer_id="12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", model="llama", start=0, end=4,
                  state="ONLINE", public_name=HOSTILE),)), [health])


def mail_url(port: int) -> str:
    return f"mailto://127.0.0.1:{port}?from=monitor@example.org&to=ops@example.org&mode=insecure"


def test_notices_arrive_by_email_as_plain_text_and_a_refused_or_unreachable_server_is_retried(smtp, tmp_path):
    inbox, port = smtp.inbox, smtp.port
    settings = Settings(data_dir=tmp_path, scrape_period=60, initial_peers=[], alerts={
        "dashboard_url": "http://127.0.0.1:8080", "retry_backoff": 1,
        "rules": [{"name": "model-health", "kind": "model_degraded", "for": 0}],
        "webhooks": [{"name": "mail", "url": mail_url(port), "timeout": 2}]})
    assert settings.alerts.webhooks[0].resolved_format == "apprise"
    store = sqlite_store(tmp_path)
    try:
        now = time.time()
        alerter = Alerter(settings, store, watching_since=now - 100)
        record(store, now, "degraded")
        assert [n.event for n in alerter.evaluate(now).notices] == [FIRED]
        assert alerter.deliver(now) == {"delivered": 1, "retry": 0, "failed": 0}
        [(to, fired)] = inbox.messages
        assert to == ["ops@example.org"]  # the Bcc a peer announced made no recipient
        assert fired["Subject"] == (f"FIRING [warning] model-health: Llama 2 (llama) is degraded: {HOSTILE} (0:4) "
                                    "is ONLINE but failing: CUDA error (and 1 more)")
        assert fired["Bcc"] is None and fired.get_content_type() == "text/plain"  # markup stays text
        body = fired.get_content()
        assert f"{MARKUP} (0:4) is slow" in body and "http://127.0.0.1:8080/alerts" in body
        # and whatever a notice carries, the transport sends one line per line: no header can be made
        told = store.alert_events(0, now + 1)[0].notice
        title, text = apprise_notify.text([replace(told, summary=RAW, details=(RAW,))], None)
        assert "\r" not in title and "\n" not in title and "\r" not in text

        # the server refuses the recovery: retried with backoff, not lost
        inbox.refusing = True
        record(store, now + 10, "healthy")
        assert [n.event for n in alerter.evaluate(now + 10).notices] == [RESOLVED]
        assert alerter.deliver(now + 10) == {"delivered": 0, "retry": 1, "failed": 0}
        [pending] = store.pending_alert_deliveries()
        assert "refused" in pending.last_error and "mailto" not in pending.last_error, pending.last_error
        # ... then cannot be reached at all: still retried
        smtp.stop()
        assert alerter.deliver(now + 12) == {"delivered": 0, "retry": 1, "failed": 0}
        [pending] = store.pending_alert_deliveries()
        assert "Connection refused" in pending.last_error, pending.last_error
        # back, taking messages: the recovery arrives once
        inbox.refusing = False
        smtp.start()
        assert alerter.deliver(now + 100) == {"delivered": 1, "retry": 0, "failed": 0}
        assert [m["Subject"].split(" ")[0] for _, m in inbox.messages] == ["FIRING", "RESOLVED"]
        assert store.pending_alert_deliveries() == []
    finally:
        store.close()


def test_a_url_apprise_does_not_know_stops_start_up_and_no_url_is_shown(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a URL Apprise can send to"):
        Settings(data_dir=tmp_path, initial_peers=[], alerts={"webhooks": [
            {"name": "x", "url": "nosuchservice://token@host", "format": "apprise"}]})
    with pytest.raises(ValidationError, match="not a URL Apprise can send to"):
        Settings(data_dir=tmp_path, initial_peers=[], alerts={"webhooks": [{"name": "x", "url": "nosuchservice://a"}]})

    import json

    from monitor.settings import SettingsError, load_settings

    bad = "nosuchservice://user:s3cretpassw0rd@host"
    with pytest.raises(SettingsError) as raised:
        load_settings(environ={"SWARM_MONITOR_DATA_DIR": str(tmp_path), "SWARM_MONITOR_ALERTS": json.dumps(
            {"webhooks": [{"name": "mail", "url": bad}]})})
    assert "not a URL Apprise can send to" in str(raised.value) and "s3cretpassw0rd" not in str(raised.value)

    from monitor.web import create_app

    secret = "mailtos://user:s3cretpassw0rd@mail.example.org?to=ops@example.org"  # (never contacted here)
    settings = Settings(data_dir=tmp_path, initial_peers=[], alerts={"webhooks": [{"name": "mail", "url": secret}]})
    store = sqlite_store(tmp_path)
    try:
        client = create_app(settings, store).test_client()
        for path in ("/api/v1/alerts", "/alerts"):
            page = client.get(path).get_data(as_text=True)
            assert "s3cretpassw0rd" not in page and "mailtos://" not in page, path
    finally:
        store.close()
