"""Forecast ranges calibrated on the forecasts' own record (``monitor/core/calibration.py``): the
arithmetic on worked cases, the coverage it reaches on a stream it has not seen, and a request row
keeping the forecast it was given through the store."""

from __future__ import annotations

import math
import random
import time

import pytest

from monitor.core import calibration as cal
from monitor.core.calibration import Given, Scored, Told
from monitor.core.forecast import ForecastInputs, Observed, forecast, inputs
from monitor.core.requests import OK, RequestRecord
from support import sqlite_store


def given(load=1.0, tps=(10.0, 8.0, 12.0), ttft=None, wait=0.0) -> Given:
    median, low, high = tps
    told = Told(median, low, high, low, high)
    return Given(load=load, source="requests", based_on=20, calibrated_on=0, tokens_per_second=told,
                 time_to_first_token=Told(*([ttft] * 5)) if ttft else Told(), wait=Told(wait, None, None, None, None))


def test_each_end_takes_the_weighted_conformal_quantile_of_its_scores_the_newest_weighing_most():
    scores = [float(i) / 10 for i in range(1, 21)]  # 0.1 .. 2.0, n = 20
    # unweighted: the ceil((n + 1) * 0.9)-th smallest = the 19th
    assert cal.conformal_shift(scores, half_life=None) == 1.9
    assert cal.conformal_shift(scores, level=0.8, half_life=None) == 1.7  # ceil(21 * 0.8) = 17th
    assert cal.conformal_shift(scores[:19]) is None  # fewer than MIN_CALIBRATION: none
    # weighted by recency (half-life 10 requests): 100 old scores of 1.0, then 100 new of 0.2. The new
    # ones weigh about 13.9 together, the old 0.014, the next request 1: 90 % of the 14.9 is reached
    # within the new ones. Unweighted, the 181st smallest is 1.0 either way.
    old_wide, new_tight = [1.0] * 100, [0.2] * 100
    assert cal.conformal_shift(old_wide + new_tight, half_life=10) == 0.2
    assert cal.conformal_shift(new_tight + old_wide, half_life=10) == 1.0
    assert cal.conformal_shift(old_wide + new_tight, half_life=None) == 1.0
    # half-life 1: the next request alone outweighs every past one, so the quantile lies past the
    # last score: the largest shift allowed
    assert cal.conformal_shift([0.1] * 30, half_life=1.0) == cal.MAX_SHIFT
    assert cal.conformal_shift([10.0] * 30) == cal.MAX_SHIFT and cal.conformal_shift([-10.0] * 30) == -cal.MAX_SHIFT


def test_a_range_widens_after_misses_on_the_side_they_fell_and_then_holds_what_it_missed():
    # every request got 5 tokens/s where the requests alike said 8-12: 8 / 5 below the low end, on a
    # log scale, and 12 / 5 inside the high end
    record = [Scored(given(), {"tokens_per_second": 5.0}) for _ in range(30)]
    low, high = cal.scores("tokens_per_second", record[0].given.tokens_per_second, 5.0)
    assert math.isclose(low, math.log(8.0 / 5.0)) and math.isclose(high, math.log(5.0 / 12.0))
    calibration = cal.calibrate(record)
    shift, on = calibration.shift(1.0, "tokens_per_second")
    assert on == 30 and math.isclose(shift[0], math.log(1.6)) and math.isclose(shift[1], math.log(5.0 / 12.0))
    told = cal.widen("tokens_per_second", 10.0, (8.0, 12.0), shift)
    # the low end moves down to what they got; the high end comes in, but never past the median
    assert math.isclose(told.low, 5.0) and told.high == 10.0 and (told.base_low, told.base_high) == (8.0, 12.0)


def test_a_range_narrows_after_hits_but_never_past_its_median():
    # the requests alike said 2-50 tokens/s and every request got 9-11: the range was far too wide
    rng = random.Random(3)
    record = [Scored(given(tps=(10.0, 2.0, 50.0)), {"tokens_per_second": rng.uniform(9.0, 11.0)}) for _ in range(50)]
    shift, _ = cal.calibrate(record).shift(1.0, "tokens_per_second")
    assert max(shift) < 0
    told = cal.widen("tokens_per_second", 10.0, (2.0, 50.0), shift)
    assert 2.0 < told.low <= 10.0 <= told.high < 50.0
    assert told.high / told.low < 3  # sharp: about the spread the requests really had
    inward = cal.widen("tokens_per_second", 10.0, (9.9, 10.1), (-cal.MAX_SHIFT, -cal.MAX_SHIFT))  # stops at the median
    assert inward.low == inward.high == 10.0


def test_each_load_band_calibrates_on_its_own_and_a_thin_band_borrows_the_models():
    alone = [Scored(given(load=1.0), {"tokens_per_second": 10.0}) for _ in range(40)]  # hits, dead centre
    busy = [Scored(given(load=16.0), {"tokens_per_second": 2.0}) for _ in range(25)]  # misses by 4x
    calibration = cal.calibrate(alone + busy)
    assert max(calibration.shift(1.0, "tokens_per_second")[0]) < 0 < calibration.shift(16.0, "tokens_per_second")[0][0]
    shared = calibration.shift(3.0, "tokens_per_second")  # no request of that band: the model's, over all 65
    assert shared == calibration.shifts[cal.ALL]["tokens_per_second"] and shared[1] == 65
    assert cal.Calibration().shift(1.0, "wait") == (None, 0)


def test_the_wait_is_calibrated_on_its_own_scale_from_a_point_forecast():
    # the queue said 0 s and requests waited 0-4 s: a range around 0 appears, never below 0
    record = [Scored(given(wait=0.0), {"wait": w}) for w in [0.0] * 10 + [1.0, 2.0, 3.0, 4.0] * 5]
    shift, _ = cal.calibrate(record).shift(1.0, "wait")
    told = cal.widen("wait", 0.0, None, shift)
    assert told.low == 0.0 and 2.0 <= told.high <= 4.0


def test_calibrated_ranges_hold_eight_in_ten_of_requests_they_have_not_seen():
    """A stream whose requests alike give a range twice too narrow, then one twice too wide: each
    request is told the range calibrated on the ones before it (never on itself); the share within
    lands at 80 %, where the uncalibrated ranges held far fewer, then far more; and the ranges are
    sharp: about as wide as the truth's own 10th-90th percentiles, whatever the requests alike said."""
    rng = random.Random(7)
    for spread, uncalibrated in ((0.5, (0.30, 0.60)), (2.0, (0.95, 1.0))):
        history, hits, raw_hits, widths = [], [], [], []
        for _ in range(600):
            truth_sigma = 0.5  # log-normal tokens/s around 10
            z = 1.2816 * truth_sigma * spread  # the requests alike's 10th-90th, scaled wrong
            base = (10.0 * math.exp(-z), 10.0 * math.exp(z))
            shift, _ = cal.calibrate(history[-cal.CALIBRATION_REQUESTS:]).shift(1.0, "tokens_per_second")
            told = cal.widen("tokens_per_second", 10.0, base, shift)
            got = 10.0 * math.exp(rng.gauss(0.0, truth_sigma))
            if len(history) >= 100:  # scored once the calibration has a record
                hits.append(cal.within(told, got))
                raw_hits.append(base[0] <= got <= base[1])
                widths.append(math.log(told.high / told.low))
            history.append(Scored(Given(load=1.0, source="requests", based_on=20, calibrated_on=0,
                                        tokens_per_second=told), {"tokens_per_second": got}))
        share, raw = sum(hits) / len(hits), sum(raw_hits) / len(raw_hits)
        assert 0.74 <= share <= 0.86, (spread, share)
        assert uncalibrated[0] <= raw <= uncalibrated[1], (spread, raw)
        truth = 2 * 1.2816 * truth_sigma  # the 10th-90th percentile spread of the truth, on the log scale
        assert 0.85 <= sorted(widths)[len(widths) // 2] / truth <= 1.2, (spread, sorted(widths)[len(widths) // 2])


def test_the_record_and_a_forecast_that_has_gone_wrong():
    hits = [Scored(given(), {"tokens_per_second": 10.0})] * 40
    misses = [Scored(given(), {"tokens_per_second": 3.0})] * 60
    record = cal.track_record(hits + misses)
    assert record["tokens_per_second"]["requests"] == 100 and record["tokens_per_second"]["within_range"] == 0.4
    assert math.isclose(record["tokens_per_second"]["median_error"], 7.0 / 3.0)
    assert record["time_to_first_token"]["within_range"] is None  # no range told: not judged
    assert cal.gone_wrong(hits + misses) == ["tokens_per_second"]
    assert cal.gone_wrong(misses + hits * 3) == []  # the newest 100 are 100 % within
    assert cal.gone_wrong(misses[:20]) == []  # too few to say


def test_a_stored_forecast_is_read_back_whole_and_a_bad_one_is_none():
    g = given(ttft=0.5, wait=1.5)
    assert Given.from_json(g.to_json()) == g
    for bad in (None, [], {"load": 1}, {**g.to_json(), "load": "x"}, {**g.to_json(), "wait": [1, 2]},
                {**g.to_json(), "tokens_per_second": [float("nan")] * 5}, {**g.to_json(), "based_on": -1}):
        assert Given.from_json(bad) is None


def test_a_request_row_keeps_the_forecast_it_was_given_and_the_next_forecast_is_calibrated_on_it(tmp_path):
    store = sqlite_store(tmp_path)
    try:
        now = time.time()
        observed = tuple(Observed(route=("A",), load=1.0, time_to_first_token=0.2, tokens_per_second=10.0 + i % 3)
                         for i in range(20))
        told = forecast(ForecastInputs("m", requests=20, observed=observed), wait=0.0, prompt_tokens=10, max_tokens=20,
                        load=1, route=["A"])
        assert told.given is not None and told.calibrated_on == 0  # no record yet
        rows = [RequestRecord(at=now - 60 + i, model="m", api="openai", outcome=OK, waited=0.0,
                              time_to_first_token=0.2, tokens=20, tokens_per_second=4.0, forecast=told.given)
                for i in range(30)]
        store.record_requests(rows)
        back = store.requests_since(now - 120, model="m")
        assert [r.forecast for r in back] == [told.given] * 30
        known = inputs("m", back, None, now=now)
        assert known.gone_wrong == ("tokens_per_second",)  # 4 tokens/s, told 10-12: none within
        again = forecast(known, wait=0.0, prompt_tokens=10, max_tokens=20, load=1, route=["A"])
        assert again.calibrated_on == 30 and again.tokens_per_second_range[0] <= 4.0
        assert again.to_dict()["gone_wrong"] == ["tokens_per_second"]
    finally:
        store.close()


def test_the_stats_api_the_model_page_and_metrics_show_the_stored_rows_share_within_their_ranges(tmp_path):
    from monitor.app import assessing
    from monitor.core.assessment import RouteHop
    from monitor.core.snapshot import Snapshot
    from monitor.web import create_app
    from support import PEERS, TINY, poll_rows, web_settings

    settings, store = web_settings(), sqlite_store(tmp_path)
    try:
        now = time.time()
        snapshot = Snapshot(taken_at=now, duration=0.5, models=(TINY,), servers=tuple(poll_rows(1)))
        store.record_poll(snapshot, assessing.assess_poll(store, settings, snapshot, {}, now=now))
        # 60 answered in the last 30 min, told 8-12 tokens/s: 21 got 10 (within), 39 got 4; and 40 older ones, all within
        got = [10.0] * 21 + [4.0] * 39
        rows = [RequestRecord(at=now - 60 - i, model=TINY.dht_prefix, api="openai", outcome=OK, waited=0.0,
                              route=(RouteHop(PEERS["first"], 0, 8),), time_to_first_token=0.3, tokens=16,
                              tokens_per_second=tps, forecast=given()) for i, tps in enumerate(got)]
        rows += [RequestRecord(at=now - 3 * 3600 - i, model=TINY.dht_prefix, api="page", outcome=OK, waited=0.0,
                               time_to_first_token=0.3, tokens=16, tokens_per_second=10.0, forecast=given())
                 for i in range(40)]
        rows.append(RequestRecord(at=now - 30, model=TINY.dht_prefix, api="openai", outcome=OK, tokens=16,
                                  tokens_per_second=1.0))  # told nothing (an older chat): not judged
        store.record_requests(rows)
        client = create_app(settings, store).test_client()
        body = client.get(f"/api/v1/models/{TINY.dht_prefix}/stats").get_json()["forecasts"]
        thirty, day = body["windows"]["30m"]["tokens_per_second"], body["windows"]["1d"]["tokens_per_second"]
        assert thirty["requests"] == 60 and thirty["within_range"] == pytest.approx(21 / 60)
        assert day["requests"] == 100 and day["within_range"] == pytest.approx(61 / 100)
        assert thirty["median_error"] == pytest.approx(1.5)  # |4 - 10| / 4, the median of the errors
        assert body["gone_wrong"] == ["tokens_per_second"]  # 61 of the newest 100 within: under 65 %
        page = client.get(f"/models/{TINY.dht_prefix}").get_data(as_text=True)
        assert "How the forecasts fared" in page and "data-forecast-gone-wrong" in page and "35 %" in page
        metrics = client.get("/metrics").get_data(as_text=True)
        line = (f'swarm_monitor_forecast_within_range_ratio{{figure="tokens_per_second",model="{TINY.dht_prefix}",'
                f'window="30m"}} ')
        assert any(l.startswith(line) and float(l.split()[-1]) == pytest.approx(21 / 60) for l in metrics.splitlines())
        assert f'swarm_monitor_forecast_gone_wrong{{figure="tokens_per_second",model="{TINY.dht_prefix}"}} 1.0' in metrics
        assert f'swarm_monitor_forecast_gone_wrong{{figure="wait",model="{TINY.dht_prefix}"}} 0.0' in metrics
    finally:
        store.close()
