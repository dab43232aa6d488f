"""The in-memory seam of the client-side servers: HTTP/1.1 and HTTP/2 connections fed bytes, no
socket (as uvicorn tests its protocols over a mock transport).

`MemoryTransport` is an asyncio transport whose far end is the test: `feed` is what the client
sends, `feed_eof` its half-close, `reset` a connection reset; what the server writes collects in
`sent`, unless the client has stopped reading (`stop_reading`), when it waits in the
transport's buffer and the transport pauses its protocol's writing past the high-water mark,
as a socket whose client reads nothing does. Reading follows `pause_reading` and
`resume_reading` exactly, so the servers' read-ahead bounds are those of a socket.

`Wire` puts the server's side on top: over anyio's own asyncio socket stream (`fast`, made by
twserve/server/_anyio_fastpath.py, so the connection takes the same fast lanes it takes on a
real socket: the watch from the transport's callbacks, the gathered writes) or over a stream
that hides the transport (`plain`, the lanes every other stream takes: a reader task watches,
each write is anyio's ``send``). `Wire.serve` runs an HTTP/1.1 connection (with its switches,
so HTTP/2 and WebSocket handoffs happen as on a socket) in a task of the caller's group.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import h11

from twserve.server._anyio_fastpath import stream_over
from twserve.server.base import BodyBudget, Handler, HeadCheck, ServerLimits, Switch, plain_error
from twserve.server.http1 import Connection

__all__ = ["Answer", "MemoryTransport", "Wire", "answers", "request"]

PEER = ("10.0.0.7", 40000)


class _Socket:
    """What anyio asks of the socket under a stream: its family and addresses."""

    family = socket.AF_INET

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def getpeername(self) -> tuple[str, int]:
        return self.peer

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 8788)

    def fileno(self) -> int:
        return -1


class MemoryTransport(asyncio.Transport):
    """An asyncio transport with the test at its far end."""

    def __init__(self, peer: tuple[str, int] = PEER) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._protocol: asyncio.BaseProtocol | None = None
        self._socket = _Socket(peer)
        self._reading = True
        self._closing = False
        self._lost = False
        self._incoming: deque[bytes] = deque()  # fed, not yet taken in by the protocol
        self._eof = False
        self._eof_taken = False
        self._delivering = False
        self._high = 64 * 1024
        self._writing_paused = False
        self.unsent = bytearray()  # written while the client does not read
        self.sent = bytearray()  # written, and taken by the client
        self.client_reads = True
        # The client closes its side once the server has closed its own, as clients do (so a
        # server lingering for that close is not kept waiting).
        self.closes_at_eof = True
        self.eof_written = False
        self.aborted = False
        self._changed = asyncio.Event()

    # --- the transport's side (what asyncio's transports offer a protocol) -------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {
            "socket": self._socket,
            "peername": self._socket.peer,
            "sockname": self._socket.getsockname(),
        }.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._deliver_soon()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 * 1024 if high is None else high
        self._check_pause()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._high // 4, self._high)

    def get_write_buffer_size(self) -> int:
        return len(self.unsent)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return  # as asyncio's transports do once the connection is lost: dropped
        if self.client_reads:
            self.sent += data
            self._pulse()
        else:
            self.unsent += data
            self._check_pause()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True
        self._pulse()
        if self.closes_at_eof:
            self.feed_eof()

    def close(self) -> None:
        self._end(None)

    def abort(self) -> None:
        self.aborted = True
        self.unsent.clear()
        self._end(None)

    # --- the client's side --------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes the client sends (taken in as one read, when the server reads)."""
        if data:
            self._incoming.append(bytes(data))
            self._deliver_soon()

    def feed_eof(self) -> None:
        """The client half-closes: end of file once what it sent is read."""
        self._eof = True
        self._deliver_soon()

    def reset(self) -> None:
        """The client resets the connection."""
        self._end(ConnectionResetError("reset by the client"))

    def stop_reading(self) -> None:
        self.client_reads = False

    def read_again(self) -> None:
        """The client reads what waits, and from now on everything."""
        self.client_reads = True
        if self.unsent:
            self.sent += self.unsent
            self.unsent.clear()
            self._pulse()
        self._check_pause()

    @property
    def lost(self) -> bool:
        """The server closed (or aborted) the connection, or it was reset."""
        return self._lost

    def take(self) -> bytes:
        """What the server has written and the client has not taken yet."""
        data = bytes(self.sent)
        self.sent.clear()
        return data

    async def wait(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until `condition` holds: looked at whenever the server writes or closes, and every
        few milliseconds (for what the server keeps rather than writes)."""
        with anyio.fail_after(timeout):
            while not condition():
                self._changed.clear()
                with anyio.move_on_after(0.005):
                    await self._changed.wait()

    # --- plumbing -----------------------------------------------------------------------------

    def _pulse(self) -> None:
        self._changed.set()

    def _check_pause(self) -> None:
        protocol = self._protocol
        if protocol is None or self._lost:
            return
        size = len(self.unsent)
        if not self._writing_paused and size > self._high:
            self._writing_paused = True
            protocol.pause_writing()
        elif self._writing_paused and size <= self._high // 4:
            self._writing_paused = False
            protocol.resume_writing()

    def _deliver_soon(self) -> None:
        if not self._delivering:
            self._delivering = True
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivering = False
        protocol = self._protocol
        if protocol is None or self._lost:
            return
        assert isinstance(protocol, asyncio.Protocol)
        while self._reading and self._incoming:
            protocol.data_received(self._incoming.popleft())
        if self._reading and self._eof and not self._incoming and not self._eof_taken:
            self._eof_taken = True
            if not protocol.eof_received():
                self.close()

    def _end(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._closing = True
        self._lost = True
        protocol = self._protocol
        self._pulse()
        if protocol is not None:
            self._loop.call_soon(protocol.connection_lost, exc)


class _PlainStream(anyio.abc.SocketStream):
    """anyio's stream over the memory transport, with the transport hidden: the connection
    takes the lanes of a stream it cannot reach under (another backend, TLS)."""

    def __init__(self, inner: anyio.abc.SocketStream) -> None:
        self._inner = inner

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._inner.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._inner.send(item)

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()

    @property
    def _raw_socket(self) -> socket.socket:
        raise NotImplementedError

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._inner.extra_attributes


@dataclass
class Wire:
    """One client connection in memory; `transport` is its far end."""

    transport: MemoryTransport
    stream: anyio.abc.SocketStream
    fast: bool
    connection: Connection | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    def open(cls, *, fast: bool = True, peer: tuple[str, int] = PEER) -> Wire:
        transport = MemoryTransport(peer)
        stream = stream_over(transport)
        return cls(transport, stream if fast else _PlainStream(stream), fast)

    def serve(
        self,
        tg: anyio.abc.TaskGroup,
        handler: Handler,
        *,
        limits: ServerLimits | None = None,
        switches: Sequence[Switch] = (),
        check_head: HeadCheck | None = None,
        budget: BodyBudget | None = None,
    ) -> Connection:
        """Run the HTTP/1.1 connection over this wire in `tg`, as the accept loop would."""
        lim = limits or ServerLimits()
        conn = Connection(
            self.stream,
            handler,
            lim,
            plain_error,
            switches,
            check_head=check_head,
            budget=budget or BodyBudget(lim.body_budget_bytes),
        )
        self.connection = conn

        async def run() -> None:
            try:
                await conn.run()
            finally:
                self.done.set()

        tg.start_soon(run)
        return conn

    def feed(self, data: bytes) -> None:
        self.transport.feed(data)

    async def fed_bytewise(self, data: bytes) -> None:
        """`data` one byte per read, the server's loop turning between them."""
        for i in range(len(data)):
            self.transport.feed(data[i : i + 1])
            await anyio.sleep(0)

    async def closed(self, timeout: float = 5.0) -> None:
        """Until the connection's task has ended (its socket closed)."""
        with anyio.fail_after(timeout):
            await self.done.wait()


def request(
    method: str = "GET",
    target: str = "/",
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    chunked: bool = False,
    version: str = "1.1",
) -> bytes:
    """A request's bytes as a client writes them (a Host header unless one is given)."""
    lines = [f"{method} {target} HTTP/{version}"]
    if not any(k.lower() == "host" for k, _ in headers):
        lines.append("host: gateway.test")
    lines += [f"{k}: {v}" for k, v in headers]
    if chunked:
        lines.append("transfer-encoding: chunked")
        framed = (b"%x\r\n%b\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        return "\r\n".join(lines).encode() + b"\r\n\r\n" + framed
    if body or method in ("POST", "PUT"):
        lines.append(f"content-length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    chunked: bool

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


def answers(data: bytes, methods: Sequence[str] = ("GET",), *, eof: bool = False) -> list[Answer]:
    """The whole answers in `data`, read as a client that sent requests with `methods` (one
    each, in order) reads them, `eof` when the server closed after them; an answer cut short
    is left out."""
    client = h11.Connection(h11.CLIENT)
    client.receive_data(data)
    if eof:
        client.receive_data(b"")
    out: list[Answer] = []
    for method in methods:
        client.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
        client.send(h11.EndOfMessage())
        head: h11.Response | None = None
        body = bytearray()
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError:
                return out
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return out
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = [(bytes(k), bytes(v)) for k, v in head.headers]
                chunked = (b"transfer-encoding", b"chunked") in headers
                out.append(Answer(head.status_code, headers, bytes(body), chunked))
                break
        if client.our_state is h11.MUST_CLOSE or client.their_state is h11.MUST_CLOSE:
            return out
        try:
            client.start_next_cycle()
        except h11.LocalProtocolError:
            return out
    return out
