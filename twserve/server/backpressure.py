"""Bounds on what one connection may make the gateway hold: read ahead, written and unread.

Two things anyio's asyncio socket stream does not bound on its own, for the connections the
gateway reads and writes at the same time (HTTP/2, the Responses WebSocket, Realtime):

* **Reading ahead.** The stream pauses its transport only after a ``receive`` that had to wait;
  a ``receive`` that finds bytes already queued leaves the transport reading. A client that
  sends faster than its connection's reader takes its bytes in (a flood of PINGs, each needing
  a write) therefore keeps the transport reading into the stream's queue without end: with
  uvloop's 256 KiB reads, gigabytes in seconds. `Intake.receive` pauses the transport after
  every read, so it reads again only when the reader asks for more and the queue is empty:
  at most one transport read waits, whatever the client sends.
* **Writing to a client that does not read.** `Outflow` sets the transport's high-water mark
  to a bound (`buffered`): a write returns while no more than that waits in the transport, and
  past it the writer waits (so does the reader, whose replies to control frames are writes:
  it stops reading while output beyond the bound waits). It also counts the replies owed to
  control frames (HTTP/2 PING and SETTINGS acknowledgements, WebSocket pongs) that the client
  has not taken off the socket yet; a client that keeps sending them without reading what
  they ask for is a flood, and `Outflow.flooded` tells the connection to end it, as HTTP/2
  servers do.

Over any other stream (another backend, TLS) there is no transport to work on: `Intake` reads
as anyio does, and every write waits until it is taken, as before. (The transport comes from
twserve/server/_anyio_fastpath.py.)
"""

from __future__ import annotations

from collections import deque

import anyio.abc

from twserve.server._anyio_fastpath import raw_transport

__all__ = ["Intake", "Outflow"]


class Intake:
    """Reads `stream` without letting its transport read further ahead than one read."""

    __slots__ = ("stream", "transport")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.transport = raw_transport(stream)
        # Whoever read the stream before (the HTTP/1.1 server, parsing the upgrade) may have
        # left the transport reading.
        self._pause()

    def _pause(self) -> None:
        transport = self.transport
        if transport is not None and transport.is_reading():
            transport.pause_reading()

    async def receive(self, max_bytes: int) -> bytes:
        data = await self.stream.receive(max_bytes)
        # anyio resumes reading when a receive finds the queue empty; until then, nothing more
        # is taken from the socket (the kernel's buffers, then TCP, hold the client back).
        self._pause()
        return data


class Outflow:
    """What waits to be written to one peer, and the control-frame replies it owes.

    Every write to the connection is reported (`wrote`); replies are counted as they are made
    (`owe`) and are paid once the write that carried them has left the transport's buffer for
    the kernel. `flooded` is true when more than `max_owed` are unpaid while output waits.
    """

    __slots__ = ("_batches", "_unpaid", "_written", "max_owed", "pending", "transport")

    def __init__(self, stream: anyio.abc.ByteStream, *, buffered: int, max_owed: int) -> None:
        self.transport = raw_transport(stream)
        self.max_owed = max_owed
        if self.transport is not None:
            # A write returns while at most `buffered` bytes wait (anyio's stream sets 0, so
            # every write waits for the kernel to take all of it).
            self.transport.set_write_buffer_limits(high=buffered)
        self.pending = 0  # replies made, not yet handed to a write
        self._written = 0  # bytes handed to the transport, in all
        self._batches: deque[tuple[int, int]] = deque()  # (end offset of their write, replies)
        self._unpaid = 0  # replies in `_batches`

    def owe(self, count: int) -> None:
        """`count` replies are made and will go with the next write."""
        self.pending += count

    def wrote(self, size: int) -> None:
        """`size` bytes were handed to the transport; the replies made so far went with them."""
        self._written += size
        if self.pending:
            self._batches.append((self._written, self.pending))
            self._unpaid += self.pending
            self.pending = 0

    def owed(self) -> int:
        """Replies made that the client has not taken off the socket yet."""
        transport = self.transport
        waiting = transport.get_write_buffer_size() if transport is not None else 0
        taken = self._written - waiting
        batches = self._batches
        while batches and batches[0][0] <= taken:
            self._unpaid -= batches.popleft()[1]
        return self.pending + self._unpaid

    def flooded(self) -> bool:
        """More than `max_owed` replies are unpaid while output waits for the client: it
        keeps asking for replies without reading them. (While nothing waits, the client takes
        all it is sent, however many replies that is.)"""
        transport = self.transport
        if transport is None or not transport.get_write_buffer_size():
            return False
        return self.owed() > self.max_owed
