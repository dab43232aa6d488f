"""Hot-path benchmark of key limit accounting (docs/limits-and-costs.md): µs per request for
one admit and one settle, on a key with four limits (minute, hour, day, month) whose windows
hold a day's worth of traffic, against a key without limits.

    pytest benchmarks/hot/bench_limits.py --benchmark-enable -p no:cacheprovider
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from twengine.config import Client, KeyLimit, LimitMeasure, LimitPeriod
from twengine.limits import Admitted, KeyLimits, Spend

LIMITS = (
    KeyLimit(per=LimitPeriod.MINUTE, measure=LimitMeasure.REQUESTS, amount=10**9),
    KeyLimit(per=LimitPeriod.HOUR, measure=LimitMeasure.TOKENS, amount=10**12),
    KeyLimit(per=LimitPeriod.DAY, measure=LimitMeasure.COST, amount=10**12),
    KeyLimit(per=LimitPeriod.MONTH, measure=LimitMeasure.TOKENS, amount=10**12, cache_reads=True),
)
REQUESTS = 2000
T0 = 1_796_205_600.0


def _run(key: str, limits: KeyLimits) -> int:
    estimate = Spend(requests=1, tokens=800, cost_micros=2400)
    used = Spend(requests=1, tokens=900, cache_reads=5000, cost_micros=4100)
    admitted = 0
    now = T0
    for _ in range(REQUESTS):
        now += 0.5  # two requests a second: the hour window holds 7200 entries
        verdict = limits.admit(key, estimate, now)
        if isinstance(verdict, Admitted):
            admitted += 1
            limits.settle(verdict.reservation, used, now)
    return admitted


@pytest.mark.parametrize("key", ["limited", "plain"])
def test_admit_and_settle(benchmark: Any, key: str) -> None:
    clients = [Client(name="limited", key="a", limits=LIMITS), Client(name="plain", key="b")]
    limits = KeyLimits(clients, dt.UTC)
    assert benchmark(_run, key, limits) == REQUESTS
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_request"] = stats.stats.mean / REQUESTS * 1e6
