"""The network streams under the HTTP/1.1 upstream pool: httpcore's anyio streams, with two
costs per request taken out.

* **One write per request.** httpcore writes a request's head and its body with a system call
  each. `GatheringStream` keeps what is written until the connection first reads (the answer's
  head), or until `GATHER_BYTES` are waiting, and writes it in one call. An HTTP/1.1 exchange
  always writes the whole request before it reads, so nothing is held back that the upstream
  could act on sooner. httpcore ignores a failed write of a request and reads on (an upstream
  may answer and close before it has read everything); a gathered write that fails when the
  read starts does the same.
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
import typing

import httpcore

__all__ = ["GATHER_BYTES", "GatheringBackend", "GatheringStream"]

# Past this many bytes waiting, a request's body goes out without waiting for the read.
GATHER_BYTES = 256 * 1024


class GatheringStream(httpcore.AsyncNetworkStream):
    """One upstream connection's stream (module docs)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._pending: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None
        self._poll: typing.Any = None
        self._closed = False
        sock = inner.get_extra_info("socket")
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
        await self._inner.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            await self._flush()
        except httpcore.WriteError:
            # As httpcore does when the request itself fails to go out: read what the upstream
            # said (an early answer), or fail on the read.
            pass
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._closed = True
        self._pending = []
        self._poll = None
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush()
        return GatheringStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            if self._closed or self._poll is None:
                return self._closed or self._inner.get_extra_info(info)
            return bool(self._poll.poll(0))
        return self._inner.get_extra_info(info)


class GatheringBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, handing out `GatheringStream` connections."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return GatheringStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return GatheringStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
