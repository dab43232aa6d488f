"""HTTP/2 (h2c) through the real gateway: the official SDKs over an HTTP/2-only httpx client,
the Upgrade path, many streams on one connection, flow control both ways, a stream reset
mid-answer, drain, limits and abuse — and HTTP/2 to an upstream that speaks it."""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import anyio
import h2.errors
import h2.settings
import hpack
import httpx2
import openai
import pytest
from anyio.from_thread import start_blocking_portal
from google import genai
from google.genai import types as gtypes
from hypothesis import given
from hypothesis import strategies as st

from tests.twserve.conftest import (
    FORMATS,
    MODELS,
    PROMPT,
    StackFactory,
    StreamReportedError,
    attempts,
    fallback,
)
from tests.twserve.support.floods import flood, flood_socket
from tests.twserve.support.h2_client import RawH2
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twengine.config import build_config
from twmock.script import MockSettings, Script, parse_script
from twmock.serve.handler import make_handler
from twmock.serve.server import run_mock
from twserve.app.wiring import GatewayApp
from twserve.server import base, http2, listener
from twserve.server.base import Request, Responder
from twserve.server.h2_streams import FrameGuard

TEXT = "Grüße über HTTP/2 🚀 — one connection, many streams"
SETTINGS = h2.settings.SettingCodes

_PATHS = {
    "anthropic": "/v1/messages",
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "gemini": "/v1beta/models/m:streamGenerateContent?alt=sse",
}


def _body(fmt: str, *, stream: bool = True) -> bytes:
    if fmt == "anthropic":
        data: dict[str, Any] = {
            "model": "m",
            "max_tokens": 64,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }
    elif fmt == "openai-chat":
        data = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    elif fmt == "openai-responses":
        data = {"model": "m", "stream": stream, "input": "hi"}
    else:
        data = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    return json.dumps(data).encode()


def _auth(fmt: str = "anthropic") -> list[tuple[str, str]]:
    if fmt == "anthropic":
        return [("x-api-key", KEY), ("content-type", "application/json")]
    if fmt == "gemini":
        return [("x-goog-api-key", KEY), ("content-type", "application/json")]
    return [("authorization", f"Bearer {KEY}"), ("content-type", "application/json")]


def _in_flight(st: Stack, name: str) -> int:
    return int(st.app.gateway.router.slots.in_flight(name))


def _wait(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --- the official SDKs over HTTP/2 only -------------------------------------------------------


@contextmanager
def _h2_sdks(st: Stack) -> Iterator[tuple[anthropic.Anthropic, openai.OpenAI, Any, list[str]]]:
    versions: list[str] = []

    def seen(response: httpx2.Response) -> None:
        versions.append(response.http_version)

    with ExitStack() as exits:
        client = exits.enter_context(
            httpx2.Client(http1=False, http2=True, timeout=5.0, event_hooks={"response": [seen]})
        )
        gemini = genai.Client(
            api_key=KEY,
            http_options=gtypes.HttpOptions(
                base_url=st.url,
                timeout=5000,
                retry_options=gtypes.HttpRetryOptions(attempts=1),
                httpx_client=client,
            ),
        )
        exits.callback(gemini.close)
        yield (
            anthropic.Anthropic(
                base_url=st.url, api_key=KEY, max_retries=0, timeout=5.0, http_client=client
            ),
            openai.OpenAI(
                base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=5.0, http_client=client
            ),
            gemini,
            versions,
        )


def _ask(fmt: str, clients: Any, *, stream: bool) -> tuple[str, int]:
    """The text and the output tokens an SDK reports."""
    ant, oai, gem, _ = clients
    if fmt == "anthropic":
        kwargs: dict[str, Any] = {
            "model": MODELS[fmt],
            "max_tokens": 256,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        if stream:
            with ant.messages.stream(**kwargs) as events:
                msg = events.get_final_message()
        else:
            msg = ant.messages.create(**kwargs)
        return "".join(b.text for b in msg.content if b.type == "text"), msg.usage.output_tokens
    if fmt == "openai-chat":
        if stream:
            parts, out = [], 0
            with oai.chat.completions.create(
                model=MODELS[fmt],
                messages=[{"role": "user", "content": PROMPT}],
                stream=True,
                stream_options={"include_usage": True},
            ) as chunks:
                for chunk in chunks:
                    out = chunk.usage.completion_tokens if chunk.usage else out
                    parts += [c.delta.content or "" for c in chunk.choices]
            return "".join(parts), out
        done = oai.chat.completions.create(
            model=MODELS[fmt], messages=[{"role": "user", "content": PROMPT}]
        )
        assert done.usage is not None
        return done.choices[0].message.content or "", done.usage.completion_tokens
    if fmt == "openai-responses":
        if stream:
            with oai.responses.stream(model=MODELS[fmt], input=PROMPT) as events:
                for event in events:
                    if event.type == "response.failed":
                        raise StreamReportedError("response.failed")
                response = events.get_final_response()
        else:
            response = oai.responses.create(model=MODELS[fmt], input=PROMPT)
        assert response.usage is not None
        return response.output_text, response.usage.output_tokens
    config = gtypes.GenerateContentConfig(
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True)
    )
    if stream:
        pieces = list(
            gem.models.generate_content_stream(model=MODELS[fmt], contents=PROMPT, config=config)
        )
    else:
        pieces = [gem.models.generate_content(model=MODELS[fmt], contents=PROMPT, config=config)]
    text = "".join(p.text or "" for p in pieces)
    usage = [p.usage_metadata for p in pieces if p.usage_metadata]
    return text, usage[-1].candidates_token_count or 0 if usage else 0


@pytest.fixture(scope="module")
def h2_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One gateway with a mock of each format, each offering the model its SDK asks for."""
    script = MockSettings(script=Script(text=TEXT, chunk_size=7))
    ups = {fmt: Upstream(fmt, script, models=[MODELS[fmt]]) for fmt in FORMATS}
    with running_stack(tmp_path_factory.mktemp("h2"), ups) as st:
        yield st


@pytest.mark.sdk
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_over_h2c_prior_knowledge(h2_stack: Stack, fmt: str, stream: bool) -> None:
    with _h2_sdks(h2_stack) as clients:
        text, output = _ask(fmt, clients, stream=stream)
        versions = clients[3]
    assert text == TEXT
    assert output > 0
    assert versions and set(versions) == {"HTTP/2"}


@pytest.mark.sdk
def test_sdk_streams_share_one_h2_connection(h2_stack: Stack) -> None:
    """Eight SDK streams at once on one HTTP/2-only client: one TCP connection.

    The async client, from one event loop: httpcore's sync HTTP/2 connection lets threads
    interleave inside h2 (which is not thread-safe), so two threads' HEADERS can go out in the
    wrong stream order, and the gateway then ends the connection with PROTOCOL_ERROR, as RFC
    9113 (5.1.1) says it must."""

    async def many() -> tuple[list[str], int]:
        async with httpx2.AsyncClient(http1=False, http2=True, timeout=5.0) as client:
            oai = openai.AsyncOpenAI(
                base_url=h2_stack.url + "/v1", api_key=KEY, max_retries=0, http_client=client
            )
            results: list[str] = []

            async def one() -> None:
                parts: list[str] = []
                stream = await oai.chat.completions.create(
                    model=MODELS["openai-chat"],
                    messages=[{"role": "user", "content": PROMPT}],
                    stream=True,
                )
                async for chunk in stream:
                    parts += [c.delta.content or "" for c in chunk.choices]
                results.append("".join(parts))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
            return results, len(client._transport._pool.connections)

    results, connections = anyio.run(many)
    assert connections == 1
    assert results == [TEXT] * 8


# --- the Upgrade path ---------------------------------------------------------------------------


def test_upgrade_h2c_serves_the_request_as_stream_1(h2_stack: Stack) -> None:
    body = _body("anthropic")
    body = body.replace(b'"model": "m"', b'"model": "' + MODELS["anthropic"].encode() + b'"')
    head = (
        f"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c"
    ).encode()
    client = RawH2(h2_stack.port, upgrade=(head, body))
    try:
        assert b"upgrade: h2c" in client.switched_head.lower()
        first = client.finish(1)
        assert first.status == 200 and first.ended
        assert b"message_stop" in first.body
        # The connection now speaks HTTP/2 for further requests.
        sid = client.request(
            "/v1/messages", body, headers=[("x-api-key", KEY), ("content-type", "application/json")]
        )
        second = client.finish(sid)
        assert second.status == 200 and b"message_stop" in second.body
    finally:
        client.close()


def test_upgrade_without_settings_stays_http1(h2_stack: Stack) -> None:
    """RFC 9113: an h2c upgrade lacking HTTP2-Settings is answered over HTTP/1.1."""
    with socket.create_connection(("127.0.0.1", h2_stack.port), timeout=5) as sock:
        sock.sendall(
            b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
            + KEY.encode()
            + b"\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n"
        )
        got = sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")


# --- many streams, flow control -----------------------------------------------------------------


def test_many_concurrent_streams_on_one_connection(stack: StackFactory) -> None:
    slow = MockSettings(script=Script(chunks=10, chunk_delay=0.05))
    st = stack({"a": Upstream("anthropic", slow)})
    client = RawH2(st.port)
    try:
        started = time.monotonic()
        ids = [
            client.request("/v1/messages", _body("anthropic"), headers=_auth()) for _ in range(40)
        ]
        answers = [client.finish(i, timeout=15) for i in ids]
        took = time.monotonic() - started
    finally:
        client.close()
    assert all(a.status == 200 and a.ended and b"message_stop" in a.body for a in answers)
    # Each answer takes ~0.5 s; forty one after another would take 20 s.
    assert took < 8, took
    assert len(st.wait_rows(40)) == 40


async def _chunks_handler(
    sent: list[int], request: Request, responder: Responder, *, chunk: int, count: int
) -> None:
    await responder.start(200, [(b"content-type", b"application/octet-stream")])
    for i in range(count):
        await responder.send(bytes([i % 251]) * chunk)
        sent.append(chunk)
    await responder.end()


@contextmanager
def _server(handler: Any, **kwargs: Any) -> Iterator[int]:
    """A bare server (HTTP/1.1 with the HTTP/2 switch) around `handler`; yields its port."""
    limits = kwargs.pop("h2_limits", None)
    switch = partial(http2.switch, limits=limits) if limits else http2.switch
    with start_blocking_portal() as portal:
        server = listener.Server(handler, switches=(switch,), **kwargs)
        fut, port = portal.start_task(partial(listener.serve, handler, port=0, server=server))
        try:
            yield port
        finally:
            fut.cancel()


def test_send_waits_for_the_window() -> None:
    """A client with a 1 KiB stream window that reads slowly: the handler's sends block at the
    window, never more than the window plus one chunk is out, and every byte arrives."""
    sent: list[int] = []
    chunk, count, window = 300, 40, 1024
    handler = partial(_chunks_handler, sent, chunk=chunk, count=count)
    with _server(handler) as port:
        client = RawH2(port, settings={SETTINGS.INITIAL_WINDOW_SIZE: window}, auto_ack=False)
        try:
            sid = client.request("/", method="GET")
            answer = client.answers[sid]
            client.wait(lambda: len(answer.body) >= window)
            time.sleep(0.3)  # the handler had time to run ahead if it could
            client.read_once(0.1)
            assert len(answer.body) == window  # the server sent exactly the window
            assert sum(sent) <= window + chunk  # and the handler is held at the window
            acked = 0
            while not answer.ended:
                client.ack(sid, len(answer.body) - acked)
                acked = len(answer.body)
                client.read_once(0.2)
                assert sum(sent) <= len(answer.body) + window + chunk
        finally:
            client.close()
    expected = b"".join(bytes([i % 251]) * chunk for i in range(count))
    assert bytes(answer.body) == expected


def test_small_window_client_gets_the_whole_gateway_answer(stack: StackFactory) -> None:
    st = stack({"a": Upstream("anthropic", MockSettings(script=Script(chunks=400)))})
    client = RawH2(st.port, settings={SETTINGS.INITIAL_WINDOW_SIZE: 512})
    try:
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        small = client.finish(sid, timeout=10)
    finally:
        client.close()
    reply = httpx2.post(
        st.url + "/v1/messages", content=_body("anthropic"), headers=dict(_auth()), timeout=5
    )
    assert small.status == 200 and small.ended
    assert len(small.body) > 20 * 512  # many windows' worth
    assert small.body.count(b"content_block_delta") == reply.content.count(b"content_block_delta")


def test_request_body_over_many_windows_arrives_whole() -> None:
    seen: list[bytes] = []

    async def echo(request: Request, responder: Responder) -> None:
        seen.append(request.body)
        await responder.start(200, [])
        await responder.send(str(len(request.body)).encode())
        await responder.end()

    body = bytes(range(256)) * 12_000  # 3 MB: more than the 1 MiB stream window
    with _server(echo) as port, httpx2.Client(http1=False, http2=True) as client:
        reply = client.post(f"http://127.0.0.1:{port}/", content=body)
    assert reply.http_version == "HTTP/2" and reply.text == str(len(body))
    assert seen == [body]


# --- the client leaving, drain ---------------------------------------------------------------


def test_reset_mid_stream_cancels_upstream_and_frees_the_slot(stack: StackFactory) -> None:
    slow = MockSettings(script=Script(chunks=200, chunk_delay=0.02))
    st = stack(
        {
            "a": Upstream(
                "anthropic", slow, extra={"max_concurrent": 1, "forward_mock_headers": True}
            )
        }
    )
    client = RawH2(st.port)
    try:
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        answer = client.answers[sid]
        client.wait(lambda: b"content_block_delta" in answer.body)
        assert _in_flight(st, "a") == 1
        client.reset(sid)
        _wait(lambda: _in_flight(st, "a") == 0)
        (row,) = st.wait_rows(1)
        assert row["cancelled"] == 1
        # The connection and its other streams are unaffected: the freed slot takes the next.
        fast = client.request(
            "/v1/messages",
            _body("anthropic"),
            headers=[*_auth(), ("x-mock-script", '{"chunks": 2}')],
        )
        assert client.finish(fast, timeout=10).status == 200
    finally:
        client.close()


def test_closing_the_socket_cancels_every_stream(stack: StackFactory) -> None:
    slow = MockSettings(script=Script(chunks=200, chunk_delay=0.02))
    st = stack({"a": Upstream("anthropic", slow)})
    client = RawH2(st.port)
    ids = [client.request("/v1/messages", _body("anthropic"), headers=_auth()) for _ in range(3)]
    client.wait(lambda: all(b"content_block_delta" in client.answers[i].body for i in ids))
    client.close()
    _wait(lambda: _in_flight(st, "a") == 0)
    rows = st.wait_rows(3)
    assert [r["cancelled"] for r in rows] == [1, 1, 1]


def _raw_frames(sock: socket.socket) -> list[tuple[int, int, int, int | None, bytes]]:
    """Every frame until the server closes, as (type, flags, stream, error code, payload)."""
    data = b""
    sock.settimeout(5)
    while chunk := sock.recv(65536):
        data += chunk
    frames = []
    while len(data) >= 9:
        size = int.from_bytes(data[:3], "big")
        kind, flags = data[3], data[4]
        stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        payload = data[9 : 9 + size]
        code = int.from_bytes(payload[:4], "big") if kind == 0x3 else None
        frames.append((kind, flags, stream, code, payload))
        data = data[9 + size :]
    return frames


def test_drain_sends_goaway_finishes_streams_and_refuses_new_ones(stack: StackFactory) -> None:
    slow = MockSettings(script=Script(chunks=20, chunk_delay=0.03))
    st = stack({"a": Upstream("anthropic", slow)})
    client = RawH2(st.port)
    try:
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        answer = client.answers[sid]
        client.wait(lambda: b"content_block_delta" in answer.body)
        st.portal.start_task_soon(st.app.gateway_server.drain, 10.0)
        client.wait(lambda: client.goaway is not None)
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert client.goaway.last_stream_id == sid
        # h2 itself opens no stream after a GOAWAY; a client that races it sends one anyway.
        late = sid + 2
        block = hpack.Encoder().encode(
            [
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", b"x"),
                (b":path", b"/v1/models"),
            ]
        )
        client.send_raw(_frame(0x1, 0x5, late, block))  # END_HEADERS | END_STREAM
        frames = _raw_frames(client.sock)
        assert (0x3, late, h2.errors.ErrorCodes.REFUSED_STREAM) in [
            (kind, stream, code) for kind, _, stream, code, _ in frames
        ]
        rest = b"".join(payload for kind, _, stream, _, payload in frames if stream == sid)
        ends = [
            flags & 0x1 for kind, flags, stream, _, _ in frames if kind == 0x0 and stream == sid
        ]
        assert b"message_stop" in answer.body + rest and ends[-1] == 1
        assert frames[-1][0] == 0x7  # the connection ends with its final GOAWAY
    finally:
        client.close()


# --- limits --------------------------------------------------------------------------------------


def test_idle_connection_gets_goaway(stack: StackFactory) -> None:
    st = stack({"a": Upstream("anthropic")}, limits=base.ServerLimits(keepalive_timeout=0.3))
    client = RawH2(st.port)
    try:
        client.wait_closed(timeout=3)
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
    finally:
        client.close()


def test_slow_body_gets_408_in_the_client_format(stack: StackFactory) -> None:
    st = stack({"a": Upstream("anthropic")}, limits=base.ServerLimits(body_timeout=0.3))
    client = RawH2(st.port)
    try:
        sid = client.request("/v1/messages", b"{", headers=_auth(), end=False)
        answer = client.finish(sid)
    finally:
        client.close()
    assert answer.status == 408
    assert json.loads(answer.body)["type"] == "error"  # Anthropic's shape
    assert "not received in time" in json.loads(answer.body)["error"]["message"]


def test_body_too_large_gets_413(stack: StackFactory) -> None:
    st = stack({"a": Upstream("openai-chat")}, limits=base.ServerLimits(max_body_bytes=1000))
    client = RawH2(st.port)
    try:
        declared = client.request("/v1/chat/completions", b"x" * 2000, headers=_auth("chat"))
        sent = client.request(
            "/v1/chat/completions", b"y" * 800, headers=_auth("chat"), end=False, length=False
        )
        client.h2.send_data(sent, b"y" * 800, end_stream=True)
        client.flush()
        answers = [client.finish(declared), client.finish(sent)]
    finally:
        client.close()
    for answer in answers:
        assert answer.status == 413
        assert json.loads(answer.body)["error"]["code"] == "gw.request.body_too_large"


def test_headers_too_large_get_431_then_goaway_past_the_hard_cap(stack: StackFactory) -> None:
    st = stack({"a": Upstream("anthropic")})
    client = RawH2(st.port)
    try:
        sid = client.request(
            "/v1/messages", _body("anthropic"), headers=[*_auth(), ("x-big", "a" * 100_000)]
        )
        answer = client.finish(sid)
        assert answer.status == 431
        assert json.loads(answer.body)["error"]["type"] == "invalid_request_error"
        client.request("/v1/messages", _body("anthropic"), headers=[("x-huge", "b" * 300_000)])
        client.wait_closed()
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    finally:
        client.close()


# --- abuse ---------------------------------------------------------------------------------------


async def _hold(request: Request, responder: Responder) -> None:
    await responder.start(200, [])
    await anyio.sleep(30)


def test_too_many_streams_is_a_protocol_error() -> None:
    limits = http2.Http2Limits(max_concurrent_streams=4)
    with _server(_hold, h2_limits=limits) as port:
        # The streams go out before the server's SETTINGS are read, so the client's own h2 does
        # not hold it to the limit.
        client = RawH2(port)
        try:
            for _ in range(5):
                client.request("/", method="GET")
            client.wait_closed()
            assert client.goaway is not None
            assert client.goaway.error_code in (
                h2.errors.ErrorCodes.PROTOCOL_ERROR,
                h2.errors.ErrorCodes.REFUSED_STREAM,
            )
        finally:
            client.close()
        # The server itself is fine.
        with httpx2.Client(http1=False, http2=True) as again:
            with again.stream("GET", f"http://127.0.0.1:{port}/") as reply:
                assert reply.status_code == 200


def _frame(
    kind: int, flags: int, stream_id: int, payload: bytes, length: int | None = None
) -> bytes:
    size = len(payload) if length is None else length
    return (
        struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload
    )


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "header-only"])
def test_oversized_frame_gets_frame_size_error(h2_stack: Stack, whole: bool) -> None:
    client = RawH2(h2_stack.port)
    try:
        if whole:
            client.send_raw(_frame(0x0, 0, 1, b"z" * 20_000))  # DATA over 16 KiB
        else:
            # A header claiming 16 MB: refused at the header, not after buffering the payload.
            client.send_raw(_frame(0x0, 0, 1, b"z" * 100, length=0xFFFFFF))
        client.wait_closed()
        assert client.goaway is not None
        assert client.goaway.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
    finally:
        client.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nGET / HTTP/1.1\r\n\r\n",  # not a SETTINGS frame
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,
    ],
    ids=["http1-after-preface", "noise"],
)
def test_garbage_after_the_preface_gets_goaway(h2_stack: Stack, garbage: bytes) -> None:
    with socket.create_connection(("127.0.0.1", h2_stack.port), timeout=5) as sock:
        sock.sendall(garbage)
        frames = _raw_frames(sock)
    assert frames[0][0] == 0x4  # the server's SETTINGS
    assert frames[-1][0] == 0x7  # then GOAWAY, and the connection closes
    code = int.from_bytes(frames[-1][4][4:8], "big")
    assert code in (h2.errors.ErrorCodes.PROTOCOL_ERROR, h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
    # The gateway still serves.
    with httpx2.Client(http1=False, http2=True) as client:
        reply = client.get(h2_stack.url + "/v1/models", headers=dict(_auth("chat")))
        assert reply.status_code == 200


def test_a_broken_preface_is_answered_over_http1(h2_stack: Stack) -> None:
    """Nothing HTTP/2 is written until the whole preface is in: ``PRI *`` followed by anything
    else is a malformed HTTP/1.1 request, answered 400."""
    with socket.create_connection(("127.0.0.1", h2_stack.port), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nXY\r\n\r\n" + b"\x00" * 9)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 400 ")
    assert b"gw.request.bad_http" in got


def test_continuation_flood_is_cut_off(h2_stack: Stack) -> None:
    client = RawH2(h2_stack.port)
    try:
        # HEADERS without END_HEADERS, then empty CONTINUATIONs without end: a block that never
        # completes. h2 holds a bounded backlog and ends the connection.
        client.send_raw(_frame(0x1, 0x0, 1, b""))
        sent = 0
        try:
            for _ in range(100_000):
                client.send_raw(_frame(0x9, 0x0, 1, b""))
                sent += 1
        except OSError:
            pass
        client.wait_closed()
        assert client.goaway is not None
        assert client.goaway.error_code != h2.errors.ErrorCodes.NO_ERROR
        assert sent < 100_000 or client.closed
    finally:
        client.close()


def test_rapid_reset_is_cut_off() -> None:
    """Streams opened and reset at once do not count against the stream limit; a client that
    does it over and over gets ENHANCE_YOUR_CALM instead of unbounded handlers."""
    started: list[int] = []

    async def counting(request: Request, responder: Responder) -> None:
        started.append(1)
        await _hold(request, responder)

    limits = http2.Http2Limits(max_concurrent_streams=10, max_resets=50)
    with _server(counting, h2_limits=limits) as port:
        client = RawH2(port)
        try:
            client.read_once(0.5)  # the server's SETTINGS
            for _ in range(500):
                if client.closed:
                    break
                sid = client.request("/", method="GET")
                client.reset(sid)
            client.wait_closed()
            assert client.goaway is not None
            assert client.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        finally:
            client.close()
    assert len(started) <= 60


# --- HTTP/2 to the upstream ---------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("upstream_h2", [True, False], ids=["h2", "http1"])
async def test_provider_http2_talks_h2c_to_the_upstream(tmp_path: Path, upstream_h2: bool) -> None:
    mock = make_handler(MockSettings(script=Script(text=TEXT)))
    versions: list[str] = []

    async def recording(request: Request, responder: Responder) -> None:
        versions.append(request.http_version)
        await mock(request, responder)

    async with anyio.create_task_group() as tg:
        server = listener.Server(recording, switches=(http2.switch,))
        port = await tg.start(partial(listener.serve, recording, port=0, server=server))
        provider = {
            "name": "up",
            "protocol": "openai-chat",
            "key": "x",
            "base_url": f"http://127.0.0.1:{port}/v1",
            "http2": upstream_h2,
        }
        config = build_config(
            {"version": 1, "clients": [{"name": "t", "key": KEY}], "providers": [provider]}
        )
        app = GatewayApp(config, tmp_path, env={}, port=0)
        bound = await tg.start(app.run)
        url = f"http://127.0.0.1:{bound.gateway_port}/v1/chat/completions"

        async def one(stream: bool) -> bytes:
            async with httpx2.AsyncClient(timeout=5) as client:
                reply = await client.post(
                    url, content=_body("openai-chat", stream=stream), headers=dict(_auth("chat"))
                )
            assert reply.status_code == 200
            return reply.content

        replies: list[bytes] = []

        async def run(stream: bool) -> None:
            replies.append(await one(stream))

        async with anyio.create_task_group() as calls:
            for i in range(6):
                calls.start_soon(run, i % 2 == 0)
        tg.cancel_scope.cancel()
    assert len(replies) == 6
    whole = [json.loads(r) for r in replies if not r.startswith(b"data:")]
    assert len(whole) == 3
    assert all(w["choices"][0]["message"]["content"] == TEXT for w in whole)
    assert all(r.rstrip().endswith(b"data: [DONE]") for r in replies if r.startswith(b"data:"))
    assert versions == ["2" if upstream_h2 else "1.1"] * 6


@pytest.mark.sdk
@pytest.mark.parametrize("first", ["h2", "plain"])
def test_two_providers_on_one_base_url_keep_their_own_http2(tmp_path: Path, first: str) -> None:
    # One upstream address, two providers: each request goes over its own provider's transport,
    # whichever of them is configured first.
    seen: list[tuple[str, str]] = []  # (upstream key, HTTP version) of each request

    def recording(mock: base.Handler) -> base.Handler:
        async def handler(request: Request, responder: Responder) -> None:
            key = (request.header(b"authorization") or b"").decode()
            seen.append((key.removeprefix("Bearer upstream-key-"), request.http_version))
            await mock(request, responder)

        return handler

    second = "plain" if first == "h2" else "h2"
    fields = {"h2": {"http2": True, "models": ["m-h2"]}, "plain": {"models": ["m-plain"]}}
    up = Upstream(
        "openai-chat",
        MockSettings(script=Script(text=TEXT)),
        models=fields[first]["models"],
        extra={k: v for k, v in fields[first].items() if k != "models"},
        wrap=recording,
        twins={second: fields[second]},
    )
    with running_stack(tmp_path, {first: up}) as st:
        client = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=5)
        for model in ("m-h2", "m-plain", "m-h2", "m-plain"):
            stream = model == "m-h2"
            messages = [{"role": "user", "content": "hi"}]
            if stream:
                chunks = client.chat.completions.create(model=model, messages=messages, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                answer = client.chat.completions.create(model=model, messages=messages)
                text = answer.choices[0].message.content or ""
            assert text == TEXT
        client.close()
        rows = st.wait_rows(4)
    assert [r["provider"] for r in rows] == ["h2", "plain", "h2", "plain"]
    assert seen == [("h2", "2"), ("plain", "1.1"), ("h2", "2"), ("plain", "1.1")]


# --- the pieces ----------------------------------------------------------------------------------


def _client_bytes() -> bytes:
    """What a client sends to open a connection and ask one GET with a small body."""
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/echo")],
    )
    conn.send_data(1, b"z" * 16_000)
    conn.send_data(1, b"z" * 1_000, end_stream=True)  # two DATA frames
    return conn.data_to_send()


@given(cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=30))
def test_frame_guard_passes_any_split_of_valid_frames(cuts: list[int]) -> None:
    data = _client_bytes()
    guard = FrameGuard(16384, len(http2.PREFACE))
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert all(guard.passes(p) for p in pieces)
    assert guard.skip == 0 and guard.head == b""  # at a frame boundary at the end


@given(cut=st.integers(min_value=0, max_value=40))
def test_frame_guard_refuses_an_oversized_header_however_split(cut: int) -> None:
    data = http2.PREFACE + _frame(0x4, 0, 0, b"") + _frame(0x0, 0, 1, b"", length=16385)
    guard = FrameGuard(16384, len(http2.PREFACE))
    cut = min(cut, len(data))
    assert not (guard.passes(data[:cut]) and guard.passes(data[cut:]))


def test_a_connection_fed_one_byte_at_a_time() -> None:
    async def echo(request: Request, responder: Responder) -> None:
        await responder.start(200, [])
        await responder.send(str(len(request.body)).encode())
        await responder.end()

    with _server(echo) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in _client_bytes():
            sock.sendall(bytes([byte]))
        # No half-close: end of input is the client leaving. Read until stream 1 ends.
        got = b""
        while b"17000" not in got:
            chunk = sock.recv(65536)
            assert chunk
            got += chunk
    assert b"17000" in got


def test_a_switch_of_its_own_takes_websocket_upgrades() -> None:
    """The connection-start hook routes an ``Upgrade: websocket`` to a switch other than
    HTTP/2's, which answers it itself (as twserve/server/websocket.py will)."""
    taken: list[bytes] = []

    def websocket(request: Request) -> Any:
        if request.header(b"upgrade") != b"websocket":
            return None

        async def take(handoff: base.Handoff) -> None:
            taken.append(handoff.request.target)
            await handoff.stream.send(b"HTTP/1.1 101 Switching Protocols\r\n\r\nhello")

        return take

    async def plain(request: Request, responder: Responder) -> None:
        await responder.start(200, [(b"content-length", b"2")])
        await responder.send(b"ok")
        await responder.end()

    with start_blocking_portal() as portal:
        server = listener.Server(plain, switches=(http2.switch, websocket))
        fut, port = portal.start_task(partial(listener.serve, plain, port=0, server=server))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(
                    b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
                    b"upgrade: websocket\r\n\r\n"
                )
                got = b""
                while chunk := sock.recv(65536):
                    got += chunk
            with httpx2.Client(http1=False, http2=True) as client:
                assert client.get(f"http://127.0.0.1:{port}/").text == "ok"
        finally:
            fut.cancel()
    assert got == b"HTTP/1.1 101 Switching Protocols\r\n\r\nhello"
    assert taken == [b"/v1/responses"]


@pytest.mark.anyio
async def test_provider_http2_against_an_http1_only_upstream_fails_over(tmp_path: Path) -> None:
    """``http2: true`` over http is h2c by prior knowledge; an upstream that only speaks
    HTTP/1.1 cannot answer it, and the attempt fails over like any unreachable upstream."""
    http1_only = make_handler(MockSettings(script=Script(text="never")))
    healthy = make_handler(MockSettings(script=Script(text=TEXT)))
    async with anyio.create_task_group() as tg:
        old_port = await tg.start(partial(listener.serve, http1_only, port=0))
        new_port = await tg.start(partial(listener.serve, healthy, port=0))
        providers = [
            {
                "name": name,
                "protocol": "openai-chat",
                "key": "x",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "http2": name == "a",
            }
            for name, port in (("a", old_port), ("b", new_port))
        ]
        config = build_config(
            {
                "version": 1,
                "clients": [{"name": "t", "key": KEY}],
                "providers": providers,
                "groups": [{"name": "pool", "type": "fallback", "providers": ["a", "b"]}],
                "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
                "failover": {"wait_secs": 1},
            }
        )
        app = GatewayApp(config, tmp_path, env={}, port=0)
        bound = await tg.start(app.run)
        async with httpx2.AsyncClient(timeout=5) as client:
            reply = await client.post(
                f"http://127.0.0.1:{bound.gateway_port}/v1/chat/completions",
                content=_body("openai-chat", stream=False),
                headers=dict(_auth("chat")),
            )
        with anyio.fail_after(5):
            while app.store.written < 1:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == TEXT
    with closing(sqlite3.connect(tmp_path / "requests.sqlite3")) as db:
        (routing,) = db.execute("SELECT routing FROM requests").fetchone()
    first, second = json.loads(routing)["attempts"]
    assert (first["provider"], first["outcome"]) == ("a", "failed")
    assert (second["provider"], second["outcome"]) == ("b", "ok")
    # All it saw was the HTTP/2 preface, parsed as an HTTP/1.1 request it did not know.
    assert [(r.method, r.path) for r in http1_only.received] == [("PRI", "*")]


@pytest.mark.sdk
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", ["anthropic", "openai-responses"])
def test_h2_end_to_end_upstream_cut_off(stack: StackFactory, fmt: str, stream: bool) -> None:
    """HTTP/2 on both sides: an upstream answer cut off over h2 (a reset stream) fails over
    when nothing was sent yet, and is an error the SDK sees when content was."""
    broken = MockSettings(script=parse_script({"chunks": 6, "break_after": 3}))
    healthy = MockSettings(script=Script(text=TEXT))
    st = stack(
        {
            "a": Upstream(fmt, broken, extra={"http2": True}),
            "b": Upstream(fmt, healthy, extra={"http2": True}),
        },
        config=fallback("a", "b"),
    )
    with _h2_sdks(st) as clients:
        if stream:
            with pytest.raises((anthropic.APIError, openai.APIError, StreamReportedError)):
                _ask(fmt, clients, stream=True)
        else:
            assert _ask(fmt, clients, stream=False)[0] == TEXT
    (row,) = st.wait_rows(1)
    first = attempts(row)[0]
    assert first["provider"] == "a" and first["outcome"] == "failed"
    if stream:
        assert row["error_code"] == "gw.upstream.broken_after_content"
        assert not st.mock("b").received
    else:
        assert row["provider"] == "b" and row["status"] == 200


@pytest.mark.anyio
async def test_the_mock_upstream_speaks_h2c() -> None:
    async with (
        run_mock(MockSettings(script=Script(text=TEXT))) as mock,
        httpx2.AsyncClient(http1=False, http2=True, timeout=5) as client,
    ):
        reply = await client.post(
            mock.url + "/v1/messages", content=_body("anthropic", stream=False)
        )
    assert reply.http_version == "HTTP/2" and reply.status_code == 200
    assert reply.json()["content"][0]["text"] == TEXT
    assert [r.path for r in mock.received] == ["/v1/messages"]


# --- the HTTP/1.1 edge's protections, per stream --------------------------------------------


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_keyless_stream_is_refused_before_its_body_is_read(
    stack: StackFactory, key: str | None
) -> None:
    st = stack({"a": Upstream("anthropic")})
    client = RawH2(st.port)
    auth = [("x-api-key", key)] if key else []
    try:
        started = time.monotonic()
        # Announce 30 MiB and send none of it: the answer must not wait for the body.
        sid = client.request(
            "/v1/messages",
            headers=[*auth, ("content-length", str(30 * 1024 * 1024))],
            end=False,
        )
        answer = client.finish(sid, timeout=3)
        took = time.monotonic() - started
        # The connection serves the next stream (with a key) as usual.
        ok = client.finish(client.request("/v1/messages", _body("anthropic"), headers=_auth()))
    finally:
        client.close()
    assert answer.status == 401 and took < 2.0
    assert json.loads(answer.body)["error"]["type"] == "authentication_error"
    assert answer.header(b"x-thinkwatch-error") is not None
    assert ok.status == 200
    assert len(st.mock("a").received) == 1


def test_h2_bodies_draw_on_the_servers_one_budget(stack: StackFactory) -> None:
    body = _body("anthropic")
    st = stack(
        {"a": Upstream("anthropic")}, limits=base.ServerLimits(body_budget_bytes=len(body) + 10)
    )
    holder = RawH2(st.port)
    second = RawH2(st.port)
    try:
        # The first stream's body is partly sent: the bytes received are held for it.
        held = holder.request("/v1/messages", headers=_auth(), end=False)
        holder.h2.send_data(held, body[:20])
        holder.flush()
        time.sleep(0.3)
        busy = second.finish(second.request("/v1/messages", body, headers=_auth()))
        assert busy.status == 503 and busy.header(b"retry-after") == b"1"
        assert busy.header(b"x-thinkwatch-error") == b"rate_limited"
        assert "request bodies" in json.loads(busy.body)["error"]["message"]
        # An HTTP/1.1 request draws on the same budget.
        over_h1 = httpx2.post(st.url + "/v1/messages", content=body, headers=dict(_auth()))
        assert over_h1.status_code == 503
        holder.h2.send_data(held, body[20:], end_stream=True)
        holder.flush()
        assert holder.finish(held).status == 200
        # Given back when the stream ends: the same request now goes through.
        assert second.finish(second.request("/v1/messages", body, headers=_auth())).status == 200
        # And when the connection ends with a body half-read.
        cut = holder.request("/v1/messages", headers=_auth(), end=False)
        holder.h2.send_data(cut, body[:20])
        holder.flush()
        time.sleep(0.2)
    finally:
        holder.close()
    try:
        time.sleep(0.3)
        assert second.finish(second.request("/v1/messages", body, headers=_auth())).status == 200
    finally:
        second.close()


def test_a_stream_whose_window_stays_shut_is_taken_as_gone(stack: StackFactory) -> None:
    # Far longer than the upstream connection keeps unread (upstream_h1_conn.PAUSE_BYTES), so
    # the upstream call is still going when the client is taken as gone.
    big = MockSettings(script=Script(chunks=4000, chunk_size=256))
    st = stack(
        {
            "a": Upstream(
                "anthropic", big, extra={"max_concurrent": 1, "forward_mock_headers": True}
            )
        },
        config={"clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}]},
        limits=base.ServerLimits(write_timeout=1.0),
    )
    # A 1 KiB stream window the client never opens again.
    client = RawH2(st.port, settings={SETTINGS.INITIAL_WINDOW_SIZE: 1024}, auto_ack=False)
    try:
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        answer = client.answers[sid]
        client.wait(lambda: len(answer.body) >= 1024)
        started = time.monotonic()
        client.wait(lambda: answer.reset is not None, timeout=10)
        took = time.monotonic() - started
        assert answer.reset == h2.errors.ErrorCodes.CANCEL and not answer.ended
        # The upstream call is cancelled, the slot and the key's permit freed, the row written.
        _wait(lambda: _in_flight(st, "a") == 0)
        (row,) = st.wait_rows(1)
        assert row["cancelled"] == 1
        # The connection's other streams carry on; the freed slot and permit take the next.
        fast = client.request(
            "/v1/messages",
            _body("anthropic"),
            headers=[*_auth(), ("x-mock-script", '{"chunks": 1}')],
        )
        done = client.answers[fast]
        while not (done.ended or done.reset is not None):
            client.ack(fast, len(done.body))
            client.read_once(0.2)
        assert done.status == 200 and done.ended
    finally:
        client.close()
    assert 0.5 < took < 5, took


def test_a_connection_that_reads_nothing_is_dropped_after_the_write_timeout(
    stack: StackFactory,
) -> None:
    # Windows wide open, socket never read: the server's socket writes block, not its windows.
    big = MockSettings(script=Script(chunks=2000, chunk_size=4096))
    st = stack(
        {"a": Upstream("anthropic", big, extra={"max_concurrent": 1})},
        limits=base.ServerLimits(write_timeout=1.0),
    )
    client = RawH2(st.port, settings={SETTINGS.INITIAL_WINDOW_SIZE: 2**31 - 1})
    try:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.h2.increment_flow_control_window(2**31 - 1 - 65535)
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        started = time.monotonic()
        (row,) = st.wait_rows(1, timeout=20)
        took = time.monotonic() - started
        assert row["cancelled"] == 1 and _in_flight(st, "a") == 0
        assert not client.answers[sid].ended
    finally:
        client.close()
    assert took < 10, took


# --- control-frame floods, windows opened a byte at a time -----------------------------------

_PING = _frame(6, 0, 0, b"12345678")  # PING, no ACK flag: each asks for an acknowledgement
_SETTINGS = _frame(4, 0, 0, b"")  # an empty SETTINGS frame, acknowledged like any other


def _flood(port: int, frame: bytes, stall: float = 2.0) -> tuple[int, bool]:
    """The preface, then `frame` over and over without reading a byte
    (tests/twserve/support/floods.py). The first write carries the preface and the flood's start:
    the server's first read finds
    bytes already queued."""
    with flood_socket(port) as sock:
        blob = frame * (65536 // len(frame))
        return flood(sock, http2.PREFACE + _SETTINGS, blob, stall=stall)


@pytest.mark.parametrize("frame", [_PING, _SETTINGS], ids=["ping", "settings"])
def test_a_control_frame_flood_from_a_client_that_never_reads_is_bounded(frame: bytes) -> None:
    """Before: the server kept reading while its acknowledgements waited for the client, a
    flood's bytes piling up in memory (gigabytes in seconds). Now it stops reading: what the
    client gets to send is what the kernel's socket buffers hold."""

    async def nothing(request: Request, responder: Responder) -> None:
        await _hold(request, responder)

    # No flood limit: only the backpressure is tried here.
    limits = http2.Http2Limits(max_owed_control_frames=10**9)
    with _server(nothing, h2_limits=limits) as port:
        sent, closed = _flood(port, frame)
    assert not closed
    assert sent < 48 * 1024 * 1024, sent


def test_a_ping_flood_from_a_client_that_never_reads_is_dropped(stack: StackFactory) -> None:
    """No key is needed to send PINGs. A client that owes more acknowledgements than
    `max_owed_control_frames` while its socket is full is dropped."""
    st = stack({"a": Upstream("anthropic")})
    sent, closed = _flood(st.port, _PING, stall=15)
    assert closed
    assert sent < 48 * 1024 * 1024, sent
    # The gateway still serves.
    reply = httpx2.post(st.url + "/v1/messages", content=_body("anthropic"), headers=dict(_auth()))
    assert reply.status_code == 200


def test_a_window_opened_a_byte_at_a_time_gets_no_more_time(stack: StackFactory) -> None:
    """Before: each WINDOW_UPDATE restarted the write deadline, so one byte of window now and
    then kept the stream (its upstream slot, its key's permit) for ever. Now the answer's
    waits count together against `max_blocked_secs`."""
    big = MockSettings(script=Script(chunks=4000, chunk_size=256))
    st = stack(
        {"a": Upstream("anthropic", big, extra={"max_concurrent": 1})},
        config={"clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}]},
        limits=base.ServerLimits(write_timeout=1.0),
        h2_limits=http2.Http2Limits(max_blocked_secs=2.0),
    )
    client = RawH2(st.port, settings={SETTINGS.INITIAL_WINDOW_SIZE: 1024}, auto_ack=False)
    try:
        sid = client.request("/v1/messages", _body("anthropic"), headers=_auth())
        answer = client.answers[sid]
        client.wait(lambda: len(answer.body) >= 1024)
        deadline = time.monotonic() + 20
        # A byte of window every 0.3 s: every wait ends well inside the 1 s write timeout.
        while answer.reset is None and not answer.ended:
            assert time.monotonic() < deadline, "the stream was never given up"
            client.h2.increment_flow_control_window(1, stream_id=sid)
            client.flush()
            client.read_once(0.3)
        assert answer.reset == h2.errors.ErrorCodes.CANCEL and not answer.ended
        _wait(lambda: _in_flight(st, "a") == 0)
        (row,) = st.wait_rows(1)
        assert row["cancelled"] == 1
    finally:
        client.close()
