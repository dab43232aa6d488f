"""The gateway's shared decision state, and the hooks the relay uses to reach it.

twengine keeps the bookkeeping (health and pauses, slots, balancing, affinity) as plain objects
driven with explicit times. This module owns the one instance of each for the process, gives the
relay the narrow `RelayHooks` view of it, delivers slot grants to waiting requests, and logs
health changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

import anyio

from twengine.health import HealthChanged
from twengine.router import Router
from twengine.slots import Grant, Permit, SlotScope, Ticket
from twproto.failures import Failure

__all__ = ["EngineHooks"]

log = logging.getLogger("twserve.engine")


class EngineHooks:
    """`twserve.relay.RelayHooks` over the process's `Router`."""

    def __init__(
        self,
        router: Router,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.wall = wall
        self.clock = clock
        self._deliver: dict[int, Callable[[Permit], bool]] = {}
        self.listeners: list[Callable[[HealthChanged], None]] = []

    # -- slots ---------------------------------------------------------------------------------

    def free(self, names: Collection[str]) -> set[str]:
        slots = self.router.slots
        return {n for n in names if not slots.is_full(n)}

    def acquire(self, name: str, owner: str) -> Permit | None:
        return self.router.slots.try_acquire(name, owner=owner)

    def wait(
        self,
        names: tuple[str, ...],
        owner: str,
        deadline: float,
        deliver: Callable[[Permit], bool],
    ) -> Ticket:
        ticket = self.router.slots.wait(names, owner=owner, deadline=deadline)
        self._deliver[ticket.id] = deliver
        return ticket

    def cancel_wait(self, ticket: Ticket) -> None:
        self.router.slots.cancel(ticket)
        self._deliver.pop(ticket.id, None)

    def release(self, permit: Permit) -> None:
        self._hand_on(list(self.router.slots.release(permit)))

    def deliver_grant(self, grant: Grant) -> None:
        """A grant made outside a release (a reload raised a limit)."""
        self._hand_on([grant])

    def _hand_on(self, pending: list[Grant]) -> None:
        while pending:
            grant = pending.pop()
            deliver = self._deliver.pop(grant.ticket.id, None)
            if deliver is None or not deliver(grant.permit):
                # The waiter is gone: hand the slot straight on.
                pending.extend(self.router.slots.release(grant.permit))

    async def key_permit(self, key: str, owner: str, deadline: float) -> Permit | None:
        """A permit of gateway key `key` (``clients[].max_concurrent``), waiting in line until
        `deadline` if the key is at its limit; None when none freed in time."""
        slots = self.router.slots
        permit = slots.try_acquire(key, owner=owner, scope=SlotScope.KEY)
        if permit is not None or deadline <= self.clock():
            return permit
        ticket = slots.wait([key], owner=owner, deadline=deadline, scope=SlotScope.KEY)
        granted: list[Permit] = []
        arrived = anyio.Event()

        def deliver(p: Permit) -> bool:
            granted.append(p)
            arrived.set()
            return True

        self._deliver[ticket.id] = deliver
        try:
            with anyio.move_on_after(deadline - self.clock()):
                await arrived.wait()
        except BaseException:  # the client left while waiting
            if granted:
                self.release(granted[0])
            else:
                self.cancel_wait(ticket)
            raise
        if granted:
            return granted[0]
        self.cancel_wait(ticket)
        return None

    # -- health --------------------------------------------------------------------------------

    def paused(self, names: Collection[str], now: float) -> set[str]:
        return self.router.health.paused(names, now)

    def failed(self, provider: str, failure: Failure, now: float) -> None:
        self._publish(self.router.record_failure(provider, failure, now=now, wall_now=self.wall()))

    def succeeded(self, provider: str, now: float, first_content_secs: float | None) -> None:
        if first_content_secs is not None:
            self.router.record_first_content(provider, first_content_secs, now=now)
        self._publish(self.router.record_success(provider, now=now))

    def tick(self) -> float | None:
        """End the pauses that have run out; returns when the next one does."""
        self._publish(self.router.on_timer(self.clock()))
        return self.router.next_deadline()

    def _publish(self, changes: list[HealthChanged]) -> None:
        for change in changes:
            log.info("health: %s", change)
            for listener in self.listeners:
                listener(change)
