"""Upstream slots (``providers[].max_concurrent``) exact across instances.

*Slot leases.* The slots of an upstream with ``max_concurrent`` are leases in one sorted set per
upstream, ``<prefix>{slots:<upstream>}`` (the braces keep each upstream's key on one Cluster hash
slot), each member a lease id scored by its expiry on the Redis server's clock. `ACQUIRE` drops the
expired leases and adds as many new ones as the limit leaves room for, in one atomic step: the set
never holds more live leases than the limit, whichever instances race for them. An instance sends
to an upstream only under a lease it holds: its own `twengine.slots.Slots` is told that all slots
but its leases are held elsewhere (`Slots.set_outside`), so its requests take, wait for and give
back slots exactly as on one instance — the same FIFO queue, the same ``failover.wait_secs``
bound, the same 429 + Retry-After when it is reached — only within the leases it holds.

*Taking and giving back.* A request about to run takes a lease for each of its candidates with
``max_concurrent`` where the instance holds none spare (`claim` says which): in the round trip of
its key limit's check once that admits it, on one server (twserve.shared.admission), else in one
of their own (`ready`: the scripts pipelined; one after another on a Cluster); none for upstreams
without a limit or with a spare lease. The lease is set aside for that request (`CLAIM_SECS`) so
another task of the instance cannot give it back before the request takes its slot. A slot given
back here goes to the instance's next waiter first; a lease no request holds, waits for or has set
aside goes back to Redis (`RELEASE`, one round trip, in the background), which announces it on
the events channel. Instances with waiters then try to take it (and every `POLL_SECS` while they
wait, in case an announcement was missed): a waiter elsewhere gets the slot the moment it is
free, though not in global arrival order — each instance serves its own queue first.

*Expiry.* Leases last `LEASE_SECS` and are renewed in one batch per instance every third of
that, so a stream of any length keeps its lease while its instance lives; a dead (or stalled)
instance's leases lapse within `LEASE_SECS` and its slots come back to the others. A lease found
lapsed at renewal is dropped here (the instance then counts fewer leases than requests in flight
until enough end: the limit can be passed only by an instance stalled longer than the lease).

*Redis lost.* Leases are forgotten (they lapse in Redis on their own) and every instance counts
its slots alone against the full limit, as without Redis; once Redis is back, each takes leases
for what it has in flight, and until those fit the limit none of them starts more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import anyio
from redis.asyncio import Redis

from twproto import json_dumps
from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisDown, RedisState, ScriptCall, run_scripts

__all__ = ["ACQUIRE", "CLAIM_SECS", "LEASE_SECS", "POLL_SECS", "RELEASE", "RENEW", "SharedSlots"]

log = logging.getLogger("twserve.shared")

#: How long a slot lease lasts unless renewed (renewed every third of it).
LEASE_SECS = 5.0
#: How long a lease taken for a request about to run is kept for it.
CLAIM_SECS = 2.0
#: How often an instance with waiters tries again, announcements or not.
POLL_SECS = 0.1

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: KEYS: the upstream's lease set. ARGV: the limit, how many leases wanted, the lease in ms, the
#: lease ids' prefix, the first id's number. Returns the ids of the leases taken.
ACQUIRE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = math.min(tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1]), tonumber(ARGV[2]))
local got = {}
for i = 1, n do
  local id = ARGV[4] .. (tonumber(ARGV[5]) + i - 1)
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
  got[i] = id
end
if n > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return got
"""
)

#: KEYS: the lease set. ARGV: the channel, the announcement, then the ids given back.
RELEASE = """
local n = 0
for i = 3, #ARGV do n = n + redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
"""

#: KEYS: the lease set. ARGV: the lease in ms, then the ids held. Returns the ids found lapsed.
RENEW = (
    _NOW
    + """
local lost = {}
for i = 2, #ARGV do
  local expiry = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
    lost[#lost + 1] = ARGV[i]
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return lost
"""
)


class SharedSlots:
    """This instance's slot leases, taken and given back as its requests need them (module
    docs)."""

    def __init__(
        self,
        state: RedisState,
        hooks: RouterHooks,
        *,
        instance: str,
        clock: Callable[[], float],
        lease_secs: float = LEASE_SECS,
        claim_secs: float = CLAIM_SECS,
        poll_secs: float = POLL_SECS,
    ) -> None:
        self.state = state
        self.hooks = hooks
        self.instance = instance
        self.clock = clock
        self.lease_secs = lease_secs
        self.claim_secs = claim_secs
        self.poll_secs = poll_secs
        self.channel = state.channel("events")
        # Lease ids held, by upstream; leases set aside for requests about to run (owner → end).
        self.leases: dict[str, list[str]] = {}
        self.claims: dict[str, dict[str, float]] = {}
        self._seq = 0
        # Set when the leases may need changing (created on the event loop, in `run`).
        self._dirty: anyio.Event | None = None
        self._acquire = state.script(ACQUIRE)
        self._release = state.script(RELEASE)
        self._renew = state.script(RENEW)
        hooks.slot_gate = self.ready
        hooks.slot_listeners.append(self.changed)
        state.listeners.append(self._redis_changed)

    def lease_key(self, upstream: str) -> str:
        return f"{self.state.prefix}{{slots:{upstream}}}"

    def _limited(self) -> dict[str, int]:
        return {
            p.name: p.max_concurrent
            for p in self.hooks.router.config.providers
            if p.max_concurrent is not None
        }

    # -- what this instance's requests need -----------------------------------------------------

    def _claimed(self, name: str, now: float) -> int:
        claims = self.claims.get(name)
        if not claims:
            return 0
        for owner in [o for o, end in claims.items() if end <= now]:
            del claims[owner]
        return len(claims)

    def wanted(self, name: str, now: float) -> int:
        """The leases `name` needs here: slots in flight, requests waiting, leases set aside."""
        slots = self.hooks.router.slots
        waiting = sum(1 for t in slots.waiting() if name in t.names)
        return slots.in_flight(name) + waiting + self._claimed(name, now)

    def changed(self, owner: str) -> None:
        """A `RouterHooks` slot listener: a request took, gave back or waits for a slot."""
        for claims in self.claims.values():
            claims.pop(owner, None)
        self._wake()

    def heard(self, note: dict[str, object]) -> None:
        """A ``slots`` announcement: another instance gave a lease back."""
        if any(str(note.get("upstream")) in t.names for t in self.hooks.router.slots.waiting()):
            self._wake()

    def _wake(self) -> None:
        if self._dirty is not None:
            self._dirty.set()

    async def ready(self, names: Collection[str], owner: str) -> None:
        """Before a request runs: a lease for each of `names` with a limit where none is spare
        here, set aside for `owner` (one round trip for them all; none when all have one)."""
        if not self.state.up:
            return
        need = self.claim(names, owner)
        if need:
            try:
                await self._take({name: 1 for name in need})
            except RedisDown:
                return

    def claim(self, names: Collection[str], owner: str) -> list[str]:
        """Set a lease of each of `names` with a limit aside for `owner`; the names where none
        is spare here, which need one taken (`acquire_calls`, then `took`)."""
        limits = self._limited()
        if not any(name in limits for name in names):
            return []
        # The limits in force now (a reload may have changed them since the last round).
        self._apply()
        now = self.clock()
        slots = self.hooks.router.slots
        need = []
        for name in dict.fromkeys(names):
            if name not in limits:
                continue
            spare = len(self.leases.get(name, ())) - self.wanted(name, now)
            self.claims.setdefault(name, {})[owner] = now + self.claim_secs
            if spare <= 0 and slots.in_flight(name) < limits[name]:
                need.append(name)
        return need

    def acquire_calls(self, counts: dict[str, int]) -> list[tuple[list[str], list[str | int]]]:
        """`ACQUIRE`'s keys and arguments for `counts` more leases of each upstream, in order."""
        limits = self._limited()
        lease_ms = int(self.lease_secs * 1000)
        prefix = f"{self.instance}:"
        calls: list[tuple[list[str], list[str | int]]] = []
        for name, n in counts.items():
            start, self._seq = self._seq, self._seq + n
            calls.append(
                ([self.lease_key(name)], [limits.get(name, 0), n, lease_ms, prefix, start])
            )
        return calls

    def took(self, names: Collection[str], found: list[list[bytes]]) -> None:
        """The leases `ACQUIRE` answered with (`found`, per name in order) are held here."""
        for name, got in zip(names, found, strict=True):
            if got:
                self.leases.setdefault(name, []).extend(g.decode() for g in got)
        self._apply()

    # -- Redis ----------------------------------------------------------------------------------

    async def _take(self, counts: dict[str, int]) -> None:
        asks = self.acquire_calls(counts)

        async def run(client: Redis) -> list[list[bytes]]:
            calls: list[ScriptCall] = [(self._acquire, keys, args) for keys, args in asks]
            return await run_scripts(client, calls)

        self.took(list(counts), await self.state.call(run))

    async def _give_back(self, counts: dict[str, int]) -> None:
        ids = {}
        for name, n in counts.items():
            held = self.leases.get(name, [])
            ids[name], self.leases[name] = held[-n:], held[:-n]
        self._apply()

        async def run(client: Redis) -> None:
            calls: list[ScriptCall] = []
            for name, given in ids.items():
                note = json_dumps({"kind": "slots", "from": self.instance, "upstream": name})
                calls.append((self._release, [self.lease_key(name)], [self.channel, note, *given]))
            await run_scripts(client, calls)

        await self.state.call(run)

    async def renew(self) -> None:
        """Renew every lease held, in one round trip; drop the ones found lapsed."""
        held = {name: list(ids) for name, ids in self.leases.items() if ids}
        if not held:
            return
        lease_ms = int(self.lease_secs * 1000)

        async def run(client: Redis) -> list[list[bytes]]:
            calls: list[ScriptCall] = [
                (self._renew, [self.lease_key(name)], [lease_ms, *ids])
                for name, ids in held.items()
            ]
            return await run_scripts(client, calls)

        for name, lost in zip(held, await self.state.call(run), strict=True):
            if lost:
                gone = {x.decode() for x in lost}
                log.warning("shared slots: %d lease(s) of %s had lapsed", len(gone), name)
                self.leases[name] = [i for i in self.leases.get(name, []) if i not in gone]
        self._apply()

    async def reconcile(self) -> bool:
        """Take the leases the requests here need, give back the ones they do not; whether a
        request still waits for a lease it could not get."""
        limits = self._limited()
        now = self.clock()
        take: dict[str, int] = {}
        give: dict[str, int] = {}
        for name in set(limits) | set(self.leases):
            held = len(self.leases.get(name, ()))
            want = min(self.wanted(name, now), limits.get(name, 0))
            if want > held:
                take[name] = want - held
            elif held > want:
                give[name] = held - want
        if give:
            await self._give_back(give)
        if take:
            await self._take(take)
        self._apply()
        return any(
            len(self.leases.get(name, ())) < min(self.wanted(name, now), limits[name])
            for name in take
        )

    def _apply(self) -> None:
        """Tell this instance's `Slots` that the slots it holds no lease for are held elsewhere
        (none while Redis is lost: each instance then counts alone)."""
        outside: dict[str, int] = {}
        if self.state.up:
            for name, limit in self._limited().items():
                outside[name] = max(0, limit - len(self.leases.get(name, ())))
        for grant in self.hooks.router.slots.set_outside(outside):
            self.hooks.deliver_grant(grant)

    def _redis_changed(self, up: bool, detail: str) -> None:
        if not up:
            self.leases.clear()
            self.claims.clear()
            self._apply()
        self._wake()

    async def run(self) -> None:
        """Keep the leases in line with the requests, and renewed; until cancelled."""
        renew_every = self.lease_secs / 3
        renew_at = self.clock() + renew_every
        self._dirty = anyio.Event()
        while True:
            short = False
            if self.state.up:
                try:
                    short = await self.reconcile()
                    if self.clock() >= renew_at:
                        renew_at = self.clock() + renew_every
                        await self.renew()
                except RedisDown:
                    self._apply()
            else:
                self._apply()
            wait = min(renew_at - self.clock(), self.claim_secs)
            if short:
                wait = min(wait, self.poll_secs)
            dirty = self._dirty
            with anyio.move_on_after(max(wait, 0.0)):
                await dirty.wait()
            self._dirty = anyio.Event()
