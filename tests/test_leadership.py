"""Specs of the pollers' lease: the claims and the fence on a real SQLite file and a real PostgreSQL
database (a take-over, a hand-over, many pollers claiming at once, a leader frozen in the middle of
a write), and the thread that keeps it (``app/leadership.py``). The decisions (pure) and what the
pages say: ``test_lease_decisions.py``; two real poller processes on a real swarm are
``test_ha_pollers.py``'s."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from monitor.app.leadership import Leadership, for_settings
from monitor.core import leadership as core
from monitor.core.leadership import EXPIRED, FIRST, RELEASED, PollerId
from monitor.settings import Settings
from monitor.store import NotLeader, Store
from support import STORE_KINDS, expire_lease, lease_of, migrated_store, store_url_of, wait_until

A = PollerId("host-a:1:aa", "host-a", 1, 1000.0)
B = PollerId("host-b:2:bb", "host-b", 2, 1001.0)


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

    expire_lease(store)
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
    released = store.poller_status().lease
    assert released.released and store.poller_status().leader is None  # nobody leads until a standby claims
    assert not store.release_poller_lease(B.holder, 1)  # a poller that never held it gives nothing up
    assert not store.release_poller_lease(A.holder, 2)  # nor a term A never had
    assert store.release_poller_lease(A.holder, 1)  # again: still A's released term, nothing changes
    assert store.poller_status().lease == released
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

        expire_lease(store)
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
    expire_lease(store)
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
        assert wait_until(lambda: expire_lease(store) or store.claim_poller_lease(B, 2.0).held, 2, step=0.05)
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
