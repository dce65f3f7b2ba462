"""Specs of the alert rules, judged without I/O (``monitor.core.alert_rules``): when a rule fires,
holds, repeats and resolves, over views of models, peers and bootstrap peers; the settings that
name a bad rule; and the webhook payloads (``monitor.app.webhooks``) each format sends, also what
is pushed to an Alertmanager's ``POST /api/v2/alerts`` (a real one: ``test_alertmanager.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from monitor.alert_settings import AlertSettings, Kind
from monitor.settings import SettingsError, load_settings
from monitor.app import webhooks
from monitor.core import alert_rules as core
from monitor.core.alert_rules import (
    CHANGED, FIRED, FIRING, PENDING, REPEATED, RESOLVED, BootstrapView, Cause, ModelView, PeerView, Rule, SwarmView,
)
from support import unix_seconds

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
    return replace(model(state), troubled=(Cause("QmFailing", "failing-server", "failing", True),), confirmed=True)


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
        "peer my-gpu-box (…aaaaaa) announces ONLINE but does not answer reachability checks: timed out"
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
    with pytest.raises(SettingsError, match="not a URL Apprise can send to"):  # (not http(s): an Apprise URL, or nothing)
        load_settings(environ={"SWARM_MONITOR_ALERTS": '{"webhooks": [{"name": "f", "url": "file:///etc/passwd"}]}'})
    with pytest.raises(SettingsError, match="must be an http:// or https:// URL"):
        load_settings(environ={"SWARM_MONITOR_ALERTS": '{"webhooks": [{"name": "f", "url": "mailto://x@y.org", '
                                                        '"format": "slack"}]}'})


def test_the_demo_refuses_a_webhook_that_is_neither_an_http_nor_an_apprise_url():
    result = subprocess.run([sys.executable, "-m", "monitor.app.cli", "demo", "--tiny", "--webhook", "ftp://x/y"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Invalid value for --webhook: 'ftp://x/y': url: not a URL Apprise can send to" in result.stderr


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


# ---- what is pushed to an Alertmanager ---------------------------------------------------------


def test_an_alert_is_pushed_with_stable_labels_annotations_and_its_times():
    notice = core.Notice(rule="gpu-box", kind=core.PEER_OFFLINE, subject="my-box", label="peer my-box", event=FIRED,
                         state="offline", severity="warning", summary="peer my-box is offline", at=2000.0, since=1000.0,
                         details=("not announced in the latest poll",), models=("llama", "bloom"), peer=PEER_A,
                         peer_name="my-box")
    [alert] = json.loads(webhooks.group_payload([(1, notice)], "alertmanager", "https://mon.example", now=2000.0,
                                                ttl=240.0))
    assert alert["labels"] == {"alertname": "PetalsPeerOffline", "severity": "warning", "rule": "gpu-box",
                               "kind": "peer_offline", "subject": "my-box", "model": "bloom,llama", "peer": PEER_A,
                               "source": "petals-swarm-monitor"}
    assert alert["annotations"] == {"summary": "peer my-box is offline",
                                    "description": "not announced in the latest poll",
                                    "dashboard_url": f"https://mon.example/peers/{PEER_A}", "label": "peer my-box",
                                    "peer_name": "my-box"}
    assert (unix_seconds(alert["startsAt"]), unix_seconds(alert["endsAt"])) == (1000.0, 2240.0)
    assert alert["generatorURL"] == f"https://mon.example/peers/{PEER_A}"
    over = replace(notice, event=RESOLVED, at=3000.0, state="ok", severity="ok", previous_state="offline")
    resolved = json.loads(webhooks.group_payload([(2, over)], "alertmanager"))
    assert unix_seconds(resolved[0]["endsAt"]) == 3000.0 and "generatorURL" not in resolved[0]
    assert resolved[0]["labels"] == alert["labels"]  # the same alert for Alertmanager


def test_a_change_of_severity_resolves_the_alert_of_the_old_one():
    notice = core.Notice(rule="model-health", kind=core.MODEL_DEGRADED, subject="llama", label="Llama", event=CHANGED,
                         state="broken", severity="critical", summary="Llama is broken", at=500.0, since=100.0,
                         previous_state="degraded", models=("llama",))
    old, new = json.loads(webhooks.group_payload([(3, notice)], "alertmanager", now=500.0, ttl=240.0))
    assert (old["labels"]["severity"], unix_seconds(old["endsAt"])) == ("warning", 500.0)
    assert (new["labels"]["severity"], unix_seconds(new["endsAt"])) == ("critical", 740.0)
    assert {k: v for k, v in old["labels"].items() if k != "severity"} == \
        {k: v for k, v in new["labels"].items() if k != "severity"}


def test_the_webhook_url_is_the_alertmanagers_base_url_or_its_endpoint():
    from monitor.alert_settings import WebhookConfig

    assert WebhookConfig(name="am", url="http://127.0.0.1:9093", format="alertmanager").endpoint == \
        "http://127.0.0.1:9093/api/v2/alerts"
    assert WebhookConfig(name="am", url="http://am:9093/prefix/api/v2/alerts", format="alertmanager").endpoint == \
        "http://am:9093/prefix/api/v2/alerts"
    assert WebhookConfig(name="x", url="http://am:9093/hook").endpoint == "http://am:9093/hook"


# ---- every failure is told: a new cause is news, a server that left is told within the bound --------


def behind(state: str, *causes: Cause) -> ModelView:
    """The model in ``state`` with the servers behind it (confirmed as each cause says)."""
    return replace(model(state), troubled=causes, confirmed=bool(causes) and all(c.confirmed for c in causes))


DEFAULT_HEALTH = core.default_rules(PERIOD)[0]  # for 120 s, a server that left 45 s
FAILING_3 = Cause("QmServer3", "server-3", "failing", True)
WRONG_2 = Cause("QmServer2", "server-2", "wrong outputs", True)
LEFT_2 = Cause("QmServer2", "server-2", core.LEFT)


def test_a_new_cause_while_the_alert_fires_for_another_is_news_once():
    run = Run(HEALTH)
    [fired] = run.at(T0, models=[behind("degraded", FAILING_3)])
    assert fired.event == FIRED
    # server-3 healed (the alert waits out its resolve hold) and server-2 answers wrong meanwhile
    assert run.at(T0 + 20, models=[model("healthy")]) == []
    [news] = run.at(T0 + 40, models=[behind("degraded", WRONG_2)])
    assert (news.event, news.state, news.previous_state) == (core.NEWS, "degraded", "degraded")
    assert news.summary == "Llama 2 (llama) is degraded: now also server-2 returns wrong outputs"
    assert run.at(T0 + 60, models=[behind("degraded", WRONG_2)]) == []  # told once
    # the first one back beside it: it was healed and breaks again, which is news again
    [again] = run.at(T0 + 80, models=[behind("degraded", WRONG_2, FAILING_3)])
    assert again.event == core.NEWS and "now also server-3 is failing" in again.summary
    assert run.at(T0 + 100, models=[behind("degraded", WRONG_2, FAILING_3)]) == []


def test_a_server_that_left_is_told_after_the_left_hold_not_after_for_and_a_quick_restart_never():
    run = Run(DEFAULT_HEALTH)  # for 120 s, a server that left 45 s
    assert run.at(T0, models=[behind("degraded", LEFT_2)]) == []
    assert run.at(T0 + core.LEFT_HOLD - 5, models=[behind("degraded", LEFT_2)]) == []
    [fired] = run.at(T0 + core.LEFT_HOLD, models=[behind("degraded", LEFT_2)])
    assert fired.event == FIRED and fired.since == T0
    restart = Run(DEFAULT_HEALTH)
    restart.at(T0, models=[behind("degraded", LEFT_2)])
    restart.at(T0 + core.LEFT_HOLD - 10, models=[model("healthy")])
    restart.at(T0 + core.LEFT_HOLD + 10, models=[model("healthy")])
    assert restart.notices == []
    configured = Run(HEALTH)  # an operator's own `for` (120 s) holds for servers that left as well
    for t in (T0, T0 + core.LEFT_HOLD, T0 + 110):
        assert configured.at(t, models=[behind("degraded", LEFT_2)]) == []
    assert [n.event for n in configured.at(T0 + 120, models=[behind("degraded", LEFT_2)])] == [FIRED]
    # a server leaving while the alert fires for a failing one waits the same hold before it is news
    mixed = Run(DEFAULT_HEALTH)
    mixed.at(T0, models=[behind("degraded", FAILING_3)])
    assert mixed.at(T0 + 10, models=[behind("degraded", FAILING_3, LEFT_2)]) == []
    [news] = mixed.at(T0 + 10 + core.LEFT_HOLD, models=[behind("degraded", FAILING_3, LEFT_2)])
    assert news.event == core.NEWS and news.summary.endswith("now also server-2 left (OFFLINE, or gone from the DHT)")


def test_a_server_that_left_is_told_only_once_a_poll_after_the_hold_still_shows_it_away():
    """Polls come every 60 s at the defaults, the hold is 45 s: a restart seen away by one poll may
    be back by the next. So the notice waits for a poll taken a hold after the server was first seen
    away (the alert job asks for one then: ``awaiting_poll``); a restart back by it is never told."""
    away = lambda seen: LEFT_2._replace(seen=seen)  # noqa: E731  (the latest poll that shows it away)
    stop = Run(DEFAULT_HEALTH)
    assert stop.at(T0, models=[behind("degraded", away(T0 - 1))]) == []
    assert stop.at(T0 + core.LEFT_HOLD, models=[behind("degraded", away(T0 - 1))]) == []  # no poll since
    assert core.awaiting_poll(stop.rules, stop.memory, None, T0 + core.LEFT_HOLD)  # so the poller is asked for one
    assert not core.awaiting_poll(stop.rules, stop.memory, None, T0 + core.LEFT_HOLD - 1)  # (not before the hold)
    [fired] = stop.at(T0 + core.LEFT_HOLD + 3, models=[behind("degraded", away(T0 + core.LEFT_HOLD + 2))])
    assert fired.event == FIRED and not core.awaiting_poll(stop.rules, stop.memory, None, T0 + core.LEFT_HOLD + 3)
    restart = Run(DEFAULT_HEALTH)
    restart.at(T0, models=[behind("degraded", away(T0 - 1))])
    restart.at(T0 + core.LEFT_HOLD, models=[behind("degraded", away(T0 - 1))])
    restart.at(T0 + core.LEFT_HOLD + 3, models=[model("healthy")])  # the poll it asked for: back
    assert restart.notices == [] and restart.memory == {}
    # the same while a "lost servers" alert fires for a joiner that left for good: no change to degraded
    joiner = Cause("QmJoiner", "joiner-1", core.LEFT, seen=T0 - 1)
    lost = Run(DEFAULT_HEALTH)
    lost.at(T0 - 100, models=[behind("healthy", joiner._replace(seen=T0 - 101))])
    [info] = lost.at(T0 - 50, models=[behind("healthy", joiner._replace(seen=T0 - 51))])
    assert info.severity == core.INFO
    lost.at(T0, models=[behind("degraded", joiner, away(T0 - 1))])
    assert lost.at(T0 + core.LEFT_HOLD, models=[behind("degraded", joiner, away(T0 - 1))]) == []
    lost.at(T0 + core.LEFT_HOLD + 3, models=[behind("healthy", joiner)])
    assert [n.severity for n in lost.notices] == [core.INFO]  # the restart was never told
    # a watched peer that went offline waits for the same later poll
    box = Run(Rule("box-offline", core.PEER_OFFLINE, peers=(PEER_A,), for_seconds=120, left_seconds=core.LEFT_HOLD))
    gone = [PeerView(PEER_A, state="OFFLINE")]
    box.at(T0, peers=gone, last_poll=T0 - 1)
    assert box.at(T0 + core.LEFT_HOLD, peers=gone, last_poll=T0 - 1) == []
    assert core.awaiting_poll(box.rules, box.memory, T0 - 1, T0 + core.LEFT_HOLD)
    [offline] = box.at(T0 + core.LEFT_HOLD + 3, peers=gone, last_poll=T0 + core.LEFT_HOLD + 2)
    assert offline.event == FIRED and offline.state == "offline"


def test_a_healthy_model_that_lost_a_server_others_cover_is_an_info_notice_until_it_is_back():
    run = Run(DEFAULT_HEALTH)
    assert run.at(T0, models=[behind("healthy", LEFT_2)]) == []
    [fired] = run.at(T0 + core.LEFT_HOLD, models=[behind("healthy", LEFT_2)])
    assert (fired.event, fired.state, fired.severity) == (FIRED, core.LOST_SERVERS, core.INFO)
    assert fired.summary == ("Llama 2 (llama) lost servers: server-2 left (OFFLINE, or gone from the DHT) "
                             "(every block is still served by others)")
    # a slow server alone makes no alert of a healthy model; the stopped one back resolves it
    slow = Run(HEALTH)
    for t in (T0, T0 + 300):
        assert slow.at(t, models=[behind("healthy", Cause("QmServer1", "server-1", "slow"))]) == []
    run.at(T0 + 100, models=[model("healthy")])
    [resolved] = run.at(T0 + 100 + core.RESOLVE_HOLD, models=[model("healthy")])
    assert (resolved.event, resolved.previous_state) == (RESOLVED, core.LOST_SERVERS)


def test_what_an_alert_told_is_stored_so_that_a_new_leader_repeats_no_news(tmp_path):
    from monitor.store import Store

    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    run = Run(HEALTH)
    run.at(T0, models=[behind("degraded", FAILING_3)])
    result = core.evaluate((HEALTH,), view(T0 + 20, models=[behind("degraded", FAILING_3, WRONG_2)]),
                           run.memory, T0 + 20)
    assert [n.event for n in result.notices] == [core.NEWS]
    store.record_alert_evaluation(core.evaluate((HEALTH,), view(T0, models=[behind("degraded", FAILING_3)]), {}, T0),
                                  lambda notice: [], T0)
    store.record_alert_evaluation(result, lambda notice: [], T0 + 20)
    stored = store.alerts()
    assert {(c.peer, c.why, c.told) for c in stored[("model-health", "llama")].causes} == {
        ("QmServer3", "failing", True), ("QmServer2", "wrong outputs", True)}
    # a new leader knows nothing of who is behind it yet (its memory of peers is empty): nothing to repeat
    later = core.evaluate((HEALTH,), view(T0 + 40, models=[model("degraded")]), stored, T0 + 40)
    assert later.notices == ()
    later = core.evaluate((HEALTH,), view(T0 + 60, models=[behind("degraded", FAILING_3, WRONG_2)]), stored, T0 + 60)
    assert later.notices == ()
    store.close()


def test_the_servers_a_model_lost_are_drawn_from_the_stored_polls_and_stored_with_its_assessment(tmp_path):
    """What a model lost (its servers of the last hour that do not serve now) is drawn by the assess
    step from the stored polls and stored with the assessment, so a poller that takes over names a
    server that left before it took over, as the leader would (and ``lost-servers`` does not resolve
    falsely); a server gone for two hours is not lost any more."""
    import time

    from monitor.app.alerter import WatchedPeers, read_view
    from monitor.app.assessing import assess_poll
    from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow, Snapshot
    from monitor.store import Store
    from support import web_settings

    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    settings = web_settings(models=[{"dht_prefix": "llama", "num_blocks": 4}])
    now = time.time()
    llama = ModelInfo("llama", 4)
    rows = (ServerRow("QmServer1", "llama", 0, 4, ONLINE, public_name="server-1"),
            ServerRow("QmServer2", "llama", 0, 4, ONLINE, public_name="server-2"))
    for at, servers in ((now - 7200, (ServerRow("QmLongGone", "llama", 0, 4, ONLINE),)), (now - 600, rows)):
        store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(llama,), servers=servers))
    latest = Snapshot(taken_at=now - 60, duration=1.0, models=(llama,), servers=rows[:1])
    store.record_poll(latest, assess_poll(store, settings, latest, {}, now=now - 59))
    assessment = store.latest_assessments()["llama"]
    assert assessment.lost == {"QmServer2": "server-2"}  # not the one gone for 2 h
    assert not assessment.trouble_confirmed  # a server that left: told after the hold, not at once
    view = read_view(store, settings, watching_since=now, now=now, watched=WatchedPeers())  # a new leader
    assert [(c.peer, c.name, c.why) for c in view.models[0].troubled] == [("QmServer2", "server-2", core.LEFT)]
    store.close()
