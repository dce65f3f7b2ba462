"""Specs of the pollers' lease decided without I/O (``monitor.core.leadership``): who claims, renews
or waits, each term's epoch and whom it replaced, which take-over is a notice, the status and the
default lease length; and what the overview, the state API and /metrics say of the leader, its
standbys and the take-overs. The claims and the fence on SQLite and PostgreSQL, and the thread that
keeps the lease: ``test_leadership.py``.
"""

from __future__ import annotations

from monitor.core import leadership as core
from monitor.core.leadership import EXPIRED, FIRST, RELEASED, RENEW, TAKE, WAIT, PollerId
from monitor.settings import Settings
from monitor.web import create_app
from support import expire_lease, lease_of

A = PollerId("host-a:1:aa", "host-a", 1, 1000.0)
B = PollerId("host-b:2:bb", "host-b", 2, 1001.0)


# ---- the decisions -----------------------------------------------------------------------------


def test_a_claim_takes_a_missing_expired_or_released_lease_renews_its_own_and_waits_for_a_valid_one():
    assert core.claim(None, A, 100.0) == TAKE
    assert core.claim(lease_of(A), A, 100.0) == RENEW
    assert core.claim(lease_of(A, deadline=90.0), A, 100.0) == RENEW  # ran out, nobody took it: still mine
    assert core.claim(lease_of(B), A, 100.0) == WAIT
    assert core.claim(lease_of(B, deadline=100.0), A, 100.0) == TAKE  # the deadline itself is past
    assert core.claim(lease_of(B, released=True), A, 100.0) == TAKE


def test_each_term_has_the_next_epoch_and_says_whom_it_replaced_and_why():
    first = core.next_term(None, A, 10.0)
    assert (first.epoch, first.reason, first.previous_holder, first.is_takeover) == (1, FIRST, None, False)
    assert "the first poller" in first.summary()
    lost = core.next_term(lease_of(B, epoch=7, deadline=99.0), A, 100.0)
    assert (lost.epoch, lost.reason, lost.previous_holder, lost.previous_deadline) == (8, EXPIRED, B.holder, 99.0)
    assert lost.is_takeover and "took over from poller host-b (pid 2), whose lease ran out" in lost.summary()
    handed = core.next_term(lease_of(B, epoch=7, released=True), A, 100.0)
    assert (handed.reason, handed.is_takeover) == (RELEASED, False)
    assert "stopped and handed over" in handed.summary()


def test_only_a_takeover_sends_a_notice_and_it_names_the_leader_it_replaced():
    assert core.takeover_notice(core.next_term(None, A, 10.0)) is None
    assert core.takeover_notice(core.next_term(lease_of(B, released=True), A, 100.0)) is None
    notice = core.takeover_notice(core.next_term(lease_of(B, epoch=3, deadline=99.0), A, 100.0))
    assert (notice.rule, notice.kind, notice.event, notice.subject) == (
        core.TAKEOVER_RULE, core.TAKEOVER_KIND, core.TAKEOVER_EVENT, core.LEASE_NAME)
    assert "host-a (pid 1) took over from poller host-b (pid 2)" in notice.summary
    assert (notice.at, notice.since) == (100.0, 99.0)


def test_the_status_names_the_leader_while_its_lease_holds_and_counts_recent_standbys():
    members = (core.Member(A.holder, "host-a", 1, 0.0, seen_at=99.0, role="leader"),
               core.Member(B.holder, "host-b", 2, 0.0, seen_at=95.0, role="standby"),
               core.Member("c", "host-c", 3, 0.0, seen_at=10.0, role="standby"))  # long gone
    status = core.PollerStatus(now=100.0, lease_seconds=10.0, lease=lease_of(A), members=members)
    assert status.leader.holder == A.holder and status.leader_member.host == "host-a"
    assert [m.host for m in status.standbys()] == ["host-b"]
    assert status.summary().startswith("poller host-a (pid 1) leads since") and "1 standby seen" in status.summary()
    expired = core.PollerStatus(now=180.0, lease_seconds=10.0, lease=lease_of(A), members=members)
    assert expired.leader is None and [m.host for m in expired.standbys()] == []
    assert expired.summary().startswith("no poller leads: the lease of poller host-a (pid 1) ran out 70 s ago")
    assert core.PollerStatus(now=1.0, lease_seconds=None, lease=None).summary() == (
        "no poller has run against this database yet")


def test_the_default_lease_is_half_a_scrape_period_and_a_takeover_comes_within_one_and_a_half_leases():
    assert Settings().resolved_leader_lease_seconds == 30.0  # 60 s scrape period
    assert Settings(scrape_period=2).resolved_leader_lease_seconds == core.MIN_LEASE_SECONDS
    assert Settings(leader_lease_seconds=7).resolved_leader_lease_seconds == 7
    assert core.takeover_within(30.0) == 45.0 < 60.0  # within one default scrape period
    assert core.renew_every(30.0) == 7.5 and core.write_idle_limit(30.0) == 7.5


# ---- what the pages, the state API and /metrics say ---------------------------------------------


def test_the_overview_the_state_api_and_metrics_name_the_leader_its_standbys_and_the_takeovers(populated):
    from prometheus_client.parser import text_string_to_metric_families

    app, store, settings, now = populated
    client = app.test_client()
    store.claim_poller_lease(A, 30.0, last_poll_at=now)
    store.claim_poller_lease(B, 30.0, role_problem="cannot reach any bootstrap peer (x:1), retrying")

    poller = client.get("/api/v1/state").get_json()["poller"]
    assert poller["leading"] and (poller["leader"]["host"], poller["leader"]["pid"]) == ("host-a", 1)
    assert poller["leader"]["last_poll_at"] == now and poller["standbys_seen"] == 1
    assert poller["standbys"][0]["problem"] == "cannot reach any bootstrap peer (x:1), retrying"
    assert poller["takeovers"] == [] and poller["takeover_within"] == 45.0
    assert poller["single"].startswith("SQLite: one poller per database file")
    page = client.get("/").get_data(as_text=True)
    assert 'data-leader="host-a:1"' in page and 'data-standbys="1"' in page and "data-no-leader" not in page
    assert "cannot reach any bootstrap peer (x:1), retrying" in page

    expire_lease(store)  # the leader is lost; the standby takes over at its next look
    store.claim_poller_lease(B, 30.0, notify=lambda notice: [])
    fresh = create_app(settings, store).test_client()  # (an app of its own: what one reads is kept 10 s)
    poller = fresh.get("/api/v1/state").get_json()["poller"]
    assert poller["leader"]["pid"] == 2, poller
    assert [t["summary"] for t in poller["takeovers"]][0].startswith(
        "poller host-b (pid 2) took over from poller host-a (pid 1), whose lease ran out")
    metrics = {f.name: f for f in text_string_to_metric_families(fresh.get("/metrics").get_data(as_text=True))}
    [leader] = metrics["swarm_monitor_poller_leader"].samples
    assert (leader.labels["host"], leader.labels["pid"], leader.labels["epoch"], leader.value) == ("host-b", "2", "2", 1)
    assert metrics["swarm_monitor_poller_leading"].samples[0].value == 1
    assert metrics["swarm_monitor_poller_takeovers"].samples[0].value == 1

    expire_lease(store)  # and now nobody leads: the overview says so, /metrics too
    fresh = create_app(settings, store).test_client()
    poller = fresh.get("/api/v1/state").get_json()["poller"]
    assert not poller["leading"], poller
    assert (poller["lapsed"]["host"], poller["lapsed"]["pid"]) == ("host-b", 2)
    assert "data-no-leader" in fresh.get("/").get_data(as_text=True)
    metrics = {f.name: f for f in text_string_to_metric_families(fresh.get("/metrics").get_data(as_text=True))}
    assert metrics["swarm_monitor_poller_leading"].samples[0].value == 0
    assert metrics["swarm_monitor_poller_leader"].samples == []
