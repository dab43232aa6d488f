"""Upstream slots (``providers[].max_concurrent``) counted across instances.

Each instance holds its slots in its own `twengine.slots.Slots`, as without Redis, and every
`interval` seconds writes how many it has in flight per upstream to a hash of its own,
``<prefix>slots:<instance>``, which expires `lease_secs` after the last write: the lease. It
reads the others' hashes in the same round trip (the instances are the members of the sorted set
``<prefix>instances`` whose lease has not run out) and gives their sum to `Slots.set_outside`, so
a slot held anywhere counts against the limit here. An instance that dies stops renewing its
lease, and its slots come back to the others within `lease_secs`.

The count is as fresh as the last round: instances that start requests within the same
`interval` may together go over a limit for that long, by at most what they started meanwhile.
The limit is exact per instance, and across instances once every instance has synced.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from redis.asyncio import Redis

from twserve.relay.holds import RouterHooks
from twserve.shared.redis import RedisDown, RedisState

__all__ = ["SharedSlots"]


class SharedSlots:
    """This instance's slot lease and the others' counts (see the module docs)."""

    def __init__(
        self,
        state: RedisState,
        hooks: RouterHooks,
        *,
        instance: str,
        wall: Callable[[], float],
        interval: float = 0.2,
        lease_secs: float = 3.0,
    ) -> None:
        self.state = state
        self.hooks = hooks
        self.instance = instance
        self.wall = wall
        self.interval = interval
        self.lease_secs = lease_secs
        self.members = state.key("instances")

    def slot_key(self, instance: str) -> str:
        return self.state.key("slots", instance)

    def _limited(self) -> list[str]:
        return [p.name for p in self.hooks.router.config.providers if p.max_concurrent is not None]

    async def sync(self) -> None:
        """One round: write this instance's counts and lease, take the others' counts."""
        names = self._limited()
        slots = self.hooks.router.slots
        if not names:
            self._outside({})
            return
        mine = {name: slots.in_flight(name) for name in names}
        now_ms = int(self.wall() * 1000)
        lease_ms = int(self.lease_secs * 1000)

        async def run(client: Redis) -> dict[str, int]:
            async with client.pipeline(transaction=False) as pipe:
                pipe.delete(self.slot_key(self.instance))
                pipe.hset(self.slot_key(self.instance), mapping={n: c for n, c in mine.items()})
                pipe.pexpire(self.slot_key(self.instance), lease_ms)
                pipe.zadd(self.members, {self.instance: now_ms + lease_ms})
                pipe.zremrangebyscore(self.members, "-inf", now_ms)
                pipe.zrange(self.members, 0, -1)
                found = await pipe.execute()
            others = [m.decode() for m in found[-1] if m.decode() != self.instance]
            totals: dict[str, int] = {}
            if others:
                async with client.pipeline(transaction=False) as pipe:
                    for other in others:
                        pipe.hgetall(self.slot_key(other))
                    for held in await pipe.execute():
                        for name, count in held.items():
                            key = name.decode()
                            totals[key] = totals.get(key, 0) + int(count)
            return totals

        self._outside(await self.state.call(run))

    def _outside(self, counts: dict[str, int]) -> None:
        for grant in self.hooks.router.slots.set_outside(counts):
            self.hooks.deliver_grant(grant)

    async def run(self) -> None:
        """Sync every `interval` while Redis answers; count alone while it does not."""
        while True:
            if self.state.up:
                try:
                    await self.sync()
                except RedisDown:
                    self._outside({})
            else:
                self._outside({})
            await anyio.sleep(self.interval)
