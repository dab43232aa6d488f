"""The gateway's HTTP/1.1 edge against clients that are slow, keyless, greedy or malformed.

Every test drives a running gateway (or the transport on its own, where the condition cannot be
made on loopback) over a real socket with raw bytes, and bounds how long it waits: the faults
fixed here showed up as a connection that stayed open, a body buffered for nobody, or a
traceback.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

from tests.twserve.conftest import KEY, StackFactory, fallback, http
from tests.twserve.support.h2_client import RawH2
from tests.twserve.support.stack import CONTROL_KEY, Stack, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.server import base, listener
from twserve.server.base import Request, Responder

CHAT = b"/v1/chat/completions"
BODY = b'{"model":"gpt-e2e-1","messages":[{"role":"user","content":"hi"}]}'


@contextmanager
def connect(port: int, *, rcvbuf: int | None = None) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    try:
        yield sock
    finally:
        sock.close()


def read_reply(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one answer framed by Content-Length, or what came before EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            return 0, data, b""
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return int(head.split(b" ")[1]), head, body


def post_head(path: bytes, *, length: int, key: str | None = KEY, extra: bytes = b"") -> bytes:
    auth = b"authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + auth
        + extra
        + b"content-length: %d\r\n\r\n" % length
    )


# --- item 3: address and key before the body; one body deadline; a body budget --------------


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_keyless_request_is_refused_before_its_body_is_read(
    stack: StackFactory, key: str | None
) -> None:
    st = stack({"c": Upstream("openai-chat")})
    with connect(st.port) as sock:
        # Announce 30 MiB and send none of it: the answer must not wait for the body.
        sock.sendall(post_head(CHAT, length=30 * 1024 * 1024, key=key))
        started = time.monotonic()
        status, head, body = read_reply(sock)
        took = time.monotonic() - started
    assert status == 401
    assert json.loads(body)["error"]["code"] == (
        "gw.auth.missing_key" if key is None else "gw.auth.bad_key"
    )
    assert b"connection: close" in head.lower()
    assert took < 2.0


def test_a_body_trickled_in_gets_one_deadline_not_one_per_read(stack: StackFactory) -> None:
    limits = base.ServerLimits(body_timeout=1.0)
    st = stack({"c": Upstream("openai-chat")}, limits=limits)
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BODY)))
        started = time.monotonic()
        sock.settimeout(0.3)
        answer = b""
        # One byte every 0.3 s: each read is well inside the 1 s, the whole body far beyond it.
        for byte in BODY:
            try:
                sock.sendall(bytes([byte]))
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if answer:
                break
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408")
    assert took < 3.0


def test_bodies_in_memory_share_one_budget(stack: StackFactory) -> None:
    limits = base.ServerLimits(body_budget_bytes=len(BODY) + 10)
    st = stack({"c": Upstream("openai-chat")}, limits=limits)
    with connect(st.port) as holder, connect(st.port) as second:
        # The first request's body is partly sent: the bytes received are held for it.
        holder.sendall(post_head(CHAT, length=len(BODY)) + BODY[:20])
        time.sleep(0.3)
        second.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        status, head, body = read_reply(second)
        assert status == 503
        assert b"retry-after: 1" in head.lower()
        assert b"x-thinkwatch-error: rate_limited" in head.lower()
        assert json.loads(body)["error"]["code"] == "gw.request.bodies_busy"
        holder.sendall(BODY[20:])
        assert read_reply(holder)[0] == 200
    # The budget is given back when a request ends.
    with connect(st.port) as third:
        third.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        assert read_reply(third)[0] == 200


# --- item 9: head deadlines, framing, errors that echo nothing -------------------------------


def test_the_first_request_head_gets_the_head_timeout(stack: StackFactory) -> None:
    limits = base.ServerLimits(head_timeout=1.0, keepalive_timeout=20.0)
    st = stack({"c": Upstream("openai-chat")}, limits=limits)
    with connect(st.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        status, _, _ = read_reply(sock)
        took = time.monotonic() - started
    assert status == 408
    assert took < 3.0


def test_a_kept_alive_connection_idles_for_the_keepalive_time(stack: StackFactory) -> None:
    limits = base.ServerLimits(head_timeout=0.5, keepalive_timeout=2.0)
    st = stack({"c": Upstream("openai-chat")}, limits=limits)
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        assert read_reply(sock)[0] == 200
        time.sleep(1.0)  # past the head timeout, inside the keep-alive time
        sock.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        assert read_reply(sock)[0] == 200


def test_content_length_with_transfer_encoding_is_refused_and_closed(
    stack: StackFactory,
) -> None:
    st = stack({"c": Upstream("openai-chat")})
    with connect(st.port) as sock:
        sock.sendall(
            post_head(CHAT, length=len(BODY), extra=b"transfer-encoding: chunked\r\n")
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
        )
        status, head, body = read_reply(sock)
        assert sock.recv(100) == b""  # and nothing more: closed
    assert status == 400
    assert b"connection: close" in head.lower()
    assert "Transfer-Encoding" in json.loads(body)["error"]["message"]
    assert len(st.mock("c").received) == 0


def test_status_lines_carry_their_reason_phrase(stack: StackFactory) -> None:
    st = stack({"c": Upstream("openai-chat")})
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        _, ok, _ = read_reply(sock)
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BODY), key="not-the-key") + BODY)
        _, refused, _ = read_reply(sock)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
    assert refused.startswith(b"HTTP/1.1 401 Unauthorized\r\n")


def test_a_malformed_head_is_not_echoed(stack: StackFactory) -> None:
    st = stack({"c": Upstream("openai-chat")})
    with connect(st.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nx-secret sk-private-123\r\n\r\n")
        status, _, body = read_reply(sock)
    assert status == 400
    assert b"sk-private-123" not in body
    assert json.loads(body)["error"]["code"] == "gw.request.bad_http"


# --- item 5: a client that stops reading ------------------------------------------------------


def test_a_client_that_stops_reading_is_taken_as_gone(stack: StackFactory) -> None:
    # About 8 MB of answer, as fast as it goes: more than every buffer between the gateway and
    # the client holds.
    big = Script(chunks=2000, chunk_size=4096)
    limits = base.ServerLimits(write_timeout=1.0)
    config = {
        **fallback("c"),
        "clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}],
    }
    st = stack(
        {"c": Upstream("openai-chat", MockSettings(script=big), extra={"max_concurrent": 1})},
        config=config,
        limits=limits,
    )
    stream_body = BODY[:-1] + b',"stream":true}'
    with connect(st.port, rcvbuf=4096) as stalled:
        stalled.sendall(post_head(CHAT, length=len(stream_body)) + stream_body)
        # Never read. Once the socket buffers are full, the gateway's write waits 1 s, then
        # gives up: the upstream call is cancelled, the slot and the key's permit freed, and
        # the request's row is written.
        started = time.monotonic()
        first = st.wait_rows(1, timeout=20)
        took = time.monotonic() - started
        assert first and first[0]["cancelled"] == 1
        small = Script(text="ok")
        with connect(st.port) as other:
            header = b"x-mock-script: " + json.dumps({"text": small.text}).encode() + b"\r\n"
            other.sendall(post_head(CHAT, length=len(BODY), extra=header) + BODY)
            status, _, body = read_reply(other)
        rows = st.wait_rows(2)
    assert status == 200, body
    assert rows[1]["status"] == 200
    assert took < 10


def test_a_client_that_trickles_bytes_but_reads_nothing_is_taken_as_gone(
    stack: StackFactory,
) -> None:
    # The write deadline is kept by the connection's watcher, which also reads: bytes coming in
    # (here a pipelined request's head, a byte at a time) must not keep it from giving up.
    big = Script(chunks=2000, chunk_size=4096)
    limits = base.ServerLimits(write_timeout=1.0)
    config = {
        **fallback("c"),
        "clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}],
    }
    st = stack(
        {"c": Upstream("openai-chat", MockSettings(script=big), extra={"max_concurrent": 1})},
        config=config,
        limits=limits,
    )
    stream_body = BODY[:-1] + b',"stream":true}'
    with connect(st.port, rcvbuf=4096) as stalled:
        stalled.sendall(post_head(CHAT, length=len(stream_body)) + stream_body)
        started = time.monotonic()
        rows: list[dict[str, object]] = []
        for byte in post_head(CHAT, length=len(BODY)):
            if time.monotonic() - started > 20:
                break
            try:
                stalled.send(bytes([byte]))
            except OSError:
                break  # the gateway dropped the connection
            rows = st.wait_rows(1, timeout=0.1)
            if rows:
                break
        took = time.monotonic() - started
    assert rows and rows[0]["cancelled"] == 1
    assert took < 10


# --- item 1 (the transport part): allow_from at accept ----------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_refused_address_is_closed_before_anything_is_read() -> None:
    seen: list[Request] = []
    heads: list[str] = []

    async def handler(request: Request, responder: Responder) -> None:
        seen.append(request)
        await responder.start(204, [])
        await responder.end()

    def check_head(request: Request) -> base.HeadRefusal | None:
        heads.append(request.path)
        return None

    def admit(address: str) -> bool:
        return address != "127.0.0.1"

    server = listener.Server(handler, check_head=check_head, admit=admit)
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: listener.serve(handler, server=server, task_status=task_status)
        )
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await conn.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            with anyio.fail_after(2):
                try:
                    got = await conn.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    got = b""
        tg.cancel_scope.cancel()
    assert got == b""
    assert seen == [] and heads == []


# --- item 7 and item 9: the key in the query ----------------------------------------------------

GEMINI_BODY = b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}'


@pytest.mark.parametrize("name", ["key", "%6Bey", "k%65y", "%6B%65%79"])
def test_an_escaped_key_parameter_is_found_and_never_sent_upstream(
    stack: StackFactory, name: str
) -> None:
    st = stack({"g": Upstream("gemini")})
    reply = http(
        f"{st.url}/v1beta/models/gemini-e2e-1:generateContent?alt=json&{name}={KEY}&x=1",
        body=GEMINI_BODY,
        headers=[("content-type", "application/json")],
    )
    received = st.mock("g").received[-1]
    assert reply.status == 200, reply.body
    assert KEY not in received.query and KEY not in received.path
    assert "x=1" in received.query


def test_a_non_ascii_key_is_compared_as_utf8_bytes(stack: StackFactory) -> None:
    secret = "schlüssel-ключ-鍵"
    config = {"clients": [{"name": "tester", "key": secret}]}
    st = stack({"c": Upstream("openai-chat")}, config=config)
    url = f"{st.url}/v1/chat/completions"
    by_query = http(
        f"{url}?key={quote(secret)}", body=BODY, headers=[("content-type", "application/json")]
    )
    # Compared in Latin-1 (with replacement) the right key failed: its Cyrillic and CJK letters
    # became "?". A key that differs only there must still fail.
    other = "schlüssel-ключ-鑰"
    wrong = http(
        f"{url}?key={quote(other)}", body=BODY, headers=[("content-type", "application/json")]
    )
    assert by_query.status == 200, by_query.body
    assert wrong.status == 401


def _outside_address() -> str | None:
    """An address of this machine that is not loopback (routing-table lookup, nothing sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_the_gateway_closes_a_refused_address_at_accept(stack: StackFactory) -> None:
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address other than loopback")
    config = {"listen": {"gateway": {"bind": "0.0.0.0", "allow_from": ["10.99.0.0/16"]}}}
    st = stack({"c": Upstream("openai-chat")}, config=config)
    with socket.create_connection((outside, st.port), timeout=5, source_address=(outside, 0)) as s:
        s.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        try:
            got = s.recv(100)
        except ConnectionResetError:
            got = b""
    assert got == b""  # closed, not answered: nothing was read from it
    assert len(st.mock("c").received) == 0
    # Loopback is always allowed.
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BODY)) + BODY)
        assert read_reply(sock)[0] == 200


# --- the body budget: every way a body can fail gives its bytes back ---------------------------

# A body of about 60 KiB: two of them overdraw the 100 KiB budget below, so a body whose bytes
# were never given back makes the next one 503.
BIG = json.dumps(
    {"model": "gpt-e2e-1", "messages": [{"role": "user", "content": "x" * 60_000}]}
).encode()
TIGHT = base.ServerLimits(body_timeout=1.0, max_body_bytes=64 * 1024, body_budget_bytes=100 * 1024)


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _chunked_head(path: bytes = CHAT) -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n"
    )


def _cut_off(sock: socket.socket) -> int:
    sock.sendall(post_head(CHAT, length=len(BIG)) + BIG[:-1])
    time.sleep(0.2)
    return 0  # the client leaves: no answer to read


def _too_slow(sock: socket.socket) -> int:
    sock.sendall(post_head(CHAT, length=len(BIG)) + BIG[:-1])
    return read_reply(sock)[0]  # 408 after the 1 s body timeout


def _chunked_over_the_limit(sock: socket.socket) -> int:
    piece = b"x" * 40_000
    sock.sendall(_chunked_head() + (b"%x\r\n%s\r\n" % (len(piece), piece)) * 2)
    return read_reply(sock)[0]


def _malformed_chunks(sock: socket.socket) -> int:
    piece = BIG[:50_000]
    sock.sendall(_chunked_head() + b"%x\r\n%s\r\nzz-not-a-size\r\n" % (len(piece), piece))
    return read_reply(sock)[0]


@pytest.mark.parametrize(
    ("fail", "status"),
    [(_cut_off, 0), (_too_slow, 408), (_chunked_over_the_limit, 413), (_malformed_chunks, 400)],
    ids=["cut-off", "body-timeout", "chunked-over-limit", "malformed-chunking"],
)
def test_a_body_that_never_arrives_whole_gives_its_budget_back(
    stack: StackFactory, fail: Callable[[socket.socket], int], status: int
) -> None:
    st = stack({"c": Upstream("openai-chat")}, limits=TIGHT)
    budget = st.app.body_budget
    for _ in range(2):
        with connect(st.port) as sock:
            got = fail(sock)
        assert got == status
    assert _wait_for(lambda: budget.used == 0), f"{budget.used} bytes still held"
    with connect(st.port) as sock:
        sock.sendall(post_head(CHAT, length=len(BIG)) + BIG)
        later, _, body = read_reply(sock)
    assert later == 200, body


def test_a_body_refused_by_the_budget_gives_back_what_it_had(stack: StackFactory) -> None:
    st = stack({"c": Upstream("openai-chat")}, limits=TIGHT)
    budget = st.app.body_budget
    with connect(st.port) as holder:
        holder.sendall(post_head(CHAT, length=len(BIG)) + BIG[:50_000])
        assert _wait_for(lambda: budget.used == 50_000)
        for _ in range(3):
            # Its first bytes fit, the rest does not: 503, and the bytes it took go back.
            with connect(st.port) as refused:
                refused.sendall(post_head(CHAT, length=len(BIG)) + BIG)
                assert read_reply(refused)[0] == 503
        assert _wait_for(lambda: budget.used == 50_000), f"{budget.used} bytes held"
    assert _wait_for(lambda: budget.used == 0), f"{budget.used} bytes still held"


def test_a_body_for_an_unknown_path_is_refused_before_it_is_read(stack: StackFactory) -> None:
    st = stack({"c": Upstream("openai-chat")}, limits=TIGHT)
    with connect(st.port) as sock:
        # A valid key, a path the gateway does not serve, and a body that never comes.
        sock.sendall(post_head(b"/v1/nothing-here", length=60_000))
        started = time.monotonic()
        status, head, body = read_reply(sock)
        took = time.monotonic() - started
    assert status == 404
    assert json.loads(body)["error"]["code"] == "gw.request.not_found"
    assert b"connection: close" in head.lower()
    assert took < 2.0
    assert st.app.body_budget.used == 0
    # A bodiless request to an unknown path keeps its connection.
    with connect(st.port) as sock:
        for _ in range(2):
            sock.sendall(b"GET /v1/nothing-here HTTP/1.1\r\nhost: x\r\n\r\n")
            assert read_reply(sock)[0] == 404


def test_an_http2_stream_cut_off_mid_body_gives_its_budget_back(stack: StackFactory) -> None:
    st = stack({"c": Upstream("openai-chat")}, limits=TIGHT)
    budget = st.app.body_budget
    for _ in range(2):
        client = RawH2(st.port)
        stream_id = client.request(
            "/v1/chat/completions",
            headers=[("authorization", f"Bearer {KEY}"), ("content-type", "application/json")],
            end=False,
        )
        for start in range(0, 48_000, 16_000):  # within the default frame size and window
            client.h2.send_data(stream_id, BIG[start : start + 16_000])
        client.flush()
        assert _wait_for(lambda: budget.used == 48_000)
        client.sock.close()
        assert _wait_for(lambda: budget.used == 0), f"{budget.used} bytes still held"


# --- connection caps: idle keep-alive connections make room; one address's share -------------


def _keep_alive_idle(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each had one answer and now wait idle for their next request."""
    keepers = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_reply(sock)[0] == 200
        keepers.append(sock)
        time.sleep(0.01)  # so that the first is the one idle longest
    return keepers


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_at_the_connection_cap_an_idle_connection_makes_room(stack: StackFactory) -> None:
    gateway = {"bind": "127.0.0.1", "max_connections": 4, "max_connections_per_address": 4}
    st = stack({"c": Upstream("openai-chat")}, config={"listen": {"gateway": gateway}})
    keepers = _keep_alive_idle(st.port, 4)
    try:
        with connect(st.port) as sock:
            started = time.monotonic()
            sock.sendall(post_head(CHAT, length=len(BODY)) + BODY)
            status, _, body = read_reply(sock)
            took = time.monotonic() - started
        assert status == 200, body
        assert took < 3.0  # not the 75 s keep-alive time of the idle ones
        assert _closed_by_server(keepers[0])  # the one idle longest went
        # The others are still served on their connections.
        keepers[1].sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_reply(keepers[1])[0] == 200
    finally:
        for sock in keepers:
            sock.close()


def test_one_address_gets_its_share_of_connections(stack: StackFactory) -> None:
    config = {
        "listen": {
            "gateway": {
                "bind": "127.0.0.1",
                "max_connections": 10,
                "max_connections_per_address": 2,
            }
        }
    }
    st = stack({"c": Upstream("openai-chat")}, config=config)
    with connect(st.port) as busy, connect(st.port) as other_busy:
        # Two requests in progress (heads half sent): nothing of this address is idle.
        for sock in (busy, other_busy):
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        assert _wait_for(lambda: st.app.gateway_server.per_address.get("127.0.0.1") == 2)
        with connect(st.port) as third:
            started = time.monotonic()
            status, head, body = read_reply(third)
            took = time.monotonic() - started
        assert status == 503
        assert json.loads(body)["error"]["code"] == "gw.listen.address_busy"
        assert b"retry-after: 1" in head.lower()
        assert took < 2.0
    assert _wait_for(lambda: "127.0.0.1" not in st.app.gateway_server.per_address)
    # With one of its connections idle, that one makes room for the new one.
    keeper = _keep_alive_idle(st.port, 1)[0]
    try:
        with connect(st.port) as busy:
            busy.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            assert _wait_for(lambda: st.app.gateway_server.per_address.get("127.0.0.1") == 2)
            with connect(st.port) as third:
                third.sendall(post_head(CHAT, length=len(BODY)) + BODY)
                assert read_reply(third)[0] == 200
            assert _closed_by_server(keeper)
    finally:
        keeper.close()


# --- the control listener: key before body, its own caps and budget -----------------------------


def _control_stack(tmp_path: Path, **control: Any) -> ContextManager[Stack]:
    config = {
        "listen": {
            "gateway": {"bind": "127.0.0.1"},
            "control": {"bind": "127.0.0.1", "key": CONTROL_KEY, **control},
        }
    }
    return running_stack(
        tmp_path,
        {"c": Upstream("openai-chat")},
        config=config,
        control=True,
        limits=base.ServerLimits(body_budget_bytes=2048),
    )


def _control_head(length: int, key: str | None = CONTROL_KEY) -> bytes:
    auth = b"x-control-key: " + key.encode() + b"\r\n" if key else b""
    return (
        b"PUT /config HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + auth
        + b"content-length: %d\r\n\r\n" % length
    )


@pytest.mark.parametrize("key", [None, "wrong-control-key"])
def test_the_control_key_is_checked_before_the_body(tmp_path: Path, key: str | None) -> None:
    with _control_stack(tmp_path) as st:
        assert st.control_port is not None
        with connect(st.control_port) as sock:
            # Under the 1 MiB body cap, and never sent.
            sock.sendall(_control_head(1_000_000, key=key))
            started = time.monotonic()
            status, head, body = read_reply(sock)
            took = time.monotonic() - started
    assert status == 401
    assert json.loads(body)["error"]["code"] == (
        "control.auth.missing_key" if key is None else "control.auth.bad_key"
    )
    assert b"connection: close" in head.lower()
    assert took < 2.0


def test_the_control_listener_has_its_own_body_cap_and_budget(tmp_path: Path) -> None:
    with _control_stack(tmp_path, max_body_bytes=4096) as st:
        assert st.control_port is not None
        with connect(st.control_port) as sock:
            sock.sendall(_control_head(5000))
            status, _, body = read_reply(sock)
        assert status == 413
        assert json.loads(body)["error"]["code"] == "gw.request.body_too_large"
        # A control body held half sent does not take from the gateway's 2 KiB budget.
        server = st.app._control_server
        assert server is not None
        with connect(st.control_port) as holder:
            holder.sendall(_control_head(4000) + b"{" + b" " * 1500)
            assert _wait_for(lambda: server.budget.used == 1501)
            padded = BODY[:-1] + b',"user":"' + b"u" * 1400 + b'"}'
            with connect(st.port) as sock:
                sock.sendall(post_head(CHAT, length=len(padded)) + padded)
                status, _, body = read_reply(sock)
            assert status == 200, body
        # Cut off, it gives its bytes back to its own budget.
        assert _wait_for(lambda: server.budget.used == 0)
        assert st.app.body_budget.used == 0


def test_the_control_listener_caps_its_connections(tmp_path: Path) -> None:
    status_request = b"GET /status HTTP/1.1\r\nhost: x\r\nx-control-key: %s\r\n\r\n" % (
        CONTROL_KEY.encode()
    )
    with _control_stack(tmp_path, max_connections=2) as st:
        assert st.control_port is not None
        with connect(st.control_port) as one, connect(st.control_port) as two:
            for sock in (one, two):
                sock.sendall(b"GET /status HTTP/1.1\r\nhost: x\r\n")  # heads half sent
            with connect(st.control_port) as third:
                third.sendall(status_request)
                third.settimeout(0.5)
                with pytest.raises(TimeoutError):
                    third.recv(100)  # at the cap, nothing idle: it waits in the backlog
                one.close()
                third.settimeout(5)
                assert read_reply(third)[0] == 200
                # third is now idle between requests: a new client takes its place.
                with connect(st.control_port) as fourth:
                    fourth.sendall(status_request)
                    assert read_reply(fourth)[0] == 200
                assert _closed_by_server(third)
