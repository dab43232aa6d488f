"""The HTTP/1.1 connection fed bytes in memory (tests/twserve/support/memory_wire.py): framing,
limits and the client-gone rules, without a socket.

Every test runs twice: over anyio's asyncio stream on the memory transport (`fast`: the watch
from the transport's callbacks and the gathered writes, as on a real socket) and over a stream
that hides its transport (`plain`: a watcher task and anyio's ``send``). Both must answer
byte for byte alike. The socket tests (test_http1.py, test_transport_hardening.py) stay: they
are the real wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from tests.twserve.support.memory_wire import Answer, Wire, answers, request
from twserve.server.base import (
    BodyBudget,
    ClientGone,
    HeadRefusal,
    Request,
    Responder,
    ServerLimits,
)

pytestmark = pytest.mark.anyio

LIMITS = ServerLimits(
    max_header_bytes=2048,
    max_headers=20,
    max_body_bytes=1000,
    head_timeout=0.5,
    body_timeout=0.5,
    keepalive_timeout=0.5,
    write_timeout=0.5,
)


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def fast(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class Echo:
    """Answers each request with its method, path and body, as two chunked pieces."""

    def __init__(self) -> None:
        self.seen: list[Request] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.seen.append(request)
        await responder.start(200, [(b"content-type", b"text/plain")])
        if request.method != "HEAD":  # h11 refuses a body on an answer to HEAD
            await responder.send(f"{request.method} {request.path}:".encode())
            await responder.send(request.body)
        await responder.end()


@asynccontextmanager
async def wire(
    handler: Callable[[Request, Responder], Awaitable[None]],
    *,
    fast: bool,
    limits: ServerLimits = LIMITS,
    **serve: object,
) -> AsyncIterator[Wire]:
    async with anyio.create_task_group() as tg:
        w = Wire.open(fast=fast)
        w.serve(tg, handler, limits=limits, **serve)  # type: ignore[arg-type]
        yield w
        tg.cancel_scope.cancel()


async def until_answers(w: Wire, methods: list[str], *, eof: bool = False) -> list[Answer]:
    await w.transport.wait(
        lambda: len(answers(bytes(w.transport.sent), methods, eof=eof)) == len(methods)
    )
    return answers(bytes(w.transport.sent), methods, eof=eof)


async def until_closed(w: Wire) -> bytes:
    await w.closed()
    return bytes(w.transport.sent)


def status_and_code(data: bytes) -> tuple[int, bytes]:
    (answer,) = answers(data, eof=True)
    return answer.status, answer.body


# --- framing ---------------------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order(fast: bool) -> None:
    echo = Echo()
    async with wire(echo, fast=fast) as w:
        w.feed(
            request("POST", "/a", body=b"one")
            + request("GET", "/b")
            + request("POST", "/c", body=b"three", chunked=True)
        )
        got = await until_answers(w, ["POST", "GET", "POST"])
    assert [a.body for a in got] == [b"POST /a:one", b"GET /b:", b"POST /c:three"]
    assert all(a.status == 200 and a.chunked for a in got)
    assert [r.path for r in echo.seen] == ["/a", "/b", "/c"]


async def test_a_request_fed_a_byte_at_a_time_is_read_as_one_fed_whole(fast: bool) -> None:
    data = request("POST", "/v1/x?q=1", [("x-one", "1")], body=b"payload")
    results = []
    for bytewise in (False, True):
        echo = Echo()
        async with wire(echo, fast=fast) as w:
            if bytewise:
                await w.fed_bytewise(data)
            else:
                w.feed(data)
            results.append(((await until_answers(w, ["POST"]))[0], echo.seen[0]))
    (whole, first), (bytewise_answer, second) = results
    assert whole == bytewise_answer
    assert (second.path, second.query, second.body) == ("/v1/x", "q=1", b"payload")
    assert second.headers == first.headers and (b"x-one", b"1") in second.headers


async def test_a_chunked_body_in_odd_pieces_is_joined(fast: bool) -> None:
    head = b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"3\r\nabc\r\n1;ext=1\r\nd\r\n0\r\nx-trailer: t\r\n\r\n"
    echo = Echo()
    async with wire(echo, fast=fast) as w:
        w.feed(head + body[:5])
        await anyio.sleep(0.01)
        w.feed(body[5:17])
        await anyio.sleep(0.01)
        w.feed(body[17:])
        (answer,) = await until_answers(w, ["POST"])
    assert answer.body == b"POST /c:abcd"


async def test_a_bad_chunk_is_400_and_the_connection_closes(fast: bool) -> None:
    echo = Echo()
    async with wire(echo, fast=fast) as w:
        w.feed(b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        status, body = status_and_code(await until_closed(w))
    assert status == 400 and b"gw.request.bad_http" in body
    assert echo.seen == []


async def test_length_and_chunked_together_are_refused(fast: bool) -> None:
    echo = Echo()
    async with wire(echo, fast=fast) as w:
        w.feed(
            b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n"
            b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        status, body = status_and_code(await until_closed(w))
    assert status == 400 and b"Content-Length and Transfer-Encoding" in body
    assert echo.seen == []


async def test_an_http10_client_gets_the_answer_unframed_then_the_close(fast: bool) -> None:
    async with wire(Echo(), fast=fast) as w:
        w.feed(request("GET", "/old", version="1.0"))
        data = await until_closed(w)
    (answer,) = answers(data, eof=True)
    assert answer.body == b"GET /old:" and not answer.chunked


async def test_a_head_request_gets_no_body(fast: bool) -> None:
    async with wire(Echo(), fast=fast) as w:
        w.feed(request("HEAD", "/h") + request("GET", "/g"))
        head, get = await until_answers(w, ["HEAD", "GET"])
    assert (head.status, head.body) == (200, b"")
    assert get.body == b"GET /g:"


# --- limits ----------------------------------------------------------------------------------


def _head_of(size: int) -> bytes:
    """A GET whose head counts `size` bytes as the server counts them (target, and each header's
    name and value plus four)."""
    target = "/"
    fixed = len(target) + len("host") + len("gateway.test") + 4 + len("x-pad") + 4
    return request("GET", target, [("host", "gateway.test"), ("x-pad", "p" * (size - fixed))])


async def test_a_head_at_the_byte_limit_passes_and_one_byte_more_is_431(fast: bool) -> None:
    async with wire(Echo(), fast=fast) as w:
        w.feed(_head_of(LIMITS.max_header_bytes))
        (answer,) = await until_answers(w, ["GET"])
    assert answer.status == 200
    async with wire(Echo(), fast=fast) as w:
        w.feed(_head_of(LIMITS.max_header_bytes + 1))
        status, body = status_and_code(await until_closed(w))
    assert status == 431 and b"gw.request.headers_too_large" in body


async def test_too_many_headers_is_431(fast: bool) -> None:
    headers = [(f"x-h{i}", "v") for i in range(LIMITS.max_headers)]
    async with wire(Echo(), fast=fast) as w:
        w.feed(request("GET", "/", headers))
        status, _ = status_and_code(await until_closed(w))
    assert status == 431


async def test_a_head_that_never_ends_is_bounded_while_it_arrives(fast: bool) -> None:
    # No end of head in sight: h11's incomplete-event bound refuses it before it all arrives.
    async with wire(Echo(), fast=fast) as w:
        w.feed(b"GET / HTTP/1.1\r\nx-pad: " + b"p" * (4 * LIMITS.max_header_bytes))
        status, _ = status_and_code(await until_closed(w))
    assert status == 431


async def test_a_body_over_the_limit_is_refused_from_its_length_before_it_is_read(
    fast: bool,
) -> None:
    echo = Echo()
    budget = BodyBudget(10_000)
    async with wire(echo, fast=fast, budget=budget) as w:
        w.feed(b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 1001\r\n\r\n")
        status, body = status_and_code(await until_closed(w))
    assert status == 413 and b"gw.request.body_too_large" in body
    assert echo.seen == [] and budget.used == 0


async def test_a_chunked_body_over_the_limit_is_413(fast: bool) -> None:
    budget = BodyBudget(10_000)
    async with wire(Echo(), fast=fast, budget=budget) as w:
        w.feed(request("POST", "/big", body=b"b" * 1001, chunked=True))
        status, _ = status_and_code(await until_closed(w))
    assert status == 413 and budget.used == 0


async def test_a_body_past_the_budget_is_503_with_retry_after(fast: bool) -> None:
    budget = BodyBudget(100)
    async with wire(Echo(), fast=fast, budget=budget) as w:
        w.feed(request("POST", "/b", body=b"b" * 101))
        data = await until_closed(w)
    (answer,) = answers(data, ["POST"], eof=True)
    assert answer.status == 503 and answer.header(b"retry-after") == b"1"
    assert b"gw.request.bodies_busy" in answer.body
    assert budget.used == 0


async def test_a_head_check_refuses_before_the_body_is_read(fast: bool) -> None:
    echo = Echo()
    budget = BodyBudget(10_000)

    def check(request: Request) -> HeadRefusal | None:
        if request.header(b"x-key") != b"good":
            return HeadRefusal(status=401, headers=[], body=b"no key")
        return None

    async with wire(echo, fast=fast, check_head=check, budget=budget) as w:
        # The body is announced and never sent: the refusal does not wait for it.
        w.feed(b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n")
        data = await until_closed(w)
    (answer,) = answers(data, ["POST"], eof=True)
    assert (answer.status, answer.body) == (401, b"no key")
    assert echo.seen == [] and budget.used == 0


# --- time ------------------------------------------------------------------------------------


async def test_a_head_not_done_in_time_is_408(fast: bool) -> None:
    async with wire(Echo(), fast=fast) as w:
        w.feed(b"GET / HTTP/1.1\r\nhost: x\r\n")
        status, body = status_and_code(await until_closed(w))
    assert status == 408 and b"gw.request.timeout" in body


async def test_a_body_not_done_in_time_is_408_and_gives_its_budget_back(fast: bool) -> None:
    budget = BodyBudget(10_000)
    async with wire(Echo(), fast=fast, budget=budget) as w:
        w.feed(b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"b" * 40)
        await w.transport.wait(lambda: budget.used == 40)
        status, _ = status_and_code(await until_closed(w))
    assert status == 408 and budget.used == 0


async def test_a_connection_that_sends_nothing_closes_quietly(fast: bool) -> None:
    async with wire(Echo(), fast=fast) as w:
        data = await until_closed(w)
    assert data == b"" and w.transport.lost


async def test_keep_alive_waits_between_requests_then_closes_quietly(fast: bool) -> None:
    echo = Echo()
    async with wire(echo, fast=fast) as w:
        w.feed(request("GET", "/1"))
        await until_answers(w, ["GET"])
        conn = w.connection
        assert conn is not None
        # Idle between requests: marked so, for the server's caps.
        await w.transport.wait(lambda: conn.idle.since is not None)
        w.feed(request("GET", "/2"))
        await until_answers(w, ["GET", "GET"])
        await until_closed(w)
    assert [r.path for r in echo.seen] == ["/1", "/2"]
    (_, second) = answers(bytes(w.transport.sent), ["GET", "GET"])
    assert second.body == b"GET /2:"


async def test_an_idle_connection_evicted_for_a_new_client_closes_at_once(fast: bool) -> None:
    async with wire(Echo(), fast=fast, limits=ServerLimits(keepalive_timeout=60)) as w:
        w.feed(request("GET", "/1"))
        await until_answers(w, ["GET"])
        conn = w.connection
        assert conn is not None
        await w.transport.wait(lambda: conn.idle.since is not None)
        conn.evict()
        with anyio.fail_after(2):
            await w.closed()
    assert conn.idle.evicted


# --- the client going away -------------------------------------------------------------------


async def test_a_client_that_leaves_mid_body_never_reaches_the_handler(fast: bool) -> None:
    echo = Echo()
    budget = BodyBudget(10_000)
    async with wire(echo, fast=fast, budget=budget) as w:
        w.feed(b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"b" * 30)
        await w.transport.wait(lambda: budget.used == 30)
        w.transport.feed_eof()
        status, body = status_and_code(await until_closed(w))
    assert echo.seen == [] and budget.used == 0
    assert status == 400 and b"gw.request.bad_http" in body  # h11: the body ended early


class Streaming:
    """Writes a first piece, then waits; records how it ended."""

    def __init__(self) -> None:
        self.wrote = anyio.Event()
        self.ended: str | None = None

    async def __call__(self, request: Request, responder: Responder) -> None:
        await responder.start(200, [])
        await responder.send(b"first")
        self.wrote.set()
        try:
            while True:
                await anyio.sleep(0.01)
                await responder.send(b".")
        except ClientGone:
            self.ended = "gone"
            raise
        except anyio.get_cancelled_exc_class():
            self.ended = "cancelled"
            raise


@pytest.mark.parametrize("how", ["eof", "reset"])
async def test_a_client_that_leaves_mid_answer_cancels_the_handler(fast: bool, how: str) -> None:
    handler = Streaming()
    async with wire(handler, fast=fast) as w:
        w.feed(request("GET", "/s"))
        with anyio.fail_after(5):
            await handler.wrote.wait()
        if how == "eof":
            w.transport.feed_eof()
        else:
            w.transport.reset()
        await w.closed()
    assert handler.ended in ("gone", "cancelled")


async def test_a_client_that_stops_reading_is_taken_as_gone(fast: bool) -> None:
    handler = Streaming()
    async with wire(handler, fast=fast) as w:
        w.feed(request("GET", "/s"))
        with anyio.fail_after(5):
            await handler.wrote.wait()
        w.transport.stop_reading()
        # The server's writes wait in the transport; past write_timeout the client is gone.
        with anyio.fail_after(5):
            await w.closed()
    assert handler.ended in ("gone", "cancelled")
    assert w.transport.get_write_buffer_size() == 0  # dropped, not kept for a dead reader


async def test_a_handler_that_fails_before_answering_gets_a_500(fast: bool) -> None:
    async def broken(request: Request, responder: Responder) -> None:
        raise ValueError("a bug")

    async with wire(broken, fast=fast) as w:
        w.feed(request("GET", "/x"))
        status, body = status_and_code(await until_closed(w))
    assert status == 500 and b"gw.internal" in body


async def test_a_handler_that_stops_mid_answer_ends_the_connection(fast: bool) -> None:
    async def unended(request: Request, responder: Responder) -> None:
        await responder.start(200, [])
        await responder.send(b"half")

    async with wire(unended, fast=fast) as w:
        w.feed(request("GET", "/x") + request("GET", "/never"))
        data = await until_closed(w)
    assert answers(data, ["GET"], eof=True) == []  # no whole answer: the client knows
    assert b"4\r\nhalf\r\n" in data
