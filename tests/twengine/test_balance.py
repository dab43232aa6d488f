"""Smooth weighted round-robin: shares, interleaving, sticky counting, sitting out, dry-run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twengine.balance import (
    BalanceBy,
    SmoothWeightedRoundRobin,
    balance_factors,
    effective_weights,
    group_median,
    health_factor,
    latency_factor,
    swrr_step,
    take_part,
)

# At every prefix of a run over a fixed set of members, each member's count stays within
# (-2, 1) requests of its exact share n·w/W. The upper side is a theorem (a winner's current
# weight never falls to -W); the lower side is measured: adversarial search over weights 1–100
# and up to 30 members found -1.65 at worst. See docs/balancing.md.
BOUND_BELOW = 2.0
BOUND_ABOVE = 1.0

# Found by adversarial search: the deepest deficits (about -1.65) over weights 1–100.
# fmt: off
DEEPEST_1 = [1, 1, 1, 1, 3, 3, 100, 1, 1, 100, 1, 1, 3, 1, 100, 1, 1, 100, 100, 3,
             1, 100, 3, 3, 3, 100, 3, 1, 1, 100]
DEEPEST_2 = [100, 100, 3, 1, 3, 100, 100, 100, 1, 1, 1, 2, 3, 1, 1, 100, 1, 1, 100, 3,
             1, 1, 1, 1, 3, 3, 1, 100, 3, 1]
# fmt: on


def names(n: int) -> list[str]:
    return [f"m{i}" for i in range(n)]


def members_of(weights: list[int]) -> list[tuple[str, float]]:
    return list(zip(names(len(weights)), map(float, weights), strict=True))


def run_checked(weights: list[int], n: int) -> tuple[dict[str, int], float]:
    """Pick `n` times, checking the share bound and that peek predicts each pick; returns the
    counts and the deepest deficit seen."""
    rr = SmoothWeightedRoundRobin()
    members = members_of(weights)
    everyone = {name for name, _ in members}
    total = sum(weights)
    counts = dict.fromkeys(everyone, 0)
    deepest = 0.0
    for k in range(1, n + 1):
        expected = rr.peek(members, everyone)
        got = rr.pick(members, everyone)
        assert got == expected
        counts[got] += 1
        for name, weight in members:
            deviation = counts[name] - k * weight / total
            assert -BOUND_BELOW < deviation < BOUND_ABOVE, (k, name, deviation)
            deepest = min(deepest, deviation)
    return counts, deepest


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(1, 100), min_size=1, max_size=30),
    n=st.integers(1, 1200),
)
def test_every_prefix_stays_near_the_exact_share(weights: list[int], n: int) -> None:
    run_checked(weights, n)


def test_the_measured_worst_cases() -> None:
    for weights in (DEEPEST_1, DEEPEST_2):
        _, deepest = run_checked(weights, sum(weights))
        assert -1.66 < deepest < -1.64


@pytest.mark.parametrize(
    "weights",
    [
        DEEPEST_1,
        DEEPEST_2,
        [*([1] * 29), 100],
        [100] * 30,
        [7, 3],
    ],
)
def test_a_full_period_returns_to_the_start(weights: list[int]) -> None:
    counts, _ = run_checked(weights, sum(weights))
    # After W picks every member has had exactly its weight.
    assert counts == dict(zip(names(len(weights)), weights, strict=True))


def test_seven_to_three_interleaves() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    picks = "".join(rr.pick(members, {"a", "b"}) for _ in range(20))
    assert picks == "abaaabaaba" * 2
    assert "aaaa" not in picks


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 500))
def test_seven_to_three_never_runs_more_than_three(n: int) -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    picks = "".join(rr.pick(members, {"a", "b"}) for _ in range(n))
    assert "aaaa" not in picks
    assert "bb" not in picks


def test_float_weights_follow_the_integer_sequence() -> None:
    ints = SmoothWeightedRoundRobin()
    floats = SmoothWeightedRoundRobin()
    every = {"a", "b", "c"}
    for _ in range(200):
        expected = ints.pick([("a", 7.0), ("b", 3.0), ("c", 5.0)], every)
        got = floats.pick([("a", 0.7), ("b", 0.3), ("c", 0.5)], every)
        assert got == expected
    # Integer arithmetic: the current weights still sum to zero exactly.
    assert sum(floats.current().values()) == 0


def test_weights_with_factors_stay_deterministic() -> None:
    members = [("a", 7 * 0.123456789), ("b", 3 * 1.987654321), ("c", 1 * 9.99)]
    every = {"a", "b", "c"}
    first, second = SmoothWeightedRoundRobin(), SmoothWeightedRoundRobin()
    one = [first.pick(members, every) for _ in range(5000)]
    two = [second.pick(members, every) for _ in range(5000)]
    assert one == two
    assert sum(first.current().values()) == 0


# -- sticky requests --------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.integers(1, 100), min_size=2, max_size=8),
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=300),
)
def test_sticky_requests_count_toward_the_share(weights: list[int], lengths: list[int]) -> None:
    """Conversations start with a pick and stay for some requests; totals keep the shares."""
    rr = SmoothWeightedRoundRobin()
    members = members_of(weights)
    every = {name for name, _ in members}
    total_weight = sum(weights)
    counts = dict.fromkeys(every, 0)
    n = 0
    for length in lengths:
        chosen = rr.pick(members, every)
        counts[chosen] += 1
        n += 1
        for _ in range(length):
            assert rr.count(chosen, members, every)
            counts[chosen] += 1
            n += 1
        # Between conversations, each member is within one conversation's worth of its share:
        # the current weights are exactly the deviation, and the picks pull them back.
        for name, weight in members:
            deviation = counts[name] - n * weight / total_weight
            assert -(BOUND_BELOW + max(lengths)) * len(weights) < deviation
            assert deviation < BOUND_ABOVE + max(lengths)


def test_sticky_traffic_takes_new_conversations_away() -> None:
    """Half of all requests stick to `a` (weight 7 of 10): new conversations make up the rest,
    so over the run `a` ends with 70% of all requests, not 50% + 70% of the other half."""
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    every = {"a", "b"}
    counts = {"a": 0, "b": 0}
    for i in range(1000):
        if i % 2:
            rr.count("a", members, every)
            counts["a"] += 1
        else:
            counts[rr.pick(members, every)] += 1
    assert counts == {"a": 700, "b": 300}


def test_a_sticky_count_is_a_forced_step() -> None:
    members = [("a", 7.0), ("b", 3.0)]
    winner, after = swrr_step({}, members, {"a", "b"}, forced="b")
    assert winner == "b"
    assert after == {"a": 7000, "b": -7000}


def test_max_lead_forgives_sticky_requests_beyond_it() -> None:
    rr = SmoothWeightedRoundRobin(max_lead=5)
    members = [("a", 1.0), ("b", 1.0)]
    every = {"a", "b"}
    counted = [rr.count("a", members, every) for _ in range(20)]
    # Each counted request puts `a` half a request further ahead of its 50% share.
    assert counted == [True] * 10 + [False] * 10
    # `b` now catches up for exactly those ten counted requests, then they alternate.
    picks = [rr.pick(members, every) for _ in range(14)]
    assert picks == ["b"] * 10 + ["a", "b", "a", "b"]


# -- sitting out ------------------------------------------------------------------------------


def test_take_part() -> None:
    assert take_part(["a", "b", "c"], {"b"}) == {"a", "c"}
    assert take_part(["a", "b"], {"a", "b"}) == {"a", "b"}
    assert take_part(["a"], set()) == {"a"}


def test_a_member_sitting_out_is_never_picked_and_comes_back_without_a_burst() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 1.0), ("b", 1.0), ("c", 1.0)]
    picks = [rr.pick(members, {"a", "b", "c"}) for _ in range(3)]
    assert sorted(picks) == ["a", "b", "c"]
    out = [rr.pick(members, {"a", "b"}) for _ in range(30)]
    assert "c" not in out
    back = [rr.pick(members, {"a", "b", "c"}) for _ in range(30)]
    # No catch-up for the time away: the three take turns again at once.
    for i in range(0, 30, 3):
        assert sorted(back[i : i + 3]) == ["a", "b", "c"]


def test_when_all_sit_out_all_take_part() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    picks = [rr.pick(members, set()) for _ in range(10)]
    assert picks.count("a") == 7
    assert rr.peek(members, set()) == rr.pick(members, set())


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.integers(1, 100), min_size=1, max_size=10),
    steps=st.lists(st.tuples(st.integers(0, 1023), st.booleans(), st.integers(0, 9)), max_size=200),
)
def test_peek_always_equals_the_next_pick(
    weights: list[int], steps: list[tuple[int, bool, int]]
) -> None:
    """Whatever mixes of eligibility, sticky counts and picks came before."""
    rr = SmoothWeightedRoundRobin()
    members = members_of(weights)
    for mask, sticky, who in steps:
        eligible = {name for i, (name, _) in enumerate(members) if mask >> i & 1}
        if sticky:
            rr.count(members[who % len(members)][0], members, eligible)
            continue
        expected = rr.peek(members, eligible)
        before = rr.current()
        assert rr.peek(members, eligible) == expected  # peeking twice changes nothing
        assert rr.current() == before
        picked = rr.pick(members, eligible)
        assert picked == expected
        assert picked in (eligible & {name for name, _ in members} or {n for n, _ in members})


def test_long_run_with_a_member_paused_halfway() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    counts = {"a": 0, "b": 0}
    for i in range(1000):
        eligible = take_part(["a", "b"], {"b"} if i >= 500 else set())
        expected = rr.peek(members, eligible)
        picked = rr.pick(members, eligible)
        assert picked == expected
        counts[picked] += 1
        if i == 499:
            assert counts == {"a": 350, "b": 150}
    assert counts == {"a": 850, "b": 150}


def test_long_run_with_a_pause_in_the_middle() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    counts = {"a": 0, "b": 0}
    for i in range(1000):
        eligible = take_part(["a", "b"], {"b"} if 300 <= i < 500 else set())
        expected = rr.peek(members, eligible)
        picked = rr.pick(members, eligible)
        assert picked == expected
        counts[picked] += 1
    # 800 requests with both at 7:3, 200 with `a` alone.
    assert counts == {"a": 560 + 200, "b": 240}


def test_pure_step_does_not_touch_its_input() -> None:
    current = {"a": 5, "gone": 3}
    winner, after = swrr_step(current, [("a", 1.0), ("b", 1.0)], {"a", "b"})
    assert current == {"a": 5, "gone": 3}
    assert winner == "a"
    assert after == {"a": 5 + 1000 - 2000, "b": 1000}


def test_bad_members_are_refused() -> None:
    rr = SmoothWeightedRoundRobin()
    with pytest.raises(ValueError):
        rr.pick([], set())
    with pytest.raises(ValueError):
        rr.pick([("a", 1.0), ("a", 2.0)], {"a"})
    with pytest.raises(ValueError):
        rr.pick([("a", 0.0)], {"a"})
    with pytest.raises(ValueError):
        rr.count("x", [("a", 1.0)], {"a"})


# -- balance factors --------------------------------------------------------------------------


def test_latency_factor() -> None:
    assert latency_factor(1.0, 1.0) == 1.0
    assert latency_factor(0.5, 1.0) == 4.0
    assert latency_factor(2.0, 1.0) == 0.25
    assert latency_factor(0.1, 1.0) == 10.0  # 100, clamped
    assert latency_factor(10.0, 1.0) == 0.1  # 0.01, clamped
    assert latency_factor(None, 1.0) == 1.0
    assert latency_factor(1.0, None) == 1.0


def test_health_factor() -> None:
    assert health_factor(1.0) == 1.0
    assert health_factor(0.5) == 0.25
    assert health_factor(0.1) == 0.05
    assert health_factor(None) == 1.0


def test_group_median() -> None:
    assert group_median([1.0, None, 3.0, 2.0]) == 2.0
    assert group_median([None]) is None


def test_balance_factors_by_mode() -> None:
    names = ["fast", "slow", "new"]
    ttfb = {"fast": 1.0, "slow": 4.0, "new": None}
    rate = {"fast": 0.5, "slow": 1.0}
    assert balance_factors(names, "weights", first_content=ttfb, success_rate=rate) == {
        "fast": 1.0,
        "slow": 1.0,
        "new": 1.0,
    }
    # Group median of the known medians: 2.5.
    latency = balance_factors(names, BalanceBy.LATENCY, first_content=ttfb, success_rate=rate)
    assert latency == {"fast": 6.25, "slow": 2.5**2 / 16, "new": 1.0}
    health = balance_factors(names, "health", first_content=ttfb, success_rate=rate)
    assert health == {"fast": 0.25, "slow": 1.0, "new": 1.0}
    both = balance_factors(names, "latency-health", first_content=ttfb, success_rate=rate)
    assert both == {"fast": 6.25 * 0.25, "slow": 2.5**2 / 16, "new": 1.0}
    with pytest.raises(ValueError):
        balance_factors(names, "fastest", first_content=ttfb, success_rate=rate)


def test_effective_weights() -> None:
    assert effective_weights([("a", 7.0), ("b", 3.0)], {"a": 0.5}) == [("a", 3.5), ("b", 3.0)]
