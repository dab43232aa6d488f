"""A relayed request's inbox: what its readers, the slot grants and the deadline post to its loop.

A bounded queue with the behaviour of an anyio memory object stream as the relay uses one —
`send` waits while the inbox is full (a slow client slows the upstream read), `send_nowait`
raises `anyio.WouldBlock` when it is full, `receive_nowait` raises it when it is empty, and once
`close` has been called a send raises `anyio.BrokenResourceError` — without the pass through the
event loop anyio's stream takes before every ``send`` and ``receive``. The loop asks
`receive_nowait` first and waits only when nothing is there, and a reader posts without waiting
while there is room: the extra pass cost a task step each time, on both sides, several per
request. Waiting is on a plain asyncio future, so a cancel scope still cuts it short.

The relay and its readers run on one event loop (the asyncio backend, as everywhere in
twserve); the inbox is not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

import anyio

__all__ = ["Inbox"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """Up to `size` items waiting for the relay's loop (see the module docstring)."""

    __slots__ = ("_closed", "_getter", "_items", "_putters", "_size")

    def __init__(self, size: int) -> None:
        self._items: deque[T] = deque()
        self._size = size
        self._getter: asyncio.Future[None] | None = None  # the loop, waiting for an item
        self._putters: deque[asyncio.Future[None]] = deque()  # senders waiting for room
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
        item = self._items.popleft()
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
            room = self._putters.popleft()
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
            room = self._putters.popleft()
            if not room.done():
                room.set_result(None)
