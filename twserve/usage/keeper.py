"""Usage, cost and key limits on the request path: the IO around twengine's pricing and limits.

The gateway calls this module twice per generation request, and nowhere else:

* `UsageKeeper.admit` once routing has chosen the candidates and before anything is sent: the
  key's limits (`twengine.limits.KeyLimits`) take the request's estimate — one request, the
  input token estimate, that input's cost at the dearest candidate's price — or answer that it
  must wait (a rolling limit: the wait happens here, within ``failover.wait_secs``) or is
  refused (an `twproto.errors.GatewayError` in the client's format, returned for the gateway
  to send).
* `UsageKeeper.settle` when the request is over: it prices the row and each attempt that
  reported usage (`twengine.pricing.Pricer`), books what the request really used in place of
  its estimate — or nothing at all if no attempt reached an upstream — and publishes
  `KeyLimitAlert` events. An answer that reported no usage (a stream cancelled or abandoned
  before its usage event) is booked at its estimate, and the row says so: its input tokens and
  cost are the estimate's, cost state ``estimated``.

A Realtime connection is one request that spends as it goes: `UsageKeeper.book_part` books
each response's usage as it is reported (so the key's limits see it at once, not when the
connection closes), `UsageKeeper.used_up` says when a token or cost limit is spent, and the
settling at the end books only what the parts did not.

Limits count wall-clock time (`wall`), the time rows are stored with, so that the totals
rebuilt from the store at startup (`rebuild`) line up with the ones kept live. Calendar periods
follow the local time zone unless one is given.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from twengine.attempt import AttemptRecord
from twengine.config import Config, KeyLimit, LimitMeasure
from twengine.limits import (
    Admitted,
    KeyLimits,
    LimitAlert,
    LimitStatus,
    Refused,
    Reservation,
    Spend,
    Wait,
    used_up,
)
from twengine.pricing import Cost, CostState, Pricer, PriceTable
from twproto.errors import ErrorCategory, GatewayError
from twproto.ir import Usage
from twserve.shared.down import RedisDown
from twserve.store.sqlite import RequestRow, Store

if TYPE_CHECKING:
    from twserve.shared.admission import Ride
    from twserve.shared.limits import SharedLimits

__all__ = ["Admission", "UsageKeeper", "describe_amount", "local_tz", "spend_of"]

log = logging.getLogger("twserve.usage.keeper")

# How often a request waiting on a rolling limit looks again, at most (the wall clock may be
# moved by an operator or a test; a settling request wakes it sooner).
RECHECK_SECS = 0.25
# After a rebuild failed (the store could not be read), how long before the next try.
REBUILD_RETRY_SECS = 5.0


def local_tz() -> dt.tzinfo:
    """The machine's local time zone as it is now."""
    tz = dt.datetime.now().astimezone().tzinfo
    assert tz is not None
    return tz


@dataclass(slots=True)
class Admission:
    """A request let through its key's limits; `estimate_tokens` is what it reserved."""

    reservation: Reservation
    estimate: Spend
    # False for token counts: priced at nothing and booked against no limit.
    counts: bool = True
    # The reservation's id in Redis when the key's limits were shared ones at admission.
    shared_id: str | None = None
    # What `UsageKeeper.book_part` booked of the request already (a Realtime connection's
    # responses); its settling books the rest.
    booked: Spend | None = None

    @classmethod
    def uncounted(cls, key: str) -> Admission:
        nothing = Spend(requests=0)
        return cls(
            reservation=Reservation(key=key, estimate=nothing, held=False),
            estimate=nothing,
            counts=False,
        )


def spend_of(
    usage: Usage | None, cost: int, estimate: Spend, *, extra: Iterable[Usage] = ()
) -> Spend:
    """What a finished request counts: its answer's reported usage — or, when the answer
    reported none, its estimate's tokens — plus what other attempts billed; `cost` is the
    request's counted cost."""
    tokens = estimate.tokens if usage is None else 0
    reads = 0
    for u in (usage, *extra):
        if u is None:
            continue
        tokens += u.input_tokens + u.cache_write_tokens + u.output_tokens
        reads += u.cache_read_tokens
    return Spend(requests=1, tokens=tokens, cache_reads=reads, cost_micros=max(cost, 0))


def describe_amount(limit: KeyLimit, amount: int) -> str:
    """An amount in `limit`'s measure as people read it."""
    if limit.measure is LimitMeasure.COST:
        return f"${amount / 1_000_000:,.4f}".rstrip("0").rstrip(".")
    unit = "request" if limit.measure is LimitMeasure.REQUESTS else "token"
    return f"{amount:,} {unit}{'' if amount == 1 else 's'}"


def _describe_limit(limit: KeyLimit) -> str:
    reads = " (cache reads included)" if limit.cache_reads else ""
    return f"{describe_amount(limit, limit.amount)}{reads} per {limit.per.value}"


def _stamp(ts: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).isoformat(timespec="seconds")


class UsageKeeper:
    """The process's limits and prices (see the module docs)."""

    def __init__(
        self,
        config: Config,
        table: PriceTable,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        tz: dt.tzinfo | None = None,
    ) -> None:
        self.table = table
        self.wall = wall
        self.clock = clock
        self.tz = tz if tz is not None else local_tz()
        self.limits = KeyLimits(config.clients, self.tz)
        self.pricer = Pricer(config, table)
        self.config = config
        # Set whenever a request settles, so requests waiting on a full window look again.
        self._settled: anyio.Event | None = None
        self.alert_listeners: list[Callable[[LimitAlert], None]] = []
        # Set when a reload changed some key's limits; the next admission (or the maintenance
        # task, whichever comes first) rebuilds the totals from `store`.
        self.rebuild_needed = False
        self.store: Store | None = None
        self._retry_rebuild = -math.inf
        # True while a rebuild reads the store: admissions wait for it.
        self.rebuilding = False
        self._rebuild_lock: anyio.Lock | None = None
        # Set with ``state.redis_url``: limits checked across instances while Redis answers;
        # `limits` (this process's own totals) while it does not.
        self.shared: SharedLimits | None = None

    def apply_config(self, config: Config) -> bool:
        """Take a new config; True when the limits changed and need a `rebuild`."""
        changed = [(c.name, c.limits) for c in config.clients] != [
            (c.name, c.limits) for c in self.config.clients
        ]
        self.config = config
        self.pricer = Pricer(config, self.table)
        if changed:
            self.limits.configure(config.clients)
            self.rebuild_needed = True
        return changed

    def set_tz(self, tz: dt.tzinfo) -> None:
        """Count calendar periods in `tz` from now on (the caller rebuilds)."""
        self.tz = tz
        self.limits.tz = tz
        self.limits.configure(self.config.clients)

    def set_table(self, table: PriceTable) -> None:
        self.table = table
        self.pricer = Pricer(self.config, table)

    # -- admission --------------------------------------------------------------------------

    def estimate(self, input_tokens: int, targets: Sequence[tuple[str, str]]) -> Spend:
        """One request of `input_tokens` estimated input, priced at the dearest of the
        `(upstream, model)` targets it may go to (unpriced and free ones count 0)."""
        price = 0.0
        for provider, model in targets:
            p = self.pricer.input_price(provider, model)
            if p is not None:
                price = max(price, p)
        return Spend(
            requests=1,
            tokens=input_tokens,
            cost_micros=math.ceil(input_tokens * price),
        )

    def may_wait(self, key: str) -> bool:
        """Whether `admit` for `key` may have to wait (a limit to check, a rebuild to run)."""
        return self.rebuild_due() or self.rebuilding or self.limits.has_limits(key)

    async def admit(
        self, key: str, estimate: Spend, *, deadline: float, along: Ride | None = None
    ) -> Admission | GatewayError:
        """Let the request through `key`'s limits, waiting on a rolling window until `deadline`
        (the gateway's monotonic clock); a refusal comes back as the error to send. `along`
        (the request's shared turn and slot leases) is taken with a shared limit's admission,
        in its round trip; left undone otherwise."""
        if self.rebuild_due() or self.rebuilding:
            # A reload changed the limits (or the store came back): count the stored rows
            # before admitting anything; a rebuild under way is waited for.
            try:
                await self.rebuild_now()
            except Exception as exc:  # the store is away: admit on the totals kept live
                log.warning("key limits not rebuilt, the request store cannot be read: %s", exc)
        limits = self.limits
        if not limits.has_limits(key):
            return Admission(
                reservation=Reservation(key=key, estimate=estimate, held=False), estimate=estimate
            )
        while True:
            now = self.wall()
            verdict, shared_id = await self._admit_once(key, estimate, now, along)
            if isinstance(verdict, Admitted):
                return Admission(
                    reservation=verdict.reservation, estimate=estimate, shared_id=shared_id
                )
            left = deadline - self.clock()
            if (
                isinstance(verdict, Refused)
                or left <= 0
                or (verdict.until is not None and verdict.until - now > left)
            ):
                # Refused, or the window will not roll in time: answer now, with the reset.
                self._alert(limits.refused_alert(key, verdict, now))
                return self._refusal(key, verdict, now)
            # Wait for the window to roll (or for a request in flight to settle), then retry.
            pause = left if verdict.until is None else max(0.0, verdict.until - now)
            if self._settled is None:
                self._settled = anyio.Event()
            settled = self._settled
            with anyio.move_on_after(min(pause, left, RECHECK_SECS)):
                await settled.wait()

    async def _admit_once(
        self, key: str, estimate: Spend, now: float, along: Ride | None
    ) -> tuple[Admitted | Wait | Refused, str | None]:
        """One look at the key's limits: the shared ones while Redis answers, else this
        process's own."""
        shared = self.shared
        if shared is not None and shared.state.up:
            limits = self.config.client(key).limits
            try:
                return await shared.admit(key, limits, estimate, now, self.tz, along)
            except RedisDown:
                pass  # counted from here on by this process alone, until Redis is back
        return self.limits.admit(key, estimate, now), None

    def _refusal(self, key: str, verdict: Refused | Wait, now: float) -> GatewayError:
        limit = verdict.limit
        used = describe_amount(limit, verdict.used)
        what = f"gateway key {key!r} is over its limit of {_describe_limit(limit)}: used {used}"
        if limit.per.rolling:
            code = f"gw.key_limit.{limit.measure.value}_rolling"
            if isinstance(verdict, Refused) and verdict.reset is None:
                return GatewayError(
                    status=429,
                    category=ErrorCategory.RATE_LIMITED,
                    code=code,
                    message=f"{what}; this request's estimate alone is over the limit",
                    should_retry=False,
                )
            reset = verdict.reset if isinstance(verdict, Refused) else verdict.until
            if reset is None:
                # Requests in flight hold the whole window: it frees when one of them ends.
                retry = 1.0
                message = f"{what}; this request fits when requests in flight finish"
            else:
                retry = max(0.0, reset - now)
                message = f"{what}; retry in {retry:.3f} s (at {_stamp(reset, self.tz)})"
            return GatewayError(
                status=429,
                category=ErrorCategory.RATE_LIMITED,
                code=code,
                message=message,
                retry_after=retry,
                extra_headers=((b"retry-after-ms", str(math.ceil(retry * 1000)).encode()),),
            )
        assert isinstance(verdict, Refused) and verdict.reset is not None
        retry = max(0.0, verdict.reset - now)
        return GatewayError(
            status=429,
            category=ErrorCategory.RATE_LIMITED,
            code="gw.key_limit.period",
            message=(
                f"{what} this {limit.per.value}; it resets at {_stamp(verdict.reset, self.tz)} "
                f"(in {_duration(retry)})"
            ),
            retry_after=retry,
            openai_type="insufficient_quota",
            should_retry=False,
        )

    # -- settling ---------------------------------------------------------------------------

    def cost(self, provider: str | None, model: str | None, usage: Usage | None) -> Cost | None:
        """The cost of `usage` at `provider`'s price for `model`; None without usage."""
        if usage is None or provider is None or model is None:
            return None
        return self.pricer.cost(provider, model, usage)

    def finish(
        self,
        row: RequestRow,
        admission: Admission | None,
        *,
        usage: Usage | None,
        attempts: Sequence[AttemptRecord],
        attempt_usage: Mapping[int, Usage],
        models: Mapping[str, str],
    ) -> None:
        """Price a finished request's row and attempts, and settle its key's limits.

        `usage` is the answer's (the last attempt sent); `attempt_usage` what other attempts
        reported; `models` the model sent to each upstream. The row gets cost_micros and
        cost_state, every attempt that reported usage its own usage and cost, and the limit
        columns what the request counted.
        """
        if admission is not None and not admission.counts:
            if row.provider is not None:
                row.cost_micros, row.cost_state = 0, CostState.KNOWN.value
            return
        sent = [i for i, a in enumerate(attempts) if a.sent_at is not None]
        views: list[dict[str, Any]] = (row.routing or {}).get("attempts") or []
        last = sent[-1] if sent else None
        extra_cost = 0
        extras: list[Usage] = []
        for index, billed in attempt_usage.items():
            if index == last and usage is not None:
                continue
            if billed is None or index >= len(attempts):
                continue
            provider = attempts[index].provider
            cost = self.cost(provider, models.get(provider), billed)
            extras.append(billed)
            extra_cost += cost.counted if cost is not None else 0
            if index < len(views):
                views[index]["usage"] = _usage_json(billed)
                views[index]["cost_micros"], views[index]["cost_state"] = cost_fields(cost)
        self._price_quiet_attempts(views, attempts, skip=last if usage is not None else None)
        reached = usage is not None or bool(extras) or any(a.status is not None for a in attempts)
        if last is None or not reached:
            # No upstream answered at all (none was sent to, or none could be connected to):
            # no cost, and nothing counts toward the limits.
            self.settle(admission, None)
            return
        estimate = admission.estimate if admission is not None else Spend()
        # What the answer reported no usage for is counted at its estimate, and shown as such.
        estimated = Cost(state=CostState.ESTIMATED, micros=estimate.cost_micros)
        answer: Cost | None
        if row.provider is not None:
            model = models.get(row.provider, row.model or "")
            if usage is not None:
                answer = self.pricer.cost(row.provider, model, usage)
            elif self.pricer.is_free(row.provider):
                answer = Cost(state=CostState.FREE, micros=0)
            else:
                answer = estimated  # no usage reported (cancelled or cut before it came)
            if last < len(views):
                if usage is not None:
                    views[last]["usage"] = _usage_json(usage)
                views[last]["cost_micros"], views[last]["cost_state"] = cost_fields(answer)
        elif all((attempts[i].status or 0) >= 400 for i in sent):
            answer = None  # every upstream refused outright: billed nothing but what it said
        else:
            answer = estimated if not extras else None
        if answer is None:
            row.cost_micros, row.cost_state = extra_cost, CostState.KNOWN.value
        elif answer.micros is None:
            row.cost_micros, row.cost_state = None, answer.state.value
        else:
            row.cost_micros, row.cost_state = answer.micros + extra_cost, answer.state.value
        if answer is estimated and row.input_tokens is None:
            row.input_tokens = estimate.tokens  # the estimate the limits counted, shown
        counted_cost = extra_cost + (answer.counted if answer is not None else 0)
        # The answer's tokens: its usage, else its estimate (nothing for a refusal).
        counted_usage = usage if answer is not None or usage is not None else Usage()
        spend = spend_of(counted_usage, counted_cost, estimate, extra=extras)
        row.counted = True
        row.settled_ts = self.wall()
        row.limit_tokens = spend.tokens
        row.limit_cache_reads = spend.cache_reads
        row.limit_cost = spend.cost_micros
        self.settle(admission, spend)

    @staticmethod
    def _price_quiet_attempts(
        views: list[dict[str, Any]], attempts: Sequence[AttemptRecord], *, skip: int | None
    ) -> None:
        """Cost fields for the attempts that reported no usage: one never sent, or refused
        outright with an error status, billed nothing (0, known); one that was sent and ended
        without saying what it used may have billed something (unknown)."""
        for index, view in enumerate(views):
            if "cost_state" in view or index == skip or index >= len(attempts):
                continue
            record = attempts[index]
            if record.sent_at is None or (record.status or 0) >= 400:
                view["cost_micros"], view["cost_state"] = 0, CostState.KNOWN.value
            else:
                view["cost_micros"], view["cost_state"] = None, CostState.UNKNOWN.value

    def book_part(
        self, admission: Admission, usage: Usage, provider: str | None, model: str | None
    ) -> None:
        """Book part of a request still running (one response of a Realtime connection) at its
        usage and `provider`'s price for `model`, now: no request, its tokens and cost. The
        request's reservation stays until it settles, which books only what is left."""
        if not admission.counts:
            return
        cost = self.cost(provider, model, usage)
        part = spend_of(usage, cost.counted if cost is not None else 0, admission.estimate)
        part = Spend(
            requests=0,
            tokens=part.tokens,
            cache_reads=part.cache_reads,
            cost_micros=part.cost_micros,
        )
        admission.booked = _add(admission.booked, part)
        key = admission.reservation.key
        now = self.wall()
        self._alert(self.limits.settle(Reservation(key=key, estimate=part, held=False), part, now))
        shared = self.shared
        if admission.shared_id is not None and shared is not None:
            limits = self.config.client(key).limits if self.config.has_client(key) else ()
            rid = f"{admission.shared_id}.{uuid.uuid4().hex[:12]}"
            tz = self.tz

            async def job(_client: object) -> None:
                with suppress(RedisDown):
                    await shared.settle(key, rid, limits, part, now, tz)

            shared.state.later(job)
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    async def used_up(self, key: str) -> GatewayError | None:
        """The refusal for anything more of `key` once one of its token or cost limits is
        spent (counted across instances while the limits are shared); None while each has
        room."""
        now = self.wall()
        statuses: Sequence[LimitStatus] = ()
        shared = self.shared
        if shared is not None and shared.state.up and self.limits.has_limits(key):
            try:
                statuses = await shared.status(key, self.config.client(key).limits, now, self.tz)
            except RedisDown:
                statuses = ()
        if not statuses:
            statuses = self.limits.status(key, now)
        verdict = used_up(statuses)
        return None if verdict is None else self._refusal(key, verdict, now)

    def settle(self, admission: Admission | None, spend: Spend | None) -> None:
        """Book what an admitted request used (`spend`), or release it (None: it never reached
        an upstream). What `book_part` booked of it already is not booked again."""
        if admission is None:
            return
        if spend is not None and admission.booked is not None:
            spend = _less(spend, admission.booked)
        reservation = admission.reservation
        if admission.shared_id is not None and self.shared is not None:
            self._settle_shared(admission, spend)
        elif spend is None:
            self.limits.release(reservation)
        else:
            self._alert(self.limits.settle(reservation, spend, self.wall()))
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    def _settle_shared(self, admission: Admission, spend: Spend | None) -> None:
        """Settle a reservation made in Redis, in the background. The spend is booked in this
        process's own totals as well, which count alone while Redis is lost."""
        shared, rid = self.shared, admission.shared_id
        assert shared is not None and rid is not None
        key, now, tz = admission.reservation.key, self.wall(), self.tz
        if spend is not None:
            self.limits.settle(Reservation(key=key, estimate=spend, held=False), spend, now)
        limits = self.config.client(key).limits if self.config.has_client(key) else ()

        async def job(_client: object) -> None:
            try:
                used = await shared.settle(key, rid, limits, spend, now, tz)
            except RedisDown:
                return  # the reservation lapses on its own
            if used is not None:
                self._alert(self.limits.shared_alerts(key, used, now))

        shared.held.pop(rid, None)
        shared.state.later(job)

    def _alert(self, alerts: list[LimitAlert]) -> None:
        for alert in alerts:
            log.info(
                "key %s reached %d%% of its limit of %s",
                alert.key,
                alert.percent,
                _describe_limit(alert.limit),
            )
            for listener in self.alert_listeners:
                try:
                    listener(alert)
                except Exception:
                    log.exception("key limit alert listener failed")

    # -- startup ------------------------------------------------------------------------------

    def rebuild_due(self) -> bool:
        """A rebuild is needed, and the last failed one (if any) was long enough ago."""
        return (
            self.rebuild_needed and self.store is not None and self.clock() >= self._retry_rebuild
        )

    async def rebuild_now(self) -> int:
        """Rebuild from `store` once, however many requests ask at the same moment. A store
        that cannot be read leaves `rebuild_needed` set and raises."""
        if self._rebuild_lock is None:
            self._rebuild_lock = anyio.Lock()
        async with self._rebuild_lock:
            if not self.rebuild_needed or self.store is None:
                return 0
            self.rebuild_needed = False
            self.rebuilding = True
            try:
                return await self.rebuild(self.store)
            except BaseException:
                self.rebuild_needed = True
                self._retry_rebuild = self.clock() + REBUILD_RETRY_SECS
                raise
            finally:
                self.rebuilding = False

    async def rebuild(self, store: Store) -> int:
        """Book the spends stored in `store` that fall in the current windows."""
        if not self.limits.keys:
            return 0
        now = self.wall()
        since = self.limits.earliest_start(now)
        keys = self.limits.keys

        events = [
            (k, ts, Spend(requests=1, tokens=t, cache_reads=r, cost_micros=c))
            for k, ts, t, r, c in await store.limit_spends(keys, since)
        ]
        # From empty ledgers (reservations of requests in flight stay): a rebuild retried after
        # the store was away replaces what was booked live meanwhile, which the store now has.
        self.limits.configure(self.config.clients)
        self.limits.rebuild(events, now)
        return len(events)

    # -- views --------------------------------------------------------------------------------

    async def current_key_view(self, key: str) -> list[dict[str, Any]]:
        """`key_view`, with the usage of every instance while the limits are shared (Redis
        answering); this process's own otherwise."""
        shared = self.shared
        if shared is not None and shared.state.up and self.limits.has_limits(key):
            now = self.wall()
            try:
                statuses = await shared.status(key, self.config.client(key).limits, now, self.tz)
            except RedisDown:
                pass
            else:
                return self._view(statuses)
        return self.key_view(key)

    def key_view(self, key: str) -> list[dict[str, Any]]:
        """Each limit of `key` with usage and reset, for the control plane's keys view."""
        return self._view(self.limits.status(key, self.wall()))

    def _view(self, statuses: Sequence[LimitStatus]) -> list[dict[str, Any]]:
        out = []
        for st in statuses:
            lim = st.limit
            out.append(
                {
                    "per": lim.per.value,
                    "measure": lim.measure.value,
                    "amount": lim.amount,
                    "cache_reads": lim.cache_reads,
                    "rolling": lim.per.rolling,
                    "used": st.used,
                    "reserved": st.reserved,
                    "percent": round(100 * st.used / lim.amount, 1) if lim.amount else None,
                    "window_start": round(st.window_start, 3),
                    "reset": round(st.reset, 3) if st.reset is not None else None,
                    "reset_local": _stamp(st.reset, self.tz) if st.reset is not None else None,
                }
            )
        return out

    def unpriced_models(self, key: str) -> list[dict[str, str]]:
        """The (upstream, model) pairs a key with a cost limit can reach that have no price;
        upstreams without a model list are listed with model ``*``."""
        config = self.config
        if not config.has_client(key) or not any(
            lim.measure is LimitMeasure.COST for lim in config.client(key).limits
        ):
            return []
        out = []
        for provider in config.providers:
            if self.pricer.is_free(provider.name):
                continue
            if provider.models is None:
                out.append({"provider": provider.name, "model": "*"})
                continue
            for model in provider.models:
                if self.pricer.pricing(provider.name, model) is None:
                    out.append({"provider": provider.name, "model": model})
        return out


def _add(total: Spend | None, more: Spend) -> Spend:
    if total is None:
        return more
    return Spend(
        requests=total.requests + more.requests,
        tokens=total.tokens + more.tokens,
        cache_reads=total.cache_reads + more.cache_reads,
        cost_micros=total.cost_micros + more.cost_micros,
    )


def _less(spend: Spend, booked: Spend) -> Spend:
    """What `spend` adds to `booked`, never below nothing (a cost summed over parts may round
    above the whole's)."""
    return Spend(
        requests=max(0, spend.requests - booked.requests),
        tokens=max(0, spend.tokens - booked.tokens),
        cache_reads=max(0, spend.cache_reads - booked.cache_reads),
        cost_micros=max(0, spend.cost_micros - booked.cost_micros),
    )


def _usage_json(usage: Usage) -> dict[str, int]:
    out = {
        "input": usage.input_tokens,
        "output": usage.output_tokens,
        "cache_read": usage.cache_read_tokens,
        "cache_write": usage.cache_write_tokens,
        "reasoning": usage.reasoning_tokens,
    }
    if usage.cache_write_1h_tokens:
        out["cache_write_1h"] = usage.cache_write_1h_tokens
    return out


def _duration(secs: float) -> str:
    secs = math.ceil(secs)
    hours, rest = divmod(secs, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {seconds} s"
    return f"{seconds} s"


def cost_fields(cost: Cost | None) -> tuple[int | None, str | None]:
    """A cost as the row's (cost_micros, cost_state)."""
    if cost is None:
        return None, None
    return cost.micros, cost.state.value


__all__ += ["CostState", "cost_fields"]
