"""Ordering a group's members by the group's type.

A group's type decides only the *order* in which its members are asked; every member stays a
candidate, so a request fails over through the whole group whatever the strategy. The facts a
strategy needs (the member the balancer chose, effective weights, latencies, prices) are passed
in; this module keeps no state.

* ``fallback``: declared order.
* ``select``: the selected member first, then the rest in declared order.
* ``load-balance``: the member smooth weighted round-robin chose (`lead`, from
  `twengine.balance.SmoothWeightedRoundRobin.pick` for a new conversation, or ``peek`` for a
  dry-run) first; the rest by effective weight, heaviest first, so a failover goes where the
  group sends most of its traffic anyway. Ties keep declared order.
* ``url-test``: lowest latency first. A member's latency is the median time to first content of
  its last 32 streamed answers once it has 3; before that a connection test timed at startup
  stands in (`url_test_latency`); a member with neither ranks after all measured ones.
* ``cheapest``: lowest input price of the requested model first; free members (price 0) lead,
  unpriced members come last.

Every sort is stable: members that compare equal keep their declared order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from twengine.config.model import GroupType

__all__ = ("URL_TEST_MIN_SAMPLES", "GroupType", "order_members", "url_test_latency")

# Samples an upstream needs before its own median replaces the startup connection test.
URL_TEST_MIN_SAMPLES = 3


def url_test_latency(
    median: float | None,
    samples: int,
    startup_test: float | None,
    *,
    min_samples: int = URL_TEST_MIN_SAMPLES,
) -> float | None:
    """The latency a ``url-test`` group ranks a member by (None: unmeasured, ranks last)."""
    if median is not None and samples >= min_samples:
        return median
    return startup_test


def _first(members: list[str], name: str | None) -> list[str]:
    if name is None or name not in members:
        return members
    return [name, *(member for member in members if member != name)]


def order_members(
    group_type: GroupType | str,
    members: Sequence[str],
    *,
    selected: str | None = None,
    lead: str | None = None,
    weights: Mapping[str, float] | None = None,
    latency: Mapping[str, float | None] | None = None,
    prices: Mapping[str, float | None] | None = None,
) -> list[str]:
    """The order in which a group's members are asked.

    `selected`: the ``select`` group's choice. `lead` and `weights` (effective weights; a
    missing one counts 1): ``load-balance``. `latency`: ``url-test`` (see `url_test_latency`;
    None or missing: unmeasured). `prices`: ``cheapest``, the requested model's input price per
    member (0: free; None or missing: unpriced). Arguments another type needs are ignored.
    """
    kind = GroupType(group_type)
    names = list(members)
    if kind is GroupType.FALLBACK:
        return names
    if kind is GroupType.SELECT:
        return _first(names, selected)
    if kind is GroupType.LOAD_BALANCE:
        known = weights or {}
        by_weight = sorted(names, key=lambda name: -known.get(name, 1.0))
        return _first(by_weight, lead)
    if kind is GroupType.URL_TEST:
        times = latency or {}
        return sorted(names, key=lambda name: _measured_first(times.get(name)))
    costs = prices or {}
    return sorted(names, key=lambda name: _measured_first(costs.get(name)))


def _measured_first(value: float | None) -> tuple[bool, float]:
    # Known values ascend; unknown ones follow, all equal so declared order holds among them.
    return (value is None, 0.0 if value is None else value)
