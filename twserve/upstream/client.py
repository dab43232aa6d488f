"""Upstream calls: the `Upstream` protocol the relay sends through, and its connection pools.

The relay opens an answer with `Upstream.open` (a `twproto.upstream_request.UpstreamRequest`,
built without IO) and reads it chunk by chunk as it arrives; nothing buffers a whole answer.
`UpstreamClient` holds the shared pools: HTTP/1.1 upstreams go through the gateway's own pool
(twserve/upstream/h1_pool.py), upstreams with ``http2: true`` through httpcore's
(twserve/upstream/h2_pool.py). Which one an attempt takes is its `Transport`, carried with the
attempt from its destination (`twengine.destinations.Destination`, built from its provider's
config), never found again from the URL; tests can put `twserve.upstream.memory.MemoryUpstream`
in its place. Failures are mapped at the boundary to two errors named by when they happened
(twserve/upstream/errors.py): `UpstreamUnreachable` (no response head: refused, reset, TLS,
timeout — carries the `TransportFault` the failure classifier takes) and `UpstreamBroken` (the
body broke off after the head). Cancelling the caller's anyio scope closes the upstream
connection, which is how a client that leaves stops the upstream's work too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

from twengine.config import UpstreamPool
from twengine.destinations import Transport
from twproto.upstream_request import UpstreamRequest
from twserve.upstream.cloud_tokens import CloudTokens
from twserve.upstream.errors import UpstreamBroken, UpstreamUnreachable
from twserve.upstream.h1_pool import H1Pool

if TYPE_CHECKING:
    from twserve.upstream.h2_pool import H2Pools

__all__ = [
    "Upstream",
    "UpstreamAnswer",
    "UpstreamBroken",
    "UpstreamClient",
    "UpstreamUnreachable",
    "read_prefix",
]

Headers = list[tuple[bytes, bytes]]


class UpstreamAnswer(Protocol):
    """An upstream response whose head has arrived; the body is read with `chunks`."""

    status: int
    headers: Headers

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises `UpstreamBroken` if it breaks off."""
        ...

    def divert(self, sink: Callable[[bytes], bool]) -> bool:
        """Hand what arrives from now on to `sink` in the event loop's callback where the
        transport can (`twserve.upstream.h1_connection`); what it does not take — and everything
        where this returns False — `chunks` still reads, in order."""
        ...


class Upstream(Protocol):
    """Where the relay sends upstream requests: the httpcore pool (`UpstreamClient`), or an
    in-memory stand-in (`twserve.upstream.memory.MemoryUpstream`) in tests."""

    def open(
        self,
        request: UpstreamRequest,
        *,
        connect_timeout: float | None = None,
        transport: Transport = Transport.HTTP1,
    ) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send `request` over `transport` (HTTP/1.1 or HTTP/2; connecting within
        `connect_timeout`, None: the default); yield the answer once its head has arrived, or
        raise `UpstreamUnreachable`. Leaving the context (or cancelling it) closes the
        request."""
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


class UpstreamClient:
    """Pools of upstream connections shared by every request.

    HTTP/1.1 goes through `H1Pool` (twserve/upstream/h1_pool.py): ``max_connections`` bounds its
    open connections, ``max_keepalive`` its idle ones (both over all origins), and a connection
    idle for ``keepalive_expiry`` seconds is closed; the HTTP/2 pools (twserve/upstream/h2_pool.py,
    made when first needed) have the same bounds.
    A request whose transport is `Transport.HTTP2` (the provider's ``http2``) goes through
    pools of their own, over https one that offers h2 by ALPN (HTTP/1.1 where the upstream
    declines it), over http one that speaks h2 by prior knowledge, since cleartext has no
    negotiation.
    """

    def __init__(
        self,
        *,
        max_connections: int = 10_000,
        max_keepalive: int = 200,
        keepalive_expiry: float = 60.0,
        connect_timeout: float = 10.0,
        wait_secs: float = 10.0,
    ) -> None:
        self.connect_timeout = connect_timeout
        # Vertex AI access tokens, by key file (twserve/upstream/cloud_tokens.py).
        self.tokens = CloudTokens()
        self._bounds = (max_connections, max_keepalive, keepalive_expiry)
        # HTTP/1.1: the gateway's own pool (twserve/upstream/h1_pool.py).
        self.pool = H1Pool(
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            keepalive_expiry=keepalive_expiry,
            wait_secs=wait_secs,
        )
        self._h2: H2Pools | None = None

    @classmethod
    def for_pool(cls, pool: UpstreamPool) -> UpstreamClient:
        """A client with the config's ``pool`` bounds (docs/configuration.md, "`pool`")."""
        return cls(
            max_connections=pool.max_connections,
            max_keepalive=pool.max_idle,
            keepalive_expiry=pool.idle_secs,
            wait_secs=pool.wait_secs,
        )

    def apply_pool(self, pool: UpstreamPool) -> None:
        """A reload's ``pool`` section: the HTTP/1.1 pool takes every bound at its next checkout;
        the HTTP/2 pools, made with the bounds of their time, take the wait."""
        self.pool.max_connections = pool.max_connections
        self.pool.max_keepalive = pool.max_idle
        self.pool.keepalive_expiry = pool.idle_secs
        self.pool.wait_secs = pool.wait_secs
        self._bounds = (pool.max_connections, pool.max_idle, pool.idle_secs)
        if self._h2 is not None:
            self._h2.wait_secs = pool.wait_secs

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self._h2 is not None:
            await self._h2.aclose()

    def _h2_pools(self) -> H2Pools:
        if self._h2 is None:
            from twserve.upstream.h2_pool import H2Pools

            connections, keepalive, expiry = self._bounds
            self._h2 = H2Pools(
                max_connections=connections,
                max_keepalive=keepalive,
                keepalive_expiry=expiry,
                wait_secs=self.pool.wait_secs,
            )
        return self._h2

    def open(
        self,
        request: UpstreamRequest,
        *,
        connect_timeout: float | None = None,
        transport: Transport = Transport.HTTP1,
    ) -> AbstractAsyncContextManager[UpstreamAnswer]:
        """Send `request` over `transport` and yield the answer once its head has arrived.
        `connect_timeout` is the upstream's own (``providers[].connect_timeout_secs``); None
        takes the pool's. (A Responses socket is the client socket's, not a pool's: the reader
        opens it, twserve/relay/reader.py.)"""
        timeout = self.connect_timeout if connect_timeout is None else connect_timeout
        if transport is Transport.HTTP2:
            return self._h2_pools().open(request, timeout)
        return self.pool.open(request, timeout)
