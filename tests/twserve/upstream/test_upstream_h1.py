"""The HTTP/1.1 upstream pool (twserve/upstream/h1_pool.py, its connections in
twserve/upstream/h1_connection.py) against raw loopback servers and the mock: reuse, liveness,
bounds and expiry, what is pooled and what is closed, the faults, one piece per arrival, and reading
paused for a slow reader. On the standard asyncio loop and on uvloop (the gateway's default)."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.streams.tls import TLSListener

from tests.twserve.support.loops import BOTH_LOOPS
from tests.twserve.support.tls_front import certificates
from twengine.config import GatewayListen
from twengine.shedding import LoadGauge
from twmock import run_mock
from twmock.script import MockSettings, Script
from twproto.failures import TransportFault
from twproto.upstream_request import UpstreamRequest
from twserve.app.loop_lag import watch_loop_lag
from twserve.upstream.client import UpstreamClient, read_prefix
from twserve.upstream.errors import UpstreamBroken, UpstreamUnreachable
from twserve.upstream.h1_connection import PAUSE_BYTES, H1Connection, ReadTurns
from twserve.upstream.h1_pool import H1Pool

pytestmark = pytest.mark.anyio


@pytest.fixture(params=BOTH_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

Handler = Callable[["Conn"], Awaitable[None]]


@dataclass
class Conn:
    """One connection the raw server accepted: what its reads brought, and when it ended."""

    stream: anyio.abc.SocketStream
    peer_port: int
    reads: list[bytes] = field(default_factory=list)
    buffered: bytes = b""
    ended: anyio.Event = field(default_factory=anyio.Event)

    async def request(self) -> bytes | None:
        """The next whole request (head and content-length body), or None at the end."""
        while b"\r\n\r\n" not in self.buffered or len(self.buffered) < _size(self.buffered):
            try:
                data = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return None
            self.reads.append(data)
            self.buffered += data
        size = _size(self.buffered)
        request, self.buffered = self.buffered[:size], self.buffered[size:]
        return request

    async def until_end(self) -> None:
        try:
            while await self.stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass


def _size(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


@dataclass
class RawServer:
    handler: Handler
    conns: list[Conn] = field(default_factory=list)
    port: int = 0

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        conn = Conn(stream, stream.extra(anyio.abc.SocketAttribute.remote_port))
        self.conns.append(conn)
        try:
            async with stream:
                await self.handler(conn)
        finally:
            conn.ended.set()


@asynccontextmanager
async def raw_server(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    server = RawServer(handler)
    listener: anyio.abc.Listener[anyio.abc.SocketStream] = await anyio.create_tcp_listener(
        local_host="127.0.0.1", local_port=0
    )
    server.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    serving: anyio.abc.Listener = listener
    if tls is not None:
        serving = TLSListener(listener, tls, standard_compatible=False)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(serving.serve, server.serve)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


async def keep_alive(conn: Conn) -> None:
    """Answers each request with a small 200 and keeps the connection."""
    while await conn.request() is not None:
        await conn.stream.send(OK)


async def close_after_answer(conn: Conn) -> None:
    if await conn.request() is not None:
        await conn.stream.send(OK)


def _request(port: int, scheme: str = "http") -> UpstreamRequest:
    headers = [(b"content-type", b"application/json")]
    url = f"{scheme}://127.0.0.1:{port}/v1/messages"
    return UpstreamRequest(method="POST", url=url, headers=headers, body=BODY, sse=True)


async def _ask(pool: H1Pool, request: UpstreamRequest, timeout: float = 5.0) -> tuple[int, bytes]:
    async with pool.open(request, timeout) as answer:
        return answer.status, b"".join([piece async for piece in answer.chunks()])


async def test_a_request_goes_out_in_one_write_and_the_connection_is_reused() -> None:
    pool = H1Pool()
    async with raw_server(keep_alive) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert pool.idle_count == 1
        await pool.aclose()
    (conn,) = server.conns  # the same connection (same local port) served both
    # One write of head and body arrives in one read on loopback: each request is one read.
    assert len(conn.reads) == 2
    assert all(r.startswith(b"POST /v1/messages HTTP/1.1\r\n") for r in conn.reads)
    assert all(r.endswith(BODY) for r in conn.reads)
    assert b"host: 127.0.0.1:%d\r\n" % server.port in conn.reads[0]
    assert b"content-length: %d\r\n" % len(BODY) in conn.reads[0]


def _idle(pool: H1Pool) -> list[H1Connection]:
    return [conn for conns in pool._idle.values() for conn in conns]


async def _until_unfit(pool: H1Pool) -> None:
    """Until the pool's one idle connection has seen what its upstream did (the next turn of
    the event loop on loopback)."""
    (conn,) = _idle(pool)
    with anyio.fail_after(5):
        while conn.fit:
            await anyio.sleep(0.001)


async def test_a_connection_the_upstream_closed_while_idle_is_not_used() -> None:
    pool = H1Pool()
    async with raw_server(close_after_answer) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        await server.conns[0].ended.wait()
        await _until_unfit(pool)
        # The connection saw the end of file: a new connection, not a failed request.
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert len(server.conns) == 2
        assert server.conns[0].peer_port != server.conns[1].peer_port
        assert pool.open_count == 1
        await pool.aclose()


async def test_an_answer_with_connection_close_is_not_pooled() -> None:
    async def answer_close(conn: Conn) -> None:
        while await conn.request() is not None:
            await conn.stream.send(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
            )

    pool = H1Pool()
    async with raw_server(answer_close) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert (pool.idle_count, pool.open_count) == (0, 0)
        with anyio.fail_after(5):
            await server.conns[0].ended.wait()  # the gateway closed it
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
    assert len(server.conns) == 2


async def test_a_body_cut_mid_way_is_broken_and_its_connection_not_pooled() -> None:
    async def cut(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabcd")

    pool = H1Pool()
    async with raw_server(cut) as server:
        got: list[bytes] = []
        with pytest.raises(UpstreamBroken):
            async with pool.open(_request(server.port), 5.0) as answer:
                assert answer.status == 200
                async for piece in answer.chunks():
                    got.append(piece)
        assert got == [b"abcd"]
        assert (pool.idle_count, pool.open_count) == (0, 0)


async def test_chunked_and_content_length_bodies() -> None:
    async def both(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
        await conn.request()
        await conn.stream.send(
            b"HTTP/1.1 201 Created\r\nX-Trace: 1\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
        )
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(both) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"hello")
        async with pool.open(_request(server.port), 5.0) as answer:
            assert answer.status == 201
            assert (b"X-Trace", b"1") in answer.headers  # as the upstream spelled it
            assert b"".join([piece async for piece in answer.chunks()]) == b"abcdefg"
        assert pool.idle_count == 1  # both read to the end on one connection
        await pool.aclose()
    assert len(server.conns) == 1


async def test_what_one_read_brings_is_one_piece() -> None:
    go_on = anyio.Event()

    async def two_bursts(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\na1\r\n2\r\na2\r\n2\r\na3\r\n"
        )
        await go_on.wait()
        await conn.stream.send(b"2\r\nb1\r\n2\r\nb2\r\n0\r\n\r\n")
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(two_bursts) as server:
        pieces: list[bytes] = []
        async with pool.open(_request(server.port), 5.0) as answer:
            async for piece in answer.chunks():
                pieces.append(piece)
                go_on.set()
        await pool.aclose()
    # Three chunk frames in the head's read are one piece, the two of the next write another.
    assert pieces == [b"a1a2a3", b"b1b2"]


async def test_a_cancelled_request_closes_its_connection() -> None:
    async def endless(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(endless) as server:
        got: list[bytes] = []
        with anyio.CancelScope() as scope:
            async with pool.open(_request(server.port), 5.0) as answer:
                async for piece in answer.chunks():
                    got.append(piece)
                    scope.cancel()
        assert got == [b"x"]
        assert (pool.idle_count, pool.open_count) == (0, 0)
        with anyio.fail_after(5):
            await server.conns[0].ended.wait()  # the upstream saw the connection close


async def test_an_error_body_read_in_part_closes_the_connection() -> None:
    async def big_error(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 500 Oops\r\ncontent-length: 100000\r\n\r\n" + b"e" * 10)
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(big_error) as server:
        async with pool.open(_request(server.port), 5.0) as answer:
            assert answer.status == 500
            assert await read_prefix(answer, 5) == b"eeeee"
        assert (pool.idle_count, pool.open_count) == (0, 0)


async def _unreachable(*sends: bytes) -> UpstreamUnreachable:
    """What asking an upstream that sends `sends` (and keeps the connection) raises."""

    async def send(conn: Conn) -> None:
        await conn.request()
        for data in sends:
            await conn.stream.send(data)
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(send) as server:
        with pytest.raises(UpstreamUnreachable) as caught:
            await _ask(pool, _request(server.port))
    assert pool.open_count == 0
    return caught.value


async def test_a_malformed_answer_head_is_unreachable() -> None:
    refused = await _unreachable(b"HTTP/1.1 two hundred\r\n\r\n")
    assert refused.fault is TransportFault.RESET_BEFORE_HEAD


async def test_a_connection_closed_before_the_head_is_reset_before_head() -> None:
    async def hang_up(conn: Conn) -> None:
        await conn.request()

    pool = H1Pool()
    async with raw_server(hang_up) as server:
        with pytest.raises(UpstreamUnreachable) as caught:
            await _ask(pool, _request(server.port))
    assert caught.value.fault is TransportFault.RESET_BEFORE_HEAD


async def test_a_refused_connection() -> None:
    with anyio.fail_after(5):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await listener.aclose()  # nothing listens there now
    pool = H1Pool()
    with pytest.raises(UpstreamUnreachable) as caught:
        await _ask(pool, _request(port))
    assert caught.value.fault is TransportFault.CONNECT_REFUSED
    assert pool.open_count == 0


async def test_connecting_past_the_connect_timeout() -> None:
    async def silent(conn: Conn) -> None:
        await conn.until_end()  # accepts, never answers the TLS handshake

    pool = H1Pool()
    async with raw_server(silent) as server:
        with pytest.raises(UpstreamUnreachable) as caught:
            await _ask(pool, _request(server.port, "https"), timeout=0.2)
        assert caught.value.fault is TransportFault.CONNECT_TIMEOUT
        assert pool.open_count == 0
        with anyio.fail_after(5):
            # On a busy machine the server may accept it only after the client gave up on it.
            while not server.conns:
                await anyio.sleep(0.01)
            await server.conns[0].ended.wait()  # the half-made connection is closed


async def test_https_checks_the_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, context = certificates(tmp_path)
    context.set_alpn_protocols(["http/1.1"])
    pool = H1Pool()
    async with raw_server(keep_alive, tls=context) as server:
        # Not signed by anything the default store trusts: a TLS fault.
        with pytest.raises(UpstreamUnreachable) as caught:
            await _ask(pool, _request(server.port, "https"))
        assert caught.value.fault is TransportFault.TLS
        # Trusted through SSL_CERT_FILE, as the gateway's other TLS clients do.
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        assert await _ask(pool, _request(server.port, "https")) == (200, b"ok")
        assert await _ask(pool, _request(server.port, "https")) == (200, b"ok")
        assert pool.idle_count == 1
        await pool.aclose()
    # The refused handshake never became a connection; the trusted one was kept alive.
    assert len(server.conns) == 1


async def test_an_idle_connection_past_keepalive_expiry_is_closed() -> None:
    now = [100.0]
    pool = H1Pool(keepalive_expiry=5.0, clock=lambda: now[0])
    async with raw_server(keep_alive) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        now[0] += 4.0
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert len(server.conns) == 1  # within the expiry: reused
        now[0] += 5.0
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert len(server.conns) == 2
        with anyio.fail_after(5):
            await server.conns[0].ended.wait()
        await pool.aclose()


def _held_until(release: anyio.Event) -> Handler:
    """A server that answers each request once `release` is set."""

    async def held(conn: Conn) -> None:
        while await conn.request() is not None:
            await release.wait()
            await conn.stream.send(OK)

    return held


def _ask_into(
    results: list[tuple[int, bytes]], pool: H1Pool, port: int
) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        results.append(await _ask(pool, _request(port)))

    return one


async def test_idle_connections_are_bounded_by_max_keepalive() -> None:
    release = anyio.Event()
    pool = H1Pool(max_keepalive=1)
    results: list[tuple[int, bytes]] = []
    async with raw_server(_held_until(release)) as server, anyio.create_task_group() as tg:
        tg.start_soon(_ask_into(results, pool, server.port))
        tg.start_soon(_ask_into(results, pool, server.port))
        with anyio.fail_after(5):
            while len(server.conns) < 2:
                await anyio.sleep(0.01)
        release.set()
    assert results == [(200, b"ok"), (200, b"ok")]
    assert (pool.idle_count, pool.open_count) == (1, 1)
    await pool.aclose()
    assert pool.open_count == 0


async def test_max_connections_makes_a_request_wait_for_a_connection() -> None:
    release = anyio.Event()
    pool = H1Pool(max_connections=1)
    results: list[tuple[int, bytes]] = []
    async with raw_server(_held_until(release)) as server, anyio.create_task_group() as tg:
        tg.start_soon(_ask_into(results, pool, server.port))
        tg.start_soon(_ask_into(results, pool, server.port))
        with anyio.fail_after(5):
            while not server.conns or not server.conns[0].reads:
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)
        assert len(server.conns) == 1  # the second request waits for the one connection
        release.set()
    assert results == [(200, b"ok"), (200, b"ok")]
    assert len(server.conns) == 1
    await pool.aclose()


async def test_a_waiter_cancelled_once_woken_leaves_no_one_waiting() -> None:
    pool = H1Pool(max_connections=1)
    opened, finish = anyio.Event(), anyio.Event()
    b_scope = anyio.CancelScope()
    results: list[tuple[str, int, bytes]] = []

    async with raw_server(keep_alive) as server:

        async def a() -> None:
            async with pool.open(_request(server.port), 5.0) as answer:
                opened.set()
                await finish.wait()
                body = b"".join([piece async for piece in answer.chunks()])
                results.append(("a", answer.status, body))
            # Leaving handed the connection back and woke b, which has not run yet.
            b_scope.cancel()

        async def b() -> None:
            with b_scope:
                results.append(("b", *await _ask(pool, _request(server.port))))

        async def c() -> None:
            results.append(("c", *await _ask(pool, _request(server.port))))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a)
                await opened.wait()
                tg.start_soon(b)
                await anyio.sleep(0.05)
                tg.start_soon(c)
                await anyio.sleep(0.05)  # b and c wait for the one connection, b first
                finish.set()
        await pool.aclose()
    # c was not left waiting. (b, cancelled once awake, may have taken the connection and
    # closed it: then c made a new one.)
    assert results == [("a", 200, b"ok"), ("c", 200, b"ok")]
    assert len(server.conns) <= 2
    assert pool.open_count == 0


async def test_a_mock_stream_through_the_client_is_whole_and_its_connection_reused() -> None:
    settings = MockSettings(script=Script(chunks=200, chunk_size=4))
    body = (
        b'{"model":"m","max_tokens":900,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    )
    headers = [(b"content-type", b"application/json"), (b"x-api-key", b"k")]
    client = UpstreamClient()
    async with run_mock(settings) as mock:
        url = mock.url + "/v1/messages"
        request = UpstreamRequest(method="POST", url=url, headers=headers, body=body, sse=True)
        pieces: list[list[bytes]] = []
        for _ in range(2):
            async with client.open(request) as answer:
                assert answer.status == 200
                pieces.append([piece async for piece in answer.chunks()])
            assert client.pool.idle_count == 1  # read to the end: back in the pool
        await client.aclose()

    def events(data: bytes) -> list[bytes]:
        return [line for line in data.split(b"\n") if line.startswith(b"event:")]

    first, second = (events(b"".join(p)) for p in pieces)
    assert first == second and first.count(b"event: content_block_delta") >= 50
    assert all(1 <= len(p) <= len(first) for p in pieces)
    assert first[-1] == b"event: message_stop"


async def test_an_idle_connection_sent_something_unasked_for_is_not_used() -> None:
    answered, sent = anyio.Event(), anyio.Event()

    async def chatty(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(OK)
        await answered.wait()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno")
        sent.set()
        await conn.until_end()

    async def second(conn: Conn) -> None:
        await keep_alive(conn)

    handlers = [chatty, second]

    async def handler(conn: Conn) -> None:
        await handlers.pop(0)(conn)

    pool = H1Pool()
    async with raw_server(handler) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert pool.idle_count == 1
        answered.set()
        await sent.wait()
        await _until_unfit(pool)
        # Not read as the next request's answer: a new connection answers it.
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert len(server.conns) == 2
        with anyio.fail_after(5):
            await server.conns[0].ended.wait()  # the gateway closed the chatty one
        assert pool.open_count == 1
        await pool.aclose()


async def test_bytes_after_an_answer_in_the_same_read_keep_it_out_of_the_pool() -> None:
    async def extra(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(OK + b"HTTP/1.1 200 OK\r\n")
        await conn.until_end()

    pool = H1Pool()
    async with raw_server(extra) as server:
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        assert (pool.idle_count, pool.open_count) == (0, 0)
        with anyio.fail_after(5):
            await server.conns[0].ended.wait()


async def test_a_slow_reader_pauses_reading_and_the_stream_still_completes() -> None:
    frame = b"data: " + b"x" * 4090 + b"\n\n"  # 4 KiB a chunk
    count = 1024  # 4 MiB in all, far past what the connection keeps unread

    async def flood(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(count):
            await conn.stream.send(b"%x\r\n%s\r\n" % (len(frame), frame))
        await conn.stream.send(b"0\r\n\r\n")
        await keep_alive(conn)

    pool = H1Pool()
    async with raw_server(flood) as server:
        total = 0
        most_kept = 0
        paused = False
        async with pool.open(_request(server.port), 5.0) as answer:
            conn = answer._conn
            async for piece in answer.chunks():
                total += len(piece)
                if not paused:
                    # A reader that stops: the connection stops reading past PAUSE_BYTES.
                    with anyio.fail_after(5):
                        while not conn._read_paused:
                            await anyio.sleep(0.001)
                    paused = True
                    await anyio.sleep(0.05)  # more would have arrived, were it reading
                most_kept = max(most_kept, conn._unread)
        assert paused
        # At most the bound plus what one socket read brings.
        assert PAUSE_BYTES < most_kept <= PAUSE_BYTES + 256 * 1024 + len(frame)
        assert total == count * len(frame)
        assert pool.idle_count == 1  # read to its end: reading is on again, the connection kept
        (kept,) = _idle(pool)
        assert not kept._read_paused
        assert await _ask(pool, _request(server.port)) == (200, b"ok")  # and it is usable
        await pool.aclose()
    assert len(server.conns) == 1


def _chunked(frames: list[bytes], gap: float) -> Handler:
    """Answers one request with `frames` as chunks, `gap` seconds apart, then keeps alive."""

    async def send(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for frame in frames:
            await conn.stream.send(b"%x\r\n%s\r\n" % (len(frame), frame))
            await anyio.sleep(gap)
        await conn.stream.send(b"0\r\n\r\n")
        await keep_alive(conn)

    return send


class _Ticking:
    """A clock a second further on at every look: every read after a turn's first is late."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_reads_late_in_a_turn_wait_for_the_next_and_every_stream_is_whole() -> None:
    frames = [b"data: %d\n\n" % i for i in range(200)]
    turns = ReadTurns(clock=_Ticking())
    turns.engaged = True  # as the loop-lag sampler does while the loop lags
    pool = H1Pool()
    pool.turns = turns
    answers: list[tuple[int, bytes]] = []

    async def ask(port: int) -> None:
        answers.append(await _ask(pool, _request(port)))

    async with raw_server(_chunked(frames, 0.0005)) as server:
        async with anyio.create_task_group() as tg:
            for _ in range(6):  # several connections reading in the same turns
                tg.start_soon(ask, server.port)
        assert answers == [(200, b"".join(frames))] * 6  # whole, in order
        assert turns.held_total > 0  # some reads waited for the next turn
        kept = _idle(pool)  # read to their end, reading on again: the connections are kept
        assert len(kept) == 6
        assert not any(c._turn_held or c._read_paused for c in kept)
        assert await _ask(pool, _request(server.port)) == (200, b"ok")
        await pool.aclose()


async def test_a_held_read_and_a_slow_reader_pause_together_and_the_stream_completes() -> None:
    frame = b"data: " + b"x" * 4090 + b"\n\n"
    frames = [frame] * 256  # 1 MiB: past what the connection keeps unread
    turns = ReadTurns(clock=_Ticking())
    turns.engaged = True  # as the loop-lag sampler does while the loop lags
    pool = H1Pool()
    pool.turns = turns
    async with raw_server(_chunked(frames, 0.0)) as server:
        total = 0
        async with pool.open(_request(server.port), 5.0) as answer:
            async for piece in answer.chunks():
                total += len(piece)
                await anyio.sleep(0.002)  # a slow reader: unread body pauses reading too
        assert total == len(frames) * len(frame)
        assert pool.idle_count == 1
        await pool.aclose()


class _Conn:
    def __init__(self) -> None:
        self.turned = 0

    def turn_over(self) -> None:
        self.turned += 1


class _Loop:
    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)


def test_a_read_past_behind_in_the_same_turn_is_held_until_the_turn_ends() -> None:
    now = [10.0]
    turns = ReadTurns(behind=0.02, clock=lambda: now[0])
    turns.engaged = True
    loop, a, b = _Loop(), _Conn(), _Conn()
    read = lambda conn: turns.read(conn, loop)  # type: ignore[arg-type]  # noqa: E731
    assert not read(a)  # the turn's first read: its end is scheduled, once
    assert len(loop.soon) == 1
    now[0] += 0.02
    assert not read(b)  # within `behind` of the first: read on
    now[0] += 0.001
    assert read(a) and read(b)  # past it: both wait for the turn's end
    assert len(loop.soon) == 1 and turns.held_total == 2
    loop.soon.pop()()  # the loop's next turn
    assert (a.turned, b.turned) == (1, 1)
    assert not read(a)  # a new turn: its first read schedules its end again
    assert len(loop.soon) == 1


# --- what the parser makes of an answer -------------------------------------------------------


async def _answer_with(reply: bytes) -> tuple[H1Pool, tuple[int, bytes] | UpstreamBroken]:
    """`reply` sent for one request, then the upstream closes; the pool and what was read."""

    async def once(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(reply)

    pool = H1Pool()
    got: tuple[int, bytes] | UpstreamBroken
    async with raw_server(once) as server:
        try:
            got = await _ask(pool, _request(server.port))
        except UpstreamBroken as exc:
            got = exc
    return pool, got


async def test_a_body_framed_by_nothing_ends_at_end_of_file_and_is_not_pooled() -> None:
    pool, got = await _answer_with(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello")
    assert got == (200, b"hello")
    assert (pool.idle_count, pool.open_count) == (0, 0)


async def test_an_informational_head_is_skipped() -> None:
    reply = b"HTTP/1.1 100 Continue\r\nx-early: 1\r\n\r\n" + OK
    pool = H1Pool()

    async def once(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(reply)
        await conn.until_end()

    async with raw_server(once) as server:
        async with pool.open(_request(server.port), 5.0) as answer:
            assert answer.status == 200
            assert answer.headers == [(b"content-length", b"2")]  # not the 100's
            assert b"".join([p async for p in answer.chunks()]) == b"ok"
        await pool.aclose()


async def test_a_switch_of_protocols_is_unreachable() -> None:
    refused = await _unreachable(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n")
    assert refused.fault is TransportFault.RESET_BEFORE_HEAD


async def test_a_head_past_the_bound_is_unreachable() -> None:
    filler = b"x-filler: " + b"f" * 4086 + b"\r\n"
    # 160 KiB of headers, and never the blank line.
    refused = await _unreachable(b"HTTP/1.1 200 OK\r\n", *[filler] * 40)
    assert "too large" in str(refused)


async def test_a_content_length_body_cut_short_is_broken() -> None:
    pool, got = await _answer_with(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
    assert isinstance(got, UpstreamBroken)
    assert pool.open_count == 0


async def test_a_chunked_body_without_its_last_chunk_is_broken() -> None:
    reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
    pool, got = await _answer_with(reply)
    assert isinstance(got, UpstreamBroken)
    assert pool.open_count == 0


@pytest.mark.parametrize(
    "header",
    [(b"x-bad", b"a\r\nx-injected: 1"), (b"x-bad", b"nul\x00"), (b"bad name", b"v")],
    ids=["line-break", "nul", "space-in-name"],
)
async def test_a_header_that_would_split_the_head_is_never_sent(
    header: tuple[bytes, bytes],
) -> None:
    pool = H1Pool()
    async with raw_server(keep_alive) as server:
        request = _request(server.port)
        bad = UpstreamRequest(method="POST", url=request.url, headers=[header], body=BODY, sse=True)
        with pytest.raises(UpstreamUnreachable) as caught:
            await _ask(pool, bad)
        assert caught.value.fault is TransportFault.PROTOCOL_ERROR
        assert server.conns == []  # refused before any connection was made
        assert await _ask(pool, request) == (200, b"ok")
        await pool.aclose()


# --- a sink takes the body in the loop's callback ---------------------------------------------


def _bursts(count: int) -> tuple[Handler, list[anyio.Event]]:
    """An upstream that sends chunk i+1 (b"p<i+1>") only after event i is set."""
    gates = [anyio.Event() for _ in range(count)]

    async def serve(conn: Conn) -> None:
        await conn.request()
        await conn.stream.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\np0\r\n")
        for i, gate in enumerate(gates):
            await gate.wait()
            await conn.stream.send(b"2\r\np%d\r\n" % (i + 1))
        await conn.stream.send(b"0\r\n\r\n")
        await keep_alive(conn)

    return serve, gates


async def _sink_run(
    sink_says: Callable[[int], bool | Exception],
) -> tuple[list[bytes], list[bytes], Exception | None]:
    """Four pieces, the first read by the reader, who then diverts; `sink_says(n)` decides the
    sink's n-th call. What the sink took, what the reader read, and what reading raised."""
    serve, gates = _bursts(3)
    taken: list[bytes] = []
    arrived = 0  # bytes the sink was offered and did not give back
    calls = 0

    def sink(data: bytes) -> bool:
        nonlocal calls, arrived
        verdict = sink_says(calls)
        calls += 1
        if isinstance(verdict, Exception):
            arrived += len(data)
            raise verdict
        if verdict:
            taken.append(data)
            arrived += len(data)
        return verdict

    read: list[bytes] = []
    failed: Exception | None = None
    pool = H1Pool()
    async with raw_server(serve) as server, pool.open(_request(server.port), 5.0) as answer:
        conn = answer._conn
        pieces = answer.chunks().__aiter__()
        read.append(await pieces.__anext__())
        assert answer.divert(sink)
        for i, gate in enumerate(gates):
            gate.set()
            with anyio.fail_after(5):  # until piece i+1 has arrived, taken or kept
                while arrived + conn._unread < 2 * (i + 1):
                    await anyio.sleep(0.001)
        try:
            async for piece in pieces:
                read.append(piece)
        except ValueError as exc:
            failed = exc
        await pool.aclose()
    return taken, read, failed


async def test_a_sink_takes_what_arrives_and_the_reader_only_sees_the_end() -> None:
    taken, read, failed = await _sink_run(lambda n: True)
    assert (read, taken, failed) == ([b"p0"], [b"p1", b"p2", b"p3"], None)


async def test_what_a_sink_declines_waits_for_the_reader_with_all_after_it() -> None:
    # p1 declined: it and everything after it (nothing is offered while it is unread) reach
    # the reader, in order.
    taken, read, failed = await _sink_run(lambda n: n != 0)
    assert (b"".join(read), taken, failed) == (b"p0p1p2p3", [], None)
    assert read[:2] == [b"p0", b"p1p2p3"]


async def test_a_sink_that_raises_fails_the_read_with_its_error() -> None:
    taken, read, failed = await _sink_run(lambda n: ValueError("sink broke"))
    assert isinstance(failed, ValueError) and str(failed) == "sink broke"
    assert (read, taken) == ([b"p0"], [])


async def test_the_lag_sampler_engages_read_turns_only_while_the_loop_lags() -> None:
    gauge, turns = LoadGauge(), ReadTurns()
    listen = GatewayListen()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(watch_loop_lag, gauge, lambda: listen, turns=turns, period=0.01))
        await anyio.sleep(0.05)
        assert not turns.engaged  # a loop that keeps up
        time.sleep(0.05)  # the loop held past `behind`
        with anyio.fail_after(2):
            while not turns.engaged:
                await anyio.sleep(0)
        with anyio.fail_after(2):
            while turns.engaged:  # caught up: the next samples disengage it
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()


def test_a_read_far_past_the_samplers_due_time_paces_before_any_sample_says_so() -> None:
    now, due = [10.0], [10.0]
    turns = ReadTurns(lambda: due[0], behind=0.02, clock=lambda: now[0])
    loop, a = _Loop(), _Conn()
    read = lambda conn: turns.read(conn, loop)  # type: ignore[arg-type]  # noqa: E731
    now[0] = 10.02
    assert not read(a) and not loop.soon  # within `behind` of due, not engaged: not looked at
    now[0] = 10.03  # a poll that has run past due by more than `behind`
    assert not read(a) and len(loop.soon) == 1  # the turn's first read: its end scheduled
    now[0] = 10.06
    assert read(a)  # and the next one, late in the same turn, waits for it
    assert not ReadTurns().read(a, loop)  # type: ignore[arg-type]  # no sampler: only engaged
