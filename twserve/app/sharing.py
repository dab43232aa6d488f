"""The shared state of one instance, wired to its gateway (``state.redis_url`` set).

`Sharing` builds the Redis connection and the shared parts over the gateway's own objects — key
limits (`UsageKeeper.shared`), upstream slots, pauses/affinity and health (listeners on
`RouterHooks`), load-balance turns and slot leases taken with a request's key limit in one round
trip (`RouterHooks.rides`), the effort memory and sealed-reasoning marks (listeners on
`ReasoningMemory`) — and runs their background work: the connection's jobs and reconnects,
renewing the reservations of requests in flight, the slot leases, the announcements channel and
the health reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio

from twengine.reasoning import ReasoningMemory
from twserve.relay.abort import Aborts
from twserve.relay.holds import RouterHooks
from twserve.shared.aborts import SharedAborts
from twserve.shared.admission import SharedAdmissions
from twserve.shared.health import SharedHealth
from twserve.shared.limits import SharedLimits
from twserve.shared.memory import SharedMemory
from twserve.shared.redis import RedisDown, RedisState
from twserve.shared.router import SharedRouter
from twserve.shared.slots import SharedSlots
from twserve.shared.turns import SharedTurns
from twserve.usage.keeper import UsageKeeper

__all__ = ["Sharing"]


class Sharing:
    """Redis-backed limits, slots, pauses, affinity, turns, health, aborts and reasoning
    memories for one instance."""

    def __init__(
        self,
        redis_url: str,
        hooks: RouterHooks,
        usage: UsageKeeper,
        *,
        aborts: Aborts | None = None,
        reasoning: ReasoningMemory | None = None,
        on_efforts_changed: Callable[[], None] = lambda: None,
        wall: Callable[[], float],
        clock: Callable[[], float],
        prefix: str = "twserve:",
        timeout: float = 1.0,
        retry_secs: float = 1.0,
    ) -> None:
        self.instance = uuid.uuid4().hex[:16]
        self.state = RedisState(redis_url, timeout=timeout, retry_secs=retry_secs, prefix=prefix)
        self.wall = wall
        self.limits = SharedLimits(self.state)
        usage.shared = self.limits
        self.slots = SharedSlots(self.state, hooks, instance=self.instance, clock=clock)
        self.router = SharedRouter(
            self.state, hooks, instance=self.instance, wall=wall, clock=clock
        )
        # Aborts of requests running on another instance (twserve.shared.aborts).
        self.aborts = SharedAborts(
            self.state, aborts if aborts is not None else Aborts(), instance=self.instance
        )
        self.router.handlers["abort"] = self.aborts.heard
        # Load-balance turns taken by the deployment (twserve.shared.turns).
        self.turns = SharedTurns(self.state, hooks.router)
        # A request's limit, turn and leases in one round trip (twserve.shared.admission).
        self.admissions = SharedAdmissions(self.state, self.turns, self.slots)
        hooks.rides = self.admissions
        # Failure runs, success rates and first-content samples (twserve.shared.health).
        self.health = SharedHealth(self.state, hooks, wall=wall, clock=clock)
        self.router.handlers["slots"] = self.slots.heard
        # The effort memory and sealed-reasoning marks (twserve.shared.memory).
        self.memory = SharedMemory(
            self.state,
            self.router,
            reasoning if reasoning is not None else ReasoningMemory(),
            instance=self.instance,
            wall=wall,
            clock=clock,
            on_efforts_changed=on_efforts_changed,
        )

    async def connect(self) -> bool:
        """Reach Redis once before serving; False: serving starts on in-process state."""
        return await self.state.connect()

    async def run(self) -> None:
        """The background work, until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.state.run)
                tg.start_soon(self.slots.run)
                tg.start_soon(self.router.listen)
                tg.start_soon(self.health.run)
                tg.start_soon(self._renew)
        finally:
            await self.state.aclose()

    async def _renew(self) -> None:
        every = self.limits.reservation_secs / 3
        while True:
            await anyio.sleep(every)
            if self.state.up:
                try:
                    await self.limits.renew(self.wall())
                except RedisDown:
                    pass
