"""Usage limits per gateway key (``clients[].limits``): pure accounting, time passed in.

Theory of operation
-------------------
Each limit counts one *measure* — requests, tokens or cost (micro-dollars) — over one *period*:
``minute`` and ``hour`` roll (the last 60 or 3600 seconds up to now), ``day``, ``week`` (from
Monday) and ``month`` follow the local calendar of the time zone given to `KeyLimits` (periods
start at local midnight; the tz is an argument, so tests and the server decide which one).

What a request counts is a `Spend`: one request, its tokens (uncached input + cache writes +
output; a limit with ``cache_reads: true`` adds cache reads) and its cost. Per key, one ledger
per period the key's limits use holds the settled spends in force; limits on the same period
share it and read their own measure from it.

A request's life, as `KeyLimits` sees it:

1. `admit(key, estimate, now)` before the request goes to an upstream. The estimate is one
   request, the input token estimate, and that input's cost at the dearest candidate's price.
   Every limit must hold with the estimate added to what is settled *and* to what the key's
   requests in flight have reserved: ``settled + reserved + estimate ≤ amount``. So requests
   racing a limit never pass it together — each admission sees the others' reservations. The
   answer is `Admitted` (the estimate is now reserved), `Wait` (a rolling limit is full: `until`
   says when enough of the window will have rolled off, None when only requests in flight hold
   it — the caller tries again when one settles, within its own deadline), or `Refused` (a
   calendar limit is used up until `reset`, or the estimate alone is over a rolling limit).
2. `settle(reservation, spend, now)` when it ends, with what it really used: the reservation is
   dropped and the spend is booked at `now`. `release(reservation)` instead when the request
   never reached an upstream: it counts for nothing.

A request that lives long and spends as it goes (a Realtime connection, one response after
another) books each part as it comes, as a spend of no request settled without a reservation,
and settles what is left at its end; `used_up(statuses)` says whether a token or cost limit is
spent meanwhile, so that no further part is started.

`rebuild(events, now)` books stored spends (from the request store's rows) at startup, so
calendar totals survive a restart. `status(key, now)` reports every limit's usage and reset for
the control plane. `settle` and refusals return `LimitAlert` values when a limit's usage first
reaches 80 % or 100 % in its window (again after a rolling window has fallen below 80 %, or in
the next calendar period).
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from twengine.config.model import Client, KeyLimit, LimitMeasure, LimitPeriod

__all__ = (
    "ALERT_LEVELS",
    "Admitted",
    "KeyLimits",
    "LimitAlert",
    "LimitStatus",
    "Refused",
    "Reservation",
    "Spend",
    "Wait",
    "period_bounds",
    "used_up",
)

ALERT_LEVELS = (80, 100)
_SPANS = {LimitPeriod.MINUTE: 60.0, LimitPeriod.HOUR: 3600.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Spend:
    """What one request counts toward limits. `tokens` leaves cache reads out."""

    requests: int = 1
    tokens: int = 0
    cache_reads: int = 0
    cost_micros: int = 0

    def measure(self, limit: KeyLimit) -> int:
        """This spend in `limit`'s measure."""
        if limit.measure is LimitMeasure.REQUESTS:
            return self.requests
        if limit.measure is LimitMeasure.TOKENS:
            return self.tokens + (self.cache_reads if limit.cache_reads else 0)
        return self.cost_micros


_NOTHING = Spend(requests=0)


class _Totals:
    """A running sum of spends, changed in place (the request path makes no objects for it)."""

    __slots__ = ("cache_reads", "cost_micros", "requests", "tokens")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.cache_reads = 0
        self.cost_micros = 0

    def add(self, spend: Spend) -> None:
        self.requests += spend.requests
        self.tokens += spend.tokens
        self.cache_reads += spend.cache_reads
        self.cost_micros += spend.cost_micros

    def remove(self, spend: Spend) -> None:
        self.requests -= spend.requests
        self.tokens -= spend.tokens
        self.cache_reads -= spend.cache_reads
        self.cost_micros -= spend.cost_micros

    def measure(self, limit: KeyLimit) -> int:
        if limit.measure is LimitMeasure.REQUESTS:
            return self.requests
        if limit.measure is LimitMeasure.TOKENS:
            return self.tokens + (self.cache_reads if limit.cache_reads else 0)
        return self.cost_micros


def period_bounds(per: LimitPeriod, now: float, tz: dt.tzinfo) -> tuple[float, float]:
    """The calendar period holding `now` in `tz`, as (start, end) unix seconds; end excluded."""
    local = dt.datetime.fromtimestamp(now, tz)
    day = local.date()
    if per is LimitPeriod.DAY:
        first, after = day, day + dt.timedelta(days=1)
    elif per is LimitPeriod.WEEK:
        first = day - dt.timedelta(days=day.weekday())
        after = first + dt.timedelta(days=7)
    elif per is LimitPeriod.MONTH:
        first = day.replace(day=1)
        after = (first + dt.timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"{per.value} is a rolling period, not a calendar one")

    def midnight(d: dt.date) -> float:
        return dt.datetime(d.year, d.month, d.day, tzinfo=tz).timestamp()

    return midnight(first), midnight(after)


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """An admitted request's hold on its key's limits until it settles or is released."""

    key: str
    estimate: Spend
    # False for a key without limits: nothing was reserved.
    held: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    reservation: Reservation


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """A rolling limit is full. `until`: when enough will have rolled off (None: only requests
    in flight hold it, so try again when one settles)."""

    limit: KeyLimit
    used: int
    until: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """The request may not go now. `reset`: when the limit's window frees (a calendar period's
    end; for a rolling limit the time enough rolls off, None if no wait can make room)."""

    limit: KeyLimit
    used: int
    reset: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitAlert:
    """A key's limit reached `percent` (80 or 100) of its amount in the current window."""

    key: str
    limit: KeyLimit
    percent: int
    used: int
    reset: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitStatus:
    """One limit as the control plane shows it. `used` includes reservations in flight
    (`reserved`); `reset` is the calendar period's end, or for a rolling window when its oldest
    counted spend rolls off (None when nothing is counted)."""

    limit: KeyLimit
    used: int
    reserved: int
    reset: float | None
    window_start: float


def used_up(statuses: Sequence[LimitStatus]) -> Refused | None:
    """The first token or cost limit among `statuses` whose usage has reached its amount, as
    the refusal of anything more; None while each has room. Request limits are left out: they
    count whole requests, and a long one was counted when it was admitted."""
    for st in statuses:
        lim = st.limit
        if lim.measure is not LimitMeasure.REQUESTS and st.used >= lim.amount:
            return Refused(limit=lim, used=st.used, reset=st.reset)
    return None


# --- the ledgers -----------------------------------------------------------------------------


class _Rolling:
    """Settled spends of the last `span` seconds, oldest first, with their running total."""

    __slots__ = ("events", "span", "total")

    def __init__(self, span: float) -> None:
        self.span = span
        self.events: deque[tuple[float, Spend]] = deque()
        self.total = _Totals()

    def roll(self, now: float) -> None:
        edge = now - self.span
        events = self.events
        while events and events[0][0] <= edge:
            self.total.remove(events.popleft()[1])

    def add(self, ts: float, spend: Spend) -> None:
        self.events.append((ts, spend))
        self.total.add(spend)

    def frees_at(self, limit: KeyLimit, need: int) -> float | None:
        """When `need` of `limit`'s measure will have rolled off, or None if never."""
        freed = 0
        for ts, spend in self.events:
            freed += spend.measure(limit)
            if freed >= need:
                return ts + self.span
        return None

    def reset(self) -> float | None:
        return self.events[0][0] + self.span if self.events else None

    def start(self, now: float) -> float:
        return now - self.span


class _Calendar:
    """Settled spends of the current calendar period."""

    __slots__ = ("end", "per", "start", "total", "tz")

    def __init__(self, per: LimitPeriod, tz: dt.tzinfo) -> None:
        self.per = per
        self.tz = tz
        self.start = 0.0
        self.end = 0.0
        self.total = _Totals()

    def roll(self, now: float) -> None:
        if not self.start <= now < self.end:
            self.start, self.end = period_bounds(self.per, now, self.tz)
            self.total = _Totals()

    def add(self, ts: float, spend: Spend) -> None:
        if self.start <= ts < self.end:
            self.total.add(spend)

    def reset(self) -> float | None:
        return self.end


_Ledger = _Rolling | _Calendar


@dataclass(slots=True)
class _Key:
    limits: tuple[KeyLimit, ...]
    ledgers: dict[LimitPeriod, _Ledger]
    reserved: _Totals = field(default_factory=_Totals)
    in_flight: int = 0
    # Per limit (by position): the alert level reached in the window, and the window it was in.
    alerted: list[int] = field(default_factory=list)
    alerted_window: list[float] = field(default_factory=list)


class KeyLimits:
    """Every key's limit accounting (see the module docs). Keys without limits cost nothing."""

    def __init__(self, clients: Sequence[Client], tz: dt.tzinfo) -> None:
        self.tz = tz
        self._keys: dict[str, _Key] = {}
        self.configure(clients)

    def configure(self, clients: Sequence[Client]) -> None:
        """Take a new config's limits. Ledgers start empty (the caller rebuilds them from the
        store); reservations of requests in flight are kept."""
        old = self._keys
        self._keys = {}
        for client in clients:
            if not client.limits:
                continue
            periods = {lim.per for lim in client.limits}
            ledgers: dict[LimitPeriod, _Ledger] = {
                per: _Rolling(_SPANS[per]) if per.rolling else _Calendar(per, self.tz)
                for per in periods
            }
            key = _Key(
                limits=client.limits,
                ledgers=ledgers,
                alerted=[0] * len(client.limits),
                alerted_window=[0.0] * len(client.limits),
            )
            previous = old.get(client.name)
            if previous is not None:
                key.reserved, key.in_flight = previous.reserved, previous.in_flight
            self._keys[client.name] = key

    def has_limits(self, key: str) -> bool:
        return key in self._keys

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    # -- the request path -----------------------------------------------------------------------

    def admit(self, key: str, estimate: Spend, now: float) -> Admitted | Wait | Refused:
        """May a request of `key` estimated at `estimate` go now? (see the module docs)"""
        state = self._keys.get(key)
        if state is None:
            return Admitted(reservation=Reservation(key=key, estimate=_NOTHING, held=False))
        blocked: list[tuple[KeyLimit, int, float | None]] = []
        for ledger in state.ledgers.values():
            ledger.roll(now)
        for lim in state.limits:
            ledger = state.ledgers[lim.per]
            used = ledger.total.measure(lim) + state.reserved.measure(lim)
            want = estimate.measure(lim)
            if used + want <= lim.amount:
                continue
            if not lim.per.rolling:
                return Refused(limit=lim, used=used, reset=ledger.reset())
            assert isinstance(ledger, _Rolling)
            if want > lim.amount:
                return Refused(limit=lim, used=used, reset=None)
            # Enough must roll off for the estimate to fit beside what is reserved; when the
            # reservations alone leave no room, only a settling request can make some.
            until = None
            if state.reserved.measure(lim) + want <= lim.amount:
                until = ledger.frees_at(lim, used + want - lim.amount)
            blocked.append((lim, used, until))
        if blocked:
            untils = [until for _, _, until in blocked]
            lim, used, _ = blocked[0]
            if any(u is None for u in untils):
                return Wait(limit=lim, used=used, until=None)
            latest = max(blocked, key=lambda b: b[2] or 0.0)
            return Wait(limit=latest[0], used=latest[1], until=latest[2])
        state.reserved.add(estimate)
        state.in_flight += 1
        return Admitted(reservation=Reservation(key=key, estimate=estimate))

    def release(self, reservation: Reservation) -> None:
        """The request never reached an upstream: drop its reservation, count nothing."""
        state = self._keys.get(reservation.key)
        if state is None or not reservation.held:
            return
        state.reserved.remove(reservation.estimate)
        state.in_flight -= 1

    def settle(self, reservation: Reservation, spend: Spend, now: float) -> list[LimitAlert]:
        """The request ended having used `spend`: book it at `now` in place of its estimate."""
        state = self._keys.get(reservation.key)
        if state is None:
            return []
        if reservation.held:
            state.reserved.remove(reservation.estimate)
            state.in_flight -= 1
        for ledger in state.ledgers.values():
            ledger.roll(now)
            ledger.add(now, spend)
        return self._alerts(reservation.key, state, now)

    def shared_alerts(self, key: str, used: Sequence[int], now: float) -> list[LimitAlert]:
        """The alerts for usage counted outside this object (several instances sharing their
        totals): `used` is each limit's settled usage, in declared order. Each level is raised
        once per window here, as `settle` does for its own totals."""
        state = self._keys.get(key)
        if state is None or len(used) != len(state.limits):
            return []
        for ledger in state.ledgers.values():
            ledger.roll(now)
        return self._alerts(key, state, now, used=used)

    def refused_alert(self, key: str, refusal: Refused | Wait, now: float) -> list[LimitAlert]:
        """The 100 % alert for a limit that just turned a request away, once per window."""
        state = self._keys.get(key)
        if state is None:
            return []
        for i, lim in enumerate(state.limits):
            if lim is refusal.limit:
                ledger = state.ledgers[lim.per]
                reset = refusal.reset if isinstance(refusal, Refused) else refusal.until
                return self._raise(key, state, i, 100, refusal.used, self._window(ledger), reset)
        return []

    # -- startup and views ----------------------------------------------------------------------

    def rebuild(self, events: Iterable[tuple[str, float, Spend]], now: float) -> int:
        """Book stored spends `(key, time, spend)` that fall in the current windows; returns how
        many were booked. Call on empty ledgers (after `configure`)."""
        booked = 0
        relevant = self._keys
        for state in relevant.values():
            for ledger in state.ledgers.values():
                ledger.roll(now)
        for key, ts, spend in sorted(events, key=lambda e: e[1]):
            found = relevant.get(key)
            if found is None or ts > now:
                continue
            for ledger in found.ledgers.values():
                if isinstance(ledger, _Rolling):
                    if ts > now - ledger.span:
                        ledger.add(ts, spend)
                        booked += 1
                else:
                    ledger.add(ts, spend)
        for key, state in relevant.items():
            self._alerts(key, state, now, publish=False)
        return booked

    def earliest_start(self, now: float) -> float:
        """The oldest time a current window reaches back to (what `rebuild` needs to read)."""
        starts = [now]
        for state in self._keys.values():
            for ledger in state.ledgers.values():
                ledger.roll(now)
                starts.append(ledger.start(now) if isinstance(ledger, _Rolling) else ledger.start)
        return min(starts)

    def status(self, key: str, now: float) -> list[LimitStatus]:
        """Every limit of `key` with its usage and reset, in declared order."""
        state = self._keys.get(key)
        if state is None:
            return []
        out = []
        for lim in state.limits:
            ledger = state.ledgers[lim.per]
            ledger.roll(now)
            reserved = state.reserved.measure(lim)
            out.append(
                LimitStatus(
                    limit=lim,
                    used=ledger.total.measure(lim) + reserved,
                    reserved=reserved,
                    reset=ledger.reset(),
                    window_start=ledger.start(now)
                    if isinstance(ledger, _Rolling)
                    else ledger.start,
                )
            )
        return out

    def in_flight(self, key: str) -> int:
        state = self._keys.get(key)
        return state.in_flight if state is not None else 0

    # -- alerts ---------------------------------------------------------------------------------

    @staticmethod
    def _window(ledger: _Ledger) -> float:
        # A calendar window is named by its start; rolling windows are one continuing window.
        return ledger.start if isinstance(ledger, _Calendar) else 0.0

    def _alerts(
        self,
        key: str,
        state: _Key,
        now: float,
        *,
        publish: bool = True,
        used: Sequence[int] | None = None,
    ) -> list[LimitAlert]:
        out: list[LimitAlert] = []
        counted = used
        for i, lim in enumerate(state.limits):
            ledger = state.ledgers[lim.per]
            used_now = ledger.total.measure(lim) if counted is None else counted[i]
            window = self._window(ledger)
            if state.alerted_window[i] != window:
                state.alerted_window[i] = window
                state.alerted[i] = 0
            if isinstance(ledger, _Rolling) and used_now * 100 < ALERT_LEVELS[0] * lim.amount:
                state.alerted[i] = 0  # fallen below the first level: alert again next time
            level = 0
            for percent in ALERT_LEVELS:
                if used_now * 100 >= percent * lim.amount:
                    level = percent
            if level:
                found = self._raise(key, state, i, level, used_now, window, ledger.reset())
                if publish:
                    out.extend(found)
        return out

    @staticmethod
    def _raise(
        key: str, state: _Key, i: int, level: int, used: int, window: float, reset: float | None
    ) -> list[LimitAlert]:
        if state.alerted_window[i] != window:
            state.alerted_window[i] = window
            state.alerted[i] = 0
        if level <= state.alerted[i]:
            return []
        state.alerted[i] = level
        return [LimitAlert(key=key, limit=state.limits[i], percent=level, used=used, reset=reset)]
