"""The HTTP/2 connection fed bytes in memory (tests/twserve/support/memory_wire.py): framing,
limits and the client-gone rules, without a socket.

The HTTP/1.1 connection reads the preface and hands itself to HTTP/2 through its switch, as on
a socket; the client is h2's own state machine, its bytes fed to the memory transport and the
server's read back from it. The socket tests (test_http2.py, test_transport_hardening.py)
stay: they are the real wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from tests.twserve.support.memory_wire import Wire
from twserve.server import http2
from twserve.server.base import Handler, Request, Responder, ServerLimits

pytestmark = pytest.mark.anyio

LIMITS = ServerLimits(max_body_bytes=1000, head_timeout=2, body_timeout=1, keepalive_timeout=5)
H2 = http2.Http2Limits(max_concurrent_streams=4, max_resets=10, reset_window_secs=10)


class Client:
    """h2's client state machine at the far end of a memory wire."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.events: list[h2.events.Event] = []
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.wire.feed(data)

    def read(self) -> None:
        data = self.wire.transport.take()
        if data:
            self.events += self.h2.receive_data(data)
            self.flush()

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        def done() -> bool:
            self.read()
            return condition()

        await self.wire.transport.wait(done, timeout)

    def request(
        self,
        path: str,
        body: bytes = b"",
        *,
        method: str = "GET",
        headers: int = 0,
        end: bool = True,
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"http"),
            (b":authority", b"gateway.test"),
            (b":path", path.encode()),
            *((b"x-h%d" % i, b"v") for i in range(headers)),
        ]
        self.h2.send_headers(sid, fields, end_stream=end and not body)
        if body:
            self.h2.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def of(self, sid: int, kind: type[h2.events.Event]) -> list[h2.events.Event]:
        return [e for e in self.events if isinstance(e, kind) and getattr(e, "stream_id", 0) == sid]

    def status(self, sid: int) -> int | None:
        for event in self.of(sid, h2.events.ResponseReceived):
            return int(dict(event.headers or ())[b":status"])  # type: ignore[attr-defined]
        return None

    def body(self, sid: int) -> bytes:
        return b"".join(e.data or b"" for e in self.of(sid, h2.events.DataReceived))  # type: ignore[attr-defined]

    def ended(self, sid: int) -> bool:
        return bool(self.of(sid, h2.events.StreamEnded))

    def reset_code(self, sid: int) -> int | None:
        for event in self.of(sid, h2.events.StreamReset):
            return int(event.error_code or 0)  # type: ignore[attr-defined]
        return None

    def goaway(self) -> h2.events.ConnectionTerminated | None:
        found = [e for e in self.events if isinstance(e, h2.events.ConnectionTerminated)]
        return found[-1] if found else None


async def echo(request: Request, responder: Responder) -> None:
    await responder.start(200, [(b"content-type", b"text/plain")])
    await responder.send(f"{request.method} {request.path}:".encode() + request.body)
    await responder.end()


@asynccontextmanager
async def h2_wire(handler: Handler = echo, limits: http2.Http2Limits = H2) -> AsyncIterator[Client]:
    async with anyio.create_task_group() as tg:
        wire = Wire.open()
        wire.serve(
            tg,
            handler,
            limits=LIMITS,
            switches=[lambda request: http2.switch(request, limits)],
        )
        client = Client(wire)
        yield client
        tg.cancel_scope.cancel()


async def test_streams_are_answered_each_on_its_own() -> None:
    async with h2_wire() as client:
        a = client.request("/a")
        b = client.request("/b", b"payload", method="POST")
        await client.until(lambda: client.ended(a) and client.ended(b))
        assert (client.status(a), client.body(a)) == (200, b"GET /a:")
        assert (client.status(b), client.body(b)) == (200, b"POST /b:payload")


async def test_the_server_offers_its_limits_in_its_settings() -> None:
    async with h2_wire() as client:
        await client.until(lambda: client.h2.remote_settings.max_concurrent_streams == 4)
        assert client.h2.remote_settings.enable_push == 0


async def test_a_head_over_the_header_limit_is_431_on_its_stream_only() -> None:
    async with h2_wire() as client:
        big = client.request("/big", headers=LIMITS.max_headers + 1)
        small = client.request("/small")
        await client.until(lambda: client.ended(big) and client.ended(small))
        assert client.status(big) == 431 and b"gw.request.headers_too_large" in client.body(big)
        assert client.status(small) == 200


async def test_a_body_over_the_limit_is_413() -> None:
    async with h2_wire() as client:
        sid = client.request("/b", b"x" * (LIMITS.max_body_bytes + 1), method="POST")
        await client.until(lambda: client.ended(sid) or client.reset_code(sid) is not None)
        assert client.status(sid) == 413


async def test_a_body_not_done_in_time_is_408() -> None:
    async with h2_wire() as client:
        sid = client.request("/slow", b"part", method="POST", end=False)
        await client.until(lambda: client.ended(sid) or client.reset_code(sid) is not None)
        assert client.status(sid) == 408


async def test_rapid_resets_end_the_connection_with_enhance_your_calm() -> None:
    started = anyio.Event()

    async def slow(request: Request, responder: Responder) -> None:
        started.set()
        await anyio.sleep(30)

    async with h2_wire(slow) as client:
        for _ in range(H2.max_resets + 2):
            sid = client.request("/r")
            client.h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            client.flush()
        await client.until(lambda: client.goaway() is not None)
        goaway = client.goaway()
        assert goaway is not None
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


async def test_a_client_that_leaves_cancels_its_handlers() -> None:
    running = anyio.Event()
    ended: list[str] = []

    async def streaming(request: Request, responder: Responder) -> None:
        await responder.start(200, [])
        running.set()
        try:
            while True:
                await responder.send(b".")
                await anyio.sleep(0.01)
        except anyio.get_cancelled_exc_class():
            ended.append("cancelled")
            raise
        except Exception as exc:
            ended.append(type(exc).__name__)
            raise

    async with h2_wire(streaming) as client:
        client.request("/s")
        with anyio.fail_after(5):
            await running.wait()
        client.wire.transport.reset()
        await client.wire.closed()
    assert ended and ended[0] in ("cancelled", "ClientGone")


async def test_an_idle_connection_closed_for_a_new_client_says_so() -> None:
    async with h2_wire() as client:
        sid = client.request("/a")
        await client.until(lambda: client.ended(sid))
        conn = client.wire.connection
        assert conn is not None
        await client.wire.transport.wait(lambda: conn.idle.since is not None)
        conn.evict()
        await client.until(lambda: client.goaway() is not None)
        goaway = client.goaway()
        assert goaway is not None and goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert goaway.additional_data == http2.EVICTED_GOAWAY
        await client.wire.closed()


async def test_a_connection_with_a_stream_is_not_idle() -> None:
    release = anyio.Event()

    async def waits(request: Request, responder: Responder) -> None:
        await release.wait()
        await echo(request, responder)

    async with h2_wire(waits) as client:
        sid = client.request("/w")
        conn = client.wire.connection
        assert conn is not None
        await anyio.sleep(0.05)
        assert conn.idle.since is None
        release.set()
        await client.until(lambda: client.ended(sid))
        await client.wire.transport.wait(lambda: conn.idle.since is not None)
