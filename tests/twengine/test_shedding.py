"""Load shedding's verdicts: pure, the lag samples and the count given."""

from __future__ import annotations

import pytest

from twengine.config import GatewayListen
from twengine.shedding import WINDOW, BacklogWait, LoadGauge

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
    # No sleep under way: a quarter of the bound (100 ms) on, for a client that arrives.
    assert gauge.door_wakes(7.0, LAGGY) == pytest.approx(7.025)
    gauge.due = 7.01
    assert gauge.door_wakes(7.0, LAGGY) == pytest.approx(7.025)  # sooner than due + 100 ms
    gauge.due = 6.92
    assert gauge.door_wakes(7.0, LAGGY) == pytest.approx(7.02)  # due + 100 ms comes first
    # A client has waited 90 ms in the accept queue: it reaches the bound in 10 ms.
    assert gauge.door_wakes(7.0, LAGGY, waited=0.09) == pytest.approx(7.01)
    gauge.due = 7.1
    assert gauge.door_wakes(7.0, LAGGY, waited=0.09) == pytest.approx(7.01)
    assert gauge.door_wakes(7.0, GatewayListen(shed_loop_lag_ms=0)) == 8.0
    fill(gauge, 180)  # shedding: the next sample may end it
    assert gauge.door_wakes(7.0, LAGGY) == 8.0


def test_at_the_door_a_client_waiting_the_bound_to_be_accepted_is_refused() -> None:
    gauge = LoadGauge()
    fill(gauge, 1)  # the loop's timers on time: the lag says nothing
    assert gauge.at_door(5.0, LAGGY, waited=0.099) is None
    refusal = gauge.at_door(5.0, LAGGY, waited=0.1)
    assert refusal is not None and refusal.code == "gw.overloaded"
    assert "waited 100 ms to be accepted" in refusal.message
    assert gauge.accept_wait_ms == pytest.approx(100.0)  # the last look's, for GET /status
    assert gauge.at_door(5.0, GatewayListen(shed_loop_lag_ms=0), waited=9.0) is None


def test_backlog_wait_follows_the_oldest_client_still_queued() -> None:
    wait = BacklogWait()
    assert wait.look(1.0, taken=0, queued=0) == 0.0
    assert wait.look(1.0, taken=0, queued=3) == 0.0  # three seen at 1.0
    assert wait.look(1.2, taken=2, queued=4) == pytest.approx(0.2)  # one of them still waits
    assert wait.look(1.5, taken=3, queued=3) == pytest.approx(0.3)  # those three are in: 1.2's
    assert wait.look(1.6, taken=6, queued=2) == pytest.approx(0.0)  # two new, seen now
    assert wait.look(1.9, taken=7, queued=2) == pytest.approx(0.3)  # one in, one still waits
    assert wait.look(2.0, taken=7, queued=0) == 0.0  # gone (reset before its accept): cleared
    assert wait.look(2.1, taken=7, queued=1) == 0.0


def test_backlog_wait_leaves_a_paused_loop_to_the_lag() -> None:
    """Nobody accepted since the client was seen: the loop is paused, not serving a flood."""
    wait = BacklogWait()
    wait.look(1.0, taken=4, queued=2)
    assert wait.look(1.9, taken=4, queued=2) == 0.0  # a 900 ms pause: not the queue's to judge
    assert wait.look(2.0, taken=5, queued=3) == pytest.approx(1.0)  # accepting, one still waits


def test_backlog_wait_keeps_its_oldest_mark_when_full() -> None:
    wait = BacklogWait(keep=2)
    for i in range(10):
        wait.look(float(i), taken=0, queued=i + 1)  # nothing accepted, ten arrive
    assert wait.look(10.0, taken=1, queued=10) == pytest.approx(9.0)  # the first is in: 1.0's
    assert wait.look(11.0, taken=11, queued=1) == pytest.approx(0.0)  # all of those are in


def test_backlog_wait_counts_an_accept_between_its_two_reads_as_short_not_long() -> None:
    wait = BacklogWait()
    # The count read (5), then a client accepted, then the length (2 rather than 3): the mark
    # is 7 where 8 would be right, so it is reached one accept early, never waits for nobody.
    wait.look(2.0, taken=5, queued=2)
    assert wait.look(3.0, taken=7, queued=1) == pytest.approx(0.0)
