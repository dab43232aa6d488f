"""The retry backoff schedule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twengine.attempt import base_backoff, next_backoff

FAR = 10_000.0


def test_schedule() -> None:
    assert [base_backoff(r) for r in range(1, 8)] == [2, 4, 8, 16, 16, 16, 16]
    assert [next_backoff(r, None, 0.5, 0.0, FAR) for r in range(1, 6)] == [2, 4, 8, 16, 16]
    with pytest.raises(ValueError):
        base_backoff(0)


@given(round_=st.integers(1, 50), jitter=st.floats(0.0, 1.0, exclude_max=True))
def test_jitter_stays_within_twenty_percent(round_: int, jitter: float) -> None:
    pause = next_backoff(round_, None, jitter, 0.0, FAR)
    assert pause is not None
    base = base_backoff(round_)
    # Below 1.2 × base in exact arithmetic; a draw just under 1 may round onto it.
    assert 0.8 * base <= pause <= 1.2 * base


def test_jitter_ends() -> None:
    assert next_backoff(1, None, 0.0, 0.0, FAR) == pytest.approx(1.6)
    assert next_backoff(4, None, 0.999999, 0.0, FAR) == pytest.approx(19.2, abs=1e-4)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            next_backoff(1, None, bad, 0.0, FAR)


def test_a_hint_lengthens_never_shortens() -> None:
    assert next_backoff(1, 30.0, 0.5, 0.0, FAR) == 30.0
    assert next_backoff(3, 1.0, 0.5, 0.0, FAR) == 8.0
    assert next_backoff(1, 0.0, 0.5, 0.0, FAR) == 2.0  # 0 is ignored
    assert next_backoff(1, -5.0, 0.5, 0.0, FAR) == 2.0


def test_tiny_hints_count_as_a_quarter_second() -> None:
    # The schedule never pauses under 1.6 s, so the floor shows only as "no shorter than".
    pause = next_backoff(1, 0.01, 0.0, 0.0, FAR)
    assert pause == pytest.approx(1.6)
    assert pause is not None and pause >= 0.25


@given(
    round_=st.integers(1, 20),
    hint=st.none() | st.floats(0.0, 100.0),
    jitter=st.floats(0.0, 1.0, exclude_max=True),
)
def test_hint_is_a_lower_bound(round_: int, hint: float | None, jitter: float) -> None:
    pause = next_backoff(round_, hint, jitter, 0.0, FAR)
    plain = next_backoff(round_, None, jitter, 0.0, FAR)
    assert pause is not None and plain is not None
    assert pause >= plain
    if hint:
        assert pause >= max(hint, 0.25)


def test_stops_when_the_pause_would_end_after_the_deadline() -> None:
    # Arrived at 0 with wait_secs 10; the first pause (2 s) fits, 4 s from 7 does not.
    assert next_backoff(1, None, 0.5, 1.0, 10.0) == 2.0
    assert next_backoff(2, None, 0.5, 6.0, 10.0) == 4.0  # ends exactly at the deadline
    assert next_backoff(2, None, 0.5, 7.0, 10.0) is None
    # A hint that outlasts the deadline stops retrying too.
    assert next_backoff(1, 60.0, 0.5, 0.0, 10.0) is None
    # wait_secs 0: no retry at all.
    assert next_backoff(1, None, 0.5, 0.0, 0.0) is None
