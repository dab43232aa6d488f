"""Load shedding's verdicts: pure, the lag samples and the count given."""

from __future__ import annotations

import pytest

from twengine.config import GatewayListen
from twengine.shedding import WINDOW, LoadGauge

LAGGY = GatewayListen(shed_loop_lag_ms=100)


def fill(gauge: LoadGauge, lag_ms: float, listen: GatewayListen = LAGGY, n: int = WINDOW) -> None:
    for _ in range(n):
        gauge.sample(lag_ms / 1000, listen)


def test_a_quiet_loop_sheds_nothing() -> None:
    gauge = LoadGauge()
    fill(gauge, 2)
    assert gauge.lag_ms == pytest.approx(2)
    assert gauge.verdict(LAGGY) is None and gauge.shed == 0


def test_a_saturated_loop_sheds_with_503_and_retry_after() -> None:
    gauge = LoadGauge()
    fill(gauge, 180)
    refusal = gauge.verdict(LAGGY)
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.retry_after) == (503, "gw.overloaded", 1.0)
    assert "180 ms behind" in refusal.message and gauge.shed == 1


def test_one_pause_is_not_saturation_the_median_decides() -> None:
    gauge = LoadGauge()
    fill(gauge, 1)
    gauge.sample(5.0, LAGGY)  # a 5 s pause: a collection, a page fault
    gauge.sample(3.0, LAGGY)
    assert not gauge.shedding and gauge.verdict(LAGGY) is None


def test_nothing_is_shed_before_the_window_has_filled() -> None:
    gauge = LoadGauge()
    fill(gauge, 500, n=WINDOW - 1)
    assert not gauge.shedding
    gauge.sample(0.5, LAGGY)
    assert gauge.shedding


def test_shedding_stops_only_under_half_the_bound() -> None:
    gauge = LoadGauge()
    fill(gauge, 150)
    assert gauge.shedding
    fill(gauge, 60)  # under the bound, above half of it: still shedding
    assert gauge.shedding
    fill(gauge, 40)
    assert not gauge.shedding and gauge.verdict(LAGGY) is None


def test_a_bound_of_zero_never_sheds_on_lag() -> None:
    off = GatewayListen(shed_loop_lag_ms=0)
    gauge = LoadGauge()
    fill(gauge, 10_000, off)
    assert not gauge.shedding and gauge.verdict(off) is None


def test_max_requests_counts_the_requests_in_progress() -> None:
    listen = GatewayListen(max_requests=2, shed_loop_lag_ms=0)
    gauge = LoadGauge()
    gauge.in_progress = 1
    assert gauge.verdict(listen) is None
    gauge.in_progress = 2
    refusal = gauge.verdict(listen)
    assert refusal is not None and "2 requests in progress" in refusal.message
    assert gauge.verdict(GatewayListen(max_requests=0, shed_loop_lag_ms=0)) is None


def test_at_the_door_the_lag_as_it_stands_decides_before_any_sample_does() -> None:
    gauge = LoadGauge()
    fill(gauge, 1)
    assert gauge.at_door(50.0, LAGGY) is None  # no sleep under way
    gauge.due = 50.0  # the sampler's sleep should end at 50 s
    assert gauge.at_door(50.25, LAGGY) is None  # one stall of a quiet loop passes
    gauge.sample(0.06, LAGGY)  # the last sample 60 ms late: the loop lags
    assert not gauge.shedding  # (the median is still 1 ms)
    assert gauge.at_door(50.099, LAGGY) is None  # 99 ms past it: under the bound
    refusal = gauge.at_door(50.25, LAGGY)
    assert refusal is not None and refusal.code == "gw.overloaded"
    assert "250 ms behind" in refusal.message
    assert gauge.shed == 0 and gauge.shed_at_door == 0  # the door counts what it answers
    assert gauge.at_door(50.25, GatewayListen(shed_loop_lag_ms=0)) is None  # 0: never


def test_at_the_door_a_shedding_loop_refuses_even_when_on_time_now() -> None:
    gauge = LoadGauge()
    fill(gauge, 180)
    gauge.due = 10.0
    refusal = gauge.at_door(9.95, LAGGY)
    assert refusal is not None and "180 ms behind" in refusal.message


def test_the_door_need_look_again_only_when_the_loop_could_be_behind_by_the_bound() -> None:
    gauge = LoadGauge()
    fill(gauge, 1)
    assert gauge.door_wakes(7.0, LAGGY) == 8.0  # no sleep under way: in a second
    gauge.due = 7.1
    assert gauge.door_wakes(7.0, LAGGY) == pytest.approx(7.2)  # due + 100 ms
    assert gauge.door_wakes(7.0, GatewayListen(shed_loop_lag_ms=0)) == 8.0
    fill(gauge, 180)  # shedding: the next sample may end it
    assert gauge.door_wakes(7.0, LAGGY) == 8.0
