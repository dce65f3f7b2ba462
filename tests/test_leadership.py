"""Specs of the pollers' lease: the decisions (pure), the claims and the fence on a real SQLite
file and a real PostgreSQL database (a take-over, a hand-over, many pollers claiming at once, a
leader frozen in the middle of a write), and the thread that keeps it (``app/leadership.py``).
Two real poller processes on a real swarm are ``test_ha_pollers.py``'s."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from monitor.app.leadership import Leadership, for_settings
from monitor.core import leadership as core
from monitor.core.leadership import EXPIRED, FIRST, RELEASED, RENEW, TAKE, WAIT, Lease, PollerId
from monitor.settings import Settings
from monitor.store import NotLeader, Store
from monitor.web import create_app
from support import STORE_KINDS, migrated_store, store_url_of, wait_until

A = PollerId("host-a:1:aa", "host-a", 1, 1000.0)
B = PollerId("host-b:2:bb", "host-b", 2, 1001.0)


def lease_of(who: PollerId, *, epoch=1, deadline=110.0, released=False) -> Lease:
    return Lease(holder=who.holder, host=who.host, pid=who.pid, started_at=who.started_at, epoch=epoch, since=50.0,
                 deadline=deadline, renewed_at=deadline - 10, released=released)


# ---- pure ----------------------------------------------------------------------------------------


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


# ---- a real database ------------------------------------------------------------------------------


@pytest.fixture(params=STORE_KINDS)
def store_url(request, tmp_path) -> str:
    return store_url_of(request, tmp_path / "monitor.db")


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as s:
        yield s


def poll_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT COUNT(*) FROM polls")).scalar()


def expire(store: Store) -> None:
    """Move the lease's deadline into the past (as the clock would, a lease length later)."""
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE poller_leases SET deadline = deadline - 3600"))


def test_the_first_claim_leads_a_second_poller_stands_by_and_takes_over_once_the_lease_ran_out(store):
    notified = []

    def webhooks(notice):
        notified.append(notice)
        return ["ops"]

    first = store.claim_poller_lease(A, 30.0, notify=webhooks)
    assert first.held and first.lease.epoch == 1 and first.term.reason == FIRST
    assert 29.0 < first.remaining <= 30.0
    second = store.claim_poller_lease(B, 30.0, role_problem="cannot reach any bootstrap peer (x:1)", notify=webhooks)
    assert not second.held and second.lease.holder == A.holder and second.term is None
    renewed = store.claim_poller_lease(A, 30.0, last_poll_at=123.0, notify=webhooks)
    assert renewed.held and renewed.lease.epoch == 1 and renewed.lease.deadline >= first.lease.deadline
    assert notified == [] and store.alert_events(0, time.time() + 60) == []

    status = store.poller_status()
    assert status.leader.holder == A.holder
    roles = {m.holder: (m.role, m.problem, m.last_poll_at) for m in status.members}
    assert roles == {A.holder: ("leader", None, 123.0),
                     B.holder: ("standby", "cannot reach any bootstrap peer (x:1)", None)}

    expire(store)
    took = store.claim_poller_lease(B, 30.0, notify=webhooks)
    assert took.held and took.lease.epoch == 2 and took.lease.holder == B.holder
    assert (took.term.reason, took.term.previous_holder) == (EXPIRED, A.holder)
    lost = store.claim_poller_lease(A, 30.0, notify=webhooks)  # the old leader hears it at its next claim
    assert not lost.held and lost.lease.holder == B.holder

    [event] = store.alert_events(0, time.time() + 60)  # the take-over is one notice, one delivery per webhook
    assert (event.notice.rule, event.notice.event) == (core.TAKEOVER_RULE, core.TAKEOVER_EVENT)
    assert "took over from poller host-a (pid 1)" in event.notice.summary
    assert [d.webhook for d in event.deliveries] == ["ops"]
    assert [(t.epoch, t.reason) for t in store.poller_status().terms] == [(2, EXPIRED), (1, FIRST)]
    assert store.poller_takeovers_since(0) == 1


def test_a_released_lease_is_taken_at_once_without_a_notice(store):
    assert store.claim_poller_lease(A, 30.0).held
    assert store.release_poller_lease(A.holder, 1)
    assert not store.release_poller_lease(A.holder, 1) or True  # (already released: nothing changes)
    took = store.claim_poller_lease(B, 30.0, notify=lambda notice: ["ops"])
    assert took.held and took.term.reason == RELEASED and took.lease.epoch == 2
    assert store.alert_events(0, time.time() + 60) == []


def test_the_fence_lets_the_leader_write_and_refuses_a_poller_that_lost_the_lease(store):
    token = {"value": None}
    fenced = store.fenced(lambda: token["value"], idle_limit=2.0)
    try:
        with pytest.raises(NotLeader, match="standby"):
            fenced.record_failed_poll(time.time(), "a standby must not write")
        grant = store.claim_poller_lease(A, 30.0)
        token["value"] = (A.holder, grant.lease.epoch)
        fenced.record_failed_poll(time.time(), "the leader writes")
        assert poll_count(store) == 1

        expire(store)
        with pytest.raises(NotLeader, match="ran out"):  # nobody took it yet, but it is no longer held
            fenced.record_failed_poll(time.time(), "too late")
        assert store.claim_poller_lease(B, 30.0).held
        with pytest.raises(NotLeader, match="host-b .pid 2. leads now .epoch 2; this poller led epoch 1"):
            fenced.record_failed_poll(time.time(), "a woken leader")
        assert poll_count(store) == 1
        store.record_failed_poll(time.time(), "an unfenced writer (the chat, the web) is not held back")
        assert poll_count(store) == 2
    finally:
        fenced.close()


def test_many_pollers_claiming_an_expired_lease_at_once_make_exactly_one_leader_per_epoch(store_url, store):
    assert store.claim_poller_lease(A, 30.0).held
    expire(store)
    pollers = [PollerId(f"p{i}", f"host-{i}", 100 + i, 0.0) for i in range(6)]
    stores = [Store(store_url) for _ in pollers]
    grants, errors = {}, []
    barrier = threading.Barrier(len(pollers))

    def run(poller, own):
        barrier.wait()
        try:
            grants[poller.holder] = own.claim_poller_lease(poller, 30.0, notify=lambda notice: ["ops"])
        except Exception as e:  # noqa: BLE001 - a locked SQLite file would be an error here
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p, s)) for p, s in zip(pollers, stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert errors == []
    winners = [holder for holder, grant in grants.items() if grant.held]
    assert len(winners) == 1
    status = store.poller_status()
    assert status.lease.holder == winners[0] and status.lease.epoch == 2
    assert [t.epoch for t in status.terms] == [2, 1]
    assert len(store.alert_events(0, time.time() + 60)) == 1  # one take-over, one notice


def test_pollers_not_seen_for_long_are_forgotten_and_the_latest_term_kept(store):
    store.claim_poller_lease(A, 30.0)
    store.claim_poller_lease(B, 30.0)
    assert store.prune_pollers(time.time() + 10) == {"poller_members": 2, "poller_terms": 0}
    assert store.poller_status().members == () and len(store.poller_status().terms) == 1


# ---- PostgreSQL: a leader frozen in the middle of a write ---------------------------------------


def test_a_leader_frozen_inside_a_write_holds_the_takeover_up_only_until_the_database_ends_its_write(postgres_url):
    """A leader's write transaction that never ends (its process frozen after its fence check):
    its renewals do not wait for it, a standby's take-over waits for it (so no write of the old
    term lands after the new term began), and the server ends it after the idle limit, so the
    take-over happens and the frozen write is lost."""
    store = Store(postgres_url)
    store.migrate()
    grant = store.claim_poller_lease(A, 3.0)
    fenced = store.fenced(lambda: (A.holder, grant.lease.epoch), idle_limit=1.5)
    try:
        writing = fenced.db.write("a write that freezes")
        frozen = writing.__enter__()  # fence passed: the lease row held FOR KEY SHARE
        frozen.execute(sa.text("INSERT INTO store_meta (key, value) VALUES ('frozen', 'x')"))
        started = time.monotonic()
        assert store.claim_poller_lease(A, 3.0).held  # the leader's own renewal does not wait for it
        assert time.monotonic() - started < 1.0
        time.sleep(3.2)  # the lease runs out
        started = time.monotonic()
        took = store.claim_poller_lease(B, 3.0)
        waited = time.monotonic() - started
        assert took.held and took.lease.epoch == 2
        assert waited < 5.0, waited  # ended by the server's idle-in-transaction timeout, not by lock_timeout
        with pytest.raises(Exception):
            frozen.execute(sa.text("SELECT 1"))  # the frozen write is gone: the server ended its session
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM store_meta WHERE key = 'frozen'")).scalar() == 0
    finally:
        fenced.close()
        store.close()


# ---- the thread that keeps the lease ------------------------------------------------------------


def test_the_leadership_thread_leads_renews_and_steps_down_when_another_poller_takes_the_lease(store):
    changes = []
    keeper = Leadership(store, 2.0, me=A, on_lead=lambda term: changes.append(("lead", term.reason)),
                        on_standby=lambda why: changes.append(("standby", why)))
    keeper.start()
    try:
        assert keeper.held() and keeper.token() == (A.holder, 1)
        time.sleep(2.5)  # longer than the lease: renewed meanwhile
        assert keeper.held() and store.poller_status().lease.epoch == 1
        # as if its renewals had stopped reaching the database for a lease length: B takes it (again
        # if a renewal of the still running thread came between the two, as a holder's may)
        assert wait_until(lambda: expire(store) or store.claim_poller_lease(B, 2.0).held, 2, step=0.05)
        assert wait_until(lambda: not keeper.held(), core.renew_every(2.0) + 1, step=0.05)  # its next renewal
        assert keeper.token() is None
        assert wait_until(lambda: len(changes) == 2, 5)
        assert changes[0] == ("lead", FIRST)
        assert changes[1][0] == "standby" and "host-b (pid 2) took the lease (epoch 2)" in changes[1][1]
    finally:
        keeper.stop()


def test_by_its_own_clock_a_lease_ends_a_lease_length_after_the_claim_that_renewed_it(store):
    keeper = Leadership(store, 2.0, me=A)
    sent = time.monotonic()
    assert keeper.claim().held  # (no thread: nothing renews it)
    assert keeper.held()
    assert wait_until(lambda: not keeper.held(), 3.0, step=0.02)
    assert 1.8 <= time.monotonic() - sent <= 2.3
    assert keeper.token() is None


def test_a_poller_that_stops_hands_its_lease_over_and_a_standby_takes_it_at_its_next_look(store):
    leader = Leadership(store, 2.0, me=A).start()
    standby = Leadership(store, 2.0, me=B).start()
    try:
        assert leader.held() and not standby.held()
        leader.stop()
        leader.release()
        started = time.monotonic()
        assert wait_until(standby.held, 2.0, step=0.05)
        assert time.monotonic() - started <= core.renew_every(2.0) + 0.5
        assert store.poller_status().terms[0].reason == RELEASED
    finally:
        leader.stop()
        standby.stop()


def test_the_settings_send_a_takeover_notice_to_every_webhook_unless_alerts_are_off(tmp_path, store):
    hooks = {"webhooks": [{"name": "ops", "url": "http://127.0.0.1:9/hook"}]}
    keeper = for_settings(store, Settings(data_dir=tmp_path, alerts=hooks, scrape_period=10))
    assert keeper.lease_seconds == 5.0
    assert keeper.notify(core.takeover_notice(core.next_term(lease_of(B, deadline=1.0), A, 2.0))) == ["ops"]
    assert for_settings(store, Settings(data_dir=tmp_path, alerts={**hooks, "enabled": False})).notify is None


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

    expire(store)  # the leader is lost; the standby takes over at its next look
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

    expire(store)  # and now nobody leads: the overview says so, /metrics too
    fresh = create_app(settings, store).test_client()
    poller = fresh.get("/api/v1/state").get_json()["poller"]
    assert not poller["leading"], poller
    assert (poller["lapsed"]["host"], poller["lapsed"]["pid"]) == ("host-b", 2)
    assert "data-no-leader" in fresh.get("/").get_data(as_text=True)
    metrics = {f.name: f for f in text_string_to_metric_families(fresh.get("/metrics").get_data(as_text=True))}
    assert metrics["swarm_monitor_poller_leading"].samples[0].value == 0
    assert metrics["swarm_monitor_poller_leader"].samples == []
