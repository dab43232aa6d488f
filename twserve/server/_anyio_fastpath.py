"""The one module allowed under anyio's and h11's private names: the client write path's fast lane.

Every reach below a public API that the transports make is here, each with its fallback:

* **The transport under anyio's socket stream.** anyio's asyncio `SocketStream` keeps the event
  loop's transport and anyio's protocol in ``_transport`` and ``_protocol``. `raw_socket` hands
  them out, for anyio's asyncio stream only (another backend, TLS: None, and the connection
  goes through ``send`` and ``receive`` as anyio's API has it). With them, HTTP/1.1 writes a
  handler's pieces to the transport once per loop turn (twserve/server/h1_output.py), and the
  connections read and write in step (twserve/server/backpressure.py).
* **Watching a client without a task.** While a handler runs, something must keep reading the
  client's socket: end of file or a reset means the client has gone, and its handler (with the
  upstream call it makes) is cancelled. A reader task per request did that, at the cost of a
  task group, a task and a cancel scope per read: more than the rest of a short request's own
  bookkeeping. `ClientWatch` does it from the transport's callbacks instead, standing between
  the transport and anyio's protocol for the connection's whole life and handing every callback
  on unchanged, so anyio's stream (and whoever the connection is handed to: HTTP/2, a
  WebSocket) reads and writes as before. It reads anyio's protocol (``read_queue``,
  ``is_at_eof``, ``exception``, ``write_event``), and keeps what a writer needs to know
  (`ClientWatch.paused`, `ClientWatch.failed`) in fields of its own.
* **anyio's own cancellation checkpoint.** A write that does not wait still stops a cancelled
  handler, as anyio's ``send`` does; the asyncio backend's check is called directly (the
  transport is that backend's), not through the backend lookup of the public one.
* **anyio's clock and cancel scopes.** ``anyio.current_time()`` and ``anyio.CancelScope()``
  look the running backend up (sniffio, a context variable) on every call: a connection asks
  for the time and a new scope several times per request. `current_time` and `cancel_scope`
  are the asyncio backend's own, called directly, as the checkpoint is.
* **A lighter protocol under the client's stream.** anyio's protocol for a socket stream holds
  two events (``asyncio.Event``) and a read queue, each with an empty ``deque`` of 0.6–0.7 KiB:
  2.2 KiB of a connection's heap before it has read a byte. `accepted_stream` makes anyio's own
  socket stream over anyio's protocol with those three made of lists (`LeanProtocol`, `Flag`,
  `ReadQueue`: what anyio's stream asks of them, no more), and without the public wrapper's
  check that an accepted socket is connected (a system call). Without anyio's asyncio stream
  where it was, the socket goes through ``anyio.abc.SocketStream.from_socket``.
* **h11's body writer.** Whether h11 frames the answer it was just given in chunked transfer
  coding (`frames_in_chunks`): h11 then is asked for nothing more until the answer's end, and
  each piece is framed by the connection.

The speed each buys is measured (docs/benchmarks.md). A release of anyio or h11 that renames
one of them switches its fast lane off, not the server: the fallbacks stay correct. It would be
slower without a word, so tests/twserve/server/test_anyio_fastpath.py asserts, on a real
loopback connection, that every lane is taken.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio.abc
import anyio.lowlevel
import h11

__all__ = [
    "FAST_CHECKPOINT",
    "ClientWatch",
    "Flag",
    "ReadQueue",
    "accepted_stream",
    "cancel_scope",
    "checkpoint_if_cancelled",
    "current_time",
    "frames_in_chunks",
    "raw_socket",
    "raw_transport",
    "stream_over",
]

try:
    from anyio._backends._asyncio import AsyncIOBackend
    from anyio._backends._asyncio import SocketStream as _AsyncioSocketStream
    from anyio._backends._asyncio import StreamProtocol as _StreamProtocol
except ImportError:  # anyio moved its backend: every lane below falls back
    checkpoint_if_cancelled: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint_if_cancelled
    current_time: Callable[[], float] = anyio.current_time
    cancel_scope: Callable[..., anyio.CancelScope] = anyio.CancelScope
    FAST_CHECKPOINT = False
    _STREAM_TYPE: type | None = None
    _PROTOCOL_TYPE: type | None = None
else:
    checkpoint_if_cancelled = AsyncIOBackend.checkpoint_if_cancelled
    current_time = AsyncIOBackend.current_time
    cancel_scope = AsyncIOBackend.create_cancel_scope
    FAST_CHECKPOINT = True
    _STREAM_TYPE = _AsyncioSocketStream
    _PROTOCOL_TYPE = _StreamProtocol


def raw_socket(stream: object) -> tuple[asyncio.Transport, Any] | None:
    """The asyncio transport under anyio's asyncio socket stream and anyio's protocol on it;
    None for any other stream (another backend, TLS), which is read and written through
    anyio's API."""
    if _STREAM_TYPE is None or type(stream) is not _STREAM_TYPE:
        return None
    transport = getattr(stream, "_transport", None)
    protocol = getattr(stream, "_protocol", None)
    if transport is None or not hasattr(transport, "pause_reading"):
        return None
    if not all(hasattr(protocol, name) for name in _PROTOCOL_FIELDS):
        return None
    return transport, protocol


# What `ClientWatch` reads of anyio's protocol.
_PROTOCOL_FIELDS = ("read_queue", "is_at_eof", "exception", "write_event")


def raw_transport(stream: object) -> asyncio.Transport | None:
    """The asyncio transport under anyio's asyncio socket stream, or None for any other."""
    found = raw_socket(stream)
    return None if found is None else found[0]


def frames_in_chunks(conn: h11.Connection) -> bool:
    """Whether h11 writes the response it was just given in chunked transfer coding (not a
    HEAD answer, an HTTP/1.0 client or a Content-Length). Asked of h11's body writer; should
    h11 ever name it otherwise, every piece simply goes through h11."""
    return type(getattr(conn, "_writer", None)).__name__ == "ChunkedWriter"


def stream_over(transport: asyncio.Transport) -> anyio.abc.SocketStream:
    """anyio's asyncio socket stream over `transport`, on the protocol `accepted_stream` uses:
    the in-memory seam of the tests runs the servers over a transport of its own."""
    if _STREAM_TYPE is None or _LEAN_TYPE is None:
        raise RuntimeError("anyio's asyncio socket stream is not where it was")
    protocol: Any = _LEAN_TYPE()  # anyio's protocol, with the lighter fields
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    stream: anyio.abc.SocketStream = _AsyncioSocketStream(transport, protocol)
    return stream


class Flag:
    """What anyio's socket stream and `ClientWatch` ask of an ``asyncio.Event`` (``is_set``,
    ``set``, ``clear``, ``wait``), with the list of its waiters made only when one waits."""

    __slots__ = ("_on", "_waiters")

    def __init__(self, on: bool = False) -> None:
        self._on = on
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._on

    def set(self) -> None:
        if self._on:
            return
        self._on = True
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._on = False

    async def wait(self) -> bool:
        if self._on:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        waiters = self._waiters
        waiters.append(waiter)
        try:
            await waiter
        finally:
            # Cancelled before a `set` (which hands the list off whole): out of the list.
            if self._waiters is waiters and waiter in waiters:
                waiters.remove(waiter)
        return True


class ReadQueue(list[bytes]):
    """anyio's read queue as a list: ``append``, ``popleft`` and ``appendleft`` on a queue that
    rarely holds more than one piece."""

    __slots__ = ()

    def popleft(self) -> bytes:
        return self.pop(0)

    def appendleft(self, item: bytes) -> None:
        self.insert(0, item)


class LeanProtocol(asyncio.Protocol):
    """anyio's asyncio stream protocol with its events and read queue made lighter (module
    docs); ``_StreamProtocol`` is its base where anyio has it (`accepted_stream`)."""

    read_queue: ReadQueue
    read_event: Flag
    write_event: Flag
    exception: Exception | None = None
    is_at_eof: bool = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.read_queue = ReadQueue()
        self.read_event = Flag()
        self.write_event = Flag(True)
        cast("asyncio.WriteTransport", transport).set_write_buffer_limits(0)  # as anyio's does

    def pause_writing(self) -> None:
        self.write_event = Flag()


def _lean_type() -> type[asyncio.Protocol] | None:
    if _PROTOCOL_TYPE is None:
        return None
    # anyio's own methods for the rest (data_received, eof_received, connection_lost,
    # resume_writing), which act on the fields through the methods above.
    return type("LeanStreamProtocol", (LeanProtocol, _PROTOCOL_TYPE), {})


_LEAN_TYPE = _lean_type()


async def accepted_stream(sock: socket.socket) -> anyio.abc.SocketStream:
    """anyio's asyncio socket stream over the accepted, connected `sock`, on `LeanProtocol`;
    ``anyio.abc.SocketStream.from_socket`` where anyio's stream is not where it was."""
    if _STREAM_TYPE is None or _LEAN_TYPE is None:
        return await anyio.abc.SocketStream.from_socket(sock)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_accepted_socket(_LEAN_TYPE, sock)
    stream: anyio.abc.SocketStream = _STREAM_TYPE(transport, protocol)
    return stream


class ClientWatch(asyncio.Protocol):
    """anyio's protocol `inner` for `transport`, with a watch on the client while a handler
    runs (`start` … `stop`).

    While `watching`, it keeps the transport reading, and end of file or a lost connection
    calls `on_gone` at once. Bytes the client sends meanwhile (a pipelined next request) stay
    in anyio's read queue for the connection's next read; past `limit` bytes reading pauses,
    as a reader task would stop reading. `paused` is true while the transport holds more than
    its high-water mark for a client that has not read it; `failed`, once the connection was
    lost to an error.
    """

    __slots__ = ("failed", "inner", "limit", "on_gone", "paused", "transport", "watching")

    def __init__(
        self, transport: asyncio.Transport, inner: Any, *, limit: int, on_gone: Callable[[], None]
    ) -> None:
        self.transport = transport
        self.inner = inner
        self.limit = limit
        self.on_gone = on_gone
        self.watching = False
        self.paused = not inner.write_event.is_set()
        self.failed = inner.exception is not None
        transport.set_protocol(self)

    def start(self) -> None:
        """Watch from now on; a client already gone is reported at once."""
        self.watching = True
        inner = self.inner
        if inner.is_at_eof or inner.exception is not None or self.transport.is_closing():
            self.on_gone()
        elif not self._over_limit():
            self.transport.resume_reading()

    def stop(self) -> None:
        """Stop watching: reading pauses until the connection next reads (anyio's ``receive``
        resumes it)."""
        self.watching = False
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def release(self) -> None:
        """The connection is over: drop the reference back to it (which would otherwise leave
        the connection, its socket stream and this object to the cycle collector)."""
        self.watching = False
        self.on_gone = _nothing

    async def drained(self) -> None:
        """Return once the transport takes more (or the connection is lost)."""
        # anyio replaces its event on each pause: it is read again for every wait.
        await self.inner.write_event.wait()

    def _over_limit(self) -> bool:
        queue = self.inner.read_queue
        return bool(queue) and sum(map(len, queue)) > self.limit

    # -- the transport's callbacks, handed on to anyio's protocol ---------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)
        if self.watching and self._over_limit():
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        keep_open: bool | None = self.inner.eof_received()
        if self.watching:
            self.on_gone()
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.paused = False
        if exc is not None:
            self.failed = True
        self.inner.connection_lost(exc)
        if self.watching:
            self.on_gone()

    def pause_writing(self) -> None:
        self.paused = True
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.paused = False
        self.inner.resume_writing()


def _nothing() -> None:
    pass
