"""The hooks the relay reaches the process's shared decision state through.

twengine keeps the bookkeeping (health and pauses, slots, balancing, affinity) as plain objects
driven with explicit times, all held by one `twengine.router.Router`. `RelayHooks` is the narrow
view a relayed request needs of it; `RouterHooks` implements it over the router, delivers slot
grants to waiting requests (handing a slot straight on when its waiter is gone), and logs
health changes. `SlotHolds` is one request's side: it carries out the attempt ledger's
bookkeeping verbs (slots, slot waits, health records) and holds the permits and the ticket they
leave it with, given back whatever happens.

`snapshot_of` and `grant_poster` are the two callbacks a relayed request hands out (to its
attempt feed and to its slot holds). They are closures over what they use, not methods of the
relay: a request's objects then form no reference cycle and are freed by reference counting the
moment it ends, instead of lingering (and being promoted through the generations) until Python's
cycle collector finds them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, assert_never

import anyio

from twengine.attempt import (
    AcquireSlot,
    CancelWait,
    RecordFailure,
    RecordSuccess,
    ReleaseSlot,
    WaitForSlot,
)
from twengine.health import PauseChanged
from twengine.router import Router
from twengine.slots import Grant, Permit, SlotScope, Ticket
from twproto.failures import Failure
from twproto.ir import Usage

if TYPE_CHECKING:  # opentelemetry is imported only when traces are on
    from twserve.observe.traces import Tracing
    from twserve.shared.admission import SharedAdmissions

__all__ = [
    "Bookkeeping",
    "Granted",
    "RelayHooks",
    "RouterHooks",
    "SlotHolds",
    "grant_poster",
    "snapshot_of",
]

#: The attempt ledger's verbs that only touch the shared state: slots, waits, health records.
Bookkeeping = AcquireSlot | ReleaseSlot | WaitForSlot | CancelWait | RecordFailure | RecordSuccess

log = logging.getLogger("twserve.relay.holds")


class RelayHooks(Protocol):
    """What the relay needs from the gateway's shared state (slots, health), and its tracer
    when traces are on."""

    tracing: Tracing | None

    def free(self, names: Collection[str]) -> set[str]: ...

    def paused(self, names: Collection[str], now: float) -> set[str]: ...

    def acquire(self, name: str, owner: str) -> Permit | None: ...

    def wait(
        self, names: tuple[str, ...], owner: str, deadline: float, deliver: Callable[[Permit], bool]
    ) -> Ticket: ...

    def cancel_wait(self, ticket: Ticket) -> None: ...

    def release(self, permit: Permit) -> None: ...

    def failed(
        self,
        provider: str,
        failure: Failure,
        now: float,
        first_content_secs: float | None = None,
    ) -> None: ...

    def succeeded(self, provider: str, now: float, first_content_secs: float | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Granted:
    """A slot grant, as posted to the waiting request's inbox."""

    permit: Permit


def grant_poster(post: Callable[[Granted], None]) -> Callable[[Permit], bool]:
    """`SlotHolds`'s ``deliver``: post the grant with `post` (an inbox's ``send_nowait``);
    False when the inbox is full or closed (the grant then goes to the next waiter)."""

    def deliver(permit: Permit) -> bool:
        try:
            post(Granted(permit))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    return deliver


def snapshot_of(hooks: RelayHooks, names: list[str]) -> Callable[[float], dict[str, set[str]]]:
    """The attempt ledger's view of `names` at a time: which have a free slot, which are
    paused (the ``free`` and ``paused`` arguments of its inputs)."""

    def snapshot(now: float) -> dict[str, set[str]]:
        return {"free": hooks.free(names), "paused": hooks.paused(names, now)}

    return snapshot


class SlotHolds:
    """The slots one request holds and the slot it waits for, by upstream name.

    `book` carries out the attempt ledger's bookkeeping verbs (`Bookkeeping`); a grant arrives
    through `granted` (`deliver` posts it to the request, and says whether it was taken).
    `close` gives back everything still held, including a grant that was delivered but never
    used.
    """

    def __init__(
        self,
        hooks: RelayHooks,
        owner: str,
        *,
        deliver: Callable[[Permit], bool],
        clock: Callable[[], float],
    ) -> None:
        self.hooks = hooks
        self.owner = owner
        self.deliver = deliver
        self.clock = clock
        self.permits: dict[str, list[Permit]] = {}
        self.ticket: Ticket | None = None

    def book(self, action: Bookkeeping) -> None:
        """Carry out one bookkeeping verb through the hooks."""
        match action:
            case AcquireSlot(provider=provider):
                self.acquire(provider)
            case ReleaseSlot(provider=provider):
                self.release(provider)
            case WaitForSlot(providers=providers, until=until):
                self.wait(providers, until)
            case CancelWait():
                self.cancel_wait()
            case RecordFailure(provider=provider, failure=failure, first_content_secs=secs):
                self.hooks.failed(provider, failure, self.clock(), secs)
            case RecordSuccess(provider=provider, first_content_secs=secs):
                self.hooks.succeeded(provider, self.clock(), secs)
            case _:
                assert_never(action)

    def acquire(self, name: str) -> None:
        permit = self.hooks.acquire(name, self.owner)
        if permit is not None:
            self.permits.setdefault(name, []).append(permit)

    def granted(self, permit: Permit) -> None:
        self.ticket = None
        self.permits.setdefault(permit.name, []).append(permit)

    def release(self, name: str) -> None:
        held = self.permits.get(name)
        if held:
            self.hooks.release(held.pop())

    def wait(self, names: tuple[str, ...], deadline: float) -> None:
        self.ticket = self.hooks.wait(names, self.owner, deadline, self.deliver)

    def cancel_wait(self) -> None:
        if self.ticket is not None:
            self.hooks.cancel_wait(self.ticket)
            self.ticket = None

    def close(self) -> None:
        self.cancel_wait()
        for held in self.permits.values():
            for permit in held:
                self.hooks.release(permit)
        self.permits.clear()


class RouterHooks:
    """`RelayHooks` over the process's `Router`."""

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
        self.listeners: list[Callable[[PauseChanged], None]] = []
        # Told (conversation, upstream, cached tokens) whenever a conversation got its answer.
        self.answer_listeners: list[Callable[[str, str, int], None]] = []
        # Told (upstream, time, failure or None for a success, first-content seconds) of every
        # outcome reported for an upstream (shared health: twserve.shared.health).
        self.outcome_listeners: list[
            Callable[[str, float, Failure | None, float | None], None]
        ] = []
        # Load-balance turns and slot leases taken by the deployment with a request's key
        # limit, in one round trip (twserve.shared.admission), set by the app with
        # state.redis_url.
        self.rides: SharedAdmissions | None = None
        # OpenTelemetry traces (twserve.observe.traces), set by the app when they are on.
        self.tracing: Tracing | None = None
        # With slots shared across instances (twserve.shared.slots): awaited with a request's
        # candidates and owner before it runs (`ready`), and told the owner of every slot taken,
        # given back, waited for or no longer waited for.
        self.slot_gate: Callable[[Collection[str], str], Awaitable[None]] | None = None
        self.slot_listeners: list[Callable[[str], None]] = []

    # -- slots ---------------------------------------------------------------------------------

    def free(self, names: Collection[str]) -> set[str]:
        slots = self.router.slots
        return {n for n in names if not slots.is_full(n)}

    async def ready(self, names: Collection[str], owner: str) -> None:
        """Before `owner` runs on `names`: what the shared slots need (nothing without them)."""
        if self.slot_gate is not None:
            await self.slot_gate(names, owner)

    def _slot_changed(self, owner: str) -> None:
        for listener in self.slot_listeners:
            listener(owner)

    def acquire(self, name: str, owner: str) -> Permit | None:
        permit = self.router.slots.try_acquire(name, owner=owner)
        self._slot_changed(owner)
        return permit

    def wait(
        self,
        names: tuple[str, ...],
        owner: str,
        deadline: float,
        deliver: Callable[[Permit], bool],
    ) -> Ticket:
        ticket = self.router.slots.wait(names, owner=owner, deadline=deadline)
        self._deliver[ticket.id] = deliver
        self._slot_changed(owner)
        return ticket

    def cancel_wait(self, ticket: Ticket) -> None:
        self.router.slots.cancel(ticket)
        self._deliver.pop(ticket.id, None)
        self._slot_changed(ticket.owner)

    def release(self, permit: Permit) -> None:
        self._hand_on(list(self.router.slots.release(permit)))
        self._slot_changed(permit.owner)

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

    def record_answer(
        self, conversation: str | None, provider: str | None, usage: Usage | None
    ) -> None:
        """A conversation's answer from `provider`: what its cache holds now (affinity)."""
        if conversation and provider and usage is not None:
            cached = (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
            self.router.record_answer(
                conversation, provider, cached_tokens=cached, now=self.clock()
            )
            for listener in self.answer_listeners:
                listener(conversation, provider, cached)

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

    def failed(
        self,
        provider: str,
        failure: Failure,
        now: float,
        first_content_secs: float | None = None,
    ) -> None:
        # A silent stream's idle timeout: its whole wait is its first-content sample too.
        if first_content_secs is not None:
            self.router.record_first_content(provider, first_content_secs, now=now)
        self.publish(self.router.record_failure(provider, failure, now=now, wall_now=self.wall()))
        for listener in self.outcome_listeners:
            listener(provider, now, failure, first_content_secs)

    def succeeded(self, provider: str, now: float, first_content_secs: float | None) -> None:
        if first_content_secs is not None:
            self.router.record_first_content(provider, first_content_secs, now=now)
        self.publish(self.router.record_success(provider, now=now))
        for listener in self.outcome_listeners:
            listener(provider, now, None, first_content_secs)

    def tick(self) -> float | None:
        """End the pauses that have run out; returns when the next one does."""
        self.publish(self.router.on_timer(self.clock()))
        return self.router.next_deadline()

    def publish(self, changes: list[PauseChanged]) -> None:
        for change in changes:
            # The log's line is the observation log's, from the HealthChanged event.
            log.debug("health: %s", change)
            for listener in self.listeners:
                listener(change)
