"""Each client connection, and each HTTP/2 stream's handler, runs in a plain task under its own
cancel scope (twserve.server.base): a stop cancels it as anyio cancels, shields holding, and
waits for it; a connection's bug is logged and the server serves on. Real loopback sockets."""

from __future__ import annotations

import logging
import socket
from functools import partial

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from tests.twserve.support.h2_client import RawH2
from twserve.server import http2, listener
from twserve.server.base import Request, Responder

pytestmark = pytest.mark.anyio
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _read_all(sock: socket.socket) -> bytes:
    data = b""
    with anyio.fail_after(10):
        while True:
            await anyio.wait_readable(sock)
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk


def _client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(REQUEST)
    sock.setblocking(False)
    return sock


async def test_a_stop_cancels_a_connection_and_its_shielded_cleanup_runs_to_the_end() -> None:
    began, cleaned = anyio.Event(), []

    async def forever(request: Request, responder: Responder) -> None:
        began.set()
        try:
            await anyio.sleep(60)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)  # as the request row's write
                cleaned.append(request.path)

    server = listener.Server(forever)
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(forever, server=server, task_status=task_status)
        )
        sock = _client(port)
        with anyio.fail_after(5):
            await began.wait()
        with anyio.fail_after(5):
            tg.cancel_scope.cancel()
    # The stop returned only once the connection's task had ended, its cleanup done.
    assert cleaned == ["/"] and server.open_count == 0 and not server.connections
    await _read_all(sock)  # closed by the server
    sock.close()


async def test_a_connection_s_bug_is_logged_and_the_next_client_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def ok(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-length", b"2")])
        await responder.send(b"ok")
        await responder.end()

    class Buggy(listener.Server):
        calls = 0

        async def _run(self, stream: anyio.abc.SocketStream) -> None:
            Buggy.calls += 1
            if Buggy.calls == 1:
                await stream.aclose()
                self.open_count -= 1
                raise RuntimeError("a bug in the connection's task")
            await super()._run(stream)

    server = Buggy(ok)
    caplog.set_level(logging.ERROR, logger="twserve.server.listener")
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(ok, server=server, task_status=task_status)
        )
        first = _client(port)
        assert await _read_all(first) == b""
        first.close()
        second = _client(port)
        assert (await _read_all(second)).endswith(b"ok")
        second.close()
        tg.cancel_scope.cancel()
    assert [r.getMessage() for r in caplog.records] == ["connection failed"]
    assert "a bug in the connection's task" in caplog.text


class _Bug(BaseException):
    """Escapes the stream's own handling, which takes only `Exception`s from the handler."""


def test_an_http2_stream_task_s_bug_ends_that_connection_and_the_next_one_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        if request.path == "/bug":
            raise _Bug("a bug past the stream's handling")
        await responder.start(200, [(b"content-length", b"2")])
        await responder.send(b"ok")
        await responder.end()

    caplog.set_level(logging.ERROR, logger="twserve.server.http2")
    with start_blocking_portal() as portal:
        server = listener.Server(handler, switches=(http2.switch,))
        fut, port = portal.start_task(partial(listener.serve, handler, port=0, server=server))
        try:
            first = RawH2(port)
            try:
                first.request("/bug", method="GET")
                first.wait_closed()  # the connection ends with every stream on it
            finally:
                first.close()
            second = RawH2(port)
            try:
                answer = second.finish(second.request("/ok", method="GET"))
                assert answer.status == 200 and bytes(answer.body) == b"ok"
            finally:
                second.close()
        finally:
            fut.cancel()
    failed = [r for r in caplog.records if "HTTP/2 connection from" in r.getMessage()]
    assert len(failed) == 1 and "a bug past the stream's handling" in caplog.text
