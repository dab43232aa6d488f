"""Key limits shared by every instance: Lua scripts that check and reserve in one step.

The semantics are `twengine.limits`'s, with the totals in Redis instead of in the process:

* ``ADMIT`` drops the key's lapsed reservations, sums the live ones and each limit's settled
  spends (a rolling window's events since ``now - span``; a calendar period's running totals),
  and admits only when ``settled + reserved + estimate ≤ amount`` holds for every limit — then
  stores the reservation with its expiry. Otherwise it answers as `KeyLimits.admit` does: refused
  (a calendar limit used up, or an estimate over a rolling limit on its own) or wait (a full
  rolling window: when enough rolls off, or never while only reservations hold it).
  A script runs alone on the server, so instances racing a limit never pass it together.
* ``SETTLE`` replaces a reservation with the spend the request really made, booked at ``now``
  in each window (a calendar period only while ``now`` is in it), and returns each window's
  settled totals so the caller can raise the 80 %/100 % alerts.
* A reservation lapses ``reservation_secs`` after it was made or last renewed: the instance that
  holds it renews it (`renew`) while the request runs, so only a dead instance's reservations
  lapse — and then they count for nothing.

Keys (``{key}`` is the gateway key's name, in braces so a cluster keeps them on one slot):
``<prefix>lim:{key}:res`` (reservation → expiry, ms), ``<prefix>lim:{key}:resv`` (reservation →
its estimate), ``<prefix>lim:{key}:roll:<secs>`` (a rolling window's events, by time) with
``…:roll:<secs>:sum`` (their running sum, so an admission reads totals without walking the
window; only a refusal reads the oldest events, to say when enough rolls off) and
``<prefix>lim:{key}:cal:<period>:<start>`` (a calendar period's totals, kept a day past its end).
Spends are four integers: requests, tokens (uncached input, cache writes, output), cache reads,
cost in micro-dollars.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from twengine.config import KeyLimit, LimitMeasure, LimitPeriod
from twengine.limits import (
    Admitted,
    LimitStatus,
    Refused,
    Reservation,
    Spend,
    Wait,
    period_bounds,
)
from twserve.shared.redis import RedisState

if TYPE_CHECKING:
    from twserve.shared.admission import Ride

__all__ = [
    "ADMIT",
    "SETTLE",
    "STATUS",
    "SharedLimits",
    "Window",
    "admit_args",
    "read_verdict",
    "settle_args",
    "windows",
]

_SPANS = {LimitPeriod.MINUTE: 60, LimitPeriod.HOUR: 3600}
_MEASURE = {LimitMeasure.REQUESTS: "r", LimitMeasure.TOKENS: "t", LimitMeasure.COST: "m"}

_COMMON = """
local NAMES = {'r', 't', 'c', 'm'}
local function spend_of(text, skip)
  local s = {0, 0, 0, 0}
  local i = 1 - skip
  for x in string.gmatch(text, '%S+') do
    if i >= 1 then s[i] = tonumber(x) end
    i = i + 1
  end
  return s
end
local function measure(s, m, reads)
  if m == 'r' then return s[1] elseif m == 't' then
    if reads == '1' then return s[2] + s[3] end
    return s[2]
  end
  return s[4]
end
local function totals(key)
  local got = redis.call('HMGET', key, 'r', 't', 'c', 'm')
  local s = {0, 0, 0, 0}
  for k = 1, 4 do s[k] = tonumber(got[k]) or 0 end
  return s
end
-- The settled totals of one limit's window. A rolling window (events in the zset `key`, their
-- running sum in the hash `sums`) first drops what rolled off, from both.
local function settled(key, sums, kind, a, now)
  if kind == 'r' then
    local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now - a)
    if #gone > 0 then
      local drop = {0, 0, 0, 0}
      for _, member in ipairs(gone) do
        local s = spend_of(member, 1)
        for k = 1, 4 do drop[k] = drop[k] + s[k] end
      end
      for k = 1, 4 do redis.call('HINCRBY', sums, NAMES[k], -drop[k]) end
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a)
    end
    return totals(sums)
  end
  return totals(key)
end
-- When `need` of the measure will have rolled off a rolling window: its oldest events first,
-- read a hundred at a time.
local function frees_at(key, a, need, m, reads)
  local freed = 0
  local start = 0
  while true do
    local found = redis.call('ZRANGE', key, start, start + 99, 'WITHSCORES')
    if #found == 0 then return 'none' end
    for j = 1, #found, 2 do
      freed = freed + measure(spend_of(found[j], 1), m, reads)
      if freed >= need then return string.format('%.6f', tonumber(found[j + 1]) + a) end
    end
    start = start + 100
  end
end
-- Drop the reservations whose lease lapsed by `now`; the sum of those still held.
local function reserved_now(expiry, held, now)
  local lapsed = redis.call('ZRANGEBYSCORE', expiry, '-inf', now * 1000)
  for _, id in ipairs(lapsed) do redis.call('HDEL', held, id) end
  if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', expiry, '-inf', now * 1000) end
  local reserved = {0, 0, 0, 0}
  for _, v in ipairs(redis.call('HVALS', held)) do
    local s = spend_of(v, 0)
    for k = 1, 4 do reserved[k] = reserved[k] + s[k] end
  end
  return reserved
end
"""

#: KEYS: reservations (zset), their estimates (hash), then two per limit: its ledger (a rolling
#: window's events, or a calendar period's totals) and a rolling window's running sum.
#: ARGV: now, reservation id, expiry (ms), the estimate's four figures, reservation ttl (ms),
#: then per limit: kind (r/c), span or period start, period end, measure (r/t/m), reads, amount.
ADMIT = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local rid = ARGV[2]
local expires = tonumber(ARGV[3])
local est = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local ttl = tonumber(ARGV[8])
local reserved = reserved_now(KEYS[1], KEYS[2], now)
local blocked = {}
local n = (#ARGV - 8) / 6
for i = 1, n do
  local b = 8 + (i - 1) * 6
  local kind, a, m, reads = ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 4], ARGV[b + 5]
  local amount = tonumber(ARGV[b + 6])
  local key = KEYS[1 + 2 * i]
  local total = settled(key, KEYS[2 + 2 * i], kind, a, now)
  local held = measure(reserved, m, reads)
  local used = measure(total, m, reads) + held
  local want = measure(est, m, reads)
  if used + want > amount then
    if kind == 'c' then return {'refused', i, used, ''} end
    if want > amount then return {'refused', i, used, 'none'} end
    local untl = 'none'
    if held + want <= amount then untl = frees_at(key, a, used + want - amount, m, reads) end
    blocked[#blocked + 1] = {i, used, untl}
  end
end
if #blocked > 0 then
  local latest = nil
  for _, bl in ipairs(blocked) do
    if bl[3] == 'none' then return {'wait', blocked[1][1], blocked[1][2], 'none'} end
    if latest == nil or tonumber(bl[3]) > tonumber(latest[3]) then latest = bl end
  end
  return {'wait', latest[1], latest[2], latest[3]}
end
redis.call('ZADD', KEYS[1], expires, rid)
redis.call('HSET', KEYS[2], rid, table.concat(est, ' '))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return {'admitted', 0, 0, ''}
"""
)

#: KEYS: as ADMIT's. ARGV: now, reservation id, the spend's four figures, then per limit: kind,
#: span or period start, period end.
SETTLE = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local rid = ARGV[2]
local spend = {ARGV[3], ARGV[4], ARGV[5], ARGV[6]}
redis.call('ZREM', KEYS[1], rid)
redis.call('HDEL', KEYS[2], rid)
local booked = {}
local out = {}
local n = (#ARGV - 6) / 3
for i = 1, n do
  local b = 6 + (i - 1) * 3
  local key, sums, kind = KEYS[1 + 2 * i], KEYS[2 + 2 * i], ARGV[b + 1]
  local a, z = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local total = settled(key, sums, kind, a, now)
  if not booked[key] then
    booked[key] = true
    local target = key
    if kind == 'r' then
      redis.call('ZADD', key, now, rid .. ' ' .. table.concat(spend, ' '))
      redis.call('PEXPIRE', key, math.floor(a * 1000) + 60000)
      redis.call('PEXPIRE', sums, math.floor(a * 1000) + 60000)
      target = sums
    end
    if kind == 'r' or (a <= now and now < z) then
      for k = 1, 4 do redis.call('HINCRBY', target, NAMES[k], spend[k]) end
      if kind == 'c' then redis.call('PEXPIREAT', key, math.floor(z * 1000) + 86400000) end
    end
    total = totals(target)
  end
  out[#out + 1] = table.concat(total, ' ')
end
return out
"""
)


#: KEYS: as ADMIT's. ARGV: now, then per limit: kind, span or period start, period end,
#: measure, reads. Per limit: settled usage, reserved usage, when the oldest counted spend of a
#: rolling window rolls off ('' for none, or a calendar period).
STATUS = (
    _COMMON
    + """
local now = tonumber(ARGV[1])
local reserved = reserved_now(KEYS[1], KEYS[2], now)
local out = {}
local n = (#ARGV - 1) / 5
for i = 1, n do
  local b = 1 + (i - 1) * 5
  local kind, a, m, reads = ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 4], ARGV[b + 5]
  local key = KEYS[1 + 2 * i]
  local total = settled(key, KEYS[2 + 2 * i], kind, a, now)
  local oldest = ''
  if kind == 'r' then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #first > 0 then oldest = string.format('%.6f', tonumber(first[2]) + a) end
  end
  out[#out + 1] = {measure(total, m, reads), measure(reserved, m, reads), oldest}
end
return out
"""
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """Where one limit's settled spends live now: a rolling window of `span` seconds, or the
    calendar period [`start`, `end`)."""

    key: str
    rolling: bool
    # A rolling window's running sum (a calendar period's ledger is its own sum).
    sums: str = ""
    span: float = 0.0
    start: float = 0.0
    end: float = 0.0

    def args(self) -> list[str]:
        if self.rolling:
            return ["r", repr(self.span), "0"]
        return ["c", repr(self.start), repr(self.end)]


def _figures(spend: Spend) -> list[str]:
    return [str(spend.requests), str(spend.tokens), str(spend.cache_reads), str(spend.cost_micros)]


def windows(
    prefix: str, key: str, limits: Sequence[KeyLimit], now: float, tz: dt.tzinfo
) -> list[Window]:
    """Each limit's window at `now`, in declared order (calendar periods in `tz`)."""
    out = []
    for lim in limits:
        if lim.per.rolling:
            span = _SPANS[lim.per]
            name = f"{prefix}lim:{{{key}}}:roll:{span}"
            out.append(Window(key=name, rolling=True, sums=name + ":sum", span=span))
        else:
            start, end = period_bounds(lim.per, now, tz)
            name = f"{prefix}lim:{{{key}}}:cal:{lim.per.value}:{int(start)}"
            out.append(Window(key=name, rolling=False, sums=name, start=start, end=end))
    return out


def reservation_keys(prefix: str, key: str) -> list[str]:
    return [f"{prefix}lim:{{{key}}}:res", f"{prefix}lim:{{{key}}}:resv"]


def admit_args(
    limits: Sequence[KeyLimit],
    wins: Sequence[Window],
    estimate: Spend,
    now: float,
    rid: str,
    reservation_secs: float,
) -> list[str]:
    """ADMIT's ARGV."""
    ttl_ms = int(reservation_secs * 1000)
    args = [repr(now), rid, str(int(now * 1000) + ttl_ms), *_figures(estimate), str(ttl_ms * 4)]
    for lim, win in zip(limits, wins, strict=True):
        reads = "1" if lim.cache_reads else "0"
        args += [*win.args(), _MEASURE[lim.measure], reads, str(lim.amount)]
    return args


def settle_args(wins: Sequence[Window], spend: Spend, now: float, rid: str) -> list[str]:
    """SETTLE's ARGV."""
    args = [repr(now), rid, *_figures(spend)]
    for win in wins:
        args += win.args()
    return args


def read_verdict(
    answer: Sequence[object],
    key: str,
    limits: Sequence[KeyLimit],
    wins: Sequence[Window],
    estimate: Spend,
) -> Admitted | Wait | Refused:
    """ADMIT's answer as `twengine.limits` verdicts."""
    status, index, used, until = (_text(a) for a in answer)
    if status == "admitted":
        return Admitted(reservation=Reservation(key=key, estimate=estimate))
    lim = limits[int(index) - 1]
    count = int(float(used))
    if status == "refused":
        win = wins[int(index) - 1]
        reset = None if win.rolling else win.end
        return Refused(limit=lim, used=count, reset=reset)
    return Wait(limit=lim, used=count, until=None if until == "none" else float(until))


def read_totals(answer: Sequence[object], limits: Sequence[KeyLimit]) -> list[int]:
    """SETTLE's answer: each limit's settled usage in its own measure."""
    used = []
    for lim, total in zip(limits, answer, strict=True):
        r, t, c, m = (int(float(x)) for x in _text(total).split())
        spend = Spend(requests=r, tokens=t, cache_reads=c, cost_micros=m)
        used.append(spend.measure(lim))
    return used


def _ledger_keys(wins: Sequence[Window]) -> list[str]:
    return [name for w in wins for name in (w.key, w.sums)]


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


class SharedLimits:
    """Key limits kept in Redis (see the module docs); `RedisDown` from any call means the
    caller uses its in-process `KeyLimits` instead."""

    def __init__(self, state: RedisState, *, reservation_secs: float = 30.0) -> None:
        self.state = state
        self.reservation_secs = reservation_secs
        self.prefix = state.prefix
        # Reservations this instance holds, by id: their gateway key (renewed by `renew`).
        self.held: dict[str, str] = {}
        self._admit = state.script(ADMIT)
        self._settle = state.script(SETTLE)
        self._status = state.script(STATUS)

    async def admit(
        self,
        key: str,
        limits: Sequence[KeyLimit],
        estimate: Spend,
        now: float,
        tz: dt.tzinfo,
        along: Ride | None = None,
    ) -> tuple[Admitted | Wait | Refused, str]:
        """The verdict for one request of `key`, and its reservation id when admitted. `along`:
        the request's turn and slot leases, taken in the same round trip when admitted (on one
        server; twserve.shared.admission)."""
        wins = windows(self.prefix, key, limits, now, tz)
        rid = uuid.uuid4().hex
        keys = [*reservation_keys(self.prefix, key), *_ledger_keys(wins)]
        args = admit_args(limits, wins, estimate, now, rid, self.reservation_secs)

        async def run(client: Redis) -> list[object]:
            return list(await self._admit(keys=keys, args=args, client=client))

        if along is not None and along.one_trip:
            answer = await along.with_limit(keys, args)
        else:
            answer = await self.state.call(run)
        verdict = read_verdict(answer, key, limits, wins, estimate)
        if isinstance(verdict, Admitted):
            self.held[rid] = key
        return verdict, rid

    async def settle(
        self,
        key: str,
        rid: str,
        limits: Sequence[KeyLimit],
        spend: Spend | None,
        now: float,
        tz: dt.tzinfo,
    ) -> list[int] | None:
        """Book `spend` in place of reservation `rid` (None: only drop the reservation);
        returns each limit's settled usage after it."""
        self.held.pop(rid, None)
        res_keys = reservation_keys(self.prefix, key)
        if spend is None:

            async def drop(client: Redis) -> None:
                await client.zrem(res_keys[0], rid)
                await client.hdel(res_keys[1], rid)

            await self.state.call(drop)
            return None
        wins = windows(self.prefix, key, limits, now, tz)
        keys = [*res_keys, *_ledger_keys(wins)]
        args = settle_args(wins, spend, now, rid)

        async def run(client: Redis) -> list[object]:
            return list(await self._settle(keys=keys, args=args, client=client))

        return read_totals(await self.state.call(run), limits)

    async def status(
        self, key: str, limits: Sequence[KeyLimit], now: float, tz: dt.tzinfo
    ) -> list[LimitStatus]:
        """Every limit of `key` with its usage across instances (reservations included), as
        `KeyLimits.status` reports a process's own."""
        wins = windows(self.prefix, key, limits, now, tz)
        keys = [*reservation_keys(self.prefix, key), *_ledger_keys(wins)]
        args = [repr(now)]
        for lim, win in zip(limits, wins, strict=True):
            args += [*win.args(), _MEASURE[lim.measure], "1" if lim.cache_reads else "0"]

        async def run(client: Redis) -> list[tuple[int, int, str]]:
            rows = await self._status(keys=keys, args=args, client=client)
            return [(int(a), int(b), _text(c)) for a, b, c in rows]

        out = []
        for lim, win, row in zip(limits, wins, await self.state.call(run), strict=True):
            settled, reserved, oldest = row
            rolling_reset = float(oldest) if oldest else None
            out.append(
                LimitStatus(
                    limit=lim,
                    used=settled + reserved,
                    reserved=reserved,
                    reset=rolling_reset if win.rolling else win.end,
                    window_start=now - win.span if win.rolling else win.start,
                )
            )
        return out

    async def renew(self, now: float) -> None:
        """Push the expiry of every reservation this instance holds `reservation_secs` on."""
        if not self.held:
            return
        expires = int(now * 1000 + self.reservation_secs * 1000)
        held = list(self.held.items())
        ttl_ms = int(self.reservation_secs * 4000)

        async def run(client: Redis) -> None:
            async with client.pipeline(transaction=False) as pipe:
                for rid, key in held:
                    res, resv = reservation_keys(self.prefix, key)
                    pipe.zadd(res, {rid: expires}, xx=True)
                    pipe.pexpire(res, ttl_ms)
                    pipe.pexpire(resv, ttl_ms)
                await pipe.execute()

        await self.state.call(run)
