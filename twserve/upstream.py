"""Upstream calls: the `Upstream` protocol the relay sends through, and its connection pools.

The relay opens an answer with `Upstream.open` (a `twproto.upstream_request.UpstreamRequest`,
built without IO) and reads it chunk by chunk as it arrives; nothing buffers a whole answer.
`UpstreamClient` holds the shared pools: HTTP/1.1 upstreams go through the gateway's own pool
(twserve/upstream_h1.py, on h11), upstreams with ``http2: true`` through httpcore's pools;
tests can put `twserve.upstream_memory.MemoryUpstream` in its place. Failures are mapped at the
boundary to two errors named by when they happened (twserve/upstream_errors.py):
`UpstreamUnreachable` (no response head: refused, reset, TLS, timeout — carries the
`TransportFault` the failure classifier takes) and `UpstreamBroken` (the body broke off after
the head). Cancelling the caller's anyio scope closes the upstream connection, which is how a
client that leaves stops the upstream's work too.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import anyio
import httpcore

from twproto.failures import TransportFault
from twproto.headers import client_response_headers
from twproto.upstream_request import UpstreamRequest
from twserve.coalesce import coalesced
from twserve.upstream_errors import UpstreamBroken, UpstreamUnreachable
from twserve.upstream_h1 import H1Pool

__all__ = [
    "Upstream",
    "UpstreamAnswer",
    "UpstreamBroken",
    "UpstreamClient",
    "UpstreamUnreachable",
    "client_headers",
    "read_prefix",
]

Headers = list[tuple[bytes, bytes]]


def client_headers(upstream: Headers) -> Headers:
    """The upstream's response headers a client may see when the answer is passed on as is:
    an allow-list, compared without regard to case (`twproto.headers`)."""
    return client_response_headers(upstream)


class UpstreamAnswer(Protocol):
    """An upstream response whose head has arrived; the body is read with `chunks`."""

    status: int
    headers: Headers

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises `UpstreamBroken` if it breaks off."""
        ...

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        """Hand what arrives from now on to `sink` in the event loop's callback where the
        transport can (`twserve.upstream_h1_conn`); what it does not take — and everything
        where this returns False — `chunks` still reads, in order."""
        ...


class Upstream(Protocol):
    """Where the relay sends upstream requests: the httpcore pool (`UpstreamClient`), or an
    in-memory stand-in (`twserve.upstream_memory.MemoryUpstream`) in tests."""

    def open(
        self, request: UpstreamRequest, *, connect_timeout: float | None = None
    ) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send `request` (connecting within `connect_timeout`; None: the default); yield the
        answer once its head has arrived, or raise `UpstreamUnreachable`. Leaving the context
        (or cancelling it) closes the request."""
        ...


async def read_prefix(answer: UpstreamAnswer, limit: int) -> bytes:
    """Up to `limit` bytes of the body (error bodies are only ever read this far); a break
    ends it quietly."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in answer.chunks():
            parts.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    except UpstreamBroken:
        pass
    return b"".join(parts)[:limit]


# Given a request and its connect timeout: the answer's context manager when the request goes
# another way than HTTP, else None.
SocketRoute = Callable[[UpstreamRequest, float], AbstractAsyncContextManager[UpstreamAnswer] | None]


@dataclass(slots=True)
class _HttpcoreAnswer:
    status: int
    headers: Headers
    _response: httpcore.Response

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        try:
            # What one socket read brought comes out as one piece, written to the client with
            # one send (twserve/coalesce.py).
            async for chunk in coalesced(self._response.aiter_stream()):
                if chunk:
                    yield chunk
        except (httpcore.ReadError, httpcore.RemoteProtocolError, httpcore.ReadTimeout) as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        return False  # httpcore's streams are read by a task


def _fault_for(exc: Exception) -> TransportFault:
    if isinstance(exc, httpcore.ConnectTimeout):
        return TransportFault.CONNECT_TIMEOUT
    if isinstance(exc, httpcore.ConnectError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError) or "ssl" in str(exc).lower():
            return TransportFault.TLS
        if "name" in str(exc).lower() and "resolv" in str(exc).lower():
            return TransportFault.DNS
        return TransportFault.CONNECT_REFUSED
    return TransportFault.RESET_BEFORE_HEAD


class UpstreamClient:
    """Pools of upstream connections shared by every request.

    HTTP/1.1 goes through `H1Pool` (twserve/upstream_h1.py): ``max_connections`` bounds its
    open connections, ``max_keepalive`` its idle ones (both over all origins), and a connection
    idle for ``keepalive_expiry`` seconds is closed; each httpcore HTTP/2 pool has the same
    bounds.
    `http2_for(url)` says whether the upstream at `url` is spoken to over HTTP/2 (the
    provider's ``http2``): such requests go through pools of their own, over https one that
    offers h2 by ALPN (HTTP/1.1 where the upstream declines it), over http one that speaks h2 by
    prior knowledge, since cleartext has no negotiation.
    """

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        max_keepalive: int = 200,
        keepalive_expiry: float = 60.0,
        connect_timeout: float = 10.0,
        http2_for: Callable[[str], bool] | None = None,
        socket_route: SocketRoute | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.http2_for = http2_for
        # Another way to an upstream for some requests (twserve.upstream_socket): asked first.
        self.socket_route = socket_route

        def pool(*, http1: bool = True, http2: bool = False) -> httpcore.AsyncConnectionPool:
            return httpcore.AsyncConnectionPool(
                max_connections=max_connections,
                max_keepalive_connections=max_keepalive,
                keepalive_expiry=keepalive_expiry,
                retries=0,
                http1=http1,
                http2=http2,
            )

        # HTTP/1.1: the gateway's own pool (twserve/upstream_h1.py).
        self.pool = H1Pool(
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            keepalive_expiry=keepalive_expiry,
        )
        self.h2_pool = pool(http2=True)
        self.h2c_pool = pool(http1=False, http2=True)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.h2_pool.aclose()
        await self.h2c_pool.aclose()

    def _h2_pool_for(self, url: str) -> httpcore.AsyncConnectionPool | None:
        if self.http2_for is None or not self.http2_for(url):
            return None
        return self.h2_pool if url.startswith("https:") else self.h2c_pool

    def open(
        self, request: UpstreamRequest, *, connect_timeout: float | None = None
    ) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send `request` and yield the answer once its head has arrived. `connect_timeout` is
        the upstream's own (``providers[].connect_timeout_secs``); None takes the pool's. A
        request `socket_route` takes goes its way instead of over HTTP."""
        timeout = self.connect_timeout if connect_timeout is None else connect_timeout
        if self.socket_route is not None:
            routed = self.socket_route(request, timeout)
            if routed is not None:
                return routed
        h2_pool = self._h2_pool_for(request.url)
        if h2_pool is None:
            return self.pool.open(request, timeout)
        return self._open_h2(h2_pool, request, timeout)

    @asynccontextmanager
    async def _open_h2(
        self, pool: httpcore.AsyncConnectionPool, request: UpstreamRequest, connect_timeout: float
    ) -> AsyncIterator[UpstreamAnswer]:
        # No read timeout here: the attempt machine's idle timer decides when silence is too
        # long, and cancelling the attempt closes the connection.
        timeouts: dict[str, float | None] = {
            "connect": connect_timeout,
            "read": None,
            "write": 60.0,
            "pool": None,
        }
        body = request.body
        headers = [*request.headers, (b"content-length", str(len(body)).encode())]
        try:
            cm = pool.stream(
                request.method.encode(),
                request.url.encode(),
                headers=headers,
                content=body,
                extensions={"timeout": timeouts},
            )
            response = await cm.__aenter__()
        except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
            raise UpstreamUnreachable(_fault_for(exc), str(exc) or type(exc).__name__) from exc
        except (
            httpcore.ReadError,
            httpcore.WriteError,
            httpcore.RemoteProtocolError,
            httpcore.ReadTimeout,
            httpcore.WriteTimeout,
            httpcore.PoolTimeout,
        ) as exc:
            raise UpstreamUnreachable(
                TransportFault.RESET_BEFORE_HEAD, str(exc) or type(exc).__name__
            ) from exc
        except httpcore.UnsupportedProtocol as exc:
            raise UpstreamUnreachable(TransportFault.CONNECT_REFUSED, str(exc)) from exc
        try:
            yield _HttpcoreAnswer(
                status=response.status, headers=list(response.headers), _response=response
            )
        finally:
            # Shielded: when the attempt is cancelled (the client left, a slow start, an idle
            # timeout) the connection must still be closed, not left for the collector.
            with anyio.CancelScope(shield=True):
                await cm.__aexit__(None, None, None)
