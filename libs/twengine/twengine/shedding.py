"""Load shedding: when a new request is refused at once instead of joining a saturated loop.

A gateway whose event loop is saturated does not fail: every stream it carries slows down, and a
new request waits behind all of them for its first byte (seconds, at thousands of streams).
Refusing the new request at once, with 503 and ``Retry-After`` in the client's own format, lets
the client's SDK or a load balancer in front go elsewhere while the streams already admitted
keep their pace (docs/operations.md, "Shedding load").

Two signals, both from ``listen.gateway`` (docs/configuration.md):

* ``max_requests``: the requests in progress at once, over every connection and protocol (0: no
  bound). The caller counts them in `LoadGauge.in_progress`; the verdict only compares.
* ``shed_loop_lag_ms``: the event loop's lag, sampled by the caller (how late a short sleep
  wakes up) and kept here as the median of the last `WINDOW` samples, so that one pause (a
  garbage collection, a page fault) does not shed anything. Shedding starts when the median
  reaches the bound and stops once it is back under half of it, so that the gateway does not
  flap at the edge.

  A loop that is behind cannot shed quickly itself (its own check waits behind the streams), so
  the gateway also reads the lag as it stands from a thread of its own, the door
  (twserve/app/door.py): `LoadGauge.due` is when the sampler's current sleep should end, and
  `LoadGauge.at_door` refuses while the loop is that far past it, or while shedding;
  `LoadGauge.door_wakes` says when the door need look again.

Pure: the samples and the count are arguments, and the verdict a value.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from twengine.config import GatewayListen
from twproto.errors import ErrorCategory, GatewayError

__all__ = ("WINDOW", "LoadGauge", "overloaded")

#: Lag samples the median is taken over (the caller samples every 100 ms: one second).
WINDOW = 10


def overloaded(reason: str) -> GatewayError:
    """The refusal of a request the gateway sheds (503, ``Retry-After: 1``)."""
    return GatewayError(
        status=503,
        # The gateway's own load, not the upstream's: the category the transport's own shedding
        # (request bodies held) carries too.
        category=ErrorCategory.RATE_LIMITED,
        code="gw.overloaded",
        message=f"the gateway is overloaded ({reason}); retry shortly or use another instance",
        retry_after=1.0,
    )


class LoadGauge:
    """The loop's recent lag and whether the gateway sheds new requests (module docs)."""

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self._lag_ms = 0.0
        self.shedding = False  # on the loop-lag signal, with its hysteresis
        self.shed = 0  # requests refused since start
        self.in_progress = 0  # requests being relayed now (the caller counts them)
        # When the sampler's sleep under way (or last) should end, on the caller's monotonic
        # clock; None before the first. Read by the door's thread, written by the loop.
        self.due: float | None = None
        self.shed_at_door = 0  # clients refused by the door (only its thread counts them)

    @property
    def lag_ms(self) -> float:
        """The median of the recent samples, milliseconds."""
        return self._lag_ms

    def sample(self, lag_secs: float, listen: GatewayListen) -> None:
        """Take one lag sample (seconds late) and update the shedding state for `listen`."""
        self._samples.append(max(0.0, lag_secs) * 1000.0)
        self._lag_ms = median(self._samples)
        bound = listen.shed_loop_lag_ms
        if bound <= 0:
            self.shedding = False
        elif self.shedding:
            self.shedding = self._lag_ms >= bound / 2
        else:
            self.shedding = len(self._samples) == self._samples.maxlen and self._lag_ms >= bound

    def at_door(self, now: float, listen: GatewayListen) -> GatewayError | None:
        """The refusal for a new client at the door at monotonic `now`, or None to leave it to
        the loop: while shedding, or while the sleep under way is `shed_loop_lag_ms` or more
        past `due` (the loop is that far behind now, before any sample says so) after a last
        sample of half the bound or more."""
        bound = listen.shed_loop_lag_ms
        if bound <= 0:
            return None
        due = self.due
        late_ms = 0.0 if due is None else (now - due) * 1000.0
        # Only on a loop already lagging (its last sample at half the bound or more): one
        # stall of an otherwise quiet loop (a first request's imports, a collection) passes.
        lagging = bool(self._samples) and self._samples[-1] >= bound / 2
        if late_ms >= bound and lagging:
            return overloaded(f"event loop {late_ms:.0f} ms behind, shed_loop_lag_ms")
        if self.shedding:
            return overloaded(f"event loop {self._lag_ms:.0f} ms behind, shed_loop_lag_ms")
        return None

    def door_wakes(self, now: float, listen: GatewayListen) -> float:
        """When the door looks next while the loop keeps up: the moment the loop would be
        `shed_loop_lag_ms` behind if the sleep under way were stuck now (`due` plus the
        bound), and at most a second after `now` (no sleep under way, no bound, or shedding,
        which the next sample may end)."""
        due, bound = self.due, listen.shed_loop_lag_ms
        if due is None or bound <= 0 or self.shedding:
            return now + 1.0
        return min(now + 1.0, due + bound / 1000.0)

    def verdict(self, listen: GatewayListen) -> GatewayError | None:
        """The refusal for a new request now, or None to serve it."""
        if listen.max_requests and self.in_progress >= listen.max_requests:
            self.shed += 1
            return overloaded(f"{self.in_progress} requests in progress, max_requests")
        if self.shedding and listen.shed_loop_lag_ms > 0:
            self.shed += 1
            return overloaded(f"event loop {self._lag_ms:.0f} ms behind, shed_loop_lag_ms")
        return None
