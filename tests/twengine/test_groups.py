"""Ordering a group's members by its type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twengine.balance import SmoothWeightedRoundRobin
from twengine.groups import GroupType, order_members, url_test_latency

MEMBERS = ["a", "b", "c", "d"]


def test_fallback_keeps_declared_order() -> None:
    assert order_members("fallback", MEMBERS, selected="c", lead="d") == MEMBERS


def test_select_puts_the_selected_first() -> None:
    assert order_members(GroupType.SELECT, MEMBERS, selected="c") == ["c", "a", "b", "d"]
    assert order_members("select", MEMBERS, selected=None) == MEMBERS
    assert order_members("select", MEMBERS, selected="gone") == MEMBERS


def test_load_balance_leads_with_the_pick_then_by_weight() -> None:
    weights = {"a": 1.0, "b": 7.0, "c": 3.0, "d": 3.0}
    assert order_members("load-balance", MEMBERS, lead="c", weights=weights) == [
        "c",
        "b",
        "d",
        "a",
    ]
    # No pick (a conversation held elsewhere, a dry-run of the order alone): weight order.
    assert order_members("load-balance", MEMBERS, weights=weights) == ["b", "c", "d", "a"]
    # Missing weights count 1; ties keep declared order.
    assert order_members("load-balance", MEMBERS, lead="d") == ["d", "a", "b", "c"]


def test_load_balance_with_the_balancer() -> None:
    rr = SmoothWeightedRoundRobin()
    members = [("a", 7.0), ("b", 3.0)]
    weights = dict(members)
    firsts = []
    for _ in range(10):
        lead = rr.pick(members, {"a", "b"})
        order = order_members("load-balance", ["a", "b"], lead=lead, weights=weights)
        assert sorted(order) == ["a", "b"]
        firsts.append(order[0])
    assert firsts.count("a") == 7


def test_url_test_latency_prefers_own_median_once_it_has_three() -> None:
    assert url_test_latency(1.5, 3, 0.2) == 1.5
    assert url_test_latency(1.5, 2, 0.2) == 0.2
    assert url_test_latency(None, 0, 0.2) == 0.2
    assert url_test_latency(1.5, 2, None) is None
    assert url_test_latency(None, 0, None) is None


def test_url_test_orders_by_latency_unmeasured_last() -> None:
    latency = {"a": None, "b": 2.0, "c": 0.5, "d": None}
    assert order_members("url-test", MEMBERS, latency=latency) == ["c", "b", "a", "d"]
    assert order_members("url-test", MEMBERS) == MEMBERS


def test_cheapest_free_first_unpriced_last() -> None:
    prices = {"a": 3.0, "b": None, "c": 0.0, "d": 0.8}
    assert order_members("cheapest", MEMBERS, prices=prices) == ["c", "d", "a", "b"]
    assert order_members("cheapest", ["x", "y"], prices={"y": 1.0}) == ["y", "x"]


def test_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError):
        order_members("round-robin", MEMBERS)


@given(
    kind=st.sampled_from(list(GroupType)),
    members=st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=8),
    values=st.dictionaries(
        st.text(min_size=1, max_size=3), st.none() | st.floats(0, 100), max_size=8
    ),
    first=st.none() | st.text(min_size=1, max_size=3),
)
def test_a_strategy_only_orders(
    kind: GroupType, members: list[str], values: dict[str, float | None], first: str | None
) -> None:
    """Every member stays a candidate, once, whatever the strategy and its inputs."""
    weights = {k: v for k, v in values.items() if v is not None}
    order = order_members(
        kind, members, selected=first, lead=first, weights=weights, latency=values, prices=values
    )
    assert sorted(order) == sorted(members)
