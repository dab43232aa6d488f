"""What a relayed request's loop waits on: its inbox, or the attempt ledger's deadline.

**The inbox** (`Inbox`) is what the request's readers, the slot grants and the deadline post to
its loop. A bounded queue with the behaviour of an anyio memory object stream as the relay uses
one — `send` waits while the inbox is full (a slow client slows the upstream read),
`send_nowait` raises `anyio.WouldBlock` when it is full, `receive_nowait` raises it when it is
empty, and once `close` has been called a send raises `anyio.BrokenResourceError` — without the
pass through the event loop anyio's stream takes before every ``send`` and ``receive``. The loop
asks `receive_nowait` first and waits only when nothing is there, and a reader posts without
waiting while there is room: the extra pass cost a task step each time, on both sides, several
per request. Waiting is on a plain asyncio future, so a cancel scope still cuts it short.

**The deadline** (`DeadlineWake`). The loop takes one inbox item at a time, or wakes at the
ledger's `next_deadline()`. A deadline scope around each wait cost more than the item it waited
for. `DeadlineWake` instead keeps one event-loop timer for the deadline, armed again only when
the deadline changes; when it fires it sets `due` and posts `WAKE` into the inbox, so a loop
waiting on the inbox wakes up. `next_item` asks `due` before it takes an item: a deadline that
has passed comes first, as it did when the wait was cut short by its scope.

The relay and its readers run on one event loop (the asyncio backend, as everywhere in
twserve); neither is thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import anyio

__all__ = ["WAKE", "DeadlineWake", "Inbox", "Receiving", "Wake", "next_item"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """Up to `size` items waiting for the relay's loop (see the module docstring)."""

    __slots__ = ("_closed", "_getter", "_items", "_putters", "_size")

    def __init__(self, size: int) -> None:
        # Lists, not deques: an inbox holds an item or two at a time, and an empty deque is 760
        # bytes against a list's 56, for every stream in flight.
        self._items: list[T] = []
        self._size = size
        self._getter: asyncio.Future[None] | None = None  # the loop, waiting for an item
        self._putters: list[asyncio.Future[None]] = []  # senders waiting for room
        self._closed = False

    def send_nowait(self, item: T) -> None:
        """Queue `item`; `anyio.WouldBlock` when full, `anyio.BrokenResourceError` when
        closed."""
        if self._closed:
            raise anyio.BrokenResourceError
        if len(self._items) >= self._size:
            raise anyio.WouldBlock
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def send(self, item: T) -> None:
        """Queue `item`, waiting while the inbox is full."""
        while True:
            try:
                self.send_nowait(item)
                return
            except anyio.WouldBlock:
                room = asyncio.get_running_loop().create_future()
                self._putters.append(room)
                try:
                    await room
                except BaseException:
                    if room.done() and not room.cancelled():
                        self._wake_putter()  # cancelled as room was made: the next one has it
                    raise

    def receive_nowait(self) -> T:
        """The oldest item; `anyio.WouldBlock` when there is none."""
        if not self._items:
            raise anyio.WouldBlock
        item = self._items.pop(0)
        self._wake_putter()
        return item

    async def receive(self) -> T:
        """The oldest item, waiting for one (`anyio.EndOfStream` once closed)."""
        while not self._items:
            if self._closed:
                raise anyio.EndOfStream
            got = self._getter = asyncio.get_running_loop().create_future()
            try:
                await got
            finally:
                self._getter = None
        return self.receive_nowait()

    def _wake_putter(self) -> None:
        while self._putters:
            room = self._putters.pop(0)
            if not room.done():  # a cancelled wait is done too: skipped
                room.set_result(None)
                return

    def close(self) -> None:
        """No more sends; a sender waiting for room gets `anyio.BrokenResourceError`, a
        receiver waiting for an item `anyio.EndOfStream`."""
        self._closed = True
        self._items.clear()
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)
        while self._putters:
            room = self._putters.pop(0)
            if not room.done():
                room.set_result(None)


T_co = TypeVar("T_co", covariant=True)


class Receiving(Protocol[T_co]):
    """An inbox as `next_item` takes from it (`Inbox`)."""

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
            self._handle = asyncio.get_running_loop().call_later(delay, self.fire)

    def taken(self) -> None:
        """The loop has acted on the deadline: the next `set` arms the timer afresh."""
        self.cancel()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed = self._UNSET
        self.due = False

    def fire(self) -> None:
        """The deadline has come (the timer's call; also a reader's failure, which the loop
        must see at once: twserve.relay.loop)."""
        if self._handle is not None:
            self._handle.cancel()  # a no-op for the timer that is calling
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
