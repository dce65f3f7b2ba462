"""The contribution ledger (``core/contributions.py``, ``store/contributions.py``, ``web/contributors.py``):
what every server gave the swarm, by what the stored assessments said of it between polls —
measured, not announced. (On a real swarm with faults the harness controls: ``test_contributors_swarm.py``.)"""

from __future__ import annotations

import dataclasses
import time

import pytest

from monitor.core import contributions as ledger
from monitor.core.assessment import CAUSE_FAILING, CAUSE_SERVING, Assessment, RouteHop, ServerAssessment
from monitor.core.common import HOUR
from monitor.core.probes import CORRECT, WRONG, ServerProbe
from monitor.core.requests import OK, RequestRecord
from monitor.core.snapshot import JOINING, ONLINE, ServerRow, Snapshot
from monitor.web import create_app
from support import PEERS, TINY, peer, poll_rows, sqlite_store, web_settings

A, B, C = PEERS["first"], PEERS["second"], PEERS["full"]


def judged(peer: str, cause: str, *, verdict: str | None = None, at: float = 0.0, measured: float | None = None):
    probe = ServerProbe(peer, "m", 0, 4, at=at, ok=True, verdict=verdict) if verdict else None
    return ServerAssessment(peer_id=peer, cause=cause, verdict=probe, measured=measured)


def assessment(*servers: ServerAssessment) -> Assessment:
    return Assessment(model="m", state="healthy", reasons=(), coverage_pct=100.0, servers_online=len(servers),
                      min_redundancy=1, blocks=(), missing_ranges=(), single_served_ranges=(), bottleneck_ranges=(),
                      low_cache_ranges=(), est_tokens_per_s=None, route=(), recommendation=None,
                      servers={s.peer_id: s for s in servers})


def test_a_poll_earns_its_servers_what_its_assessment_said_until_the_next_one():
    start = 10 * HOUR - 30  # the interval crosses an hour: split at it
    servers = [ServerRow(A, "m", 0, 4, ONLINE), ServerRow(B, "m", 4, 8, ONLINE), ServerRow(C, "m", 0, 8, ONLINE),
               ServerRow(PEERS["joining"], "m", 2, 6, JOINING)]
    said = assessment(judged(A, CAUSE_SERVING, verdict=CORRECT, at=start - 60, measured=0.01),
                      judged(B, CAUSE_FAILING), judged(C, CAUSE_SERVING, verdict=WRONG, at=start - 60),
                      judged(PEERS["joining"], "joining"))
    found = {(a.peer_id, a.hour): a for a in ledger.accrue_poll(start, start + 60, servers, {"m": said})}
    first, second = found[(A, 9 * HOUR)], found[(A, 10 * HOUR)]
    assert (first.watched, second.watched) == (30.0, 30.0)
    assert first.announced == first.serving == first.verified == 4 * 30.0  # serving, checked correct 60 s before
    assert first.speed_sum == pytest.approx(0.01 * 30) and first.speed_seconds == 30.0
    failing = found[(B, 9 * HOUR)]
    assert failing.announced == 4 * 30.0 and failing.serving == failing.verified == failing.serving_seconds == 0.0
    wrong = found[(C, 9 * HOUR)]  # serving, but its newest verdict is wrong: nothing verified
    assert wrong.serving == 8 * 30.0 and wrong.verified == 0.0
    joining = found[(PEERS["joining"], 9 * HOUR)]
    assert joining.announced == joining.serving == 0.0 and joining.watched == 30.0
    # a verdict older than VERIFIED_WITHIN verifies nothing; a gap past MAX_GAP earns nothing past it
    stale = assessment(judged(A, CAUSE_SERVING, verdict=CORRECT, at=start - ledger.VERIFIED_WITHIN - 1))
    (late,) = ledger.accrue_poll(start, start + 10, servers[:1], {"m": stale})
    assert late.serving == 40.0 and late.verified == 0.0
    away = ledger.accrue_poll(0.0, 10 * HOUR, servers[:1], {"m": said})
    assert sum(a.watched for a in away) == ledger.MAX_GAP
    assert ledger.accrue_poll(start, start + 60, servers[:1], {}) [0].serving == 0.0  # no assessment: not serving


def test_real_requests_credit_each_server_of_their_route_with_tokens_times_its_blocks():
    at = 5 * HOUR + 1
    records = [RequestRecord(at=at, model="m", api="openai", outcome=OK, tokens=10, route=(RouteHop(A, 0, 4), RouteHop(B, 4, 8))),
               RequestRecord(at=at, model="m", api="page", outcome=OK, tokens=5, route=(RouteHop(C, 0, 8),)),
               RequestRecord(at=at, model="m", api="page", outcome="error", tokens=3, route=(RouteHop(A, 0, 4),))]
    found = {a.peer_id: a for a in ledger.accrue_requests(records)}
    assert (found[A].block_tokens, found[A].requests) == (40, 1) and found[B].block_tokens == 40
    assert found[C].block_tokens == 40 and found[C].hour == 5 * HOUR


def test_the_store_keeps_the_ledger_by_hour_and_for_all_time_and_the_api_and_page_show_it(tmp_path):
    from monitor.app import assessing

    settings, store = web_settings(), sqlite_store(tmp_path)
    try:
        now = time.time()
        start = now - 180
        for i in range(4):  # four polls 60 s apart: three intervals earned
            at = start + 60 * i
            snapshot = Snapshot(taken_at=at, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
            store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=at))
        day = store.contributions(now - 86400)
        assert {c.peer_id for c in day} == {A, B, C}
        by_peer = {c.peer_id: c for c in day}
        assert by_peer[C].watched_hours == pytest.approx(180 / HOUR)
        assert by_peer[C].announced_block_hours == pytest.approx(8 * 180 / HOUR)
        assert by_peer[A].announced_block_hours == pytest.approx(4 * 180 / HOUR)
        assert by_peer[C].name == "https://example.org/full"  # its announced name, shown as a claim
        total = {c.peer_id: c for c in store.contributions(None)}
        assert total[C].announced_block_hours == pytest.approx(by_peer[C].announced_block_hours)
        since, days = ledger.window_start("week", now)  # a week: read from the days, summed beside the hours
        weekly = {c.peer_id: c.to_dict() for c in store.contributions(since, days=days)}
        assert days and weekly == {peer: c.to_dict() for peer, c in by_peer.items()}  # (to_dict: to 4 decimals)
        for c in day:  # judged serving all along, never checked for correctness: serving, not verified
            assert c.serving_block_hours == pytest.approx(c.announced_block_hours) and c.verified_block_hours == 0.0
            assert c.uptime == 1.0
        client = create_app(settings, store).test_client()
        body = client.get("/api/v1/contributors?window=day&sort=announced").get_json()
        assert body["window"] == "day" and [c["peer_id"] for c in body["contributors"]][0] == C
        assert client.get(f"/api/v1/contributors?model={TINY.dht_prefix}&window=all").status_code == 200
        for bad in ("window=year", "sort=name", "limit=0", "limit=x", "model=%00"):
            answer = client.get(f"/api/v1/contributors?{bad}")
            assert answer.status_code == 400 and bad.split("=")[0] in answer.get_json()["error"]
        one = client.get(f"/api/v1/contributors/{C}").get_json()
        assert one["windows"]["day"]["total"]["announced_block_hours"] == pytest.approx(8 * 180 / HOUR, rel=1e-3)
        assert [m["model"] for m in one["windows"]["all"]["models"]] == [TINY.dht_prefix]
        assert client.get("/api/v1/contributors/not-a-peer").status_code == 400
        page = client.get("/contributors?window=day").get_data(as_text=True)
        assert "Contributors" in page and "measured, not announced" in page and "example.org/full" in page
        assert client.get("/contributors?window=year").status_code == 400
        badge = client.get(f"/badges/peers/{C}/contribution.svg?window=day").get_data(as_text=True)
        assert "0 verified block-hours" in badge and "<svg" in badge  # serving, never checked: none verified
        assert "unknown" in client.get(f"/badges/peers/{peer('never-seen')}/contribution.json").get_data(as_text=True)
        state = client.get("/api/v1/state").get_json()
        assert {c["peer_id"] for c in state["measured_contributors"]} == {A, B, C}
        assert state["top_contributors"]["https://example.org/full"] == 8  # health.petals.dev's: names, blocks now
        peer_page = client.get(f"/peers/{C}").get_data(as_text=True)
        assert "What this server gave" in peer_page and f"/api/v1/contributors/{C}" in peer_page
        assert "contribution.svg" in peer_page  # its badge's Markdown, to paste
        # a later assessment of the last poll (a reachability round: C cannot be reached) judges it anew
        last = Snapshot(taken_at=start + 180, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
        again = [dataclasses.replace(a, servers={**a.servers, C: dataclasses.replace(a.servers[C], cause="unreachable")})
                 for a in assessing.assess_poll(store, settings, last, {}, now=start + 180)]
        assert store.record_assessments(again, taken_at=start + 180)
        after = Snapshot(taken_at=start + 240, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
        store.record_poll(after, assessing.assess_poll(store, settings, after, {}, now=start + 240))
        grown = {c.peer_id: c for c in store.contributions(None)}
        assert grown[C].watched_hours == pytest.approx(240 / HOUR)
        assert grown[C].serving_block_hours == pytest.approx(8 * 180 / HOUR)  # its last minute: unreachable, nothing
        assert grown[A].serving_block_hours == pytest.approx(4 * 240 / HOUR)
        # the hours past the rollup retention go into the all-time rows, each once
        unnamed = lambda found: {c.peer_id: dataclasses.replace(c, name=None) for c in found}  # noqa: E731
        store.rollup_and_prune(now + 3 * 86400, raw_retention_days=1, rollup_retention_days=1)
        assert store.contributions(now - 86400) == []  # no hour kept (nor the peers' names, long unseen)
        assert unnamed(store.contributions(None)) == unnamed(grown.values())
        store.rollup_and_prune(now + 3 * 86400, raw_retention_days=1, rollup_retention_days=1)  # again: nothing twice
        assert unnamed(store.contributions(None)) == unnamed(grown.values())
    finally:
        store.close()


def test_hours_fold_into_days_once_each_late_credits_count_in_every_window_and_old_hours_go(tmp_path):
    """The hourly rollup folds each hour that ended into its day (``store/contributions.fold``); a
    credit that arrives for an hour already folded (a late request row, a poll after an outage) is
    added to its day too; hours older than two days are dropped once folded — and every window says
    the same sums throughout."""
    import sqlalchemy as sa

    from monitor.store import contributions as stored
    from monitor.store.schema import ContributionHourRow

    store = sqlite_store(tmp_path)
    now = 100 * 86400.0 + 13 * HOUR + 1200  # 13:20 UTC, day 100
    hours = [now - 3 * 86400, now - 86400 + HOUR, now - 2 * HOUR, now]  # 3 days ago, yesterday, earlier, now
    credit = lambda at, n=1.0: ledger.Accrual(peer_id=A, model="m", hour=at // HOUR * HOUR, announced=n * 3600,  # noqa: E731
                                              serving=n * 3600, watched=3600.0, serving_seconds=3600.0)

    def windows():
        out = {}
        for name in ("day", "week", "month", "all"):
            since, days = ledger.window_start(name, now)
            found = store.contributions(since, days=days)
            out[name] = round(found[0].announced_block_hours, 6) if found else 0.0
        return out

    try:
        with store.db.write("spec") as conn:
            stored.record(conn, [credit(at) for at in hours])
        before = windows()
        assert before == {"day": 3.0, "week": 4.0, "month": 4.0, "all": 4.0}
        with store.db.write("spec") as conn:
            assert stored.fold(conn, now) == 3  # every hour that ended 10 min ago; not the one going on
            assert stored.fold(conn, now) == 0  # each once
        assert windows() == before
        with store.db.write("spec") as conn:
            stored.record(conn, [credit(hours[1], 0.5)])  # late, for yesterday's folded hour
        assert windows() == {"day": 3.5, "week": 4.5, "month": 4.5, "all": 4.5}
        with store.db.write("spec") as conn:
            stored.prune(conn, now - 400 * 86400, now)  # (no day past the retention) hours older than 2 days
            assert stored.fold(conn, now + 2 * HOUR) == 1  # the hour that was going on, once it ended
        assert windows() == {"day": 3.5, "week": 4.5, "month": 4.5, "all": 4.5}
        with store.db.read("spec") as conn:
            kept = [r[0] for r in conn.execute(sa.select(ContributionHourRow.__table__.c.hour))]
        assert min(kept) > now - 2 * 86400  # the hour of 3 days ago is only in its day now
    finally:
        store.close()
