"""The network streams under the HTTP/1.1 upstream pool: httpcore's anyio streams, with two
costs per request taken out.

* **One write per request.** httpcore writes a request's head and its body with a system call
  each. `GatheringStream` keeps what is written until the connection first reads (the answer's
  head), or until `GATHER_BYTES` are waiting, and writes it in one call. An HTTP/1.1 exchange
  always writes the whole request before it reads, so nothing is held back that the upstream
  could act on sooner. httpcore ignores a failed write of a request and reads on (an upstream
  may answer and close before it has read everything); a gathered write that fails when the
  read starts does the same.
* **No scope per read.** httpcore's own streams enter a deadline scope and an exception-mapping
  context for every read and write, even without a timeout (the gateway sets no read timeout:
  the attempt machine decides when silence is too long); here a read without a timeout is a
  plain ``receive``, and errors are mapped to httpcore's by ``except`` clauses.
* **A cheaper liveness check.** Before each request the pool asks every idle connection
  whether its socket is readable (an upstream that closed it, or sent something unasked for);
  httpcore builds anyio's table of socket attributes and a fresh ``poll`` object for each
  question. Here each stream keeps its own ``poll`` object, registered once: one system call
  per question and nothing else.

Only the HTTP/1.1 pool uses these streams: an HTTP/2 connection reads and writes from several
requests at once, so a write kept until the next read could wait on another request's read.
"""

from __future__ import annotations

import select
import ssl
import typing

import anyio
import anyio.abc
import httpcore
from anyio.streams.tls import TLSAttribute, TLSStream

__all__ = ["GATHER_BYTES", "GatheringBackend", "GatheringStream"]

# Past this many bytes waiting, a request's body goes out without waiting for the read.
GATHER_BYTES = 256 * 1024

_READ_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class GatheringStream(httpcore.AsyncNetworkStream):
    """One upstream connection's stream over an anyio byte stream (module docs)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._pending: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None
        self._poll: typing.Any = None
        self._closed = False
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        poll = getattr(select, "poll", None)
        if sock is not None and poll is not None:
            self._poll = poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._pending.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= GATHER_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        self._size = 0
        try:
            with anyio.fail_after(self._timeout):
                await self._stream.send(data)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except _READ_ERRORS as exc:
            raise httpcore.WriteError(exc) from exc

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            await self._flush()
        except httpcore.WriteError:
            # As httpcore does when the request itself fails to go out: read what the upstream
            # said (an early answer), or fail on the read.
            pass
        try:
            if timeout is None:
                return await self._stream.receive(max_bytes)
            with anyio.fail_after(timeout):
                return await self._stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(exc) from exc
        except _READ_ERRORS as exc:
            raise httpcore.ReadError(exc) from exc

    async def aclose(self) -> None:
        self._closed = True
        self._pending = []
        self._poll = None
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush()
        try:
            with anyio.fail_after(timeout):
                tls = await TLSStream.wrap(
                    self._stream,
                    ssl_context=ssl_context,
                    hostname=server_hostname,
                    standard_compatible=False,
                    server_side=False,
                )
        except Exception as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise httpcore.ConnectTimeout(exc) from exc
            if isinstance(exc, (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError)):
                raise httpcore.ConnectError(exc) from exc
            raise
        return GatheringStream(tls)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            if self._closed:
                return True
            if self._poll is None:
                return _readable_without_poll(self._socket())
            return bool(self._poll.poll(0))
        if info == "ssl_object":
            return self._stream.extra(TLSAttribute.ssl_object, None)
        if info == "client_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.local_address, None)
        if info == "server_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.remote_address, None)
        if info == "socket":
            return self._socket()
        return None

    def _socket(self) -> typing.Any:
        return self._stream.extra(anyio.abc.SocketAttribute.raw_socket, None)


def _readable_without_poll(sock: typing.Any) -> bool:
    if sock is None:
        return True
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


class GatheringBackend(httpcore.AsyncNetworkBackend):
    """Connections for the HTTP/1.1 pool, each a `GatheringStream`."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_tcp(host, port, local_host=local_address)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except (OSError, anyio.BrokenResourceError) as exc:
            raise httpcore.ConnectError(exc) from exc
        _set_options(stream, socket_options)
        return GatheringStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_unix(path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except (OSError, anyio.BrokenResourceError) as exc:
            raise httpcore.ConnectError(exc) from exc
        _set_options(stream, socket_options)
        return GatheringStream(stream)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def _set_options(stream: anyio.abc.ByteStream, options: typing.Iterable[typing.Any] | None) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    for option in options or ():
        if sock is not None:
            sock.setsockopt(*option)
