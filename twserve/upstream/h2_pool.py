"""Upstreams with ``http2: true``: httpcore's HTTP/2 pools, loaded only when one is used.

Over ``https`` the pool offers h2 by ALPN (HTTP/1.1 where the upstream declines it); over
``http`` another speaks h2 by prior knowledge, since cleartext has no negotiation. Both have
the bounds of the HTTP/1.1 pool (`twserve.upstream.client.UpstreamClient`). httpcore's errors are
mapped here to the two the relay knows (twserve/upstream/errors.py). A gateway whose
providers all speak HTTP/1.1 never imports this module, nor httpcore.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import anyio
import httpcore

from twproto.failures import TransportFault
from twproto.upstream_request import UpstreamRequest
from twserve.upstream.coalesce import coalesced
from twserve.upstream.errors import LOCAL_SHORTAGE, UpstreamBroken, UpstreamUnreachable

__all__ = ["H2Pools"]

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class _HttpcoreAnswer:
    status: int
    headers: Headers
    _response: httpcore.Response

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        try:
            # What one socket read brought comes out as one piece, written to the client with
            # one send (twserve/upstream/coalesce.py).
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
        if isinstance(cause, OSError) and cause.errno in LOCAL_SHORTAGE:
            return TransportFault.LOCAL_RESOURCES
        if isinstance(cause, ssl.SSLError) or "ssl" in str(exc).lower():
            return TransportFault.TLS
        if "name" in str(exc).lower() and "resolv" in str(exc).lower():
            return TransportFault.DNS
        return TransportFault.CONNECT_REFUSED
    return TransportFault.RESET_BEFORE_HEAD


class H2Pools:
    """The two HTTP/2 pools, with the HTTP/1.1 pool's bounds."""

    def __init__(
        self,
        *,
        max_connections: int,
        max_keepalive: int,
        keepalive_expiry: float,
        wait_secs: float = 10.0,
    ) -> None:
        # How long a request waits for a connection at the cap (httpcore's pool timeout); the
        # pools' other bounds are fixed when they are made.
        self.wait_secs = wait_secs

        def pool(*, http1: bool = True) -> httpcore.AsyncConnectionPool:
            return httpcore.AsyncConnectionPool(
                max_connections=max_connections,
                max_keepalive_connections=max_keepalive,
                keepalive_expiry=keepalive_expiry,
                retries=0,
                http1=http1,
                http2=True,
            )

        self.tls = pool()
        self.cleartext = pool(http1=False)

    async def aclose(self) -> None:
        await self.tls.aclose()
        await self.cleartext.aclose()

    def open(
        self, request: UpstreamRequest, connect_timeout: float
    ) -> AbstractAsyncContextManager[_HttpcoreAnswer]:
        pool = self.tls if request.url.startswith("https:") else self.cleartext
        return _open(pool, request, connect_timeout, self.wait_secs)


@asynccontextmanager
async def _open(
    pool: httpcore.AsyncConnectionPool,
    request: UpstreamRequest,
    connect_timeout: float,
    wait_secs: float,
) -> AsyncIterator[_HttpcoreAnswer]:
    # No read timeout here: the attempt machine's idle timer decides when silence is too
    # long, and cancelling the attempt closes the connection.
    timeouts: dict[str, float | None] = {
        "connect": connect_timeout,
        "read": None,
        "write": 60.0,
        "pool": wait_secs,
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
    except httpcore.PoolTimeout as exc:
        raise UpstreamUnreachable(
            TransportFault.POOL_FULL,
            f"every HTTP/2 upstream connection in use for {wait_secs:g} s (pool.wait_secs)",
        ) from exc
    except (
        httpcore.ReadError,
        httpcore.WriteError,
        httpcore.RemoteProtocolError,
        httpcore.ReadTimeout,
        httpcore.WriteTimeout,
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
