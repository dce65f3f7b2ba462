"""Spec: the chat's router reads the server probes' verdicts from the stored assessment (README:
Chat, Probes).

The assessment counts a probe for ``recent_window(speed_probe_period)`` seconds
(``monitor.core.probes``); the router's weights (``chat.feedback.StoreWeights``) take the verdicts
and measured speeds from that stored assessment, so a "wrong outputs" verdict the dashboard no
longer shows no longer zeroes a server's routing weight, and a stale speed no longer steers routes.
Chat outcomes keep their own, longer window (``CHAT_OUTCOME_WINDOW``): they come only when someone
chats. Through a real store (SQLite), the poller's assess step and the real StoreWeights.
"""

from __future__ import annotations

import time

import pytest

from chat.feedback import CHAT_OUTCOME_WINDOW, UNUSABLE_SCORE, StoreWeights
from monitor.app import assessing
from monitor.core.probes import WRONG, ServerProbe, recent_window
from monitor.core.snapshot import ONLINE, ChatOutcome, ModelInfo, ServerRow, Snapshot
from monitor.settings import Settings
from monitor.store import Store

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
OTHER = "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"
PERIOD = 60.0  # speed_probe_period: the window is MAX_AGE_PERIODS of it, far below an hour


@pytest.fixture
def store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    yield store
    store.close()


def wrong_probe(peer: str, at: float) -> ServerProbe:
    return ServerProbe(peer_id=peer, model="m", start=0, end=4, at=at, ok=True, seconds_per_token=0.2,
                       verdict=WRONG, error_ratio=0.9, tolerance=0.01)


def assess(store, now: float, speed_probe_period: float) -> None:
    """A poll of both servers, stored with its assessment as the poller stores it."""
    model = ModelInfo("m", 4)
    snapshot = Snapshot(taken_at=now, duration=0.1, models=(model,),
                        servers=tuple(ServerRow(peer, "m", 0, 4, ONLINE) for peer in (PEER, OTHER)))
    settings = Settings(models=[{"dht_prefix": "m", "num_blocks": 4}], speed_probe_period=speed_probe_period)
    store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=now))


def test_a_wrong_output_verdict_older_than_the_diagnosis_window_no_longer_zeroes_the_weight(store):
    now = time.time()
    window = recent_window(PERIOD)
    assert window < CHAT_OUTCOME_WINDOW  # the case this spec is about: an hour would still see it
    stale, fresh = wrong_probe(PEER, now - window - 30), wrong_probe(OTHER, now - window / 2)
    store.record_server_probes([stale, fresh])

    assess(store, now, PERIOD)
    servers = store.latest_assessments()["m"].servers  # what the assessment reads: only the fresh verdict
    assert servers[OTHER].wrong_outputs and servers[PEER].wrong_outputs is None

    weights = StoreWeights(store, period=3600).refresh()
    assert weights[OTHER].score == UNUSABLE_SCORE  # a fresh verdict zeroes it
    assert PEER not in weights or weights[PEER].score != UNUSABLE_SCORE  # a stale one no longer does
    assert PEER not in weights or weights[PEER].seconds_per_token_per_block is None  # nor its stale speed


def test_the_window_follows_the_speed_probe_period_and_chat_outcomes_keep_their_own(store):
    now = time.time()
    at = now - recent_window(PERIOD) - 30  # past the window of PERIOD, within that of 10 * PERIOD
    store.record_server_probes([wrong_probe(PEER, at)])
    store.record_chat_outcome(ChatOutcome(at=now - CHAT_OUTCOME_WINDOW / 2, peer_id=OTHER, model="m", start=0, end=4,
                                          ok=True, seconds_per_token=0.2))

    assess(store, now, PERIOD)
    short = StoreWeights(store, period=3600).refresh()
    assess(store, now + 1, 10 * PERIOD)  # the poller runs with a longer probe period
    long = StoreWeights(store, period=3600).refresh()
    assert PEER not in short or short[PEER].score != UNUSABLE_SCORE
    assert long[PEER].score == UNUSABLE_SCORE
    for weights in (short, long):  # a chat half an hour ago still counts, whatever the probes' window
        assert weights[OTHER].seconds_per_token_per_block == pytest.approx(0.05)
