"""Key limit accounting: rolling and calendar windows, reservations, races, rebuild, alerts."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from twengine.config import Client, KeyLimit, LimitMeasure, LimitPeriod
from twengine.limits import (
    Admitted,
    KeyLimits,
    Refused,
    Reservation,
    Spend,
    Wait,
    period_bounds,
    used_up,
)

UTC = dt.UTC
PARIS = ZoneInfo("Europe/Paris")
# Wednesday 2026-12-02 10:00:00 UTC
T0 = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC).timestamp()


def limits(*lims: KeyLimit, tz: dt.tzinfo = UTC) -> KeyLimits:
    return KeyLimits([Client(name="k", key="x", limits=lims)], tz)


def lim(per: str, measure: str, amount: int, cache_reads: bool = False) -> KeyLimit:
    return KeyLimit(
        per=LimitPeriod(per), measure=LimitMeasure(measure), amount=amount, cache_reads=cache_reads
    )


def one(tokens: int = 0, cost: int = 0, reads: int = 0) -> Spend:
    return Spend(requests=1, tokens=tokens, cost_micros=cost, cache_reads=reads)


def run(kl: KeyLimits, spend: Spend, now: float, estimate: Spend | None = None) -> None:
    verdict = kl.admit("k", estimate or one(), now)
    assert isinstance(verdict, Admitted), verdict
    kl.settle(verdict.reservation, spend, now)


def test_period_bounds_follow_the_local_calendar() -> None:
    # 2026-12-02 is a Wednesday; Paris is UTC+1 in December.
    day = period_bounds(LimitPeriod.DAY, T0, PARIS)
    assert day == (
        dt.datetime(2026, 12, 2, tzinfo=PARIS).timestamp(),
        dt.datetime(2026, 12, 3, tzinfo=PARIS).timestamp(),
    )
    week = period_bounds(LimitPeriod.WEEK, T0, PARIS)
    assert dt.datetime.fromtimestamp(week[0], PARIS).date() == dt.date(2026, 11, 30)  # Monday
    assert week[1] - week[0] == 7 * 86400
    month = period_bounds(LimitPeriod.MONTH, T0, PARIS)
    assert dt.datetime.fromtimestamp(month[1], PARIS) == dt.datetime(2027, 1, 1, tzinfo=PARIS)
    # Across a DST change the day is 23 hours long.
    spring = dt.datetime(2026, 3, 29, 12, tzinfo=PARIS).timestamp()
    start, end = period_bounds(LimitPeriod.DAY, spring, PARIS)
    assert end - start == 23 * 3600


def test_rolling_minute_requests_wait_until_the_oldest_rolls_off() -> None:
    kl = limits(lim("minute", "requests", 2))
    run(kl, one(), T0)
    run(kl, one(), T0 + 10)
    verdict = kl.admit("k", one(), T0 + 20)
    assert isinstance(verdict, Wait) and verdict.until == T0 + 60 and verdict.used == 2
    assert isinstance(kl.admit("k", one(), T0 + 59.999), Wait)
    assert isinstance(kl.admit("k", one(), T0 + 60), Admitted)


def test_rolling_tokens_need_enough_to_roll_off_for_the_estimate() -> None:
    kl = limits(lim("hour", "tokens", 1000))
    run(kl, one(tokens=300), T0)
    run(kl, one(tokens=300), T0 + 100)
    run(kl, one(tokens=300), T0 + 200)
    # 900 used; an estimate of 500 needs 400 to go: the first two must roll off.
    verdict = kl.admit("k", one(tokens=500), T0 + 300)
    assert isinstance(verdict, Wait) and verdict.until == T0 + 100 + 3600
    # An estimate larger than the limit can never fit.
    assert isinstance(kl.admit("k", one(tokens=1001), T0 + 300), Refused)


def test_cache_reads_count_only_when_asked() -> None:
    kl = limits(lim("day", "tokens", 1000), lim("day", "tokens", 5000, cache_reads=True))
    run(kl, one(tokens=100, reads=4000), T0)
    status = kl.status("k", T0)
    assert [s.used for s in status] == [100, 4100]


def test_calendar_limit_refuses_until_the_reset() -> None:
    kl = limits(lim("day", "cost", 1_000_000), tz=PARIS)
    run(kl, one(cost=999_990), T0)
    verdict = kl.admit("k", one(cost=20), T0 + 60)
    assert isinstance(verdict, Refused)
    assert verdict.reset == dt.datetime(2026, 12, 3, tzinfo=PARIS).timestamp()
    # Just after local midnight the day starts over.
    assert isinstance(kl.admit("k", one(cost=20), verdict.reset), Admitted)


def test_week_and_month_periods() -> None:
    kl = limits(lim("week", "requests", 1), lim("month", "requests", 3))
    run(kl, one(), T0)
    refused = kl.admit("k", one(), T0 + 3600)
    assert isinstance(refused, Refused) and refused.limit.per is LimitPeriod.WEEK
    monday = dt.datetime(2026, 12, 7, tzinfo=UTC).timestamp()
    assert refused.reset == monday
    run(kl, one(), monday)
    run(kl, one(), monday + 7 * 86400)
    refused = kl.admit("k", one(), monday + 14 * 86400)
    assert isinstance(refused, Refused) and refused.limit.per is LimitPeriod.MONTH
    assert refused.reset == dt.datetime(2027, 1, 1, tzinfo=UTC).timestamp()


def test_racing_requests_see_each_others_reservations() -> None:
    kl = limits(lim("day", "requests", 5))
    admitted = [kl.admit("k", one(), T0) for _ in range(20)]
    assert sum(isinstance(v, Admitted) for v in admitted) == 5
    assert all(isinstance(v, Refused) for v in admitted[5:])


def test_rolling_window_full_of_reservations_waits_for_a_settle() -> None:
    kl = limits(lim("minute", "requests", 1))
    first = kl.admit("k", one(), T0)
    assert isinstance(first, Admitted)
    waiting = kl.admit("k", one(), T0 + 1)
    assert isinstance(waiting, Wait) and waiting.until is None
    kl.release(first.reservation)  # never reached an upstream: counts nothing
    assert isinstance(kl.admit("k", one(), T0 + 2), Admitted)


def test_settle_replaces_the_estimate() -> None:
    kl = limits(lim("day", "tokens", 10_000))
    verdict = kl.admit("k", one(tokens=4000), T0)
    assert isinstance(verdict, Admitted)
    assert kl.status("k", T0)[0].used == 4000 and kl.status("k", T0)[0].reserved == 4000
    kl.settle(verdict.reservation, one(tokens=6500), T0 + 5)
    st = kl.status("k", T0 + 5)[0]
    assert st.used == 6500 and st.reserved == 0


def test_rebuild_books_only_the_current_windows() -> None:
    kl = limits(lim("day", "requests", 100), lim("minute", "tokens", 1000), tz=UTC)
    midnight = dt.datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    events = [
        ("k", midnight - 1, one(tokens=10)),  # yesterday
        ("k", midnight + 5, one(tokens=20)),
        ("k", T0 - 120, one(tokens=30)),  # today, out of the minute
        ("k", T0 - 30, one(tokens=40)),
        ("other", T0 - 30, one(tokens=50)),
    ]
    kl.rebuild(events, T0)
    day, minute = kl.status("k", T0)
    assert day.used == 3 and minute.used == 40
    assert kl.earliest_start(T0) == midnight


def test_alerts_at_80_and_100_percent_once_per_window() -> None:
    kl = limits(lim("day", "requests", 5))
    alerts = []
    for i in range(5):
        verdict = kl.admit("k", one(), T0 + i)
        assert isinstance(verdict, Admitted)
        alerts += kl.settle(verdict.reservation, one(), T0 + i)
    assert [(a.percent, a.used) for a in alerts] == [(80, 4), (100, 5)]
    refused = kl.admit("k", one(), T0 + 10)
    assert isinstance(refused, Refused)
    assert kl.refused_alert("k", refused, T0 + 10) == []  # 100 % was already told
    # Next day: the window starts over, so do the alerts.
    tomorrow = T0 + 86400
    for i in range(4):
        verdict = kl.admit("k", one(), tomorrow + i)
        assert isinstance(verdict, Admitted)
        alerts = kl.settle(verdict.reservation, one(), tomorrow + i)
    assert [a.percent for a in alerts] == [80]


def test_keys_without_limits_cost_nothing() -> None:
    kl = KeyLimits([Client(name="free", key="x")], UTC)
    verdict = kl.admit("free", one(), T0)
    assert isinstance(verdict, Admitted) and not verdict.reservation.held
    assert kl.settle(verdict.reservation, one(), T0) == []


def test_reload_keeps_reservations_in_flight() -> None:
    kl = limits(lim("day", "requests", 2))
    first = kl.admit("k", one(), T0)
    assert isinstance(first, Admitted)
    kl.configure([Client(name="k", key="x", limits=(lim("day", "requests", 1),))])
    assert isinstance(kl.admit("k", one(), T0), Refused)
    kl.settle(first.reservation, one(), T0)
    assert kl.status("k", T0)[0].used == 1


@pytest.mark.parametrize("per", ["minute", "hour"])
def test_rolling_spans(per: str) -> None:
    span = 60 if per == "minute" else 3600
    kl = limits(lim(per, "cost", 100))
    run(kl, one(cost=100), T0, estimate=one(cost=1))
    verdict = kl.admit("k", one(cost=1), T0 + 1)
    assert isinstance(verdict, Wait) and verdict.until == T0 + span


def test_calendar_moves_with_the_time_zone() -> None:
    # 22:30 and 23:30 UTC on 2 December: one day in UTC, two days in Paris (23:30 and 00:30).
    kl = limits(lim("day", "requests", 1))
    first = dt.datetime(2026, 12, 2, 22, 30, tzinfo=UTC).timestamp()
    later = first + 3600
    run(kl, one(), first)
    assert isinstance(kl.admit("k", one(), later), Refused)
    kl.tz = PARIS
    kl.configure([Client(name="k", key="x", limits=(lim("day", "requests", 1),))])
    kl.rebuild([("k", first, one())], later)
    (day,) = kl.status("k", later)
    assert day.window_start == dt.datetime(2026, 12, 3, tzinfo=PARIS).timestamp()
    assert day.used == 0 and isinstance(kl.admit("k", one(), later), Admitted)


def test_alerts_for_usage_counted_elsewhere_are_raised_once_per_window() -> None:
    kl = limits(lim("day", "requests", 10), lim("minute", "tokens", 100))
    assert kl.shared_alerts("k", [7, 10], T0) == []
    assert [(a.limit.per.value, a.percent, a.used) for a in kl.shared_alerts("k", [8, 50], T0)] == [
        ("day", 80, 8)
    ]
    assert kl.shared_alerts("k", [9, 60], T0 + 1) == []  # 80 % of the day was told already
    both = kl.shared_alerts("k", [10, 100], T0 + 2)
    assert [(a.limit.per.value, a.percent) for a in both] == [("day", 100), ("minute", 100)]
    assert kl.shared_alerts("k", [10], T0 + 3) == []  # not one figure per limit: ignored
    assert kl.shared_alerts("nobody", [1], T0) == []


def test_used_up_names_a_spent_token_or_cost_limit_and_leaves_requests_out() -> None:
    kl = limits(lim("day", "requests", 1), lim("day", "tokens", 100), lim("hour", "cost", 50))
    admitted = kl.admit("k", Spend(requests=1), T0)
    assert isinstance(admitted, Admitted)
    # The long request itself fills the request limit: that is no reason to stop it.
    assert used_up(kl.status("k", T0)) is None
    # Parts booked as they come (no request each), without a reservation of their own.
    part = Spend(requests=0, tokens=60, cost_micros=10)
    kl.settle(Reservation(key="k", estimate=part, held=False), part, T0)
    assert used_up(kl.status("k", T0)) is None
    kl.settle(Reservation(key="k", estimate=part, held=False), part, T0 + 1)
    spent = used_up(kl.status("k", T0 + 1))
    assert spent is not None and spent.limit.measure is LimitMeasure.TOKENS
    assert spent.used == 120 and spent.reset is not None
