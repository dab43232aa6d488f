"""The HTTP/1.1 upstream pool: keep-alive connections per origin, spoken to with h11.

Built for what the gateway does with an upstream — one request per connection at a time, the
answer read as it arrives — so that a request costs the same however many connections are
pooled:

* **Checkout in O(1).** Each origin (scheme, host, port) has a LIFO of idle connections. A
  request pops the most recently used one and asks its socket once whether it is readable (one
  ``poll`` system call on an object registered when the connection was made): an idle
  connection has nothing to read, so a readable one was closed by the upstream, or was sent
  something unasked for, and is closed instead of used. A connection idle for longer than
  ``keepalive_expiry`` is closed too, and with it every one below it in the LIFO (they are
  older).
* **Bounds.** ``max_connections`` bounds the connections open at once, in use or idle, over all
  origins (as httpcore's pool did): a request that needs a new connection at the bound closes
  an idle one of another origin, or waits until a connection is closed or handed back.
  ``max_keepalive`` bounds the idle connections, over all origins: a connection handed back
  past it is closed.
* **One write per request.** The request's head and body go out in one ``send``. Only a
  request larger than `WRITE_SCOPE_BYTES` is written under the write timeout (`WRITE_TIMEOUT`):
  a smaller one, on a connection whose last answer was read to its end, stays under the
  transport's high-water mark (64 KiB in asyncio and uvloop), so ``send`` hands it over without
  waiting and needs no deadline scope; an upstream that does not read it never answers, which
  the attempt machine's timers see.
* **No timeout while reading.** The attempt machine's idle timer decides when silence is too
  long; cancelling the attempt closes the connection. Connecting (TCP, then TLS for https)
  happens under one deadline, the connect timeout.
* **One piece per read.** Each socket read is fed to h11, and the body data it yields is
  joined into one piece, so the relay writes once for what one read brought (several SSE
  events often arrive together).

A connection goes back to the pool only when its answer was read to its end, h11 can start
the next cycle (neither side asked to close) and nothing unasked for came after it; otherwise
leaving the answer (or cancelling it) closes the connection, shielded from the cancellation.

TLS: the system's default certificate store (which honours ``SSL_CERT_FILE`` and
``SSL_CERT_DIR``) plus certifi's bundle, hostname checks on, ALPN ``http/1.1`` — the context
httpcore builds. It is made once and made again when those variables change.

Failures map to `UpstreamUnreachable` before the head — `TransportFault.CONNECT_TIMEOUT`
(TCP and TLS together past the connect timeout), ``TLS`` (an `ssl.SSLError` in the handshake),
``DNS`` (the name did not resolve), ``CONNECT_REFUSED`` (any other failure to connect), else
``RESET_BEFORE_HEAD`` (the connection broke, or the response head was malformed) — and to
`UpstreamBroken` after it.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import certifi
import h11
from anyio.streams.tls import TLSStream

from twproto.failures import TransportFault
from twproto.upstream_request import UpstreamRequest
from twserve.upstream_errors import UpstreamBroken, UpstreamUnreachable

__all__ = ["READ_BYTES", "WRITE_SCOPE_BYTES", "WRITE_TIMEOUT", "H1Answer", "H1Pool"]

READ_BYTES = 65536
# A request at most this large goes out without a write deadline (module docs).
WRITE_SCOPE_BYTES = 16 * 1024
WRITE_TIMEOUT = 60.0
# The largest response head h11 buffers (httpcore's figure).
MAX_HEAD_BYTES = 100 * 1024

Headers = list[tuple[bytes, bytes]]
Origin = tuple[str, str, int]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NETWORK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


@dataclass(frozen=True, slots=True)
class _Target:
    origin: Origin
    target: bytes  # path and query
    host: bytes  # the Host header


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise UpstreamUnreachable(TransportFault.CONNECT_REFUSED, f"not an http(s) URL: {url}")
    host = parts.hostname
    default = _DEFAULT_PORTS[scheme]
    port = parts.port or default
    named = f"[{host}]" if ":" in host else host
    host_header = named if port == default else f"{named}:{port}"
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target((scheme, host, port), path.encode(), host_header.encode())


def _fault_for_connect(exc: BaseException, tls: bool) -> TransportFault:
    if isinstance(exc, TimeoutError):
        return TransportFault.CONNECT_TIMEOUT
    if tls and isinstance(exc, ssl.SSLError):
        return TransportFault.TLS
    if isinstance(exc, socket.gaierror):
        return TransportFault.DNS
    text = str(exc).lower()
    if "name" in text and "resolv" in text:
        return TransportFault.DNS
    return TransportFault.CONNECT_REFUSED


class _Connection:
    """One upstream connection: its stream, its h11 state, and its liveness check."""

    __slots__ = ("h11", "idle_until", "origin", "poll", "stream")

    def __init__(self, stream: anyio.abc.ByteStream, origin: Origin) -> None:
        self.stream = stream
        self.origin = origin
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.idle_until = 0.0
        self.poll: Any = None
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        make_poll = getattr(select, "poll", None)
        if sock is not None and make_poll is not None:
            self.poll = make_poll()
            self.poll.register(sock.fileno(), select.POLLIN)

    def readable(self) -> bool:
        """Whether the socket has something to read (an end of file, or bytes nobody asked
        for): an idle connection that is readable is not fit for another request."""
        if self.poll is not None:
            return bool(self.poll.poll(0))
        sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if sock is None:
            return True
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready)

    def next_cycle(self) -> bool:
        """Ready the connection for another request if the last exchange ended cleanly."""
        conn = self.h11
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        if conn.trailing_data[0]:
            return False
        conn.start_next_cycle()
        return True

    async def receive(self) -> bytes:
        try:
            return await self.stream.receive(READ_BYTES)
        except anyio.EndOfStream:
            return b""

    async def aclose(self) -> None:
        self.poll = None
        with anyio.CancelScope(shield=True):
            await anyio.aclose_forcefully(self.stream)


class H1Answer:
    """An answer whose head has arrived; `chunks` reads the body, one piece per socket read."""

    __slots__ = ("_conn", "_done", "_failure", "_ready", "headers", "status")

    def __init__(self, conn: _Connection, response: h11.Response) -> None:
        self.status = response.status_code
        self.headers: Headers = list(response.headers.raw_items())
        self._conn = conn
        self._done = False
        self._failure: UpstreamBroken | None = None
        # Body that came in the head's read.
        self._ready = self._drain()

    def chunks(self) -> H1Answer:
        """The body as it arrives; raises `UpstreamBroken` if it breaks off."""
        return self

    def __aiter__(self) -> H1Answer:
        return self

    async def __anext__(self) -> bytes:
        if self._ready:
            piece, self._ready = self._ready, b""
            return piece
        while True:
            if self._failure is not None:
                raise self._failure
            if self._done:
                raise StopAsyncIteration
            conn = self._conn
            try:
                data = await conn.receive()
            except _NETWORK_ERRORS as exc:
                raise UpstreamBroken(str(exc) or type(exc).__name__) from exc
            conn.h11.receive_data(data)
            piece = self._drain()
            if piece:
                return piece

    def _drain(self) -> bytes:
        """The body data h11 has from what was fed to it, joined; notes the end or a break."""
        parts: list[bytes] = []
        conn = self._conn.h11
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    break
                if type(event) is h11.Data:
                    if event.data:
                        parts.append(event.data)
                elif type(event) is h11.EndOfMessage:
                    self._done = True
                    break
                elif event is h11.PAUSED or type(event) is h11.ConnectionClosed:
                    self._failure = UpstreamBroken("the upstream closed the connection")
                    break
        except h11.RemoteProtocolError as exc:
            # After what was already there, not instead of it.
            self._failure = UpstreamBroken(str(exc) or type(exc).__name__)
        if not parts:
            return b""
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)


class _Exchange:
    """One request on a pooled connection: the context `H1Pool.open` returns."""

    __slots__ = ("_conn", "_pool", "_request", "_timeout")

    def __init__(self, pool: H1Pool, request: UpstreamRequest, timeout: float) -> None:
        self._pool = pool
        self._request = request
        self._timeout = timeout
        self._conn: _Connection | None = None

    async def __aenter__(self) -> H1Answer:
        pool = self._pool
        request = self._request
        target = pool.target(request.url)
        conn = await pool.acquire(target, self._timeout)
        self._conn = conn
        try:
            return await _exchange(conn, request, target)
        except BaseException:
            self._conn = None
            await pool.release(conn)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            await self._pool.release(conn)


async def _exchange(conn: _Connection, request: UpstreamRequest, target: _Target) -> H1Answer:
    """Send `request` on `conn` in one write and read up to its answer's head."""
    h = conn.h11
    body = request.body
    headers = [(b"host", target.host), *request.headers, (b"content-length", b"%d" % len(body))]
    data = h.send(h11.Request(method=request.method, target=target.target, headers=headers))
    assert data is not None
    if body:
        data += h.send(h11.Data(data=body)) or b""
    data += h.send(h11.EndOfMessage()) or b""
    try:
        if len(data) <= WRITE_SCOPE_BYTES:
            await conn.stream.send(data)
        else:
            with anyio.fail_after(WRITE_TIMEOUT):
                await conn.stream.send(data)
    except TimeoutError as exc:
        raise UpstreamUnreachable(TransportFault.RESET_BEFORE_HEAD, "write timed out") from exc
    except _NETWORK_ERRORS:
        # An upstream may answer and close before it has read the whole request: read what it
        # said, or fail on the read (as httpcore does).
        pass
    try:
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                h.receive_data(await conn.receive())
                continue
            if type(event) is h11.Response:
                break
            if type(event) is h11.InformationalResponse:
                continue
            raise h11.RemoteProtocolError("the upstream closed the connection before answering")
    except (h11.RemoteProtocolError, *_NETWORK_ERRORS) as exc:
        raise UpstreamUnreachable(
            TransportFault.RESET_BEFORE_HEAD, str(exc) or type(exc).__name__
        ) from exc
    return H1Answer(conn, event)


class H1Pool:
    """HTTP/1.1 connections to upstreams, kept alive per origin (module docs)."""

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        max_keepalive: int = 200,
        keepalive_expiry: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self._clock = clock
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0  # connections open, in use or idle
        self._waiters: deque[anyio.Event] = deque()
        self._targets: dict[str, _Target] = {}
        self._ssl: tuple[tuple[str | None, str | None], ssl.SSLContext] | None = None

    @property
    def idle_count(self) -> int:
        return self._idle_count

    @property
    def open_count(self) -> int:
        return self._open

    def open(self, request: UpstreamRequest, connect_timeout: float) -> _Exchange:
        """Send `request`; the context yields the answer once its head has arrived."""
        return _Exchange(self, request, connect_timeout)

    def target(self, url: str) -> _Target:
        found = self._targets.get(url)
        if found is None:
            found = _target(url)
            if len(self._targets) >= 1024:
                self._targets.clear()
            self._targets[url] = found
        return found

    async def acquire(self, target: _Target, timeout: float) -> _Connection:
        """An idle connection to `target`'s origin that looks alive, else a new one."""
        origin = target.origin
        while True:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()
                self._idle_count -= 1
                if conn.idle_until <= self._clock():
                    # Expired, and every one below it is older.
                    stale = [conn, *idle]
                    idle.clear()
                    self._idle_count -= len(stale) - 1
                    for old in stale:
                        await self._discard(old)
                    break
                if conn.readable():
                    await self._discard(conn)
                    continue
                return conn
            if self._open < self.max_connections:
                self._open += 1
                try:
                    stream = await self._connect(origin, timeout)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
                return _Connection(stream, origin)
            victim = self._oldest_idle()
            if victim is not None:
                await self._discard(victim)
                continue
            waiter = anyio.Event()
            self._waiters.append(waiter)
            try:
                await waiter.wait()
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.is_set():
                    self._wake()  # woken, then cancelled: the turn goes to the next one
                raise

    async def release(self, conn: _Connection) -> None:
        """Hand `conn` back after a request: kept if it ended cleanly and there is room."""
        if self._idle_count < self.max_keepalive and conn.next_cycle():
            conn.idle_until = self._clock() + self.keepalive_expiry
            self._idle.setdefault(conn.origin, []).append(conn)
            self._idle_count += 1
            self._wake()
            return
        await self._discard(conn)

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        self._idle_count = 0
        for conn in idle:
            await self._discard(conn)

    def _oldest_idle(self) -> _Connection | None:
        oldest: _Connection | None = None
        for conns in self._idle.values():
            if conns and (oldest is None or conns[0].idle_until < oldest.idle_until):
                oldest = conns[0]
        if oldest is not None:
            self._idle[oldest.origin].pop(0)
            self._idle_count -= 1
        return oldest

    async def _discard(self, conn: _Connection) -> None:
        self._open -= 1
        self._wake()
        await conn.aclose()

    def _wake(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()

    async def _connect(self, origin: Origin, timeout: float) -> anyio.abc.ByteStream:
        scheme, host, port = origin
        stream: anyio.abc.ByteStream | None = None
        tls = False
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_tcp(host, port)
                if scheme == "https":
                    tls = True
                    stream = await TLSStream.wrap(
                        stream,
                        hostname=host,
                        ssl_context=self._ssl_context(),
                        standard_compatible=False,
                    )
        except (TimeoutError, ssl.SSLError, anyio.EndOfStream, *_NETWORK_ERRORS) as exc:
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)
            fault = _fault_for_connect(exc, tls)
            raise UpstreamUnreachable(fault, str(exc) or type(exc).__name__) from exc
        except BaseException:
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)
            raise
        return stream

    def _ssl_context(self) -> ssl.SSLContext:
        key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if self._ssl is None or self._ssl[0] != key:
            context = ssl.create_default_context()
            context.load_verify_locations(certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = (key, context)
        return self._ssl[1]
