"""Opening a WebSocket to an upstream: TCP (TLS for ``wss``) with anyio, the handshake with wsproto.

Both upstream sockets the gateway opens go through `dial`: a Realtime upstream's
(twserve/gateway/realtime.py) and an OpenAI Responses upstream's own socket
(twserve/upstream/responses_socket.py). `dial` returns the open connection (`Dialed`), or the
upstream's refusal of the upgrade as the HTTP answer it is (`Refused`: status, headers and the start
of its body), or raises `DialFailed` with the `TransportFault` the failure classifier takes when no
answer came at all.

``wss`` is checked against the system's certificate store (`ssl.create_default_context`, which
also honours ``SSL_CERT_FILE``); no compression extension is offered, so no frame can inflate
past the size limits the callers count.
"""

from __future__ import annotations

import socket
import ssl
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, RejectData
from wsproto.events import Request as WSRequest
from wsproto.utilities import RemoteProtocolError

from twproto.failures import TransportFault

__all__ = ["DialFailed", "Dialed", "Refused", "dial"]

# The most one read takes from the socket.
READ_SIZE = 65536

Headers = list[tuple[bytes, bytes]]

# A refusal's body is only read this far (error bodies are small).
REFUSAL_BODY_LIMIT = 64 * 1024
# Request headers that describe an HTTP body, not a WebSocket upgrade.
_BODY_HEADERS = frozenset({b"content-type", b"content-length", b"accept-encoding", b"host"})


@dataclass(slots=True)
class Dialed:
    """An open upstream socket: its byte stream and wsproto connection (state OPEN). Bytes that
    came with the handshake's answer are already fed to `ws`."""

    stream: anyio.abc.ByteStream
    ws: WSConnection


@dataclass(frozen=True, slots=True)
class Refused:
    """The upstream answered the upgrade with an HTTP status instead of switching."""

    status: int
    headers: Headers
    body: bytes


class DialFailed(Exception):
    """No answer to the upgrade: the socket could not be opened or broke before the answer."""

    def __init__(self, fault: TransportFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault
        self.detail = detail


def _fault(exc: BaseException) -> TransportFault:
    if isinstance(exc, TimeoutError):
        return TransportFault.CONNECT_TIMEOUT
    if isinstance(exc, ssl.SSLError):
        return TransportFault.TLS
    if isinstance(exc, socket.gaierror):
        return TransportFault.DNS
    if isinstance(exc, OSError) and "ssl" in str(exc).lower():
        return TransportFault.TLS
    return TransportFault.CONNECT_REFUSED


async def _connect(host: str, port: int, tls: bool) -> anyio.abc.ByteStream:
    if tls:
        return await anyio.connect_tcp(
            host,
            port,
            tls=True,
            ssl_context=ssl.create_default_context(),
            tls_standard_compatible=False,
        )
    return await anyio.connect_tcp(host, port)


async def dial(url: str, headers: Headers, timeout: float) -> Dialed | Refused:
    """Open the WebSocket at `url` (``ws://`` or ``wss://``) with `headers`, within `timeout`
    seconds for the connection, TLS and the handshake together."""
    parts = urlsplit(url)
    tls = parts.scheme == "wss"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    extra = [(k, v) for k, v in headers if k.lower() not in _BODY_HEADERS]
    try:
        with anyio.fail_after(timeout):
            stream = await _connect(host, port, tls)
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        raise DialFailed(_fault(exc), str(exc) or type(exc).__name__) from exc
    try:
        with anyio.fail_after(timeout):
            result = await _handshake(stream, parts.netloc, target, extra)
        if isinstance(result, Refused):
            with anyio.CancelScope(shield=True), suppress(Exception):
                await stream.aclose()
        return result
    except BaseException as exc:
        with anyio.CancelScope(shield=True), suppress(Exception):
            await stream.aclose()
        if isinstance(exc, TimeoutError):
            raise DialFailed(TransportFault.RESET_BEFORE_HEAD, "no answer to the upgrade") from exc
        if isinstance(
            exc,
            OSError
            | RemoteProtocolError
            | anyio.EndOfStream
            | anyio.BrokenResourceError
            | anyio.ClosedResourceError,
        ):
            raise DialFailed(
                TransportFault.RESET_BEFORE_HEAD, str(exc) or type(exc).__name__
            ) from exc
        raise


async def _handshake(
    stream: anyio.abc.ByteStream, host: str, target: str, headers: Headers
) -> Dialed | Refused:
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send(ws.send(WSRequest(host=host, target=target, extra_headers=headers)))
    refused: RejectConnection | None = None
    body = bytearray()
    while True:
        try:
            data = await stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            if refused is not None:  # a refusal whose body ends with the connection
                return Refused(refused.status_code, list(refused.headers), bytes(body))
            raise
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return Dialed(stream=stream, ws=ws)
            if isinstance(event, RejectConnection):
                refused = event
                if not event.has_body:
                    return Refused(event.status_code, list(event.headers), b"")
            elif isinstance(event, RejectData) and refused is not None:
                if len(body) < REFUSAL_BODY_LIMIT:
                    body += event.data[: REFUSAL_BODY_LIMIT - len(body)]
                if event.body_finished:
                    return Refused(refused.status_code, list(refused.headers), bytes(body))
