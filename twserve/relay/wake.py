"""The relay loop's wait for the attempt ledger's deadline, with no cancel scope per wait.

The relay's loop takes one inbox item at a time, or wakes at the ledger's `next_deadline()`.
A deadline scope around each wait cost more than the item it waited for. `DeadlineWake`
instead keeps one event-loop timer for the deadline, armed again only when the deadline
changes; when it fires it sets `due` and posts `WAKE` into the inbox, so a loop waiting on the
inbox wakes up. The loop asks `due` before it takes an item: a deadline that has passed comes
first, as it did when the wait was cut short by its scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio

__all__ = ["WAKE", "DeadlineWake", "Receiving", "Wake", "next_item"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Receiving(Protocol[T_co]):
    """An inbox as `next_item` takes from it (twserve.relay.inbox.Inbox)."""

    def receive_nowait(self) -> T_co: ...

    async def receive(self) -> T_co: ...


class Wake:
    """The inbox item that wakes the loop at the deadline (it carries nothing)."""

    __slots__ = ()


WAKE = Wake()


class DeadlineWake:
    """A timer at the ledger's deadline (`clock`'s time) that calls `post(WAKE)` when due
    (`post`: the inbox's ``send_nowait``)."""

    __slots__ = ("_armed", "_clock", "_handle", "_post", "due")

    _UNSET = float("nan")

    def __init__(self, post: Callable[[Wake], None], clock: Callable[[], float]) -> None:
        self._post = post
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._armed: float | None = self._UNSET  # the deadline the timer is set for
        self.due = False

    def set(self, deadline: float | None) -> None:
        """Wake at `deadline` (None: never). Unchanged, the timer already set stays."""
        if deadline == self._armed:
            return
        self.cancel()
        self._armed = deadline
        if deadline is None:
            return
        delay = deadline - self._clock()
        if delay <= 0:
            self.due = True
        else:
            self._handle = asyncio.get_running_loop().call_later(delay, self._fire)

    def taken(self) -> None:
        """The loop has acted on the deadline: the next `set` arms the timer afresh."""
        self.cancel()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed = self._UNSET
        self.due = False

    def _fire(self) -> None:
        self._handle = None
        self.due = True
        try:
            self._post(WAKE)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the inbox is full (the loop sees `due` before its next item) or closed


async def next_item(
    inbox: Receiving[T | Wake],
    wake: DeadlineWake,
    next_deadline: Callable[[], float | None],
) -> T | None:
    """The next item of `inbox`, or None once the deadline has come (it goes first). An item
    already waiting is taken without a pass through the event loop."""
    while True:
        wake.set(next_deadline())
        if wake.due:
            wake.taken()
            return None
        try:
            item = inbox.receive_nowait()
        except anyio.WouldBlock:
            item = await inbox.receive()
        if not isinstance(item, Wake):
            return item
