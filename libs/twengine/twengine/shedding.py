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

  The same bound holds for the clients the loop has not even accepted yet. The lag samples
  measure a timer, and under a flood of new connections the loop may keep its timers nearly on
  time while its accepts fall behind: the kernel's accept queue is first come, first served, so
  every new client waits behind all that came before it (seconds, with lag samples of 20 ms).
  The door reads the queue's length and the loop's count of accepts; `BacklogWait` turns the
  two into how long the oldest client in the queue has waited at least while the loop accepted
  others, and `at_door` refuses once that is the bound or more.

Pure: the samples and the count are arguments, and the verdict a value.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from twengine.config import GatewayListen
from twproto.errors import ErrorCategory, GatewayError

__all__ = ("WINDOW", "BacklogWait", "LoadGauge", "overloaded")

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
        # How long the oldest client in the accept queue had waited at the door's last look
        # (milliseconds; 0 with none waiting, or none known). Written by the door's thread.
        self.accept_wait_ms = 0.0

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

    def at_door(
        self, now: float, listen: GatewayListen, waited: float = 0.0
    ) -> GatewayError | None:
        """The refusal for a new client at the door at monotonic `now`, or None to leave it to
        the loop: while a client has waited `shed_loop_lag_ms` or more in the accept queue
        (`waited`, seconds, from `BacklogWait`), while shedding, or while the sleep under way is
        the bound or more past `due` (the loop is that far behind now, before any sample says
        so) after a last sample of half the bound or more."""
        self.accept_wait_ms = waited * 1000.0
        bound = listen.shed_loop_lag_ms
        if bound <= 0:
            return None
        if waited * 1000.0 >= bound:
            return overloaded(
                f"event loop behind: a new client waited {waited * 1000.0:.0f} ms to be"
                " accepted, shed_loop_lag_ms"
            )
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

    def door_wakes(self, now: float, listen: GatewayListen, waited: float = 0.0) -> float:
        """When the door looks next while the loop keeps up: the moment the loop would be
        `shed_loop_lag_ms` behind if the sleep under way were stuck now (`due` plus the bound),
        the moment the client that has `waited` (seconds) in the accept queue would have waited
        the bound, and a quarter of the bound after `now` at the latest (a client that arrives
        meanwhile is seen in time), but at most a second after `now` (no bound, or shedding,
        which the next sample may end)."""
        due, bound = self.due, listen.shed_loop_lag_ms
        if bound <= 0 or self.shedding:
            return now + 1.0
        soonest = min(now + 1.0, now + bound / 4000.0)
        if waited > 0.0:
            soonest = min(soonest, now + bound / 1000.0 - waited)
        return soonest if due is None else min(soonest, due + bound / 1000.0)

    def verdict(self, listen: GatewayListen) -> GatewayError | None:
        """The refusal for a new request now, or None to serve it."""
        if listen.max_requests and self.in_progress >= listen.max_requests:
            self.shed += 1
            return overloaded(f"{self.in_progress} requests in progress, max_requests")
        if self.shedding and listen.shed_loop_lag_ms > 0:
            self.shed += 1
            return overloaded(f"event loop {self._lag_ms:.0f} ms behind, shed_loop_lag_ms")
        return None


class BacklogWait:
    """How long the oldest client in a listening socket's accept queue has waited at least
    while the loop accepted others before it, from looks at the queue's length and at the count
    of clients taken from it so far (module docs).

    A look that finds `queued` clients after `taken` were accepted marks the moment: those
    clients are all out of the queue once `taken + queued` have been accepted (the queue is
    first in, first out). The oldest mark not yet reached is when the client at the queue's
    head was seen waiting, at the latest. Its wait counts only once some client has been
    accepted since that mark: a loop that accepts nobody is paused (a collection, a first
    request's imports), which the lag judges, not a loop that serves a flood of clients
    before this one. Read the count before the length: a client accepted between the two reads
    then makes the mark short by one, never long (a long mark would wait for a client that is
    gone). An empty queue clears every mark, whatever the counts say (a client that reset
    before it was accepted, or an accept that failed). At most `keep` marks are kept: past that
    the newest grows to cover the later clients, so the oldest stays.
    """

    def __init__(self, keep: int = 64) -> None:
        self._marks: deque[tuple[float, int, int]] = deque()  # seen at, all out at, taken then
        self._keep = keep

    def look(self, now: float, taken: int, queued: int) -> float:
        """Seconds the oldest client still queued has waited at least while others were
        accepted, at monotonic `now` (0: none waits so)."""
        marks = self._marks
        if queued <= 0:
            marks.clear()
            return 0.0
        while marks and marks[0][1] <= taken:
            marks.popleft()
        target = taken + queued
        if not marks or marks[-1][1] < target:
            if len(marks) < self._keep:
                marks.append((now, target, taken))
            else:
                marks[-1] = (marks[-1][0], target, marks[-1][2])
        seen, _, then = marks[0]
        return now - seen if taken > then else 0.0
