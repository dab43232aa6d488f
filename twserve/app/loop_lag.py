"""The event loop's lag, sampled for load shedding (twengine.shedding).

Every `PERIOD` seconds a short sleep measures how late the loop wakes it: with thousands of
streams on one loop that lateness is what a new request waits before its first byte is even
read. The samples go to the gateway's `LoadGauge`, which decides whether new requests are shed
(docs/operations.md, "Shedding load"). One sample costs a timer and a wake-up ten times a second,
whatever the traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from twengine.config import GatewayListen
from twengine.shedding import LoadGauge
from twserve.upstream.h1_connection import ReadTurns

__all__ = ("PERIOD", "watch_loop_lag")

#: Seconds between samples (`twengine.shedding.WINDOW` of them make the median).
PERIOD = 0.1


async def watch_loop_lag(
    gauge: LoadGauge,
    listen: Callable[[], GatewayListen],
    *,
    turns: ReadTurns | None = None,
    period: float = PERIOD,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Sample the loop's lag into `gauge` until cancelled; `listen` gives the bounds in force
    (a reload may change them). `turns` is engaged while the last sample is at least half its
    `behind`: a loop that keeps up pays nothing for it."""
    while True:
        before = clock()
        gauge.due = before + period  # the door reads how far past it the loop is, live
        await anyio.sleep(period)
        lag = clock() - before - period
        gauge.sample(lag, listen())
        if turns is not None:
            turns.engaged = lag >= turns.behind / 2
