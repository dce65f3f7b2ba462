"""Specs of the chat's feedback loop with the store: outcomes in, peer weights out."""

from __future__ import annotations

import time

from chat.feedback import StoreWeights, store_outcome_sink
from monitor.core.snapshot import ChatOutcome
from monitor.store import Store

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def test_the_next_request_routes_by_what_the_last_one_measured_not_a_period_later(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    store.migrate()
    weights = StoreWeights(store, period=3600).start()  # no periodic refresh within this test
    try:
        assert PEER not in weights()
        sink = store_outcome_sink(store, weights)
        sink(ChatOutcome(at=time.time(), peer_id=PEER, model="m", start=0, end=4, ok=True, seconds_per_token=0.2))
        deadline = time.monotonic() + 5
        while PEER not in weights() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert weights()[PEER].seconds_per_token_per_block == 0.05
        assert store.recent_chat_outcomes(0)[0].peer_id == PEER
    finally:
        weights.close()
        store.close()


def test_an_outcome_the_store_cannot_take_is_dropped_without_failing_the_chat(tmp_path, caplog):
    store = Store(f"sqlite:///{tmp_path / 'unmigrated.db'}")  # no tables: every write fails
    try:
        with caplog.at_level("WARNING", logger="chat.feedback"):
            returned = store_outcome_sink(store)(ChatOutcome(at=time.time(), peer_id=PEER, model="m", start=0, end=4,
                                                             ok=False))
        assert returned is None  # the chat goes on: nothing raised
        assert [r.getMessage() for r in caplog.records] == [
            r.getMessage() for r in caplog.records if f"chat outcome for {PEER} not recorded" in r.getMessage()]
        assert len(caplog.records) == 1  # said once, and dropped (nothing asked of the poller either)
        store.migrate()
        assert store.recent_chat_outcomes(0) == []  # the outcome is gone, not queued somewhere
    finally:
        store.close()
