"""The lighter protocol under an accepted client's anyio stream (twserve/server/_anyio_fastpath.py).

anyio's socket stream reads and writes through its protocol's events and read queue; the
server's streams run on `LeanProtocol`, where those are lists. These tests hold it to what
anyio's own protocol does: the same fields after a connection is made, and the same behaviour
through anyio's stream on real loopback sockets (reads split to ``max_bytes``, end of file, a
reset, a write that waits for a client that does not read, a wait that is cancelled). On the
standard asyncio loop and on uvloop (the gateway's default).
"""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

import twserve.server._anyio_fastpath as fastpath
from tests.twserve.support.loops import BOTH_LOOPS

# anyio's own protocol, as the module under test found it.
StreamProtocol: type[asyncio.Protocol] = fastpath._PROTOCOL_TYPE  # type: ignore[assignment]

pytestmark = pytest.mark.anyio


@pytest.fixture(params=BOTH_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@asynccontextmanager
async def _accepted() -> AsyncIterator[tuple[anyio.abc.SocketStream, socket.socket]]:
    """A loopback connection: the server side through `accepted_stream`, the client a plain
    blocking-free socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    client.setblocking(False)
    sock, _ = listener.accept()
    listener.close()
    sock.setblocking(False)
    stream = await fastpath.accepted_stream(sock)
    try:
        yield stream, client
    finally:
        await stream.aclose()
        client.close()


async def test_the_stream_is_anyios_own_on_the_lean_protocol() -> None:
    async with _accepted() as (stream, _client):
        assert type(stream) is fastpath._STREAM_TYPE
        assert isinstance(stream._protocol, fastpath.LeanProtocol)  # type: ignore[attr-defined]
        assert isinstance(stream._protocol, StreamProtocol)  # type: ignore[attr-defined]
        assert fastpath.raw_socket(stream) is not None  # the other lanes find it as before


async def test_it_sets_every_field_anyios_protocol_sets() -> None:
    # Should anyio give its protocol another field, the lean one must set it too.
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        plain_t, plain = await loop.create_connection(StreamProtocol, sock=a)
        lean_t, lean = await loop.create_connection(fastpath._LEAN_TYPE, sock=c)  # type: ignore[arg-type]
        assert set(vars(lean)) == set(vars(plain))
        assert lean.write_event.is_set() and not lean.read_event.is_set()
        assert lean_t.get_write_buffer_limits() == plain_t.get_write_buffer_limits()
        plain_t.close()
        lean_t.close()
    finally:
        for s in (b, d):
            s.close()


async def test_reads_through_anyios_stream_as_before() -> None:
    loop = asyncio.get_running_loop()
    async with _accepted() as (stream, client):
        await loop.sock_sendall(client, b"hello world")
        assert await stream.receive(5) == b"hello"  # the rest goes back to the queue's head
        await loop.sock_sendall(client, b"!")
        with anyio.fail_after(5):
            got = b""
            while got != b" world!":
                got += await stream.receive()
        client.shutdown(socket.SHUT_WR)
        with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
            await stream.receive()


async def test_a_reset_is_a_broken_stream() -> None:
    async with _accepted() as (stream, client):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()
        with anyio.fail_after(5), pytest.raises((anyio.BrokenResourceError, anyio.EndOfStream)):
            while True:
                await stream.receive()


async def test_a_write_waits_for_a_client_that_does_not_read() -> None:
    loop = asyncio.get_running_loop()
    async with _accepted() as (stream, client):
        piece = b"x" * 65536
        with anyio.move_on_after(1.0) as stalled:
            while True:
                await stream.send(piece)
        assert stalled.cancelled_caught  # a send waited on the protocol's write flag
        protocol = stream._protocol  # type: ignore[attr-defined]
        assert not protocol.write_event.is_set()

        async def drain() -> None:
            while await loop.sock_recv(client, 1 << 20):
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            with anyio.fail_after(10):
                await stream.send(b"after")  # the flag is set again once the client reads
            tg.cancel_scope.cancel()
        assert protocol.write_event.is_set()


async def test_flag_wakes_every_waiter_and_forgets_a_cancelled_one() -> None:
    flag = fastpath.Flag()
    woken: list[int] = []

    async def waiter(n: int) -> None:
        assert await flag.wait()
        woken.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, 1)
        tg.start_soon(waiter, 2)
        with anyio.move_on_after(0.01):
            await flag.wait()  # cancelled: it leaves the waiters' list
        await anyio.sleep(0.01)
        assert flag._waiters is not None and len(flag._waiters) == 2
        flag.set()
        flag.set()  # a second set changes nothing
    assert sorted(woken) == [1, 2]
    assert flag.is_set() and flag._waiters is None
    assert await flag.wait()  # a set flag does not wait
    flag.clear()
    assert not flag.is_set()


def test_read_queue_is_a_deque_to_anyio() -> None:
    queue = fastpath.ReadQueue()
    assert not queue
    queue.append(b"b")
    queue.append(b"c")
    queue.appendleft(b"a")
    assert [queue.popleft(), queue.popleft(), queue.popleft()] == [b"a", b"b", b"c"]
    with pytest.raises(IndexError):  # what anyio's receive catches on an empty queue
        queue.popleft()


async def test_an_idle_connection_holds_less_than_on_anyios_protocol() -> None:
    loop = asyncio.get_running_loop()
    pairs = [socket.socketpair() for _ in range(100)]
    try:
        sizes = {}
        for name, factory in (("anyio", StreamProtocol), ("lean", fastpath._LEAN_TYPE)):
            tracemalloc.start()
            protocols = []
            for a, _ in pairs[:50] if name == "anyio" else pairs[50:]:
                _t, protocol = await loop.create_connection(factory, sock=a)  # type: ignore[arg-type]
                protocols.append((_t, protocol))
            sizes[name] = tracemalloc.get_traced_memory()[0] / 50
            tracemalloc.stop()
            for t, _ in protocols:
                t.close()
        assert sizes["lean"] < sizes["anyio"] - 1500, sizes
    finally:
        for a, b in pairs:
            a.close()
            b.close()
