"""Health: first-content samples, success rate, pauses by kind."""

from __future__ import annotations

import pytest

from twengine.health import Health, HealthReason, HealthSettings, PauseChanged
from twproto.failures import Failure, FailureKind, PauseRule


def fail(health: Health, now: float, rule: str = "unexplained", **kw: float) -> list[PauseChanged]:
    return health.record_failure("up", now, rule, **kw)


# -- pauses: unexplained ----------------------------------------------------------------------


def test_three_unexplained_failures_in_a_row_pause() -> None:
    health = Health()
    assert fail(health, 0.0) == []
    assert fail(health, 1.0) == []
    assert not health.is_paused("up", 1.0)
    events = fail(health, 2.0)
    assert events == [
        PauseChanged(
            upstream="up",
            paused=True,
            reason=HealthReason.UNEXPLAINED,
            at=2.0,
            until=62.0,
            failures_in_row=3,
        )
    ]
    assert health.is_paused("up", 61.9)
    assert not health.is_paused("up", 62.0)
    assert health.paused_until("up") == 62.0
    assert health.next_deadline() == 62.0


def test_a_success_breaks_the_row() -> None:
    health = Health()
    fail(health, 0.0)
    fail(health, 1.0)
    assert health.record_success("up", 2.0) == []
    fail(health, 3.0)
    fail(health, 4.0)
    assert not health.is_paused("up", 4.0)
    assert fail(health, 5.0)[0].until == 65.0


def test_pauses_double_up_to_the_maximum_and_reset_on_success() -> None:
    health = Health()
    now = 0.0
    for _ in range(3):
        events = fail(health, now)
    lengths = [events[0].until - now]  # type: ignore[operator]
    for _ in range(6):
        now = health.paused_until("up")  # type: ignore[assignment]
        assert health.on_timer(now) == [
            PauseChanged(
                upstream="up",
                paused=False,
                reason=HealthReason.EXPIRED,
                at=now,
                failures_in_row=3 + len(lengths) - 1,
            )
        ]
        assert health.paused_until("up") is None
        # The row is not cleared by the pause: the first failure after it pauses again.
        events = fail(health, now)
        assert events and events[0].paused
        lengths.append(events[0].until - now)  # type: ignore[operator]
    assert lengths == [60, 120, 240, 480, 600, 600, 600]
    ended = health.record_success("up", now + 1)
    assert ended == [
        PauseChanged(
            upstream="up", paused=False, reason=HealthReason.SUCCESS, at=now + 1, failures_in_row=0
        )
    ]
    assert not health.is_paused("up", now + 1)
    for i in range(3):
        events = fail(health, now + 2 + i)
    assert events[0].until == now + 4 + 60


def test_failures_during_a_pause_do_not_lengthen_it() -> None:
    health = Health()
    for t in range(3):
        fail(health, float(t))
    # Requests already in flight fail while the upstream is paused.
    assert fail(health, 10.0) == []
    assert fail(health, 20.0) == []
    assert health.paused_until("up") == 62.0


def test_settings_are_honoured() -> None:
    health = Health(HealthSettings(failures_to_pause=1, pause_secs=5, max_pause_secs=8))
    assert fail(health, 0.0)[0].until == 5.0
    assert fail(health, 5.0)[0].until == 13.0
    assert fail(health, 13.0)[0].until == 21.0
    with pytest.raises(ValueError):
        HealthSettings(pause_secs=700)
    with pytest.raises(ValueError):
        HealthSettings(failures_to_pause=0)


# -- pauses by kind ---------------------------------------------------------------------------


def test_no_balance_pauses_at_once() -> None:
    health = Health()
    (event,) = fail(health, 100.0, "no_balance")
    assert event.reason is HealthReason.NO_BALANCE
    assert event.until == 1900.0


def test_quota_pauses_until_the_reset_named() -> None:
    health = Health()
    assert fail(health, 0.0, "quota", reset_at=7200.0)[0].until == 7200.0
    other = Health()
    assert fail(other, 0.0, "quota", pause_secs=90.0)[0].until == 90.0
    default = Health()
    assert fail(default, 0.0, "quota")[0].until == 3600.0
    # A reset already past falls back to the default.
    stale = Health()
    assert fail(stale, 10.0, "quota", reset_at=5.0)[0].until == 3610.0


def test_rate_limit_pauses_for_the_hint_capped() -> None:
    health = Health()
    (event,) = fail(health, 0.0, "rate_limit", pause_secs=30.0)
    assert (event.reason, event.until) == (HealthReason.RATE_LIMIT, 30.0)
    capped = Health()
    assert fail(capped, 0.0, "rate_limit", pause_secs=86400.0)[0].until == 3600.0


def test_rate_limit_without_a_hint_counts_as_unexplained() -> None:
    health = Health()
    assert fail(health, 0.0, "rate_limit") == []
    assert fail(health, 1.0, "rate_limit") == []
    (event,) = fail(health, 2.0, "rate_limit")
    assert (event.reason, event.until) == (HealthReason.UNEXPLAINED, 62.0)


def test_rule_none_is_not_counted() -> None:
    health = Health()
    for t in range(10):
        assert fail(health, float(t), "none") == []
    assert not health.is_paused("up", 10.0)
    assert health.success_rate("up", 10.0) is None
    assert health.snapshot("up", 10.0).attempts == 0


def test_explained_pause_does_not_shorten_a_longer_one() -> None:
    health = Health()
    fail(health, 0.0, "no_balance")
    assert fail(health, 1.0, "rate_limit", pause_secs=10.0) == []
    assert health.paused_until("up") == 1800.0
    (longer,) = fail(health, 2.0, "quota", reset_at=5000.0)
    assert longer.until == 5000.0


def test_record_reads_a_classified_failure() -> None:
    health = Health()
    quota = Failure(
        kind=FailureKind.QUOTA_USED_UP,
        failover=True,
        temporary=False,
        pause=PauseRule.QUOTA,
        reset_at=1_700_000_600.0,
    )
    # reset_at is wall-clock: 600 s after the wall time at `now`.
    (event,) = health.record("up", 50.0, quota, wall_now=1_700_000_000.0)
    assert event.until == 650.0
    limited = Failure(
        kind=FailureKind.RATE_LIMITED,
        failover=True,
        temporary=False,
        pause=PauseRule.RATE_LIMIT,
        retry_after_secs=12.0,
    )
    (event,) = health.record("other", 0.0, limited)
    assert event.until == 12.0
    missing = Failure(
        kind=FailureKind.MODEL_UNAVAILABLE, failover=True, temporary=False, pause=PauseRule.NONE
    )
    assert health.record("third", 0.0, missing) == []
    assert health.snapshot("third", 0.0).attempts == 0


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError):
        fail(Health(), 0.0, "sometimes")


def test_on_timer_ends_only_pauses_that_ran_out() -> None:
    health = Health()
    fail(health, 0.0, "rate_limit", pause_secs=10.0)
    health.record_failure("other", 0.0, "rate_limit", pause_secs=20.0)
    assert health.on_timer(5.0) == []
    assert [e.upstream for e in health.on_timer(10.0)] == ["up"]
    assert health.next_deadline() == 20.0
    assert health.paused(["up", "other", "third"], 15.0) == {"other"}


# -- success rate -----------------------------------------------------------------------------


def test_success_rate_needs_five_attempts() -> None:
    health = Health()
    for t in range(4):
        health.record_success("up", float(t))
    assert health.success_rate("up", 4.0) is None
    fail(health, 4.0, "no_balance")
    assert health.success_rate("up", 5.0) == 0.8


def test_success_rate_keeps_the_last_fifty() -> None:
    health = Health()
    for t in range(50):
        fail(health, float(t), "no_balance")
    for t in range(50, 75):
        health.record_success("up", float(t))
    assert health.success_rate("up", 75.0) == 0.5
    for t in range(75, 100):
        health.record_success("up", float(t))
    assert health.success_rate("up", 100.0) == 1.0


def test_success_rate_forgets_attempts_older_than_thirty_minutes() -> None:
    health = Health()
    for t in range(10):
        fail(health, float(t), "no_balance")
    for t in range(1000, 1005):
        health.record_success("up", float(t))
    assert health.success_rate("up", 1005.0) == 5 / 15
    # At 1809 only the attempts after t=9 are within 30 minutes.
    assert health.success_rate("up", 1809.0) == 1.0
    # And once those too are old, too few remain.
    assert health.success_rate("up", 2805.0) is None


# -- first-content samples --------------------------------------------------------------------


def test_first_content_median_over_the_last_32() -> None:
    health = Health()
    assert health.first_content_median("up") is None
    for secs in (3.0, 1.0, 2.0):
        health.record_first_content("up", secs)
    assert health.first_content_median("up") == 2.0
    assert health.first_content_median("up", min_samples=4) is None
    for _ in range(32):
        health.record_first_content("up", 10.0)
    assert health.sample_count("up") == 32
    assert health.first_content_median("up") == 10.0
    health.record_first_content("up", 0.5)
    assert health.first_content_median("up") == 10.0
    with pytest.raises(ValueError):
        health.record_first_content("up", -1.0)


def test_even_number_of_samples_takes_the_middle_mean() -> None:
    health = Health()
    for secs in (1.0, 2.0, 3.0, 10.0):
        health.record_first_content("up", secs)
    assert health.first_content_median("up") == 2.5


def test_snapshot_and_forget() -> None:
    health = Health()
    for t in range(3):
        fail(health, float(t))
    health.record_first_content("up", 1.0)
    snap = health.snapshot("up", 3.0)
    assert snap.paused_until == 62.0
    assert snap.pause_reason is HealthReason.UNEXPLAINED
    assert snap.failures_in_row == 3
    assert snap.first_content_median == 1.0
    assert snap.attempts == 3
    assert health.snapshot("up", 100.0).paused_until is None
    health.forget("up")
    assert health.snapshot("up", 3.0).attempts == 0
    assert not health.is_paused("up", 3.0)


def test_configure_keeps_state() -> None:
    health = Health()
    for secs in range(10):
        health.record_first_content("up", float(secs))
    health.configure(HealthSettings(samples=4))
    assert health.sample_count("up") == 4
    assert health.first_content_median("up") == 7.5


def test_a_pause_decided_elsewhere_keeps_its_reason_and_ends_as_such() -> None:
    h = Health()
    (start,) = h.pause("a", 10.0, 40.0, HealthReason.RATE_LIMIT)
    assert (start.paused, start.reason, start.until) == (True, HealthReason.RATE_LIMIT, 40.0)
    assert h.is_paused("a", 20.0) and h.snapshot("a", 20.0).failures_in_row == 0
    # Unlike an operator's pause, a success here ends it.
    (end,) = h.record_success("a", 21.0)
    assert (end.paused, end.reason) == (False, HealthReason.SUCCESS)
    h.pause("a", 30.0, 90.0, HealthReason.UNEXPLAINED)
    (ended,) = h.resume("a", 31.0, HealthReason.SUCCESS)
    assert (ended.paused, ended.reason) == (False, HealthReason.SUCCESS)
    assert not h.is_paused("a", 32.0) and h.resume("a", 33.0) == []


def test_shared_attempts_and_samples_keep_the_windows_and_minimum_counts() -> None:
    health = Health(HealthSettings(samples=3, attempts=4, min_attempts=3, attempts_window_secs=60))
    health.record_first_content("a", 9.0)
    # Five attempts from several instances, out of order; the oldest is outside the window.
    attempts = [(50.0, False), (10.0, True), (70.0, True), (60.0, True), (65.0, False)]
    health.take_shared("a", samples=[1.0, 2.0, 3.0, 4.0], attempts=attempts)
    # The last 3 samples (the local one is replaced), the last 4 attempts in time.
    assert health.sample_count("a") == 3 and health.first_content_median("a") == 3.0
    now = 100.0  # attempts after 40.0 count: 50 (fail), 60, 65 (fail), 70
    assert health.success_rate("a", now) == 0.5
    assert health.snapshot("a", now).attempts == 4
    assert health.success_rate("a", 125.0) is None  # only 65 and 70 left: fewer than 3
