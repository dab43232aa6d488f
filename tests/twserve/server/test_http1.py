"""The HTTP/1.1 transport on a real loopback socket, driven with raw bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from twserve.server import base, listener
from twserve.server.base import Request, Responder

pytestmark = pytest.mark.anyio

LIMITS = base.ServerLimits(
    max_header_bytes=8 * 1024,
    max_body_bytes=64 * 1024,
    head_timeout=0.5,
    body_timeout=0.5,
    keepalive_timeout=2.0,
)


class Recorder:
    def __init__(self) -> None:
        self.cancelled = anyio.Event()
        self.seen: list[Request] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.seen.append(request)
        if request.path == "/stream":
            await responder.start(200, [(b"content-type", b"text/event-stream")])
            for i in range(3):
                await responder.send(b"data: %d\n\n" % i)
            await responder.end()
        elif request.path == "/hang":
            await responder.start(200, [(b"content-type", b"text/event-stream")])
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled.set()
        else:
            body = b"echo:" + request.body
            await responder.start(200, [(b"content-length", str(len(body)).encode())])
            await responder.send(body)
            await responder.end()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, Recorder]]:
    rec = Recorder()
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(rec, port=0, limits=LIMITS, task_status=task_status)
        )
        yield port, rec
        tg.cancel_scope.cancel()


async def exchange(port: int, data: bytes, *, read_until_close: bool = True) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(data)
        out = b""
        with anyio.move_on_after(3):
            while True:
                try:
                    chunk = await sock.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
                out += chunk
                if not read_until_close and b"\r\n\r\n" in out:
                    break
        return out


async def test_keep_alive_serves_two_requests_on_one_connection(server) -> None:
    port, rec = server
    req = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(req)
        first = await sock.receive()
        await sock.send(req.replace(b"hi", b"yo"))
        second = await sock.receive()
    assert first.endswith(b"echo:hi") and second.endswith(b"echo:yo")
    assert first.startswith(b"HTTP/1.1 200")
    assert [r.body for r in rec.seen] == [b"hi", b"yo"]


async def test_streamed_answer_is_chunked(server) -> None:
    port, _ = server
    out = await exchange(port, b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert b"transfer-encoding: chunked" in out.lower()
    assert b"data: 0\n\n" in out and b"data: 2\n\n" in out and out.endswith(b"0\r\n\r\n")


async def test_streamed_pieces_are_framed_one_chunk_each(server) -> None:
    # The server frames a chunked answer's pieces itself (not through h11): each piece is one
    # chunk, hex length first, and the terminator follows the last.
    port, _ = server
    out = await exchange(port, b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    body = out.split(b"\r\n\r\n", 1)[1]
    assert body == b"9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"


async def test_http10_client_gets_the_stream_unframed(server) -> None:
    port, _ = server
    out = await exchange(port, b"GET /stream HTTP/1.0\r\nhost: x\r\n\r\n")
    head, body = out.split(b"\r\n\r\n", 1)
    assert b"transfer-encoding" not in head.lower()
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_query_string_is_split_off(server) -> None:
    port, rec = server
    await exchange(
        port,
        b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: x\r\ncontent-length: 0"
        b"\r\nconnection: close\r\n\r\n",
    )
    assert rec.seen[0].path == "/v1/messages" and rec.seen[0].query == "beta=true"


async def test_header_block_arriving_in_one_read_is_still_bounded(server) -> None:
    port, rec = server
    big = b"x-big: " + b"a" * 20_000 + b"\r\n"
    out = await exchange(port, b"GET /a HTTP/1.1\r\nhost: x\r\n" + big + b"\r\n")
    assert out.startswith(b"HTTP/1.1 431")
    assert rec.seen == []
    # and the server keeps serving
    again = await exchange(port, b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert again.startswith(b"HTTP/1.1 200")


async def test_body_over_the_limit_is_refused_up_front(server) -> None:
    port, rec = server
    out = await exchange(port, b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 999999\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413") and rec.seen == []


async def test_chunked_body_over_the_limit_is_refused(server) -> None:
    port, rec = server
    chunk = b"%x\r\n%s\r\n" % (40_000, b"z" * 40_000)
    out = await exchange(
        port, b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunk * 3
    )
    assert out.startswith(b"HTTP/1.1 413") and rec.seen == []


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\n: novalue\r\n\r\n",
        b"NOT A REQUEST\r\n\r\n",
        b"POST /a HTTP/1.1\r\ncontent-length: nope\r\n\r\n",
    ],
)
async def test_garbage_gets_400_and_server_survives(server, garbage: bytes) -> None:
    port, _ = server
    out = await exchange(port, garbage)
    assert out.startswith(b"HTTP/1.1 400") or out == b""
    again = await exchange(port, b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert again.startswith(b"HTTP/1.1 200")


async def test_slow_client_head_times_out(server) -> None:
    port, _ = server
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(b"GET /a HTTP/1.1\r\nhost:")
        out = b""
        with anyio.fail_after(3):
            while True:
                try:
                    out += await sock.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    assert out.startswith(b"HTTP/1.1 408")


async def test_truncated_body_is_dropped_without_calling_the_handler(server) -> None:
    port, rec = server
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nshort")
        await sock.send_eof()
        with anyio.move_on_after(2):
            try:
                await sock.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    assert rec.seen == []


async def test_client_leaving_cancels_the_handler(server) -> None:
    port, rec = server
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        await sock.receive()
    with anyio.fail_after(3):
        await rec.cancelled.wait()


async def test_an_answer_written_in_one_turn_reaches_the_client_in_one_write(server) -> None:
    # /stream writes its head, three pieces and its end without waiting in between: they go
    # to the socket in one system call, so on loopback the client's first read has them all.
    port, _ = server
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        first = await sock.receive()
    assert first.startswith(b"HTTP/1.1 200")
    assert b"data: 0\n\n" in first and first.endswith(b"0\r\n\r\n")


async def test_what_a_handler_wrote_before_it_aborts_reaches_the_client() -> None:
    async def handler(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-type", b"text/event-stream")])
        await responder.send(b"data: partial\n\n")
        await responder.abort()

    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(
                handler, port=0, limits=LIMITS, task_status=task_status
            )
        )
        out = await exchange(port, b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        tg.cancel_scope.cancel()
    assert out.startswith(b"HTTP/1.1 200") and b"data: partial\n\n" in out
    assert not out.endswith(b"0\r\n\r\n")  # cut off, not ended


async def test_a_request_sent_while_the_last_is_answered_is_served_next() -> None:
    # Bytes that come while a handler runs (a pipelined request) are kept for the connection's
    # next read, not taken for a client that left.
    release = anyio.Event()
    paths: list[str] = []

    async def handler(request: Request, responder: Responder) -> None:
        paths.append(request.path)
        if request.path == "/first":
            await release.wait()
        body = request.path.encode()
        await responder.start(200, [(b"content-length", str(len(body)).encode())])
        await responder.send(body)
        await responder.end()

    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(
                handler, port=0, limits=LIMITS, task_status=task_status
            )
        )
        async with await anyio.connect_tcp("127.0.0.1", port) as sock:
            await sock.send(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
            with anyio.fail_after(3):
                while not paths:
                    await anyio.sleep(0.01)
            await sock.send(b"GET /second HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            await anyio.sleep(0.05)
            assert paths == ["/first"]  # still running, not cancelled
            release.set()
            out = b""
            with anyio.fail_after(3):
                while out.count(b"HTTP/1.1 200") < 2 or not out.endswith(b"/second"):
                    out += await sock.receive()
        tg.cancel_scope.cancel()
    assert paths == ["/first", "/second"]
    assert out.index(b"/first") < out.index(b"/second")
