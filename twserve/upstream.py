"""Upstream calls over httpcore: one shared connection pool, streamed answers, auth per protocol.

The relay opens an answer with `UpstreamClient.open` and reads it chunk by chunk as it arrives;
nothing buffers a whole answer. httpcore's exceptions are mapped here, at the boundary, to two
errors named by when they happened: `UpstreamUnreachable` (no response head: refused, reset,
TLS, timeout — carries the `TransportFault` the failure classifier takes) and `UpstreamBroken`
(the body broke off after the head). Cancelling the caller's anyio scope closes the upstream
connection, which is how a client that leaves stops the upstream's work too.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpcore

from twproto.dialect import Dialect
from twproto.failures import TransportFault

__all__ = [
    "UpstreamBroken",
    "UpstreamClient",
    "UpstreamResponse",
    "UpstreamUnreachable",
    "auth_headers",
    "forwardable_headers",
]

# Headers that describe one hop, or that the gateway sets itself, never forwarded as they came.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"accept-encoding",
        b"cookie",
        # the client's own credentials for the gateway
        b"authorization",
        b"x-api-key",
        b"x-goog-api-key",
    }
)

# Headers a same-format upstream needs to see to behave as the client expects (beta features,
# API versions, SDK identification). Cross-format requests carry none of these.
_PROTOCOL_PREFIXES: dict[Dialect, tuple[bytes, ...]] = {
    Dialect.ANTHROPIC: (b"anthropic-", b"x-stainless-", b"x-app", b"user-agent", b"x-claude-"),
    Dialect.OPENAI_CHAT: (b"openai-", b"x-stainless-", b"user-agent"),
    Dialect.OPENAI_RESPONSES: (
        b"openai-",
        b"x-stainless-",
        b"user-agent",
        b"originator",
        b"session-id",
        b"session_id",
        b"thread-id",
        b"x-client-request-id",
        b"x-codex-",
        b"chatgpt-account-id",
    ),
    Dialect.GEMINI: (b"x-goog-", b"user-agent"),
}


def forwardable_headers(
    headers: list[tuple[bytes, bytes]],
    dialect: Dialect,
    *,
    same_format: bool,
    mock_headers: bool = False,
) -> list[tuple[bytes, bytes]]:
    """The client's headers that go upstream: protocol headers for a same-format upstream, and
    the mock upstream's ``x-mock-*`` only where the provider sets ``forward_mock_headers``."""
    if not same_format and not mock_headers:
        return []
    prefixes = _PROTOCOL_PREFIXES[dialect] if same_format else ()
    out = []
    for name, value in headers:
        if name in _HOP_BY_HOP or name == b"content-type":
            continue
        if name.startswith(prefixes) or (mock_headers and name.startswith(b"x-mock-")):
            out.append((name, value))
    return out


def auth_headers(dialect: Dialect, key: str) -> list[tuple[bytes, bytes]]:
    """The credential header each API expects (SPEC §3.2)."""
    if not key:
        return []
    raw = key.encode()
    if dialect is Dialect.ANTHROPIC:
        return [(b"x-api-key", raw)]
    if dialect is Dialect.GEMINI:
        return [(b"x-goog-api-key", raw)]
    return [(b"authorization", b"Bearer " + raw)]


class UpstreamUnreachable(Exception):
    """No response head arrived: the request may not have reached the upstream at all."""

    def __init__(self, fault: TransportFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault
        self.detail = detail


class UpstreamBroken(Exception):
    """The answer's body broke off after its head."""


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    _response: httpcore.Response

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        try:
            async for chunk in self._response.aiter_stream():
                if chunk:
                    yield chunk
        except (httpcore.ReadError, httpcore.RemoteProtocolError, httpcore.ReadTimeout) as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from exc

    async def read_prefix(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (error bodies are only ever read this far)."""
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in self.chunks():
                parts.append(chunk)
                size += len(chunk)
                if size >= limit:
                    break
        except UpstreamBroken:
            pass
        return b"".join(parts)[:limit]


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
    ) -> None:
        self.connect_timeout = connect_timeout
        self.http2_for = http2_for

        def pool(*, http1: bool = True, http2: bool = False) -> httpcore.AsyncConnectionPool:
            return httpcore.AsyncConnectionPool(
                max_connections=max_connections,
                max_keepalive_connections=max_keepalive,
                keepalive_expiry=keepalive_expiry,
                retries=0,
                http1=http1,
                http2=http2,
            )

        self.pool = pool()
        self.h2_pool = pool(http2=True)
        self.h2c_pool = pool(http1=False, http2=True)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.h2_pool.aclose()
        await self.h2c_pool.aclose()

    def _pool_for(self, url: str) -> httpcore.AsyncConnectionPool:
        if self.http2_for is None or not self.http2_for(url):
            return self.pool
        return self.h2_pool if url.startswith("https:") else self.h2c_pool

    @asynccontextmanager
    async def open(
        self,
        method: str,
        url: str,
        *,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        read_timeout: float | None = None,
        extra: Mapping[str, object] | None = None,
        connect_timeout: float | None = None,
    ) -> AsyncIterator[UpstreamResponse]:
        """Send the request and yield the response once its head has arrived.

        `connect_timeout` is the upstream's own (``providers[].connect_timeout_secs``); None
        takes the pool's."""
        timeouts: dict[str, float | None] = {
            "connect": self.connect_timeout if connect_timeout is None else connect_timeout,
            "read": read_timeout,
            "write": 60.0,
            "pool": None,
        }
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        try:
            cm = self._pool_for(url).stream(
                method.encode(),
                url.encode(),
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
            yield UpstreamResponse(
                status=response.status, headers=list(response.headers), _response=response
            )
        finally:
            # Shielded: when the attempt is cancelled (the client left, a slow start, an idle
            # timeout) the connection must still be closed, not left for the collector.
            with anyio.CancelScope(shield=True):
                await cm.__aexit__(None, None, None)
