"""Specs of the score job's SQL (``Store.peer_aggregates``) against the specification, the
per-observation scores (``monitor.core.scores.aggregate``): on a generated history, on SQLite and on
PostgreSQL, the same scores and the same counts. The scores themselves: ``test_scores.py``.
"""

from __future__ import annotations

import pytest

import monitor.core.scores as scores
from support import peer_histories, score_swarm

HOUR = 3600.0

# ---- the aggregate path (SQL) against the per-observation path ----------------------------------
# History comes from scripts/generate_history.py (the benchmarks' generator: churn, departures with
# and without OFFLINE, JOINING, unreachable peers, chat outcomes, hourly rollups and retention),
# written through the store's own write path, on SQLite and on PostgreSQL.

GEN_END = 1_700_006_000.0  # not on an hour boundary: every window starts mid-hour


def generated_store(url: str):
    """36 hours of 24 churning servers of a 16-block model polled every 20 minutes; raw rows kept 1
    day, so the week window reads rollups for its old part and raw rows for the last day."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from generate_history import HistoryGenerator

    from monitor.store import Store

    store = Store(url)
    store.migrate()
    HistoryGenerator(store, servers=24, models=1, poll_period=1200, raw_retention_days=1, seed=5,
                     num_blocks=16).run(1.5, end=GEN_END, progress=False)
    return store


@pytest.fixture(scope="module")
def generated(tmp_path_factory, postgres):
    """The same generated history (same seed) in SQLite and in PostgreSQL."""
    stores = {"sqlite": generated_store(f"sqlite:///{tmp_path_factory.mktemp('scores') / 'monitor.db'}"),
              "postgresql": generated_store(postgres.create_database())}
    yield stores
    for store in stores.values():
        store.close()


def per_observation_scores(store, now: float) -> dict:
    """The score job as it was: every observation (unmerged), reachability check and outcome read into Python."""
    histories = peer_histories(store, now - scores.SCORE_WINDOW, now, reachability_since=now - scores.REACHABILITY_WINDOW)
    return score_swarm(histories, now)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_scores_from_sql_aggregates_equal_the_per_observation_scores(generated, backend):
    store = generated[backend]
    for now in (GEN_END + 60, GEN_END + 1.5 * HOUR):  # right after a poll; after polls stopped
        expected = per_observation_scores(store, now)
        aggregates = store.peer_aggregates(now)
        actual = scores.score_all(aggregates, now)
        assert len(expected) > 24 and actual.keys() == expected.keys()  # churn brought new peers
        differences = {peer: abs(actual[peer].score - expected[peer].score) for peer in expected}
        assert max(differences.values()) <= 0.5, sorted(differences.items(), key=lambda kv: -kv[1])[:3]
        exact = sum(1 for d in differences.values() if d == 0)
        assert exact >= 0.9 * len(expected), f"only {exact} of {len(expected)} scores are equal"
        for peer, score in expected.items():
            for name, (quality, _, _) in score.components.items():
                assert actual[peer].components[name][0] == pytest.approx(quality, abs=0.02), (peer, name)
        # the evidence behind them is really there: uptime, flaps, reachability checks, failures, chat speed
        assert any(a.flaps for a in aggregates) and any(a.reachability_failed for a in aggregates)
        assert any(a.chat_speed.count for a in aggregates)
        assert any(a.uptime[2].polls > a.uptime[1].polls for a in aggregates)  # rollups counted


def test_sqlite_and_postgresql_count_the_same_aggregates(generated):
    now = GEN_END + 60
    sqlite, postgres = ({a.peer_id: a for a in generated[b].peer_aggregates(now)} for b in ("sqlite", "postgresql"))
    assert sqlite.keys() == postgres.keys() and sqlite
    for peer, a in sqlite.items():
        b = postgres[peer]
        assert (a.uptime, a.flaps, a.flap_chances, a.reachability_ok, a.reachability_failed, a.reachability_joining,
                a.chats_ok, a.chats_failed, a.last_reachability_error, a.last_chat_error, a.advertised_inference_rps) == (
            b.uptime, b.flaps, b.flap_chances, b.reachability_ok, b.reachability_failed, b.reachability_joining,
            b.chats_ok, b.chats_failed, b.last_reachability_error, b.last_chat_error, b.advertised_inference_rps), peer
        for mine, theirs in ((a.reachability_rtt, b.reachability_rtt), (a.chat_speed, b.chat_speed)):
            assert [(i, n) for i, n, _ in mine.bins] == [(i, n) for i, n, _ in theirs.bins], peer
            assert mine.median() == pytest.approx(theirs.median(), rel=1e-9) if mine.count else theirs.median() is None
    by_backend = [scores.score_all(list(found.values()), now) for found in (sqlite, postgres)]
    assert {p: s.score for p, s in by_backend[0].items()} == {p: s.score for p, s in by_backend[1].items()}
