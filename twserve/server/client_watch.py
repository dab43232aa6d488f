"""Noticing, without a task, that an HTTP/1.1 client left while its answer is being made.

While a handler runs, something must keep reading the client's socket: end of file or a reset
means the client has gone, and its handler (with the upstream call it makes) is cancelled. A
reader task per request did that, at the cost of a task group, a task and a cancel scope per
read — more than the rest of a short request's own bookkeeping.

`ClientWatch` does it from the event loop's callbacks instead. It stands between the socket's
transport and anyio's protocol for the connection's whole life, handing every callback on
unchanged, so anyio's socket stream (and whoever the connection is handed to: HTTP/2, a
WebSocket) reads and writes as before. While `watching`, it keeps the transport reading, and
end of file or a lost connection calls `on_gone` at once. Bytes the client sends meanwhile (a
pipelined next request) stay in anyio's read queue for the connection's next read; past
`limit` bytes reading pauses, as a reader task would stop reading.

Only anyio's asyncio socket stream has a transport to stand in front of
(`twserve.server.http1._raw_transport`); other streams keep the reader task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["ClientWatch"]


class ClientWatch(asyncio.Protocol):
    """anyio's protocol `inner` for `transport`, with a watch on the client while a handler
    runs (`start` … `stop`)."""

    __slots__ = ("inner", "limit", "on_gone", "transport", "watching")

    def __init__(
        self, transport: Any, inner: Any, *, limit: int, on_gone: Callable[[], None]
    ) -> None:
        self.transport = transport
        self.inner = inner
        self.limit = limit
        self.on_gone = on_gone
        self.watching = False
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
        self.inner.connection_lost(exc)
        if self.watching:
            self.on_gone()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _nothing() -> None:
    pass
