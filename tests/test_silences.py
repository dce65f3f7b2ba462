"""Specs of silences: matchers over alert labels, a silenced alert that keeps its state and sends
nothing, the notice it missed sent when the silence ends while it still fires, the API and the
Alerts page (operators only; anonymous readers only if allowed; hostile input refused). The store
on SQLite and PostgreSQL (every change logged: who, when, how, why) and a real swarm (a server
stopped under a silence sends nothing, and the silence is shown): ``test_alerts.py``.
"""

from __future__ import annotations

import re
import time

import pytest

from monitor.core import alert_rules as core
from monitor.core import muting
from monitor.core.alert_rules import CHANGED, FIRED, FIRING, RESOLVED, Cause, ModelView, PeerView, Rule, SwarmView
from monitor.core.muting import Matcher, Mutes, Silence, matcher, parse_matcher
from monitor.settings import Settings
from monitor.store import Store

T0 = 1_700_000_000.0
PERIOD = 60.0
PEER_A = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"


def view(at: float, *, models=(), peers=()) -> SwarmView:
    return SwarmView(at=at, scrape_period=PERIOD, last_ok_poll_at=at, watching_since=T0 - 3600,
                     models=tuple(models), peers=tuple(peers))


def model(state: str, prefix: str = "llama", lost=()) -> ModelView:
    return ModelView(prefix, "Llama 2", state, () if state == "healthy" else (f"blocks 0:4 make it {state}",),
                     troubled=tuple(Cause(peer, name, "unreachable") for peer, name in lost))


class Run:
    """Evaluations in sequence with the memory carried over and the silences of the moment."""

    def __init__(self, *rules: Rule):
        self.rules = rules
        self.memory: dict = {}
        self.silences: list[Silence] = []
        self.sent: list[core.Notice] = []
        self.held: list[core.Notice] = []

    def at(self, t: float, **kwargs) -> list[core.Notice]:
        result = core.evaluate(self.rules, view(t, **kwargs), self.memory, t, Mutes(silences=tuple(self.silences)))
        self.memory = result.alerts
        self.sent += result.notices
        self.held += result.held
        return list(result.notices)


def silence(*matchers: Matcher, start: float = T0, end: float = T0 + 3600, sid: int = 1) -> Silence:
    return Silence(id=sid, matchers=matchers, starts_at=start, ends_at=end, comment="upgrading petals",
                   created_by="alice", created_at=start)


HEALTH = Rule("model-health", core.MODEL_DEGRADED, for_seconds=0, repeat_seconds=0)


# ---- matchers ------------------------------------------------------------------------------------


def test_matchers_parse_as_alertmanager_writes_them_and_match_any_value_of_a_label():
    labels = muting.labels(rule="box", kind="peer_offline", severity="warning", subject="my-box",
                           models=("llama", "bloom"), peer=PEER_A, peer_name="my-box")
    assert labels["alertname"] == ("PetalsPeerOffline",) and labels["model"] == ("bloom", "llama")
    assert parse_matcher('model="llama"').matches(labels)  # one of the peer's two models
    assert parse_matcher("model=bloom").matches(labels)
    assert not parse_matcher('model!="llama"').matches(labels)
    assert parse_matcher('peer_name=~"my-.*"').matches(labels)
    assert not parse_matcher('peer_name=~"my"').matches(labels)  # anchored
    assert parse_matcher('kind!~"model_.*"').matches(labels)
    assert parse_matcher('severity="warning"') == Matcher("severity", "=", "warning")
    assert parse_matcher('peer=""').matches(muting.labels(rule="r", kind="model_broken", severity="critical",
                                                           subject="llama"))  # absent: the empty string
    assert str(parse_matcher(' rule = "a \\"b\\"" ')) == 'rule="a "b""'


@pytest.mark.parametrize("text, message", [
    ('colour="red"', "unknown label 'colour'"),
    ('model=~"("', "not a regular expression"),
    ("model", "is not a matcher"),
    ('model="' + "x" * 300 + '"', "one short line"),
    ('model="a\nb"', "must be one line"),
])
def test_bad_matchers_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_matcher(text)


# ---- a silenced alert ----------------------------------------------------------------------------


def test_a_silenced_alert_keeps_its_state_sends_nothing_and_fires_when_the_silence_ends():
    run = Run(HEALTH)
    run.silences = [silence(matcher("model", "=", "llama"), end=T0 + 600)]
    assert run.at(T0, models=[model("degraded")]) == []
    alert = run.memory[("model-health", "llama")]
    assert alert.status == FIRING and alert.state == "degraded" and alert.announced_state is None
    assert alert.held == ("silence 1: upgrading petals",)
    [held] = run.held
    assert (held.event, held.held) == (FIRED, "silence 1: upgrading petals")
    assert run.at(T0 + 60, models=[model("broken")]) == []  # changes under the silence: nothing
    assert run.memory[("model-health", "llama")].state == "broken"
    # the silence ends while it still fires: the receivers hear of it now, in its current state
    [fired] = run.at(T0 + 600, models=[model("broken")])
    assert (fired.event, fired.state, fired.severity, fired.since) == (FIRED, "broken", "critical", T0)
    assert run.memory[("model-health", "llama")].held == ()
    [resolved] = run.at(T0 + 660, models=[model("healthy")])
    assert (resolved.event, resolved.previous_state) == (RESOLVED, "broken")
    assert [n.event for n in run.sent] == [FIRED, RESOLVED]


def test_an_alert_over_before_its_silence_ends_sends_nothing_at_all():
    run = Run(HEALTH)
    run.silences = [silence(matcher("rule", "=", "model-health"))]
    run.at(T0, models=[model("degraded")])
    run.at(T0 + 60, models=[model("healthy")])
    run.at(T0 + 7200, models=[model("healthy")])
    assert run.sent == [] and [n.event for n in run.held] == [FIRED, RESOLVED]
    assert run.held[1].held == "silence 1: upgrading petals"


def test_a_silence_made_after_an_alert_fired_holds_its_reminders_but_not_its_recovery():
    run = Run(Rule("model-health", core.MODEL_DEGRADED, for_seconds=0, repeat_seconds=600))
    [fired] = run.at(T0, models=[model("degraded")])
    run.silences = [silence(matcher("model", "=", "llama"), start=T0 + 60, end=T0 + 7200)]
    for minute in range(1, 30):
        assert run.at(T0 + 60 * minute, models=[model("degraded")]) == []  # no repeats while silenced
    [resolved] = run.at(T0 + 1800, models=[model("healthy")])  # they were told it fired: they hear it is over
    assert resolved.event == RESOLVED and resolved.previous_state == "degraded"


def test_a_change_made_under_a_silence_is_told_once_it_ends():
    run = Run(HEALTH)
    run.at(T0, models=[model("degraded")])
    run.silences = [silence(matcher("model", "=", "llama"), start=T0 + 30, end=T0 + 300)]
    assert run.at(T0 + 60, models=[model("broken")]) == []
    [changed] = run.at(T0 + 300, models=[model("broken")])
    assert (changed.event, changed.previous_state, changed.state) == (CHANGED, "degraded", "broken")
    # back to what they were told while silenced: nothing to tell
    run.silences = [silence(matcher("model", "=", "llama"), start=T0 + 330, end=T0 + 600, sid=2)]
    run.at(T0 + 360, models=[model("degraded")])
    run.at(T0 + 420, models=[model("broken")])
    assert run.at(T0 + 600, models=[model("broken")]) == []


def test_silences_match_only_their_alerts():
    rules = (HEALTH, Rule("box", core.PEER_OFFLINE, for_seconds=0, peers=("my-box",)))
    run = Run(*rules)
    run.silences = [silence(matcher("peer_name", "=", "my-box"))]
    other = [PeerView("12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", public_name="other", state="ONLINE")]
    sent = run.at(T0, models=[model("degraded")], peers=other)  # my-box is not announced: offline
    assert [n.rule for n in sent] == ["model-health"]
    assert [n.rule for n in run.held] == ["box"]


SERVER_2 = ("12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "server-2")
SERVER_3 = ("12D3KooWCccccccccccccccccccccccccccccccccccccccccccccc", "server-3")


def test_a_model_alert_is_held_while_everything_the_model_lost_is_silenced():
    run = Run(HEALTH)
    run.silences = [silence(matcher("peer_name", "=", "server-2"))]
    assert run.at(T0, models=[model("degraded", lost=[SERVER_2])]) == []
    assert run.memory[("model-health", "llama")].held == (
        "silence 1: upgrading petals (what the model lost: server-2)",)
    # server-3 fails too, and nobody silenced it: the model's alert goes out
    [fired] = run.at(T0 + 60, models=[model("broken", lost=[SERVER_2, SERVER_3])])
    assert (fired.event, fired.state) == (FIRED, "broken")
    # a degraded model that lost nothing silenced is not held by a peer's silence
    other = Run(HEALTH)
    other.silences = run.silences
    assert [n.event for n in other.at(T0, models=[model("degraded")])] == [FIRED]


# ---- the web -------------------------------------------------------------------------------------


def web(tmp_path, **alerts):
    from monitor.web import create_app

    settings = Settings(data_dir=tmp_path, scrape_period=PERIOD, initial_peers=[], alerts=alerts)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    app = create_app(settings, store)
    token = app.extensions["operator_token"]
    return app.test_client(), store, {"Authorization": f"Bearer {token}"}


GOOD = {"model": "llama", "duration": "2h", "comment": "upgrading petals", "by": "alice"}


def test_only_operators_create_and_end_silences_and_anonymous_readers_only_if_allowed(tmp_path):
    client, store, operator = web(tmp_path)
    assert client.post("/api/v1/silences", json=GOOD).status_code == 401
    assert client.post("/api/v1/silences", json=GOOD, headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}
                       ).status_code == 401
    assert store.silences(ending_after=0) == []
    assert client.get("/api/v1/silences").status_code == 401  # not public unless allowed
    created = client.post("/api/v1/silences", json=GOOD, headers=operator)
    assert created.status_code == 201
    body = created.get_json()["silence"]
    assert (body["matchers"], body["status"], body["created_by"]) == (['model="llama"'], "active", "alice")
    assert body["changes"][0]["via"] == "api token"
    assert 7190 < body["ends_at"] - body["starts_at"] <= 7200
    sid = body["id"]
    # anonymous clients never end one, not even with a browser form (no session, no CSRF token)
    assert client.post(f"/api/v1/silences/{sid}/end").status_code == 401
    assert client.delete(f"/api/v1/silences/{sid}").status_code == 401
    assert client.post(f"/alerts/silences/{sid}/end").status_code in (400, 401, 403)
    assert store.silences(ending_after=time.time())[0].ended_at is None
    # a browser session without a CSRF token cannot either
    assert client.get(f"/login?token={operator['Authorization'][7:]}").status_code == 303
    assert client.post(f"/alerts/silences/{sid}/end").status_code == 403
    assert store.silences(ending_after=time.time())[0].ended_at is None
    page = client.get("/alerts").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert f'data-silence="{sid}" data-status="active"' in page and "upgrading petals" in page
    assert client.post(f"/alerts/silences/{sid}/end", data={"csrf_token": csrf, "reason": "done early"}
                       ).status_code == 303
    [ended] = store.silences(ending_after=time.time() - 60)
    assert ended.ended_at is not None
    changes = store.mute_changes("silence", [sid])[sid]
    assert [(c.action, c.via, c.why) for c in changes] == [("created", "api token", "upgrading petals"),
                                                          ("ended", "browser session", "done early")]
    # a silence made through the page's form
    assert client.post("/alerts/silences", data={"csrf_token": csrf, "peer": "my-box", "duration": "30m",
                                                  "comment": "moving racks", "by": "carol"}).status_code == 303
    newest = store.silences(ending_after=time.time())[0]
    assert [str(m) for m in newest.matchers] == ['peer_name="my-box"'] and newest.created_by == "carol"


def test_anonymous_readers_see_the_silences_in_force_without_who_made_them_if_allowed(tmp_path):
    client, store, operator = web(tmp_path, public_silences=True)
    client.post("/api/v1/silences", json=GOOD, headers=operator)
    ended = client.post("/api/v1/silences", json={**GOOD, "model": "bloom"}, headers=operator).get_json()["silence"]
    client.post(f"/api/v1/silences/{ended['id']}/end", json={"reason": "not needed"}, headers=operator)
    [public] = client.get("/api/v1/silences").get_json()["silences"]
    assert public["matchers"] == ['model="llama"'] and "created_by" not in public and "changes" not in public
    assert len(client.get("/api/v1/silences", headers=operator).get_json()["silences"]) == 2
    assert "upgrading petals" in client.get("/alerts").get_data(as_text=True)
    assert client.post("/api/v1/silences", json=GOOD).status_code == 401  # reading is all they may do


HOSTILE = [
    ({**GOOD, "duration": "1e9"}, "`duration` must be a duration"),
    ({**GOOD, "duration": 10 ** 12}, "`duration` must be between 60 s and 30 d"),
    ({**GOOD, "duration": -60}, "`duration` must be between"),
    ({**GOOD, "duration": "nan"}, "`duration` must be a duration"),
    ({**GOOD, "duration": float("inf")}, "`duration`"),
    ({**GOOD, "duration": True}, "`duration` must be a duration"),
    ({**GOOD, "duration": None, "ends_at": 1e300}, "`ends_at` must be within a year of now"),
    ({**GOOD, "duration": None, "ends_at": "yesterday"}, "`ends_at` must be a time"),
    ({**GOOD, "duration": None, "ends_at": 1000.0}, "`ends_at` must be within a year"),
    ({**GOOD, "ends_at": time.time() + 60}, "either `duration`"),
    ({**GOOD, "comment": "x" * 501}, "`comment` is 501 characters long; at most 500"),
    ({**GOOD, "comment": ""}, "`reason` is required"),
    ({**GOOD, "by": "x" * 101}, "`by` is 101 characters long"),
    ({"duration": "1h", "comment": "c"}, "say what to silence"),
    ({**GOOD, "model": None, "matchers": ['colour="red"']}, "unknown label 'colour'"),
    ({**GOOD, "model": None, "matchers": ['model=~"(("']}, "not a regular expression"),
    ({**GOOD, "model": None, "matchers": ['model=~".*"']}, "match every alert"),
    ({**GOOD, "model": None, "matchers": "rule"}, "is not a matcher"),
    ({**GOOD, "model": None, "matchers": [{"name": "model"}]}, "must be a list of matchers"),
    ({**GOOD, "model": None, "matchers": [f'rule="r{i}"' for i in range(25)]}, "at most 20 matchers"),
    ({**GOOD, "model": "x" * 300}, "`model` is 300 characters long"),
    ({**GOOD, "model": ["llama"]}, "`model` must be text"),
]


@pytest.mark.parametrize("body, message", HOSTILE)
def test_hostile_silences_are_refused_with_what_to_change(tmp_path, body, message):
    client, store, operator = web(tmp_path)
    response = client.post("/api/v1/silences", json={k: v for k, v in body.items() if v is not None}, headers=operator)
    assert response.status_code == 400, response.get_json()
    assert message in response.get_json()["error"]
    assert store.silences(ending_after=0) == []


def test_a_silenced_alert_shows_its_silence_only_to_those_who_may_read_silences(tmp_path):
    client, store, operator = web(tmp_path)
    alert = core.Alert(rule="model-health", kind=core.MODEL_DEGRADED, subject="llama", label="Llama", status=FIRING,
                       state="degraded", severity="warning", summary="Llama is degraded", since=T0, fired_at=T0,
                       models=("llama",), held=("silence 7: the secret upgrade plan",))
    notice = core.Notice(rule="model-health", kind=core.MODEL_DEGRADED, subject="llama", label="Llama", event=FIRED,
                         state="degraded", severity="warning", summary="Llama is degraded", at=time.time(), since=T0,
                         held="silence 7: the secret upgrade plan")
    store.record_alert_evaluation(core.Evaluation(alerts={alert.key: alert}, changed=(alert,), held=(notice,)),
                                  lambda n: ["ops"], time.time())
    anonymous = client.get("/api/v1/alerts").get_json()
    assert anonymous["active"][0]["held"] == [{"by": "silence", "reason": "silence"}]
    assert anonymous["events"][0]["held"] == "silence" and anonymous["events"][0]["deliveries"] == []
    for path in ("/", "/alerts"):
        page = client.get(path).get_data(as_text=True)
        assert "secret upgrade plan" not in page and "held" in page
    told = client.get("/api/v1/alerts", headers=operator).get_json()
    assert told["active"][0]["held"][0]["reason"] == "silence 7: the secret upgrade plan"
    public, _, _ = web(tmp_path / "public", public_silences=True)
    public.application.extensions["swarm_monitor"].store = store
    assert "secret upgrade plan" in public.get("/alerts").get_data(as_text=True)


def test_a_body_that_is_not_a_json_object_is_refused(tmp_path):
    client, store, operator = web(tmp_path)
    for body in ('["model=llama"]', '"x"', "{", "null"):
        response = client.post("/api/v1/silences", data=body, headers={**operator, "Content-Type": "application/json"})
        assert response.status_code == 400, body
    assert client.post("/api/v1/silences/notanumber/end", headers=operator).status_code == 404
    assert client.post("/api/v1/silences/999/end", headers=operator).status_code == 404
    assert store.silences(ending_after=0) == []
