"""The HTTP/1.1 upstream pool's streams (twserve/upstream_net.py), against a raw loopback
server: a request goes out in one write, a kept-alive connection is reused, and one the
upstream closed while it sat idle is not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc
import httpcore
import pytest

from twserve.upstream_net import GatheringBackend

pytestmark = pytest.mark.anyio

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@dataclass
class RawServer:
    """Answers each request with a small 200; keeps what each connection's reads brought."""

    close_after_answer: bool = False
    connections: list[list[bytes]] = field(default_factory=list)
    closed: anyio.Event = field(default_factory=anyio.Event)
    port: int = 0

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        reads: list[bytes] = []
        self.connections.append(reads)
        async with stream:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered or len(buffered) < _request_size(buffered):
                    try:
                        data = await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                    reads.append(data)
                    buffered += data
                buffered = buffered[_request_size(buffered) :]
                await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                if self.close_after_answer:
                    break
        self.closed.set()


def _request_size(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


@asynccontextmanager
async def raw_server(server: RawServer) -> AsyncIterator[RawServer]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    server.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def _pool() -> httpcore.AsyncConnectionPool:
    return httpcore.AsyncConnectionPool(retries=0, network_backend=GatheringBackend())


async def _post(pool: httpcore.AsyncConnectionPool, port: int) -> bytes:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    url = f"http://127.0.0.1:{port}/v1/messages"
    response = await pool.request("POST", url, headers=headers, content=BODY)
    assert response.status == 200
    return response.content


async def test_a_request_goes_out_in_one_write_and_the_connection_is_reused() -> None:
    async with raw_server(RawServer()) as server, _pool() as pool:
        assert await _post(pool, server.port) == b"ok"
        assert await _post(pool, server.port) == b"ok"
    assert len(server.connections) == 1  # kept alive and reused
    reads = server.connections[0]
    # One write of head and body arrives in one read on loopback: each request is one read.
    assert len(reads) == 2
    assert all(r.startswith(b"POST /v1/messages") and r.endswith(BODY) for r in reads)


async def test_a_connection_the_upstream_closed_while_idle_is_not_reused() -> None:
    async with raw_server(RawServer(close_after_answer=True)) as server, _pool() as pool:
        assert await _post(pool, server.port) == b"ok"
        await server.closed.wait()
        # The pool's liveness check sees the end of file and opens a new connection, rather
        # than sending on the closed one and failing the request.
        assert await _post(pool, server.port) == b"ok"
    assert len(server.connections) == 2
