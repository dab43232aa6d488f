"""Smooth weighted round-robin and the balance factors of a ``load-balance`` group.

Theory of operation
-------------------
Each group keeps one integer *current weight* per member. A pick is nginx's smooth weighted
round-robin step over the members taking part:

1. every participant's current weight grows by its effective weight;
2. the participant with the highest current weight wins (ties: declared order);
3. the winner's current weight drops by the participants' total.

With weights 7:3 this yields ``A B A A B A A B A A`` rather than seven A's then three B's. After
``n`` steps over a fixed set, ``current[i] == n * w[i] - W * count[i]``, so a member's deviation
from its exact share is ``-current[i] / W``. Because the winner's current weight is at least
``W / N`` before it drops by ``W``, no current weight ever falls to ``-W``: a member is never a
whole request *ahead* of its share. How far a member may fall *behind* is not as tidy; measured
over weights 1–100 and up to 30 members (adversarial search, every prefix of a full period) it
stays above -1.65 requests, and the property test holds it to ``-2 < deviation < 1``.

*Sticky requests.* A request that stays on an upstream for its conversation does not take a
turn, but it counts toward its upstream's share (`SmoothWeightedRoundRobin.count`): the same
step runs with the winner forced. Weights then describe the long-run share of *all* requests —
an upstream busy with long conversations receives fewer new ones. Forcing can push a current
weight far below ``-W`` when sticky traffic exceeds an upstream's share; `max_lead` caps how many
requests an upstream may run ahead this way (a forced step beyond it is not counted), so a burst
of one long conversation is not paid back with a long drought afterwards.

*Sitting out.* Paused and full members do not take part: their current weight neither grows nor
drops, so they come back where they left off, without a burst of catch-up picks. When every
member sits out, all take part (`take_part`).

*Floats.* Effective weights are floats once a balance factor applies. They are quantised to
integer milli-weights (``round(w * 1000)``, at least 1) before the step. Integer arithmetic keeps
the sum of current weights exactly zero and makes picks identical in every process (floats
would drift and break ties differently after enough steps); a resolution of 1/1000 is far finer
than the measurements the factors come from. Scaling all weights alike does not change the
sequence, so integer weights behave exactly as in nginx.

*Dry-run.* `peek` runs the same step on a copy: it returns exactly what the next `pick` with
the same arguments will return. `swrr_step` is the step itself, pure, for callers that keep the
current weights elsewhere.

Balance factors
---------------
``balance_by`` multiplies each weight by a factor (`balance_factors`):

* ``weights``: 1.
* ``latency``: ``clamp((group median / own median)², 0.1, 10)`` of time to first content.
* ``health``: ``max(success_rate², 0.05)``.
* ``latency-health``: the product of both.

A member without enough samples (its median or success rate is ``None``) gets factor 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence

from twengine.config.model import BalanceBy

__all__ = (
    "WEIGHT_SCALE",
    "BalanceBy",
    "SmoothWeightedRoundRobin",
    "balance_factors",
    "effective_weights",
    "group_median",
    "health_factor",
    "latency_factor",
    "milli_weights",
    "swrr_step",
    "take_part",
)

# Effective weights are quantised to this many units per weight point (see module docstring).
WEIGHT_SCALE = 1000

_LATENCY_MIN, _LATENCY_MAX = 0.1, 10.0
_HEALTH_MIN = 0.05


def take_part(members: Iterable[str], sitting_out: Collection[str]) -> set[str]:
    """The members that take part in a pick: those not sitting out, or all when all sit out."""
    names = list(members)
    eligible = {name for name in names if name not in sitting_out}
    return eligible or set(names)


def _scaled(weight: float) -> int:
    if not weight > 0:
        raise ValueError(f"weights must be positive, not {weight!r}")
    return max(1, round(weight * WEIGHT_SCALE))


def milli_weights(members: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
    """The members' effective weights as the step uses them: integer milli-weights, at least 1.

    A caller that carries out the step elsewhere (a shared balancer's script) passes these, so
    its picks are the ones `swrr_step` would make."""
    return [(name, _scaled(weight)) for name, weight in members]


def swrr_step(
    current: Mapping[str, int],
    members: Sequence[tuple[str, float]],
    eligible: Collection[str],
    *,
    forced: str | None = None,
) -> tuple[str, dict[str, int]]:
    """One smooth weighted round-robin step; returns the winner and the new current weights.

    `current` is not modified; members missing from it start at 0 and names in it that are not
    members are dropped. Members not in `eligible` keep their current weight (when none is
    eligible, all take part). `forced` names the winner instead of choosing it (a sticky
    request); it takes part even if not eligible.
    """
    winner, new, _ = _step(current, members, eligible, forced)
    return winner, new


def _step(
    current: Mapping[str, int],
    members: Sequence[tuple[str, float]],
    eligible: Collection[str],
    forced: str | None,
) -> tuple[str, dict[str, int], int]:
    if not members:
        raise ValueError("a group needs at least one member")
    weights = {name: _scaled(weight) for name, weight in members}
    if len(weights) != len(members):
        raise ValueError("a member is listed twice")
    if forced is not None and forced not in weights:
        raise ValueError(f"{forced!r} is not a member")
    taking_part = [name for name, _ in members if name in eligible] or [name for name, _ in members]
    if forced is not None and forced not in taking_part:
        taking_part.append(forced)
    new = {name: current.get(name, 0) for name in weights}
    total = 0
    best: str | None = None
    for name in taking_part:
        new[name] += weights[name]
        total += weights[name]
        # Strictly greater: ties go to the member declared first.
        if best is None or new[name] > new[best]:
            best = name
    winner = forced if forced is not None else best
    assert winner is not None
    new[winner] -= total
    return winner, new, total


class SmoothWeightedRoundRobin:
    """The current weights of one group's members, and the steps that move them.

    `members` are ``(name, effective weight)`` pairs in declared order; pass the same list to
    every call while the group's configuration and factors are unchanged. `eligible` names the
    members that may be picked now (not paused, not full — see `take_part`).
    """

    __slots__ = ("_current", "max_lead")

    def __init__(self, *, max_lead: float = 100.0) -> None:
        if max_lead <= 0:
            raise ValueError("max_lead must be positive")
        self.max_lead = max_lead
        self._current: dict[str, int] = {}

    def pick(self, members: Sequence[tuple[str, float]], eligible: Collection[str]) -> str:
        """Choose the upstream for a new conversation and take the step."""
        winner, self._current, _ = _step(self._current, members, eligible, None)
        return winner

    def peek(self, members: Sequence[tuple[str, float]], eligible: Collection[str]) -> str:
        """What `pick` would return with the same arguments, without taking the step."""
        winner, _, _ = _step(self._current, members, eligible, None)
        return winner

    def count(
        self, name: str, members: Sequence[tuple[str, float]], eligible: Collection[str]
    ) -> bool:
        """Count a sticky request on `name` toward its share; False if `max_lead` refused it.

        The step is the same as a pick's with `name` forced to win, so the other participants
        gain the credit a normal pick would have given them.
        """
        _, new, total = _step(self._current, members, eligible, name)
        if new[name] < -self.max_lead * total:
            # Too far ahead of its share already: forgive this request rather than make the
            # upstream sit out new conversations for ever longer.
            return False
        self._current = new
        return True

    def current(self) -> dict[str, int]:
        """A copy of the current weights (integer milli-weights), for views and shared state."""
        return dict(self._current)

    def restore(self, current: Mapping[str, int]) -> None:
        """Replace the current weights (e.g. with those shared by other instances)."""
        self._current = dict(current)

    def reset(self) -> None:
        """Forget all current weights (the group's members changed)."""
        self._current = {}


def latency_factor(own: float | None, group: float | None) -> float:
    """``clamp((group / own)², 0.1, 10)``; 1 when either median is unknown."""
    if own is None or group is None or own <= 0 or group <= 0:
        return 1.0
    return min(_LATENCY_MAX, max(_LATENCY_MIN, (group / own) ** 2))


def health_factor(success_rate: float | None) -> float:
    """``max(success_rate², 0.05)``; 1 when the rate is unknown (too few attempts)."""
    if success_rate is None:
        return 1.0
    return max(success_rate**2, _HEALTH_MIN)


def group_median(values: Iterable[float | None]) -> float | None:
    """The median of the known values (members' own medians), or None if none is known."""
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def balance_factors(
    names: Sequence[str],
    balance_by: BalanceBy | str,
    *,
    first_content: Mapping[str, float | None],
    success_rate: Mapping[str, float | None],
) -> dict[str, float]:
    """Each member's balance factor.

    `first_content` maps a member to its median time to first content (None or missing: too
    few samples); `success_rate` to its success rate (None or missing: too few attempts).
    """
    how = BalanceBy(balance_by)
    use_latency = how in (BalanceBy.LATENCY, BalanceBy.LATENCY_HEALTH)
    use_health = how in (BalanceBy.HEALTH, BalanceBy.LATENCY_HEALTH)
    median = group_median(first_content.get(name) for name in names) if use_latency else None
    factors: dict[str, float] = {}
    for name in names:
        factor = 1.0
        if use_latency:
            factor *= latency_factor(first_content.get(name), median)
        if use_health:
            factor *= health_factor(success_rate.get(name))
        factors[name] = factor
    return factors


def effective_weights(
    weights: Sequence[tuple[str, float]], factors: Mapping[str, float]
) -> list[tuple[str, float]]:
    """``weight × factor`` per member, in declared order (a missing factor is 1)."""
    return [(name, weight * factors.get(name, 1.0)) for name, weight in weights]
