"""The HTTP/1.1 upstream pool: keep-alive connections per origin.

Built for what the gateway does with an upstream — one request per connection at a time, the
answer read as it arrives — so that a request costs the same however many connections are
pooled. Each connection is an asyncio protocol (twserve/upstream/h1_connection.py: how it reads,
writes and bounds what it keeps):

* **Checkout in O(1).** Each origin (scheme, host, port) has a LIFO of idle connections. A
  request pops the most recently used one that is still fit: an idle connection knows when
  its upstream closed it or sent something unasked for (the event loop tells it, no system
  call at checkout) and is closed instead of used. A connection idle for longer than
  ``keepalive_expiry`` is closed too, and with it every one below it in the LIFO (they are
  older).
* **Bounds.** ``max_connections`` bounds the connections open at once, in use or idle, over all
  origins (as httpcore's pool did): a request that needs a new connection at the bound closes
  an idle one of another origin, or waits until a connection is closed or handed back — at most
  ``wait_secs`` (``pool.wait_secs``): past it the attempt fails as
  ``TransportFault.POOL_FULL``, which fails over and counts nothing against the upstream.
  ``max_keepalive`` bounds the idle connections, over all origins: a connection handed back
  past it is closed.
* **One write per request.** The request's head and body go out in one ``transport.write``;
  only when that leaves the transport's buffer above its high-water mark does the request wait
  for it to drain, under the write timeout (`WRITE_TIMEOUT`). An upstream that reads it but
  never answers is the attempt machine's timers' to see.
* **No timeout while reading.** The attempt machine's idle timer decides when silence is too
  long; cancelling the attempt closes the connection. Connecting (TCP, then TLS for https)
  happens under one deadline, the connect timeout.
* **One piece per arrival.** The body that arrived since the reader last looked is one piece,
  so the relay writes once for what a read brought (several SSE events often arrive together).

A connection goes back to the pool only when its answer was read to its end, the upstream keeps
it alive (`H1Connection.next_cycle`) and nothing unasked for came after it; otherwise
leaving the answer (or cancelling it) closes the connection at once (an abort of its transport:
nothing to await, so nothing a cancellation can interrupt).

TLS: the system's default certificate store (which honours ``SSL_CERT_FILE`` and
``SSL_CERT_DIR``) plus certifi's bundle, hostname checks on, ALPN ``http/1.1`` — the context
httpcore builds. It is made once and made again when those variables change.

Failures map to `UpstreamUnreachable` before the head — `TransportFault.CONNECT_TIMEOUT`
(TCP and TLS together past the connect timeout), ``TLS`` (an `ssl.SSLError` in the handshake),
``DNS`` (the name did not resolve), ``LOCAL_RESOURCES`` (the gateway's host out of file
descriptors, buffers or local ports), ``CONNECT_REFUSED`` (any other failure to connect),
``PROTOCOL_ERROR`` (a request head HTTP/1.1 cannot carry: a header value with a line break),
else ``RESET_BEFORE_HEAD`` (the connection broke, the write timed out, or the response head
was malformed) — and to `UpstreamBroken` after it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import anyio
import certifi

from twproto.failures import TransportFault
from twproto.upstream_request import UpstreamRequest
from twserve.upstream.errors import LOCAL_SHORTAGE, UpstreamUnreachable
from twserve.upstream.h1_connection import (
    WRITE_TIMEOUT,
    H1Answer,
    H1Connection,
    ReadTurns,
    RequestHeadError,
    WriteTimeout,
    request_bytes,
)

__all__ = ["WRITE_TIMEOUT", "H1Answer", "H1Pool"]

Origin = tuple[str, str, int]

_DEFAULT_PORTS = {"http": 80, "https": 443}


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
    if isinstance(exc, OSError) and exc.errno in LOCAL_SHORTAGE:
        return TransportFault.LOCAL_RESOURCES
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


class _Exchange:
    """One request on a pooled connection: the context `H1Pool.open` returns."""

    __slots__ = ("_conn", "_pool", "_request", "_timeout")

    def __init__(self, pool: H1Pool, request: UpstreamRequest, timeout: float) -> None:
        self._pool = pool
        self._request = request
        self._timeout = timeout
        self._conn: H1Connection | None = None

    async def __aenter__(self) -> H1Answer:
        pool = self._pool
        request = self._request
        target = pool.target(request.url)
        body = request.body
        headers = [(b"host", target.host), *request.headers, (b"content-length", b"%d" % len(body))]
        try:
            data = request_bytes(request.method.encode(), target.target, headers, body)
        except RequestHeadError as exc:
            raise UpstreamUnreachable(TransportFault.PROTOCOL_ERROR, str(exc)) from exc
        conn = await pool.acquire(target, self._timeout)
        self._conn = conn
        try:
            return await _exchange(conn, data)
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


async def _exchange(conn: H1Connection, data: bytes) -> H1Answer:
    """Send the request `data` on `conn` in one write and wait for its answer's head."""
    try:
        await conn.send(data)
    except WriteTimeout as exc:
        raise UpstreamUnreachable(TransportFault.RESET_BEFORE_HEAD, "write timed out") from exc
    # A connection that broke while writing is reported here: an upstream may answer and
    # close before it has read the whole request (as httpcore reads it).
    while conn.head is None:
        if conn.failure is not None or conn.lost:
            why = conn.failure or "the upstream closed the connection before answering"
            raise UpstreamUnreachable(TransportFault.RESET_BEFORE_HEAD, why)
        await conn.wait()
    return H1Answer(conn, conn.head)


class H1Pool:
    """HTTP/1.1 connections to upstreams, kept alive per origin (module docs)."""

    def __init__(
        self,
        *,
        max_connections: int = 10_000,
        max_keepalive: int = 200,
        keepalive_expiry: float = 60.0,
        wait_secs: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Plain attributes: a reload's ``pool`` section applies to the next checkout.
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self.wait_secs = wait_secs
        self._clock = clock
        self._idle: dict[Origin, list[H1Connection]] = {}
        self._idle_count = 0
        self._open = 0  # connections open, in use or idle
        self._waiters: deque[anyio.Event] = deque()
        self._targets: dict[str, _Target] = {}
        self._ssl: tuple[tuple[str | None, str | None], ssl.SSLContext] | None = None
        # Reads paced to one per loop turn while the loop is behind (the gateway sets it).
        self.turns: ReadTurns | None = None

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

    async def acquire(self, target: _Target, timeout: float) -> H1Connection:
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
                        self._discard(old)
                    break
                if not conn.fit:
                    self._discard(conn)
                    continue
                return conn
            if self._open < self.max_connections:
                self._open += 1
                try:
                    return await self._connect(origin, timeout)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            victim = self._oldest_idle()
            if victim is not None:
                self._discard(victim)
                continue
            waiter = anyio.Event()
            self._waiters.append(waiter)
            try:
                with anyio.move_on_after(self.wait_secs):
                    await waiter.wait()
                if not waiter.is_set():
                    self._waiters.remove(waiter)
                    raise UpstreamUnreachable(
                        TransportFault.POOL_FULL,
                        f"all {self.max_connections} upstream connections in use for "
                        f"{self.wait_secs:g} s (pool.max_connections, pool.wait_secs)",
                    )
            except UpstreamUnreachable:
                raise
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.is_set():
                    self._wake()  # woken, then cancelled: the turn goes to the next one
                raise

    async def release(self, conn: H1Connection) -> None:
        """Hand `conn` back after a request: kept if it ended cleanly and there is room."""
        if self._idle_count < self.max_keepalive and conn.next_cycle():
            conn.idle_until = self._clock() + self.keepalive_expiry
            self._idle.setdefault(conn.origin, []).append(conn)
            self._idle_count += 1
            self._wake()
            return
        self._discard(conn)

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        self._idle_count = 0
        for conn in idle:
            self._discard(conn)

    def _oldest_idle(self) -> H1Connection | None:
        oldest: H1Connection | None = None
        for conns in self._idle.values():
            if conns and (oldest is None or conns[0].idle_until < oldest.idle_until):
                oldest = conns[0]
        if oldest is not None:
            self._idle[oldest.origin].pop(0)
            self._idle_count -= 1
        return oldest

    def _discard(self, conn: H1Connection) -> None:
        self._open -= 1
        self._wake()
        conn.close()

    def _wake(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()

    async def _connect(self, origin: Origin, timeout: float) -> H1Connection:
        scheme, host, port = origin
        tls = scheme == "https"
        loop = asyncio.get_running_loop()
        conn = H1Connection(loop, origin, self.turns)
        try:
            # TCP, then TLS for https, under one deadline. Cancelled part way, the loop closes
            # what it had made.
            with anyio.fail_after(timeout):
                if tls:
                    await loop.create_connection(
                        lambda: conn, host, port, ssl=self._ssl_context(), server_hostname=host
                    )
                else:
                    await loop.create_connection(lambda: conn, host, port)
        except (TimeoutError, ssl.SSLError, OSError) as exc:
            conn.close()
            fault = _fault_for_connect(exc, tls)
            raise UpstreamUnreachable(fault, str(exc) or type(exc).__name__) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if self._ssl is None or self._ssl[0] != key:
            context = ssl.create_default_context()
            context.load_verify_locations(certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = (key, context)
        return self._ssl[1]
