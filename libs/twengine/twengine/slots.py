"""In-flight accounting and waiting queues for upstream slots and gateway keys.

Theory of operation
-------------------
Two kinds of capacity are counted here, in the same way:

* an **upstream slot** (``providers[].max_concurrent``): held by one attempt from the moment it
  is sent until its answer has been passed on in full or the client left;
* a **key permit** (``clients[].max_concurrent``): held by one request from its admission until
  it ends — a streamed answer counts until its stream ends.

A name without a limit has unlimited capacity; its in-flight count is still kept for views.

`Slots` is pure bookkeeping in the manner of httpcore's pool: it never waits. Waiting is a
`Ticket` — the names the request waits for and its deadline — kept in one FIFO queue per kind.
`release` frees a slot and returns the `Grant`\\ s it makes possible (at most one per freed
slot, to the oldest ticket that waits for that name); the caller wakes those requests. Because
grants happen the moment capacity appears, a free slot never coexists with a ticket waiting for
it, so `try_acquire` need not look at the queue to stay fair.

The deadline is the request's: ``arrival + wait_secs`` (``wait_secs`` 0 turns waiting off, so
a full candidate then means `Busy` at once). `expire` removes the tickets whose deadline has
come and returns them; `next_deadline` tells the caller when to call it.

Which upstream a request takes, skips because it is full, or waits for is not decided here but
by the attempt machine (`twengine.attempt`, docs/failover.md): it reads `full` as a snapshot and
asks, through `twengine.attempt.ledger`'s actions, for `try_acquire`, `wait` and `release`.

Releasing is idempotent (a stream's end and the client's disconnect may both release the same
permit); a permit released twice frees its slot once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = (
    "Grant",
    "Permit",
    "SlotScope",
    "Slots",
    "Ticket",
)


class SlotScope(StrEnum):
    UPSTREAM = "upstream"
    KEY = "key"


@dataclass(frozen=True, slots=True, kw_only=True)
class Permit:
    """One held slot (or key permit); give it back with `Slots.release`."""

    id: int
    scope: SlotScope
    name: str
    owner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """A request waiting for a slot on any of `names`, until `deadline`."""

    id: int
    scope: SlotScope
    names: tuple[str, ...]
    owner: str
    deadline: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A waiting ticket got its slot: the request holds `permit` now."""

    ticket: Ticket
    permit: Permit


class _Pool:
    """The limits, counts and queue of one scope."""

    __slots__ = ("in_flight", "limits", "outside", "queue")

    def __init__(self, limits: Mapping[str, int]) -> None:
        self.limits = _checked(limits)
        self.in_flight: dict[str, int] = {}
        # Slots held elsewhere (other instances sharing the limits), by name.
        self.outside: dict[str, int] = {}
        # Insertion order is arrival order: the queue is FIFO.
        self.queue: dict[int, Ticket] = {}

    def has_room(self, name: str) -> bool:
        limit = self.limits.get(name)
        return limit is None or self.in_flight.get(name, 0) + self.outside.get(name, 0) < limit


def _checked(limits: Mapping[str, int]) -> dict[str, int]:
    for name, limit in limits.items():
        if limit < 1:
            raise ValueError(f"the limit of {name!r} must be at least 1, not {limit}")
    return dict(limits)


class Slots:
    """Upstream slots and key permits in flight, and the requests waiting for them."""

    __slots__ = ("_held", "_next_id", "_pools")

    def __init__(
        self,
        *,
        upstream_limits: Mapping[str, int] | None = None,
        key_limits: Mapping[str, int] | None = None,
    ) -> None:
        self._pools = {
            SlotScope.UPSTREAM: _Pool(upstream_limits or {}),
            SlotScope.KEY: _Pool(key_limits or {}),
        }
        self._held: dict[int, Permit] = {}
        self._next_id = 1

    def _id(self) -> int:
        value, self._next_id = self._next_id, self._next_id + 1
        return value

    # -- limits and views ----------------------------------------------------------------

    def configure(
        self, *, upstream_limits: Mapping[str, int], key_limits: Mapping[str, int]
    ) -> list[Grant]:
        """Apply new limits (a reload). Held permits stay held; a limit below the number in
        flight lets none in until enough are released. Raised limits grant waiting tickets."""
        grants: list[Grant] = []
        for scope, limits in (
            (SlotScope.UPSTREAM, upstream_limits),
            (SlotScope.KEY, key_limits),
        ):
            pool = self._pools[scope]
            pool.limits = _checked(limits)
            waited_for = dict.fromkeys(name for t in pool.queue.values() for name in t.names)
            for name in waited_for:
                while (grant := self._grant_one(pool, name)) is not None:
                    grants.append(grant)
        return grants

    def set_outside(
        self, counts: Mapping[str, int], scope: SlotScope = SlotScope.UPSTREAM
    ) -> list[Grant]:
        """The slots of `scope` that other holders of the same limits (other instances) have in
        flight now, replacing the last counts given; names left out hold none elsewhere. A name
        with fewer held elsewhere than before grants waiting tickets the room that made."""
        pool = self._pools[scope]
        pool.outside = {name: n for name, n in counts.items() if n > 0}
        grants: list[Grant] = []
        waited_for = dict.fromkeys(name for t in pool.queue.values() for name in t.names)
        for name in waited_for:
            while (grant := self._grant_one(pool, name)) is not None:
                grants.append(grant)
        return grants

    def outside(self, name: str, scope: SlotScope = SlotScope.UPSTREAM) -> int:
        """The slots of `name` held elsewhere, as last given to `set_outside`."""
        return self._pools[scope].outside.get(name, 0)

    def limit(self, name: str, scope: SlotScope = SlotScope.UPSTREAM) -> int | None:
        return self._pools[scope].limits.get(name)

    def in_flight(self, name: str, scope: SlotScope = SlotScope.UPSTREAM) -> int:
        return self._pools[scope].in_flight.get(name, 0)

    def is_full(self, name: str, scope: SlotScope = SlotScope.UPSTREAM) -> bool:
        return not self._pools[scope].has_room(name)

    def full(self, names: Iterable[str], scope: SlotScope = SlotScope.UPSTREAM) -> set[str]:
        """The names among `names` without room now (they sit out of balancing)."""
        pool = self._pools[scope]
        return {name for name in names if not pool.has_room(name)}

    def waiting(self, scope: SlotScope = SlotScope.UPSTREAM) -> list[Ticket]:
        """The waiting tickets of `scope`, oldest first."""
        return list(self._pools[scope].queue.values())

    # -- acquiring -----------------------------------------------------------------------

    def try_acquire(
        self, name: str, *, owner: str, scope: SlotScope = SlotScope.UPSTREAM
    ) -> Permit | None:
        """A permit for `name` if it has room now, else None (nothing is queued)."""
        pool = self._pools[scope]
        if not pool.has_room(name):
            return None
        return self._take(pool, scope, name, owner)

    def _take(self, pool: _Pool, scope: SlotScope, name: str, owner: str) -> Permit:
        permit = Permit(id=self._id(), scope=scope, name=name, owner=owner)
        pool.in_flight[name] = pool.in_flight.get(name, 0) + 1
        self._held[permit.id] = permit
        return permit

    def wait(
        self,
        names: Sequence[str],
        *,
        owner: str,
        deadline: float,
        scope: SlotScope = SlotScope.UPSTREAM,
    ) -> Ticket:
        """Queue a request for the first slot to free on any of `names`.

        Call it only when all of `names` are full (`try_acquire` refused each); the ticket
        comes back in a `Grant` from `release`, or from `expire` once `deadline` has come.
        """
        if not names:
            raise ValueError("a ticket must wait for at least one name")
        pool = self._pools[scope]
        if any(pool.has_room(name) for name in names):
            raise ValueError("a name in the ticket has room: acquire it instead of waiting")
        ticket = Ticket(
            id=self._id(), scope=scope, names=tuple(names), owner=owner, deadline=deadline
        )
        pool.queue[ticket.id] = ticket
        return ticket

    # -- releasing and expiring ----------------------------------------------------------

    def release(self, permit: Permit) -> list[Grant]:
        """Give a permit back; returns the grant its freed slot made (if a ticket waited)."""
        if self._held.pop(permit.id, None) is None:
            return []
        pool = self._pools[permit.scope]
        count = pool.in_flight.get(permit.name, 0) - 1
        if count > 0:
            pool.in_flight[permit.name] = count
        else:
            pool.in_flight.pop(permit.name, None)
        grant = self._grant_one(pool, permit.name)
        return [] if grant is None else [grant]

    def _grant_one(self, pool: _Pool, name: str) -> Grant | None:
        if not pool.has_room(name):
            return None
        for ticket in pool.queue.values():
            if name in ticket.names:
                del pool.queue[ticket.id]
                permit = self._take(pool, ticket.scope, name, ticket.owner)
                return Grant(ticket=ticket, permit=permit)
        return None

    def cancel(self, ticket: Ticket) -> bool:
        """Stop waiting (the client left); False if the ticket was no longer queued."""
        return self._pools[ticket.scope].queue.pop(ticket.id, None) is not None

    def expire(self, now: float) -> list[Ticket]:
        """Remove and return the tickets whose deadline has come, oldest first."""
        expired: list[Ticket] = []
        for pool in self._pools.values():
            for ticket in list(pool.queue.values()):
                if ticket.deadline <= now:
                    del pool.queue[ticket.id]
                    expired.append(ticket)
        return sorted(expired, key=lambda ticket: ticket.id)

    def next_deadline(self) -> float | None:
        """The earliest deadline among waiting tickets, for the caller's timer."""
        deadlines = [t.deadline for pool in self._pools.values() for t in pool.queue.values()]
        return min(deadlines) if deadlines else None
