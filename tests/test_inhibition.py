"""Specs of inhibition and grouping: while a model's alert fires, the per-peer alerts of its servers
are held (the documented default; configurable), what they missed is told once the model's alert
is over; notices that go to one webhook together are one message listing them (a real receiver). On a
real swarm, a broken model sends its own notice, not one per server: ``test_alerts.py``.
"""

from __future__ import annotations

import time

import pytest

from monitor.alert_settings import AlertSettings
from monitor.app.alerter import Alerter
from monitor.core import alert_rules as core
from monitor.core import muting
from monitor.core.alert_rules import FIRED, FIRING, RESOLVED, ModelView, PeerView, Rule, SwarmView
from monitor.core.assessment import Assessment, Recommendation
from monitor.core.muting import Mutes
from monitor.core.snapshot import ModelInfo, ServerRow, Snapshot
from monitor.harness.webhook_receiver import WebhookReceiver
from monitor.settings import Settings, SettingsError, load_settings
from support import migrated_store

T0 = 1_700_000_000.0
A = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
B = "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
C = "12D3KooWCccccccccccccccccccccccccccccccccccccccccccccc"

RULES = (Rule("model-health", core.MODEL_DEGRADED, for_seconds=0),
         Rule("a-offline", core.PEER_OFFLINE, for_seconds=0, peers=(A,)),
         Rule("b-unreachable", core.PEER_UNREACHABLE, for_seconds=0, peers=(B,)),
         Rule("c-offline", core.PEER_OFFLINE, for_seconds=0, peers=(C,)))


class Run:
    def __init__(self, rules=RULES, inhibit=(muting.PEERS_OF_A_FIRING_MODEL,)):
        self.rules, self.inhibit = rules, inhibit
        self.memory: dict = {}
        self.sent: list[core.Notice] = []

    def at(self, t, models, peers):
        result = core.evaluate(self.rules, SwarmView(at=t, scrape_period=60, last_ok_poll_at=t, watching_since=T0 - 60,
                                                     models=tuple(models), peers=tuple(peers)),
                               self.memory, t, Mutes(inhibit=self.inhibit))
        self.memory = result.alerts
        self.sent += result.notices
        return [(n.rule, n.event) for n in result.notices]


def llama(state):
    return ModelView("llama", "Llama", state, () if state == "healthy" else ("no server serves blocks 0:8",))


UP = [PeerView(A, state="ONLINE", reachable=True, models=("llama",)),
      PeerView(B, state="ONLINE", reachable=True, models=("llama",)),
      PeerView(C, state="ONLINE", reachable=True, models=("bloom",))]
# A and C stop (their last poll said which models they served), B stops answering
DOWN = [PeerView(A, models=("llama",)), PeerView(B, state="ONLINE", reachable=False, reachability_error="timed out",
                                                 models=("llama",)), PeerView(C, models=("bloom",))]


def test_a_firing_model_alert_holds_the_peer_alerts_of_its_servers_only():
    run = Run()
    assert run.at(T0, [llama("healthy")], UP) == []
    sent = run.at(T0 + 60, [llama("broken")], DOWN)
    assert sorted(sent) == [("c-offline", FIRED), ("model-health", FIRED)]  # C serves another model
    assert run.memory[("a-offline", A)].held == ("inhibited by model-health/llama",)
    assert run.memory[("b-unreachable", B)].status == FIRING
    assert run.memory[("b-unreachable", B)].labels["model"] == ("llama",)
    # the model recovers while A is still gone: A's receivers hear of it now
    up_but_a = [p for p in UP if p.peer_id != A] + [PeerView(A, models=("llama",))]
    sent = run.at(T0 + 120, [llama("healthy")], up_but_a)
    assert sorted(sent) == [("a-offline", FIRED), ("c-offline", RESOLVED), ("model-health", RESOLVED)]
    assert run.at(T0 + 180, [llama("healthy")], UP) == [("a-offline", RESOLVED)]


def test_without_the_default_rule_every_peer_alert_is_told():
    run = Run(inhibit=())
    run.at(T0, [llama("healthy")], UP)
    assert sorted(run.at(T0 + 60, [llama("broken")], DOWN)) == [
        ("a-offline", FIRED), ("b-unreachable", FIRED), ("c-offline", FIRED), ("model-health", FIRED)]


def test_inhibition_rules_are_settings_checked_at_start(tmp_path):
    assert AlertSettings().inhibit_in_force() == (muting.PEERS_OF_A_FIRING_MODEL,)
    own = AlertSettings.model_validate({"default_inhibit": False, "inhibit_rules": [
        {"source": ['kind="model_broken"'], "target": ['rule=~"gpu-.*"'], "equal": ["model"]}]})
    [rule] = own.inhibit_in_force()
    run = Run(rules=(Rule("model-health", core.MODEL_BROKEN, for_seconds=0),
                     Rule("gpu-a", core.PEER_OFFLINE, for_seconds=0, peers=(A,)),
                     Rule("other-a", core.PEER_OFFLINE, for_seconds=0, peers=(A,))), inhibit=(rule,))
    run.at(T0, [llama("healthy")], UP)
    assert sorted(run.at(T0 + 60, [llama("broken")], DOWN)) == [("model-health", FIRED), ("other-a", FIRED)]
    config = tmp_path / "monitor.toml"
    config.write_text('[[alerts.inhibit_rules]]\nsource = [\'colour="red"\']\ntarget = [\'kind="peer_offline"\']\n')
    with pytest.raises(SettingsError, match="source: unknown label 'colour'"):
        load_settings(config, environ={})
    config.write_text('[[alerts.inhibit_rules]]\nsource = [\'kind="model_broken"\']\ntarget = [\'kind="peer_offline"\']\n'
                      'equal = ["colour"]\n')
    with pytest.raises(SettingsError, match="equal: unknown labels"):
        load_settings(config, environ={})


# ---- grouping, with a real store and receiver ---------------------------------------------------------


MODEL = ModelInfo("llama", 8, name="Llama", official=True)


def health(state: str) -> Assessment:
    return Assessment(model="llama", state=state, reasons=() if state == "healthy" else ("blocks 0:8 have one server",),
                       coverage_pct=100.0, servers_online=1, min_redundancy=1, blocks=(), missing_ranges=(),
                       single_served_ranges=(), bottleneck_ranges=(), low_cache_ranges=(), est_tokens_per_s=2.0,
                       route=(), recommendation=Recommendation(0, 8, 8, "--block_indices 0:8", "redundancy"))


def poll(store, at, servers):
    store.record_poll(Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=tuple(
        ServerRow(peer_id=peer, model="llama", start=0, end=8, state="ONLINE", public_name=name)
        for peer, name in servers)), [health("healthy")])


@pytest.fixture
def store(tmp_path):
    with migrated_store(f"sqlite:///{tmp_path / 'monitor.db'}") as s:
        yield s


def peer_settings(tmp_path, url, fmt="generic", **alerts) -> Settings:
    return Settings(data_dir=tmp_path, scrape_period=60, initial_peers=[], alerts={
        "default_rules": False, "webhooks": [{"name": "ops", "url": url, "format": fmt}],
        "rules": [{"name": f"{n}-offline", "kind": "peer_offline", "peers": [n], "for": 0} for n in ("a", "b", "c")],
        **alerts})


@pytest.mark.parametrize("fmt", ["generic", "slack", "discord"])
def test_notices_of_one_evaluation_go_to_a_webhook_as_one_message(store, tmp_path, fmt):
    with WebhookReceiver() as hook:
        now = time.time()
        alerter = Alerter(peer_settings(tmp_path, hook.url, fmt), store, watching_since=now - 100)
        poll(store, now, [(A, "a"), (B, "b"), (C, "c")])
        assert alerter.evaluate(now).notices == ()
        poll(store, now + 1, [(C, "c")])
        assert len(alerter.evaluate(now + 1).notices) == 2
        assert alerter.deliver(now + 1) == {"delivered": 2, "retry": 0, "failed": 0}
        [message] = hook.received
        if fmt == "generic":
            assert message.body["group"] is True and message.body["count"] == 2
            assert [n["rule"] for n in message.body["notices"]] == ["a-offline", "b-offline"]
            assert message.body["summary"] == "2 alert notices: 2 firing, 0 resolved"
        else:
            text = message.body["text"] if fmt == "slack" else message.body["content"]
            assert "2 alert notices" in text and "a-offline" in text.replace("\\", "") and "b-offline" in text.replace("\\", "")
        assert {d.status for d in store.alert_deliveries()} == {"delivered"}
        poll(store, now + 2, [(A, "a"), (C, "c")])
        alerter.evaluate(now + 2)
        alerter.deliver(now + 2)
        assert len(hook.received) == 2  # one notice alone: the format's own payload
        if fmt == "generic":
            assert (hook.received[1].body["rule"], hook.received[1].body["event"]) == ("a-offline", "resolved")


def test_group_wait_gathers_notices_of_the_next_evaluations(store, tmp_path):
    with WebhookReceiver() as hook:
        now = time.time()
        alerter = Alerter(peer_settings(tmp_path, hook.url, group_wait=30), store, watching_since=now - 100)
        poll(store, now, [(A, "a"), (B, "b"), (C, "c")])
        alerter.evaluate(now)
        poll(store, now + 1, [(B, "b"), (C, "c")])
        alerter.evaluate(now + 1)
        assert alerter.deliver(now + 2) == {"delivered": 0, "retry": 0, "failed": 0}  # waits for others
        poll(store, now + 10, [(C, "c")])
        alerter.evaluate(now + 10)
        assert alerter.deliver(now + 31) == {"delivered": 2, "retry": 0, "failed": 0}
        [message] = hook.received
        assert [n["rule"] for n in message.body["notices"]] == ["a-offline", "b-offline"]
