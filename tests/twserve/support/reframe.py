"""An upstream that answers like a real API server: the mock's answers, re-framed on the wire.

The mock upstream speaks through twserve's own HTTP/1.1 server, which always writes lower-case
header names and frames every answer the same way. Real APIs differ: they spell headers
``Content-Length``, frame whole answers by length, by chunks, or by closing the connection, and
send headers of their own. `Reframer` sits between the gateway and a mock: it forwards each
request to the mock, reads the whole answer, and writes it back raw with the framing chosen:

* ``length``: ``Content-Length: n``;
* ``chunked``: ``Transfer-Encoding: chunked`` (the body in two chunks);
* ``close``: neither, ``Connection: close``, the body ends when the connection does.

Whole JSON answers are indented, as OpenAI's and Google's servers send them, so that an answer
the gateway re-encodes (the model renamed) changes length on its way through.

Header names go out in the capitalisation real servers use, and `extra_headers` are added to
every answer (what an upstream sends that a client should never see).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import anyio
import anyio.abc
import h11
import httpcore
from anyio.from_thread import start_blocking_portal

FRAMINGS = ("length", "chunked", "close")


@dataclass
class Reframer:
    framing: str
    target_port: int = 0
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    port: int = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener, httpcore.AsyncConnectionPool(retries=0) as pool:
            task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
            await listener.serve(partial(self._one, pool))

    async def _one(
        self, pool: httpcore.AsyncConnectionPool, stream: anyio.abc.SocketStream
    ) -> None:
        async with stream:
            leftover = b""
            while True:
                # A fresh parser per request: the answer is written raw, not through h11.
                conn = h11.Connection(h11.SERVER)
                if leftover:  # (receive_data of nothing means end of input to h11)
                    conn.receive_data(leftover)
                request, body = await _read_request(conn, stream)
                leftover = conn.trailing_data[0]
                if request is None:
                    return
                resp = await pool.request(
                    request.method,
                    f"http://127.0.0.1:{self.target_port}".encode() + request.target,
                    headers=[(k, v) for k, v in request.headers if k != b"host"],
                    content=body,
                )
                await stream.send(self._encode(resp.status, list(resp.headers), resp.content))
                if self.framing == "close":
                    return

    def _encode(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
        if body[:1] == b"{":
            body = json.dumps(json.loads(body), indent=2).encode()
        kept = [
            (_title(k), v)
            for k, v in headers
            if k.lower() not in (b"content-length", b"transfer-encoding", b"connection", b"date")
        ]
        kept += self.extra_headers
        if self.framing == "length":
            kept.append((b"Content-Length", str(len(body)).encode()))
            payload = body
        elif self.framing == "chunked":
            kept.append((b"Transfer-Encoding", b"chunked"))
            half = len(body) // 2
            payload = b"".join(
                b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part
            )
            payload += b"0\r\n\r\n"
        else:
            kept.append((b"Connection", b"close"))
            payload = body
        head = b"HTTP/1.1 %d X\r\n" % status
        head += b"".join(k + b": " + v + b"\r\n" for k, v in kept)
        return head + b"\r\n" + payload


def _title(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


async def _read_request(
    conn: h11.Connection, stream: anyio.abc.SocketStream
) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    parts: list[bytes] = []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                conn.receive_data(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return None, b""
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            parts.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return request, b"".join(parts)
        else:
            return None, b""


@contextmanager
def reframer(
    framing: str, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> Iterator[Reframer]:
    """A running `Reframer`; set `target_port` to the mock's port before the first request."""
    with start_blocking_portal() as portal:
        proxy = Reframer(framing, extra_headers=list(extra_headers or ()))
        future, proxy.port = portal.start_task(proxy.serve)
        try:
            yield proxy
        finally:
            future.cancel()
