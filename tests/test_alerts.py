"""Specs of alerts: rules judged without I/O, settings that name a bad rule, webhook payloads,
deliveries to a real HTTP receiver on 127.0.0.1 (retries, redirects, restarts), the pages, API and
/metrics, the Prometheus rules (promtool), and a real swarm: a stopped server is one notice, its
return one recovery, a flap shorter than ``for`` none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
import sqlalchemy as sa

from monitor.alert_settings import AlertSettings, Kind
from monitor.app.alerter import Alerter, backoff
from monitor.settings import Settings, SettingsError, load_settings
from monitor.app import webhooks
from monitor.core import alert_rules as core
from monitor.core.alert_rules import (
    CHANGED, FIRED, FIRING, PENDING, REPEATED, RESOLVED, BootstrapView, ModelView, PeerView, Rule, SwarmView,
)
from monitor.core.assessment import Assessment, Recommendation
from monitor.core.snapshot import ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.harness.tiny_model import TINY_DHT_PREFIX, TINY_NUM_BLOCKS
from monitor.harness.webhook_receiver import WebhookReceiver
from monitor.store import Store
from support import (DEGRADED_SPAN, DEGRADING, STORE_KINDS, dashboard_url, keep_reading, migrated_store, start_demo,
                     stop_process, store_url_of, swarm_processes, wait_until)

T0 = 1_700_000_000.0
PERIOD = 60.0


# ---- pure evaluation ---------------------------------------------------------------------------


def view(at: float, *, models=(), peers=(), bootstrap=(), last_poll: float | None = None,
         since: float = T0 - 3600) -> SwarmView:
    """What the store holds at ``at``; by default a poll made just then."""
    return SwarmView(at=at, scrape_period=PERIOD, last_ok_poll_at=at if last_poll is None else last_poll,
                     watching_since=since, models=tuple(models), peers=tuple(peers), bootstrap=tuple(bootstrap))


def model(state: str, prefix: str = "llama", reasons=None) -> ModelView:
    reasons = reasons if reasons is not None else (() if state == "healthy" else (f"blocks 0:4 make it {state}",))
    return ModelView(prefix, "Llama 2", state, tuple(reasons))


class Run:
    """Evaluations in sequence with the memory carried over, as the alert job runs them."""

    def __init__(self, *rules: Rule):
        self.rules = rules
        self.memory: dict = {}
        self.notices: list[core.Notice] = []

    def at(self, t: float, **kwargs) -> list[core.Notice]:
        result = core.evaluate(self.rules, view(t, **kwargs), self.memory, t)
        self.memory = result.alerts
        self.notices += result.notices
        return list(result.notices)


HEALTH = Rule("model-health", core.MODEL_DEGRADED, for_seconds=120, repeat_seconds=0)


def test_a_degraded_model_is_one_notice_after_for_and_one_recovery():
    run = Run(HEALTH)
    assert run.at(T0, models=[model("healthy")]) == []
    assert run.at(T0 + 60, models=[model("degraded")]) == []
    assert run.memory[("model-health", "llama")].status == PENDING
    assert run.at(T0 + 120, models=[model("degraded")]) == []  # 60 s < for
    [fired] = run.at(T0 + 180, models=[model("degraded")])
    assert (fired.event, fired.state, fired.severity, fired.since) == (FIRED, "degraded", "warning", T0 + 60)
    assert fired.summary == "Llama 2 (llama) is degraded: blocks 0:4 make it degraded"
    assert fired.details == ("blocks 0:4 make it degraded",)
    assert run.at(T0 + 240, models=[model("degraded")]) == []  # no repeat: repeat_seconds=0
    [resolved] = run.at(T0 + 300, models=[model("healthy")])
    assert (resolved.event, resolved.previous_state, resolved.summary) == (
        RESOLVED, "degraded", "Llama 2 (llama) is healthy again")
    assert run.memory == {}
    assert run.at(T0 + 360, models=[model("healthy")]) == []


def test_a_flap_shorter_than_for_pages_nobody():
    run = Run(HEALTH)
    for i, state in enumerate(["degraded", "healthy", "broken", "degraded", "healthy"] * 3):
        run.at(T0 + 60 * i, models=[model(state)])
    assert run.notices == []
    assert run.memory == {}


def confirmed(state: str) -> ModelView:
    """The model's state rests on confirmed checks only (a server whose two compute checks failed)."""
    return replace(model(state), troubled=(("QmFailing", "failing-server"),), confirmed=True)


def test_a_state_resting_on_confirmed_checks_is_told_at_once_not_after_for():
    run = Run(HEALTH)
    assert run.at(T0, models=[model("healthy")]) == []
    [fired] = run.at(T0 + 5, models=[confirmed("degraded")])  # for is 120 s: the confirmation is enough
    assert (fired.event, fired.state, fired.since) == (FIRED, "degraded", T0 + 5)
    [changed] = run.at(T0 + 10, models=[confirmed("broken")])
    assert (changed.event, changed.previous_state, changed.state) == (core.CHANGED, "degraded", "broken")
    assert run.at(T0 + 20, models=[model("degraded")]) == []  # an unconfirmed change waits out for again


def test_a_confirmed_flap_within_a_minute_is_one_notice_pair_and_a_clean_restart_none():
    run = Run(HEALTH)
    timeline = ["healthy", "degraded", "healthy", "degraded", "healthy", "degraded", "healthy"]
    for i, state in enumerate(timeline):  # down and up every 10 s
        run.at(T0 + 10 * i, models=[confirmed(state) if state != "healthy" else model(state)])
    assert [n.event for n in run.notices] == [FIRED]  # the ups within a minute resolve nothing yet
    assert run.at(T0 + 10 * len(timeline) + 30, models=[model("healthy")]) == []
    [resolved] = run.at(T0 + 10 * len(timeline) + 60, models=[model("healthy")])  # clear for a minute
    assert resolved.event == RESOLVED and run.memory == {}
    restart = Run(HEALTH)  # a clean stop (OFFLINE: not confirmed) back within a minute: nobody is told
    for i, state in enumerate(["healthy", "degraded", "degraded", "healthy", "healthy"]):
        restart.at(T0 + 20 * i, models=[model(state)])
    assert restart.notices == []


def test_degraded_then_broken_is_one_changed_notice_once_broken_holds_for():
    run = Run(HEALTH)
    run.at(T0, models=[model("degraded")])
    assert [n.event for n in run.at(T0 + 120, models=[model("degraded")])] == [FIRED]
    assert run.at(T0 + 180, models=[model("broken")]) == []  # a broken poll: waits out `for`
    assert run.memory[("model-health", "llama")].next_state == "broken"
    assert run.at(T0 + 240, models=[model("degraded")]) == []  # back: the change is forgotten
    assert run.memory[("model-health", "llama")].next_state is None
    run.at(T0 + 300, models=[model("broken")])
    [changed] = run.at(T0 + 420, models=[model("broken")])
    assert (changed.event, changed.previous_state, changed.state, changed.severity) == (
        CHANGED, "degraded", "broken", "critical")
    [resolved] = run.at(T0 + 480, models=[model("healthy")])
    assert (resolved.event, resolved.previous_state) == (RESOLVED, "broken")
    assert [n.event for n in run.notices] == [FIRED, CHANGED, RESOLVED]


def test_a_model_broken_rule_ignores_degraded_and_says_when_it_is_no_longer_broken():
    run = Run(Rule("broken-only", core.MODEL_BROKEN, for_seconds=0))
    assert run.at(T0, models=[model("degraded")]) == []
    [fired] = run.at(T0 + 60, models=[model("broken")])
    assert fired.severity == "critical"
    [resolved] = run.at(T0 + 120, models=[model("degraded")])
    assert resolved.summary == "Llama 2 (llama) is no longer broken (now degraded)"


def test_a_rule_naming_a_model_nobody_announces_says_it_is_broken():
    run = Run(Rule("mine", core.MODEL_BROKEN, for_seconds=0, models=("my-model",)))
    [fired] = run.at(T0, models=[model("healthy")])
    assert (fired.subject, fired.state) == ("my-model", "broken")
    assert "no server announces" in fired.summary


def test_a_discovered_model_that_leaves_the_poll_is_resolved_with_a_note():
    run = Run(Rule("any", core.MODEL_BROKEN, for_seconds=0))
    run.at(T0, models=[model("broken"), model("healthy", "other")])
    [resolved] = run.at(T0 + 60, models=[model("healthy", "other")])
    assert resolved.event == RESOLVED and "no longer watched" in resolved.summary


def test_repeat_reminds_while_it_fires():
    run = Run(replace(HEALTH, for_seconds=0, repeat_seconds=3600))
    run.at(T0, models=[model("degraded")])
    for minutes in range(1, 181):
        run.at(T0 + 60 * minutes, models=[model("degraded")])
    assert [n.event for n in run.notices] == [FIRED, REPEATED, REPEATED, REPEATED]
    assert [n.at - T0 for n in run.notices] == [0, 3600, 7200, 10800]


def test_data_rules_hold_while_the_latest_poll_is_old_or_older_than_the_evaluator():
    run = Run(replace(HEALTH, for_seconds=0))
    run.at(T0, models=[model("degraded")])
    assert run.memory[("model-health", "llama")].status == FIRING
    # the poller stopped: the last poll says healthy but is 10 minutes old; nothing is decided
    assert run.at(T0 + 600, models=[model("healthy")], last_poll=T0) == []
    assert run.memory[("model-health", "llama")].status == FIRING
    # a restarted evaluator (watching since T0 + 700) does not judge the poll it found
    assert run.at(T0 + 701, models=[model("healthy")], last_poll=T0 + 650, since=T0 + 700) == []
    # its first own poll does
    [resolved] = run.at(T0 + 760, models=[model("healthy")], last_poll=T0 + 750, since=T0 + 700)
    assert resolved.event == RESOLVED


def test_a_stale_monitor_fires_after_its_periods_and_a_restart_does_not_clear_it():
    stale = Rule("monitor-stale", core.MONITOR_STALE, for_seconds=0, periods=3)
    run = Run(stale)
    assert run.at(T0 + 170, last_poll=T0) == []
    [fired] = run.at(T0 + 190, last_poll=T0)
    assert fired.state == "stale" and "no successful poll since 2023-11-14 22:13:20 UTC" in fired.summary
    # a restart (a new evaluator) while polls still fail: it keeps firing, no second notice
    assert run.at(T0 + 400, last_poll=T0, since=T0 + 390) == []
    assert run.memory[("monitor-stale", "poller")].status == FIRING
    [resolved] = run.at(T0 + 460, last_poll=T0 + 455, since=T0 + 390)
    assert resolved.summary == "the monitor polls the swarm again"


def test_a_freshly_started_monitor_gets_its_periods_for_a_first_poll():
    run = Run(Rule("monitor-stale", core.MONITOR_STALE, for_seconds=0, periods=3))
    # the last poll is an hour old (the monitor was down): no notice at start-up
    assert run.at(T0 + 10, last_poll=T0 - 3600, since=T0) == []
    assert run.memory == {}
    [fired] = run.at(T0 + 200, last_poll=T0 - 3600, since=T0)
    assert fired.event == FIRED
    never = Run(Rule("monitor-stale", core.MONITOR_STALE, for_seconds=0, periods=3))
    never.memory = {}
    result = core.evaluate(never.rules, SwarmView(at=T0 + 200, scrape_period=PERIOD, last_ok_poll_at=None,
                                                  watching_since=T0), {}, T0 + 200)
    assert [n.summary for n in result.notices] == ["no successful poll since the monitor started at "
                                                   "2023-11-14 22:13:20 UTC"]


def test_a_bootstrap_peer_down_is_judged_even_while_polls_fail():
    run = Run(Rule("bootstrap-down", core.BOOTSTRAP_DOWN, for_seconds=60))
    down = [BootstrapView("QmBootstrapPeer000000000000000000000000000001", False, "connection refused")]
    run.at(T0, bootstrap=down, last_poll=T0 - 3600)
    [fired] = run.at(T0 + 60, bootstrap=down, last_poll=T0 - 3600)
    assert fired.summary == "bootstrap peer …000001 does not answer: connection refused"
    [resolved] = run.at(T0 + 120, bootstrap=[replace(down[0], up=True)])
    assert resolved.summary == "bootstrap peer …000001 answers again"


PEER_A = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
WRONG = "returns wrong outputs (relative error 0.93 vs tolerance 0.0016, against other servers, blocks 0:4)"


def test_watched_peers_by_name_or_id_offline_unreachable_low_score_wrong_outputs():
    rules = (Rule("box-offline", core.PEER_OFFLINE, peers=("my-gpu-box",)),
             Rule("a-unreachable", core.PEER_UNREACHABLE, peers=(PEER_A,)),
             Rule("a-score", core.PEER_SCORE_BELOW, peers=(PEER_A,), below=40),
             Rule("a-wrong", core.PEER_WRONG_OUTPUTS, peers=(PEER_A,)))
    good = PeerView(PEER_A, public_name="my-gpu-box", state="ONLINE", reachable=True, score=80.0)
    run = Run(*rules)
    assert run.at(T0, peers=[good]) == []
    fired = {n.rule: n for n in run.at(T0 + 60, peers=[replace(good, reachable=False, reachability_error="timed out",
                                                                score=35.5, wrong_outputs=WRONG)])}
    assert fired["a-unreachable"].summary == \
        "peer my-gpu-box (…aaaaaa) announces ONLINE but does not answer probes: timed out"
    assert fired["a-score"].summary == "peer my-gpu-box (…aaaaaa) has a health score of 35.5, below 40"
    assert fired["a-wrong"].summary == "peer my-gpu-box (…aaaaaa) returns wrong outputs in correctness probes"
    assert fired["a-wrong"].details == (WRONG,)
    assert "box-offline" not in fired
    # it leaves: offline by name; unreachable no longer (it is not announced), score and flag kept
    notices = {n.rule: n for n in run.at(T0 + 120, peers=[replace(good, state=None, reachable=False,
                                                                   score=35.5, wrong_outputs=WRONG)])}
    assert notices["box-offline"].summary == "peer my-gpu-box is offline: not announced in the latest poll"
    assert notices["a-unreachable"].event == RESOLVED
    assert set(notices) == {"box-offline", "a-unreachable"}
    back = {n.rule: n.event for n in run.at(T0 + 180, peers=[good])}
    assert back == {"box-offline": RESOLVED, "a-score": RESOLVED, "a-wrong": RESOLVED}


def test_alerts_of_a_rule_no_longer_configured_are_dropped_without_a_notice():
    run = Run(replace(HEALTH, for_seconds=0))
    run.at(T0, models=[model("degraded")])
    result = core.evaluate([], view(T0 + 60, models=[model("degraded")]), run.memory)
    assert result.alerts == {} and result.notices == () and result.removed == (("model-health", "llama"),)


def test_only_what_changed_is_written():
    run = Run(replace(HEALTH, for_seconds=0))
    run.at(T0, models=[model("degraded")])
    again = core.evaluate(run.rules, view(T0 + 60, models=[model("degraded")]), run.memory)
    assert not again.writes
    reworded = core.evaluate(run.rules, view(T0 + 120, models=[model("degraded", reasons=("other blocks",))]),
                             run.memory)
    assert reworded.writes and not reworded.notices and reworded.changed[0].summary.endswith("other blocks")


# ---- settings ----------------------------------------------------------------------------------


def test_the_settings_and_the_core_know_the_same_rule_kinds():
    assert set(Kind.__args__) == set(core.KINDS)


def test_defaults_wait_two_scrape_periods_and_a_rule_of_the_same_name_replaces_one():
    settings = load_settings(environ={}, scrape_period=30)
    rules = {r.name: r for r in settings.alerts.rules_in_force(settings.scrape_period)}
    assert set(rules) == {"model-health", "bootstrap-down", "monitor-stale"}
    assert rules["model-health"].for_seconds == 60 and rules["model-health"].repeat_seconds == 4 * 3600
    own = AlertSettings.model_validate({"rules": [{"name": "model-health", "kind": "model_broken", "for": "10m",
                                                   "repeat": 0}]})
    rules = {r.name: r for r in own.rules_in_force(30)}
    assert (rules["model-health"].kind, rules["model-health"].for_seconds, rules["model-health"].repeat_seconds) \
        == ("model_broken", 600, 0)
    assert {r.name for r in AlertSettings(default_rules=False).rules_in_force(30)} == set()


BAD_RULES = [
    ('name = "gpu"\nkind = "peer_offline"', "rule 'gpu' (#1): a peer_offline rule needs `peers`"),
    ('name = "typo"\nkind = "model_brokne"', "rule 'typo' (#1): kind: Input should be"),
    ('name = "slow"\nkind = "model_broken"\nfor = "5 minutes"',
     "rule 'slow' (#1): for: '5 minutes' is not a duration"),
    ('name = "score"\nkind = "peer_score_below"\npeers = ["x"]',
     "rule 'score' (#1): a peer_score_below rule needs `below`"),
    ('name = "hooked"\nkind = "model_broken"\nwebhooks = ["nowhere"]', "rule 'hooked' names unknown webhooks ['nowhere']"),
    ('name = "x y"\nkind = "model_broken"', "rule 'x y' (#1): name: String should match pattern"),
]


@pytest.mark.parametrize("rule, message", BAD_RULES)
def test_a_bad_rule_stops_start_up_naming_it(tmp_path, rule, message):
    config = tmp_path / "monitor.toml"
    config.write_text(f'[[alerts.rules]]\nname = "fine"\nkind = "monitor_stale"\n\n[[alerts.rules]]\n{rule}\n')
    message = message.replace("(#1)", "(#2)")
    with pytest.raises(SettingsError) as error:
        load_settings(config, environ={})
    assert "invalid setting 'alerts" in str(error.value)
    assert message in str(error.value)


def test_webhooks_from_toml_and_env_and_their_formats(tmp_path):
    config = tmp_path / "monitor.toml"
    config.write_text('[[alerts.webhooks]]\nname = "slack"\nurl = "https://hooks.slack.com/services/T/B/x"\n'
                      '[[alerts.webhooks]]\nname = "discord"\nurl = "https://discord.com/api/webhooks/1/x"\n'
                      '[[alerts.webhooks]]\nname = "mine"\nurl = "http://127.0.0.1:9/x"\ntimeout = 2\n'
                      '[[alerts.rules]]\nname = "to-mine"\nkind = "model_broken"\nwebhooks = ["mine"]\n')
    alerts = load_settings(config, environ={}).alerts
    assert [h.resolved_format for h in alerts.webhooks] == ["slack", "discord", "generic"]
    assert [h.name for h in alerts.webhooks_for("to-mine")] == ["mine"]
    assert [h.name for h in alerts.webhooks_for("model-health")] == ["slack", "discord", "mine"]
    env = {"SWARM_MONITOR_ALERTS": json.dumps({"webhooks": [{"name": "e", "url": "https://example.org/hook"}]})}
    assert load_settings(environ=env).alerts.webhooks[0].name == "e"
    with pytest.raises(SettingsError, match="must be an http:// or https:// URL"):
        load_settings(environ={"SWARM_MONITOR_ALERTS": '{"webhooks": [{"name": "f", "url": "file:///etc/passwd"}]}'})


def test_the_demo_refuses_a_webhook_that_is_not_an_http_url():
    result = subprocess.run([sys.executable, "-m", "monitor.app.cli", "demo", "--tiny", "--webhook", "ftp://x/y"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Invalid value for --webhook: 'ftp://x/y': must be an http:// or https:// URL" in result.stderr


# ---- payloads ----------------------------------------------------------------------------------


NOTICE = core.Notice(rule="model-health", kind=core.MODEL_DEGRADED, subject="llama", label="<!channel> @everyone",
                     event=FIRED, state="degraded", severity="warning",
                     summary="<!channel> @everyone [click](http://evil.example) is degraded", at=T0, since=T0 - 120,
                     details=("blocks 0:4 have one server",))


def test_payloads_are_inert_in_slack_and_discord_and_complete_in_json():
    generic = json.loads(webhooks.payload(NOTICE, 7, "generic", "https://mon.example"))
    assert generic["id"] == 7 and generic["status"] == "firing" and generic["event"] == "firing"
    assert generic["summary"] == NOTICE.summary and generic["details"] == ["blocks 0:4 have one server"]
    assert generic["url"] == "https://mon.example/alerts"
    slack = json.loads(webhooks.payload(NOTICE, 7, "slack"))["text"]
    assert "<!channel>" not in slack and "&lt;!channel&gt;" in slack
    discord = json.loads(webhooks.payload(NOTICE, 7, "discord"))
    assert discord["allowed_mentions"] == {"parse": []}
    assert "](http" not in discord["content"] and "\\[click\\]\\(http" in discord["content"]
    resolved = json.loads(webhooks.payload(replace(NOTICE, event=RESOLVED, summary="llama is healthy again"), 8,
                                           "generic"))
    assert resolved["status"] == "resolved"


def test_payloads_are_bounded():
    huge = replace(NOTICE, summary="x" * 100_000, details=tuple("y" * 100_000 for _ in range(100)))
    for fmt in ("generic", "slack", "discord"):
        assert len(webhooks.payload(huge, 1, fmt)) <= webhooks.MAX_PAYLOAD_BYTES
    assert len(json.loads(webhooks.payload(huge, 1, "discord"))["content"]) <= 2000


# ---- deliveries, with a real store and a real receiver -----------------------------------------


MODEL = ModelInfo("llama", 4, name="Llama 2", official=True)


def diagnosis(state: str) -> Assessment:
    reasons = () if state == "healthy" else ("blocks 0:4 have one server",)
    return Assessment(model="llama", state=state, reasons=reasons,
                       coverage_pct=100.0, servers_online=1, min_redundancy=1, blocks=(), missing_ranges=(),
                       single_served_ranges=(), bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=2.0,
                       route=(), recommendation=Recommendation(0, 4, 4, "--block_indices 0:4", "redundancy"))


def record(store: Store, at: float, state: str) -> None:
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=(
        ServerRow(peer_id=PEER_A, model="llama", start=0, end=4, state="ONLINE", public_name="a"),)),
        [diagnosis(state)])


def alert_settings(tmp_path, *urls, **alerts) -> Settings:
    hooks = [{"name": f"hook-{i}", "url": url, "timeout": 2} for i, url in enumerate(urls, 1)]
    return Settings(data_dir=tmp_path, scrape_period=PERIOD, initial_peers=[],
                    alerts={"webhooks": hooks, "retry_backoff": 10, **alerts})


@pytest.fixture(params=STORE_KINDS)
def store_url(request, tmp_path) -> str:
    return store_url_of(request, tmp_path / "monitor.db")


@pytest.fixture
def store(tmp_path):
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}") as s:
        yield s


@pytest.fixture
def receiver():
    with WebhookReceiver() as hook:
        yield hook


def fire(store: Store, settings: Settings, now: float) -> Alerter:
    """A degraded model, seen long enough: the alerter's first evaluation after it fires."""
    alerter = Alerter(settings, store, watching_since=now - 1000)
    record(store, now - 200, "degraded")
    alerter.evaluate(now - 200)
    record(store, now, "degraded")
    assert [n.event for n in alerter.evaluate(now).notices] == [FIRED]
    return alerter


def test_a_failing_receiver_is_retried_with_backoff_and_gets_the_notice_once(store, receiver, tmp_path):
    receiver.plan[:] = [500, 503]
    now = time.time()
    alerter = fire(store, alert_settings(tmp_path, receiver.url), now)
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
    alerter = fire(store, settings, now)
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
        alerter = fire(store, alert_settings(tmp_path, mover.url, slow.url), now)
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
    alerter = fire(store, alert_settings(tmp_path, receiver.url), now)
    alerter.deliver(now)  # the firing notice fails: retry in 10 s
    record(store, now + 1, "healthy")
    assert [n.event for n in alerter.evaluate(now + 1).notices] == [RESOLVED]
    assert alerter.deliver(now + 2) == {"delivered": 0, "retry": 0, "failed": 0}  # waits behind the firing one
    alerter.deliver(now + 10)
    assert [r.body["event"] for r in receiver.received] == ["firing", "firing", "resolved"]


def test_nothing_is_lost_or_repeated_across_a_restart_of_the_poller(store_url, receiver, tmp_path):
    """The first poller fires, cannot deliver (its webhook is down) and dies; the second one
    delivers that notice once, does not fire again, and sends the recovery once."""
    first = Store(store_url)
    first.migrate()
    settings = alert_settings(tmp_path, receiver.url)
    receiver.plan[:] = [503]
    now = time.time()
    alerter = fire(first, settings, now)
    alerter.deliver(now)
    first.close()

    second = Store(store_url)
    try:
        restarted = Alerter(settings, second, watching_since=now + 30)
        assert restarted.evaluate(now + 31).notices == ()  # its first evaluation, before its first poll
        assert restarted.deliver(now + 31) == {"delivered": 1, "retry": 0, "failed": 0}
        record(second, now + 40, "degraded")
        assert restarted.evaluate(now + 41).notices == ()
        record(second, now + 100, "healthy")
        assert [n.event for n in restarted.evaluate(now + 101).notices] == [RESOLVED]
        restarted.deliver(now + 101)
        assert [(r.status, r.body["event"]) for r in receiver.received] == [
            (503, "firing"), (200, "firing"), (200, "resolved")]
        events = second.alert_events(now - 1000, now + 1000)
        assert [e.notice.event for e in events] == ["resolved", "firing"]
        assert second.alerts() == {}
    finally:
        second.close()


def test_a_peer_the_correctness_probes_judge_wrong_fires_its_rule_until_a_correct_verdict(store, receiver, tmp_path):
    from monitor.core.probes import CORRECT, WRONG as WRONG_VERDICT, ServerProbe

    settings = alert_settings(tmp_path, receiver.url, default_rules=False,
                              rules=[{"name": "a-wrong", "kind": "peer_wrong_outputs", "peers": ["a"], "for": 0}])
    now = time.time()
    alerter = Alerter(settings, store, watching_since=now - 100)
    record(store, now, "healthy")
    assert alerter.evaluate(now).notices == ()

    def verdict(at: float, value: str) -> ServerProbe:
        return ServerProbe(peer_id=PEER_A, model="llama", start=0, end=4, at=at, ok=True, seconds_per_token=0.1,
                           verdict=value, error_ratio=0.93 if value == WRONG_VERDICT else 1e-6, tolerance=0.0016,
                           checked_against="peers")

    def assessed_poll(at: float) -> None:  # as the poller stores a poll: with its assessment of the probes
        from monitor.app.assessing import assess_poll

        snapshot = Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=(
            ServerRow(peer_id=PEER_A, model="llama", start=0, end=4, state="ONLINE", public_name="a"),))
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
    alerter = fire(store, alert_settings(tmp_path, receiver.url), now)
    alerter.deliver(now)
    assert store.prune_alerts(now - 1) == {"alert_events": 0, "alert_deliveries": 0}
    assert store.prune_alerts(now + 1) == {"alert_events": 1, "alert_deliveries": 1}
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM alerts")).scalar() == 1  # the alert itself stays


def test_a_scheduler_running_the_alert_jobs_shuts_down_while_rounds_end(store, tmp_path):
    """Regression: waking a job from the after-round listener (``modify_job``) deadlocked with
    ``shutdown``, which holds the job stores' lock while it waits for the thread of the round."""
    from types import SimpleNamespace

    from apscheduler.schedulers.background import BackgroundScheduler

    from monitor.app.alerter import schedule_alerts
    from monitor.app.jobs import JobStats

    poller = SimpleNamespace(settings=alert_settings(tmp_path), store=store, stats=JobStats(), leads=lambda: True)
    record(store, time.time(), "healthy")
    for _ in range(10):
        scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True})
        scheduler.add_job(lambda: time.sleep(0.01), "interval", seconds=0.02, id="scrape")
        scheduler.add_job(lambda: time.sleep(0.01), "interval", seconds=0.02, id="reachability")
        alerter = schedule_alerts(scheduler, poller)
        scheduler.start()
        time.sleep(0.3)
        done = threading.Thread(target=scheduler.shutdown)
        done.start()
        done.join(15)
        assert not done.is_alive(), "the scheduler did not shut down"
        assert alerter.stopping()
    assert poller.stats.runs["alerts"] >= 10 and not poller.stats.failures


# ---- the web -----------------------------------------------------------------------------------


def test_the_alerts_page_api_and_overview_show_active_alerts_and_history(store, receiver, tmp_path):
    from monitor.web import create_app

    settings = alert_settings(tmp_path, receiver.url)
    client = create_app(settings, store).test_client()
    assert "The poller has not evaluated the rules yet" in client.get("/alerts").get_data(as_text=True)
    now = time.time()
    alerter = fire(store, settings, now)
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

    record(store, now + 1, "healthy")
    alerter.evaluate(now + 1)
    assert "Active alerts" not in client.get("/").get_data(as_text=True)


# ---- Prometheus --------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: install Debian's prometheus package (scripts/system-deps does)",
                    pytrace=False)
    return path


def test_the_prometheus_rules_pass_promtool_check_and_their_unit_tests():
    from monitor.prometheus import rules_path, rules_test_path

    check = subprocess.run([promtool(), "check", "rules", str(rules_path())], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 12 rules found" in check.stdout
    tested = subprocess.run([promtool(), "test", "rules", str(rules_test_path())], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_prometheus_rules_use_only_metrics_the_monitor_exposes(store, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.prometheus import rules_path
    from monitor.web import create_app

    settings = alert_settings(tmp_path, "http://127.0.0.1:9/unused")
    now = time.time()
    fire(store, settings, now)
    Alerter(settings, store).deliver(now)
    boot = "/ip4/127.0.0.1/tcp/1/p2p/QmBootstrapPeer000000000000000000000000000001"
    store.record_reachability(ReachabilityBatch(now, 0.1, (ReachabilityResult(boot.rsplit("/", 1)[1], "bootstrap", False, address=boot),)))
    client = create_app(settings.model_copy(update={"initial_peers": [boot]}), store).test_client()
    exposed = {f.name for f in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))}
    used = set(re.findall(r"\b(swarm_monitor_[a-z0-9_]+)", rules_path().read_text()))
    assert used and used <= exposed, used - exposed


# ---- a real swarm ------------------------------------------------------------------------------


def model_state(store: Store):
    health = store.latest_assessments().get(TINY_DHT_PREFIX)
    return health.state if health else None


def evaluated_since(poller, runs_before: dict, *, scrapes: int = 0, evaluations: int = 2) -> bool:
    """Whether the poller has polled ``scrapes`` more times and evaluated its rules ``evaluations``
    more times (each evaluation after a poll reads it) since ``runs_before`` (its ``stats.runs``)."""
    runs = poller.stats.runs
    return (runs.get("scrape", 0) >= runs_before.get("scrape", 0) + scrapes
            and runs.get("alerts", 0) >= runs_before.get("alerts", 0) + evaluations)


def nothing_to_send(poller, store: Store, runs_before: dict, *, holding: dict | None = None) -> bool:
    """The rules were evaluated twice since ``runs_before``, no delivery is pending, and the
    alerts the store remembers are exactly ``holding`` ((rule, subject) -> (status, since)): from
    then on the alerter sends nothing until the swarm changes (what the pure specs above prove).
    A pending alert (one that would fire once its ``for`` has passed) keeps this false."""
    remembered = {key: (alert.status, alert.since) for key, alert in store.alerts().items()}
    return (evaluated_since(poller, runs_before) and not store.pending_alert_deliveries()
            and remembered == (holding or {}))


@pytest.mark.timeout(600)  # a loaded machine starts and restarts petals servers slowly
def test_a_stopped_server_is_one_notice_and_its_return_one_recovery_even_across_a_poller_restart(swarm, tmp_path):
    """The session swarm, laid out as the demo's (every block served twice). One rule waits 5 s:
    stopping a server is one "degraded" notice (its first delivery fails and is retried), a
    restart of the poller while the model is degraded repeats nothing, the server's return is one
    recovery. Another rule waits 10 minutes: that same outage, shorter than its ``for``, reaches
    nobody."""
    from monitor.app.jobs import Poller
    from monitor.settings import ModelConfig

    wait_for, check, scrape = 5, 1, 2  # the model-health rule's `for`, alerts.check_period, scrape_period
    with WebhookReceiver(plan=[503]) as ops, WebhookReceiver() as patient:
        settings = Settings(
            data_dir=tmp_path, initial_peers=swarm.initial_peers,
            models=[ModelConfig(dht_prefix=TINY_DHT_PREFIX, num_blocks=TINY_NUM_BLOCKS)],
            scrape_period=scrape, reachability_period=2, reachability_timeout=2, score_period=600,
            alerts={"check_period": check, "retry_backoff": 1,
                    "webhooks": [{"name": "ops", "url": ops.url}, {"name": "patient", "url": patient.url}],
                    "rules": [{"name": "model-health", "kind": "model_degraded", "for": wait_for, "webhooks": ["ops"]},
                              {"name": "patient", "kind": "model_degraded", "for": "10m", "webhooks": ["patient"]}]})
        store = Store(settings.resolved_database_url)
        store.migrate()
        poller = Poller(settings, store, swarm.dht)
        poller.start()
        try:
            assert wait_until(lambda: model_state(store) == "healthy", 60), store.latest_assessments()
            # a healthy swarm pages nobody: seen once the rules judged it with nothing pending, or
            # else after longer than `for` and two evaluations
            runs = dict(poller.stats.runs)
            wait_until(lambda: nothing_to_send(poller, store, runs), wait_for + 2 * check)
            assert ops.received == [] and patient.received == []

            swarm.stop(DEGRADING)  # blocks 0:4 are left with one server
            stopped = time.monotonic()
            [degraded] = ops.wait_for(1, 90)
            assert (degraded["event"], degraded["rule"], degraded["state"], degraded["subject"]) == (
                "firing", "model-health", "degraded", TINY_DHT_PREFIX)
            assert DEGRADED_SPAN in " ".join(degraded["details"])
            assert [r.status for r in ops.received] == [503, 200]  # retried, one notice
            assert len({r.body["id"] for r in ops.received}) == 1

            firing = {key: (alert.status, alert.since) for key, alert in store.alerts().items()}
            assert firing[("model-health", TINY_DHT_PREFIX)][0] == FIRING
            poller.shutdown()  # the poller restarts while the model is degraded
            poller = Poller(settings, store, swarm.dht)
            poller.start()
            # it repeats nothing: seen once it has polled twice and judged the same alerts to hold
            # since the same times (a forgotten one would be pending again, and fire after `for`),
            # or else after longer than `for` and two polls
            wait_until(lambda: evaluated_since(poller, {}, scrapes=2)
                       and nothing_to_send(poller, store, {}, holding=firing), wait_for + 2 * scrape)
            assert model_state(store) == "degraded"
            assert len(ops.accepted()) == 1

            swarm.restart(DEGRADING)
            [_, recovered] = ops.wait_for(2, 90)
            outage = time.monotonic() - stopped
            assert (recovered["event"], recovered["status"], recovered["summary"]) == (
                "resolved", "resolved", f"{TINY_DHT_PREFIX} is healthy again")
            runs = dict(poller.stats.runs)  # and then nothing more (as at the start)
            wait_until(lambda: nothing_to_send(poller, store, runs), wait_for + 2 * check)
            assert len(ops.accepted()) == 2
            assert outage < 600 and patient.received == []  # the outage was a flap to the 10-minute rule
            assert store.alerts() == {}
            notices = store.alert_events(0, time.time() + 1)
            assert [(e.notice.rule, e.notice.event) for e in notices] == [
                ("model-health", "resolved"), ("model-health", "firing")]
        finally:
            poller.shutdown()
            store.close()


@pytest.mark.swarm  # the demo starts a swarm of its own
@pytest.mark.timeout(900)
def test_the_demo_sends_exactly_the_notices_its_chaos_controls_call_for(data_dir, tmp_path):
    """`swarm-monitor demo --tiny --webhook URL` with the demo's settings, its scrape period and alert
    check shortened through the environment as an operator would (4 s and 2 s; the default rules
    then wait two scrape periods, 8 s); its chaos controls stop and start server-2: one "degraded"
    notice, one recovery, nothing else."""
    import urllib.request

    started = time.time()
    check = 2  # alerts.check_period: rules are evaluated at least this often
    env = {**os.environ, "SWARM_MONITOR_DATA_DIR": str(data_dir),
           "SWARM_MONITOR_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}",
           "SWARM_MONITOR_SCRAPE_PERIOD": "4", "SWARM_MONITOR_ALERTS": json.dumps({"check_period": check})}

    def chaos(action: str, base: str) -> None:
        """What the panel's buttons and `swarm-monitor chaos` call (with a longer wait than the
        CLI's 60 s: stopping and starting wait for the server, which a loaded 2-core machine may
        take longer than that)."""
        token = (data_dir / "admin_token").read_text().strip()
        request = urllib.request.Request(f"{base}/demo/servers/server-2/{action}", method="POST",
                                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            assert response.status == 200

    def state(base: str):
        with urllib.request.urlopen(f"{base}/api/v1/state", timeout=30) as response:
            reports = json.loads(response.read())["model_reports"]
        return reports[0]["monitor_state"] if reports else None

    def alerts(base: str) -> dict:
        with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=30) as response:
            return json.loads(response.read())

    def quiet(base: str) -> bool:
        """No alert pending or firing, no delivery pending: nothing is sent until the swarm changes."""
        now = alerts(base)
        return not now["active"] and not any(counts["pending"] for counts in now["deliveries"].values())

    with WebhookReceiver() as hook:
        demo = start_demo(["--tiny", "--port", "0", "--webhook", hook.url], env=env)
        output: list[str] = []
        reader = None
        try:
            base = dashboard_url(demo, output)
            while not output[-1].startswith("Alerts:"):
                output.append(demo.stdout.readline())
            assert "(1 webhook notified)" in output[-1]
            reader = keep_reading(demo, output)  # (the pipe kept drained)
            assert wait_until(lambda: state(base) == "healthy", 120)
            # a healthy swarm pages nobody: seen once nothing is pending (an alert left pending by
            # the start, before the servers were up, would be active), or else after longer than
            # the rules' `for` (two scrape periods: 8 s)
            wait_for = max(rule["for_seconds"] for rule in alerts(base)["rules"])
            assert wait_for == 8
            wait_until(lambda: quiet(base), wait_for + check)
            assert hook.received == []

            chaos("stop", base)
            [degraded] = hook.wait_for(1, 180)
            assert (degraded["event"], degraded["state"], degraded["rule"]) == ("firing", "degraded", "model-health")
            assert "0:4" in " ".join(degraded["details"])
            chaos("start", base)
            [_, recovered] = hook.wait_for(2, 180)
            assert recovered["event"] == "resolved" and recovered["summary"].endswith("is healthy again")
            time.sleep(check)  # and then nothing more: another evaluation, and nothing pending
            wait_until(lambda: quiet(base), wait_for)
            assert [(r.body["event"], r.body["rule"]) for r in hook.received] == [
                ("firing", "model-health"), ("resolved", "model-health")]
        finally:
            if not stop_process(demo, output, signum=signal.SIGINT, timeout=180, reader=reader):
                output.append("\n(the demo did not stop within 180 s of Ctrl-C: killed)\n")
            (tmp_path / "demo.log").write_text("".join(output))
    assert demo.returncode == 0, "".join(output)[-3000:]
    assert wait_until(lambda: not swarm_processes(since=started), 30)
