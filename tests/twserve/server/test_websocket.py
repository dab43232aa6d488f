"""The Responses WebSocket (twserve/server/websocket.py) through the real gateway.

The official openai SDK's ``responses.connect()`` is the client where a test checks what a client
sees; the ``websockets`` library is the client where a test needs the socket itself (close codes,
raw frames, a client that drops its TCP connection). Every upstream is a mock on loopback; every
wait is bounded.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import anyio.abc
import httpx2
import openai
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, TextMessage
from wsproto.events import Request as WSRequest

from tests.twserve.conftest import KEY, MODELS, StackFactory, attempts, fallback
from tests.twserve.support.floods import flood, flood_socket, ws_connect, ws_ping, ws_upgrade
from tests.twserve.support.responses_socket import (
    TOOL_SCRIPT,
    TURN_ENDS,
    WEATHER,
    socket_turn,
    turn_text,
)
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script
from twserve.server import base, listener
from twserve.server.base import Handler, Request, Responder
from twserve.server.websocket import WebSocketLimits, switch_for, upgrade_refusal

pytestmark = pytest.mark.anyio

FORMATS = ("anthropic", "openai-chat", "openai-responses", "gemini")
MODEL = MODELS["openai-responses"]
TEXT = "Grüße over one socket 🚀, turn by turn"
TIMEOUT = 10.0


def _up(fmt: str, script: dict[str, Any], **extra: Any) -> Upstream:
    return Upstream(fmt, MockSettings(script=parse_script(script), seed=3), extra=extra)


def _client(st: Stack, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=key, max_retries=0, timeout=5)


async def _turn(conn: Any, **fields: Any) -> list[Any]:
    return await socket_turn(conn, {"model": MODEL, "input": "hi", **fields}, timeout=TIMEOUT)


@asynccontextmanager
async def _raw(
    st: Stack, path: str = "/v1/responses", **kw: Any
) -> AsyncIterator[ClientConnection]:
    headers = {"authorization": f"Bearer {KEY}"}
    async with websockets.connect(
        f"ws://127.0.0.1:{st.port}{path}",
        additional_headers=headers,
        open_timeout=5,
        close_timeout=5,
        compression=None,
        **kw,
    ) as ws:
        yield ws


async def _raw_turn(ws: ClientConnection, event: dict[str, Any] | str) -> list[dict[str, Any]]:
    await ws.send(event if isinstance(event, str) else json.dumps(event))
    out = []
    with anyio.fail_after(TIMEOUT):
        while True:
            got = json.loads(await ws.recv())
            out.append(got)
            if got["type"] in TURN_ENDS:
                return out


def _in_flight(st: Stack, name: str) -> int:
    return int(st.app.gateway.router.slots.in_flight(name))


async def _until(condition: Any, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


# --- turns through the SDK, for every upstream format -----------------------------------------


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
async def test_text_turns_from_every_upstream_format(stack: StackFactory, fmt: str) -> None:
    st = stack(
        {"a": _up(fmt, {"text": TEXT, "usage": {"input": 12, "output": 7}})},
        config=fallback("a"),
    )
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn)
        second = await _turn(conn, input="again")
    for events in (first, second):
        assert events[0].type == "response.created"
        assert events[-1].type == "response.completed"
        assert turn_text(events) == TEXT
        assert events[-1].response.output_text == TEXT
        assert events[-1].response.usage.output_tokens == 7
    rows = st.wait_rows(2)
    assert len(rows) == 2
    assert {r["status"] for r in rows} == {200}
    assert all(r["provider"] == "a" and r["output_tokens"] == 7 for r in rows)
    assert len({r["id"] for r in rows}) == 2


@pytest.mark.sdk
async def test_a_long_answer_arrives_whole(stack: StackFactory) -> None:
    """The closing event repeats the whole answer: well over a megabyte here."""
    st = stack({"a": _up("anthropic", {"chunks": 300, "chunk_size": 4096})}, config=fallback("a"))
    async with _client(st).responses.connect() as conn:
        events = await _turn(conn)
    assert events[-1].type == "response.completed"
    text = turn_text(events)
    assert len(text) >= 300 * 4096 > 1 << 20
    assert events[-1].response.output_text == text


@pytest.mark.sdk
@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_tool_call_round(stack: StackFactory, fmt: str) -> None:
    st = stack(
        {"a": _up(fmt, TOOL_SCRIPT)},
        config=fallback("a"),
    )
    question = {"role": "user", "content": "Weather in Oslo?"}
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn, input=[question], tools=WEATHER)
        (call,) = [o for o in first[-1].response.output if o.type == "function_call"]
        assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
        mock = st.mock("a")
        mock.settings = replace(mock.settings, script=parse_script({"text": TEXT}))
        second = await _turn(
            conn,
            tools=WEATHER,
            input=[
                question,
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "-3 °C"},
            ],
        )
    assert second[-1].type == "response.completed"
    assert turn_text(second) == TEXT
    # The tool's result reached the upstream in its own format.
    assert "-3 °C" in mock.received[-1].body.decode()
    assert len(st.wait_rows(2)) == 2


@pytest.mark.sdk
@pytest.mark.parametrize(
    "fault", [{"error": 503}, {"stream_error_after": 0}], ids=["503", "error-event"]
)
@pytest.mark.parametrize("fmt", FORMATS)
async def test_error_before_content_fails_over(
    stack: StackFactory, fmt: str, fault: dict[str, Any]
) -> None:
    st = stack(
        {"a": _up(fmt, {"text": "never heard", **fault}), "b": _up(fmt, {"text": TEXT})},
        config=fallback("a", "b"),
    )
    async with _client(st).responses.connect() as conn:
        events = await _turn(conn)
    assert events[-1].type == "response.completed" and turn_text(events) == TEXT
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"]) == (200, "b")
    first, second = attempts(row)
    assert (first["provider"], first["outcome"]) == ("a", "failed")
    assert (second["provider"], second["outcome"]) == ("b", "ok")


@pytest.mark.sdk
async def test_a_refused_turn_then_a_good_one_on_the_same_socket(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-chat", {"text": TEXT})},
        config={
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {"name": "no", "when": {"model": "forbidden-*"}, "deny": "not here"},
                        {"name": "all", "to": "a"},
                    ],
                }
            ]
        },
    )
    async with _client(st).responses.connect() as conn:
        refused = await _turn(conn, model="forbidden-1")
        good = await _turn(conn)
    # A refused turn is a failed response (the HTTP status rides along).
    (failed,) = refused
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.status == 403 and failed.response.error.code == "gw.rule.denied"
    assert failed.response.error.message and failed.response.model == "forbidden-1"
    assert good[-1].type == "response.completed" and turn_text(good) == TEXT
    rows = st.wait_rows(2)
    assert [r["status"] for r in rows] == [403, 200]
    assert rows[0]["error_code"] == "gw.rule.denied"


@pytest.mark.sdk
async def test_the_sdks_event_loop_carries_on_past_a_refused_turn(stack: StackFactory) -> None:
    """The openai SDK's push-style loop (`dispatch_events`) raises on an ``error`` event no
    handler takes; a refused turn is a ``response.failed``, so the loop and the socket carry
    on to the next turn."""
    st = stack(
        {"a": _up("openai-chat", {"text": TEXT})},
        config={
            "routes": [
                {
                    "name": "default",
                    "rules": [
                        {"name": "no", "when": {"model": "forbidden-*"}, "deny": "not here"},
                        {"name": "all", "to": "a"},
                    ],
                }
            ]
        },
    )
    seen: list[tuple[str, str | None]] = []
    completed = anyio.Event()

    def on_failed(event: Any) -> None:
        seen.append((event.type, event.response.error.code))

    def on_completed(event: Any) -> None:
        seen.append((event.type, None))
        completed.set()

    async with _client(st).responses.connect() as conn:
        conn.on("response.failed", on_failed)
        conn.on("response.completed", on_completed)
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.dispatch_events)
            await conn.send({"type": "response.create", "model": "forbidden-1", "input": "hi"})
            await conn.send({"type": "response.create", "model": MODEL, "input": "hi"})
            with anyio.fail_after(TIMEOUT):
                await completed.wait()
            tg.cancel_scope.cancel()
    assert seen == [("response.failed", "gw.rule.denied"), ("response.completed", None)]


@pytest.mark.sdk
async def test_key_limits_count_each_turn(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-chat", {"text": TEXT})},
        config={
            **fallback("a"),
            "clients": [
                {"name": "tester", "key": KEY, "limits": [{"per": "minute", "requests": 2}]}
            ],
        },
    )
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn)
        second = await _turn(conn)
        (refused,) = await _turn(conn)
    assert first[-1].type == second[-1].type == "response.completed"
    assert refused.type == "response.failed" and refused.status == 429
    assert refused.response.error.code == "gw.key_limit.requests_rolling"
    assert [r["status"] for r in st.wait_rows(3)] == [200, 200, 429]


@pytest.mark.sdk
async def test_an_unknown_model_is_a_failed_response(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT}, models=["only-this"])})
    async with _client(st).responses.connect() as conn:
        (failed,) = await _turn(conn, model="not-configured")
        good = await _turn(conn, model="only-this")
    assert failed.type == "response.failed" and failed.status in (400, 404)
    assert good[-1].type == "response.completed"
    assert [r["status"] for r in st.wait_rows(2)] == [failed.status, 200]


@pytest.mark.sdk
async def test_steer_is_refused_as_not_supported(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})}, config=fallback("a"))
    async with _client(st).responses.connect() as conn:
        await conn.send(
            {"type": "response.steer", "previous_response_id": "resp_1", "input": "faster"}
        )
        with anyio.fail_after(TIMEOUT):
            failed = await conn.recv()
        assert failed.type == "response.steer.failed"
        assert failed.error.code == "steering_not_supported"
        assert failed.steer.previous_response_id == "resp_1"
        assert (await _turn(conn))[-1].type == "response.completed"


# --- the upgrade ------------------------------------------------------------------------------


async def test_a_bad_key_is_refused_before_the_upgrade(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})})
    with pytest.raises(websockets.InvalidStatus) as bad:
        async with _client(st, key="wrong").responses.connect() as conn:
            await _turn(conn)
    assert bad.value.response.status_code == 401
    assert json.loads(bad.value.response.body)["error"]["code"] == "gw.auth.bad_key"
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://127.0.0.1:{st.port}/v1/responses", open_timeout=5):
            pass
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "gw.auth.missing_key"
    assert not st.mock("a").received


async def test_the_key_may_come_as_a_query_parameter_and_on_the_codex_path(
    stack: StackFactory,
) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})}, config=fallback("a"))
    async with websockets.connect(
        f"ws://127.0.0.1:{st.port}/backend-api/codex/responses?key={KEY}", open_timeout=5
    ) as ws:
        events = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "hi"})
    assert events[-1]["type"] == "response.completed"
    (row,) = st.wait_rows(1)
    assert row["path"] == "/backend-api/codex/responses"
    # The gateway key never travels upstream.
    assert KEY not in st.mock("a").received[-1].query


async def test_allow_from_applies_to_the_upgrade(stack: StackFactory) -> None:
    """Loopback is always allowed, so the check is asked of the running gateway directly for an
    address outside ``allow_from``, and must come before the key."""
    st = stack(
        {"a": _up("openai-responses", {"text": TEXT})},
        config={"listen": {"gateway": {"bind": "127.0.0.1", "allow_from": ["10.0.0.0/8"]}}},
    )
    gateway = st.app.gateway

    def upgrade(address: str, key: str) -> Request:
        return Request(
            method="GET",
            target=b"/v1/responses",
            path="/v1/responses",
            query="",
            headers=[(b"authorization", f"Bearer {key}".encode())],
            body=b"",
            client=(address, 40000),
        )

    denied = upgrade_refusal(gateway.check_head, upgrade("192.0.2.7", KEY))
    assert denied is not None and denied.status == 403
    assert json.loads(denied.body)["error"]["code"] == "gw.auth.denied_address"
    bad_key = upgrade_refusal(gateway.check_head, upgrade("10.1.2.3", "wrong"))
    assert bad_key is not None and bad_key.status == 401
    assert json.loads(bad_key.body)["error"]["code"] == "gw.auth.bad_key"
    assert upgrade_refusal(gateway.check_head, upgrade("10.1.2.3", KEY)) is None
    async with _raw(st) as ws:  # loopback
        events = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "x"})
    assert events[-1]["type"] == "response.completed"


async def test_other_upgrade_targets_are_not_websockets(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})})
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with _raw(st, path="/v1/chat/completions"):
            pass
    assert refused.value.response.status_code in (404, 405)
    # Realtime is not served.
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with _raw(st, path="/v1/realtime?model=m"):
            pass
    assert refused.value.response.status_code == 404


# --- the socket -------------------------------------------------------------------------------


async def test_bad_messages_get_error_events_and_the_socket_stays(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})}, config=fallback("a"))
    async with _raw(st) as ws:
        for bad in ("{not json", "[1, 2]", json.dumps({"type": "response.cancel"})):
            (error,) = await _raw_turn(ws, bad)
            assert error["type"] == "error" and error["status"] == 400
            assert error["error"]["code"] == "gw.ws.bad_event"
        (error,) = await _raw_turn(ws, {"type": "response.create", "background": True})
        assert error["error"]["code"] == "gw.ws.bad_event"
        await ws.ping()
        events = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "x"})
        assert events[-1]["type"] == "response.completed"
    # Only the turn that reached the handler is a request.
    assert len(st.wait_rows(1)) == 1


async def test_a_turn_echoes_its_stream_id(stack: StackFactory) -> None:
    st = stack({"a": _up("anthropic", {"text": TEXT})}, config=fallback("a"))
    async with _raw(st) as ws:
        events = await _raw_turn(
            ws, {"type": "response.create", "model": MODEL, "input": "x", "stream_id": "lane-2"}
        )
    assert {e.get("stream_id") for e in events} == {"lane-2"}


async def test_an_oversized_message_closes_1009(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-responses", {"text": TEXT})},
        config=fallback("a"),
        limits=base.ServerLimits(max_body_bytes=8192),
    )
    async with _raw(st, max_size=None) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 9000}))
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1009
    assert not st.mock("a").received


async def test_turns_queue_one_at_a_time(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-chat", {"chunks": 5, "chunk_delay": 0.02}, max_concurrent=4)},
        config=fallback("a"),
    )
    async with _raw(st) as ws:
        for i in range(3):
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": f"{i}"}))
        seen: list[str] = []
        done = 0
        with anyio.fail_after(TIMEOUT):
            while done < 3:
                event = json.loads(await ws.recv())
                seen.append(event["type"])
                if event["type"] == "response.output_text.delta":
                    assert _in_flight(st, "a") <= 1  # never two turns at once
                done += event["type"] == "response.completed"
    # Each turn's events are whole before the next one's begin.
    starts = [i for i, t in enumerate(seen) if t == "response.created"]
    ends = [i for i, t in enumerate(seen) if t == "response.completed"]
    assert len(starts) == 3 and all(e < s for e, s in zip(ends, starts[1:], strict=False))
    assert len(st.wait_rows(3)) == 3


@pytest.mark.parametrize("how", ["close-frame", "tcp-drop"])
async def test_a_client_that_leaves_mid_turn_frees_the_slot(stack: StackFactory, how: str) -> None:
    st = stack(
        {"a": _up("anthropic", {"chunks": 300, "chunk_delay": 0.02}, max_concurrent=1)},
        config=fallback("a"),
    )
    ws = await websockets.connect(
        f"ws://127.0.0.1:{st.port}/v1/responses",
        additional_headers={"authorization": f"Bearer {KEY}"},
        open_timeout=5,
        close_timeout=2,
    )
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
    with anyio.fail_after(TIMEOUT):
        while json.loads(await ws.recv())["type"] != "response.output_text.delta":
            pass
    assert _in_flight(st, "a") == 1
    if how == "close-frame":
        await ws.close()
    else:
        sock = ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        ws.transport.abort()
    await _until(lambda: _in_flight(st, "a") == 0)
    (row,) = st.wait_rows(1)
    assert row["cancelled"] == 1


async def test_the_drain_finishes_the_running_turn_then_closes_1001(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-responses", {"chunks": 20, "chunk_delay": 0.02})},
        config=fallback("a"),
    )
    async with _raw(st) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "y"}))
        with anyio.fail_after(TIMEOUT):
            while json.loads(await ws.recv())["type"] != "response.output_text.delta":
                pass
        started = time.monotonic()
        drained = anyio.to_thread.run_sync(
            lambda: st.portal.call(st.app.gateway_server.drain, 10.0)
        )
        types: list[str] = []
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                assert await drained

            tg.start_soon(drain)
            with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
                while True:
                    event = json.loads(await ws.recv())
                    types.append(event["type"])
                    if event["type"] == "response.failed":
                        assert event["response"]["error"]["code"] == "gw.ws.closing"
    assert ws.close_code == 1001
    assert "response.completed" in types and types[-1] == "response.failed"
    assert time.monotonic() - started < TIMEOUT
    assert [r["status"] for r in st.wait_rows(1)] == [200]


async def test_a_stream_cut_after_content_fails_the_turn_not_the_socket(
    stack: StackFactory,
) -> None:
    st = stack(
        {"a": _up("anthropic", {"chunks": 6, "break_after": 3}), "b": _up("anthropic", {})},
        config=fallback("a", "b"),
    )
    async with _client(st).responses.connect() as conn:
        broken = await _turn(conn)
        assert broken[-1].type in ("response.failed", "error")
        assert turn_text(broken)  # content had reached the client: no failover
        mock = st.mock("a")
        mock.settings = replace(mock.settings, script=parse_script({"text": TEXT}))
        good = await _turn(conn)
    assert good[-1].type == "response.completed" and turn_text(good) == TEXT
    assert len(st.wait_rows(2)) == 2


async def test_a_key_revoked_by_a_reload_ends_the_socket_1008(stack: StackFactory) -> None:
    st = stack({"a": _up("openai-responses", {"text": TEXT})}, config=fallback("a"))
    async with _raw(st) as ws:
        first = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "x"})
        assert first[-1]["type"] == "response.completed"
        gateway = st.app.gateway
        revoked = replace(gateway.config, clients=())
        st.portal.call(gateway.apply_config, revoked)
        (failed,) = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "y"})
        assert failed["type"] == "response.failed" and failed["status"] == 401
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1008


# --- the transport alone, with a handler of its own -------------------------------------------


def _admit(request: Request) -> base.HeadRefusal | None:
    """A head check of its own: every address, one key."""
    if request.header(b"authorization") == f"Bearer {KEY}".encode():
        return None
    return base.HeadRefusal(status=401, headers=[], body=b'{"error": {"message": "no"}}')


_SSE_HEAD = [(b"content-type", b"text/event-stream")]


def _sse(kind: str, **fields: Any) -> bytes:
    return f"data: {json.dumps({'type': kind, **fields})}\n\n".encode()


@asynccontextmanager
async def _transport(
    handler: Handler,
    limits: WebSocketLimits | None = None,
    *,
    budget: base.BodyBudget | None = None,
) -> AsyncIterator[tuple[int, listener.Server]]:
    server = listener.Server(handler, switches=(switch_for(_admit, limits),), budget=budget)
    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(listener.serve, handler, port=0, server=server))
        yield port, server
        tg.cancel_scope.cancel()


def _connect(port: int) -> Any:
    return websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses",
        additional_headers={"authorization": f"Bearer {KEY}"},
        open_timeout=5,
        close_timeout=5,
    )


async def test_turns_past_the_queue_are_refused_busy() -> None:
    release = anyio.Event()
    bodies: list[dict[str, Any]] = []

    async def slow(request: Request, responder: Responder) -> None:
        bodies.append(json.loads(request.body))
        await responder.start(200, _SSE_HEAD)
        await release.wait()
        await responder.send(_sse("response.completed", response={}))
        await responder.end()

    async with _transport(slow, WebSocketLimits(max_queued_turns=1)) as (port, _):
        async with _connect(port) as ws:
            create = json.dumps({"type": "response.create", "model": "m", "input": "x"})
            await ws.send(create)
            await _until(lambda: len(bodies) == 1)
            await ws.send(create)  # queued
            await ws.send(create)  # over the queue
            with anyio.fail_after(TIMEOUT):
                busy = json.loads(await ws.recv())
            assert (busy["type"], busy["status"]) == ("response.failed", 429)
            assert busy["response"]["error"]["code"] == "gw.ws.busy"
            release.set()
            with anyio.fail_after(TIMEOUT):
                done = [json.loads(await ws.recv())["type"] for _ in range(2)]
            assert done == ["response.completed"] * 2
    assert len(bodies) == 2
    # Each turn is a streamed Responses request, whatever the client sent.
    assert all(b["stream"] is True and "type" not in b for b in bodies)


async def test_a_handler_fault_closes_1011() -> None:
    async def broken(request: Request, responder: Responder) -> None:
        await responder.start(200, _SSE_HEAD)
        await responder.send(_sse("response.created", response={}))
        raise RuntimeError("a bug")

    async with _transport(broken) as (port, _):
        async with _connect(port) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "m"}))
            with anyio.fail_after(TIMEOUT):
                assert json.loads(await ws.recv())["type"] == "response.created"
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
    assert ws.close_code == 1011


async def test_an_aborted_answer_is_an_error_event() -> None:
    async def cut(request: Request, responder: Responder) -> None:
        await responder.start(200, _SSE_HEAD)
        await responder.send(_sse("response.created", response={}))
        await responder.abort()

    async with _transport(cut) as (port, _):
        async with _connect(port) as ws:
            events = await _raw_turn(ws, {"type": "response.create", "model": "m"})
            assert [e["type"] for e in events] == ["response.created", "error"]
            assert events[-1]["error"]["code"] == "gw.ws.upstream_closed"
            again = await _raw_turn(ws, {"type": "response.create", "model": "m"})
            assert again[-1]["type"] == "error"


async def test_an_idle_socket_closes_and_pings_are_answered() -> None:
    async def unused(request: Request, responder: Responder) -> None:
        raise AssertionError("no turn is sent")

    async with _transport(unused, WebSocketLimits(idle_timeout=0.5)) as (port, _):
        async with _connect(port) as ws:
            with anyio.fail_after(TIMEOUT):
                latency = await ws.ping()
                await latency
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
    assert ws.close_code == 1000
    assert ws.close_reason == "idle timeout"


async def test_a_malformed_upgrade_is_a_400() -> None:
    async def unused(request: Request, responder: Responder) -> None:
        raise AssertionError("not a turn")

    async with _transport(unused) as (port, _):
        async with await anyio.connect_tcp("127.0.0.1", port) as sock:
            await sock.send(
                b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
                b"upgrade: websocket\r\nauthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
            )
            got = b""
            with anyio.fail_after(TIMEOUT):
                with suppress(anyio.EndOfStream):
                    while True:
                        got += await sock.receive()
    assert got.startswith(b"HTTP/1.1 400 ")
    assert b"gw.request.bad_http" in got


# --- raw frames (wsproto as the client) -------------------------------------------------------


async def _echo_turn(request: Request, responder: Responder) -> None:
    body = json.loads(request.body)
    await responder.start(200, _SSE_HEAD)
    await responder.send(_sse("response.completed", response={"echo": body["input"]}))
    await responder.end()


async def _open_raw(port: int) -> tuple[anyio.abc.SocketStream, WSConnection]:
    sock = await anyio.connect_tcp("127.0.0.1", port)
    client = WSConnection(ConnectionType.CLIENT)
    await sock.send(
        client.send(
            WSRequest(
                host="127.0.0.1",
                target="/v1/responses",
                extra_headers=[(b"authorization", f"Bearer {KEY}".encode())],
            )
        )
    )
    with anyio.fail_after(TIMEOUT):
        while True:
            client.receive_data(await sock.receive())
            if any(isinstance(e, AcceptConnection) for e in client.events()):
                return sock, client


async def _next_events(sock: anyio.abc.SocketStream, client: WSConnection) -> list[Any]:
    with anyio.fail_after(TIMEOUT):
        while True:
            try:
                client.receive_data(await sock.receive())
            except anyio.EndOfStream:
                client.receive_data(None)
            events = list(client.events())
            if events:
                return events


@pytest.mark.parametrize("split", ["whole", "byte-by-byte"])
async def test_a_fragmented_message_in_any_split_is_one_turn(split: str) -> None:
    text = json.dumps({"type": "response.create", "model": "m", "input": "Grüße 🚀" * 20})
    cut = [0, 7, len(text) // 2, len(text)]
    async with _transport(_echo_turn) as (port, _):
        sock, client = await _open_raw(port)
        async with sock:
            wire = b"".join(
                client.send(TextMessage(data=text[a:b], message_finished=b == len(text)))
                for a, b in itertools.pairwise(cut)
            )
            if split == "whole":
                await sock.send(wire)
            else:
                for i in range(len(wire)):
                    await sock.send(wire[i : i + 1])
            (event,) = await _next_events(sock, client)
    assert isinstance(event, TextMessage)
    got = json.loads(event.data)
    assert got["response"]["echo"] == json.loads(text)["input"]


async def test_a_binary_message_closes_1003() -> None:
    async with _transport(_echo_turn) as (port, _):
        async with _connect(port) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "m"}).encode())
            with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
                await ws.recv()
    assert ws.close_code == 1003


async def test_a_client_that_never_answers_the_close_is_let_go() -> None:
    """After the gateway's close frame the socket is closed within the linger time, whether or
    not the client answers it."""
    async with _transport(_echo_turn, WebSocketLimits(idle_timeout=0.2)) as (port, server):
        sock, client = await _open_raw(port)
        async with sock:
            events = await _next_events(sock, client)
            assert isinstance(events[0], CloseConnection) and events[0].code == 1000
            # No close frame back; the server must drop the connection on its own.
            with anyio.fail_after(TIMEOUT):
                with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    while await sock.receive():
                        pass
        await _until(lambda: not server.connections)


async def test_invalid_utf8_closes_1007() -> None:
    async with _transport(_echo_turn) as (port, _):
        sock, client = await _open_raw(port)
        async with sock:
            # A masked text frame (FIN, opcode 1) whose payload is not UTF-8.
            payload = b"\xff\xfe\xfd"
            mask = b"\x01\x02\x03\x04"
            masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            await sock.send(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
            events = await _next_events(sock, client)
    assert isinstance(events[0], CloseConnection) and events[0].code == 1007


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 16,  # unmasked continuation with nothing to continue
        b"\x8f\x80abcd",  # a reserved opcode
        b"\xf1\x80abcd",  # reserved bits set
        b"\x81\x7f" + b"\xff" * 8 + b"mask",  # a 64-bit length with its top bit set
        b"\x89\xfe\x01\x00abcd" + b"x" * 256,  # a ping over 125 bytes
        b"GET / HTTP/1.1\r\n\r\n",
    ],
)
async def test_protocol_garbage_closes_the_socket_and_nothing_else(garbage: bytes) -> None:
    async with _transport(_echo_turn) as (port, server):
        sock, client = await _open_raw(port)
        async with sock:
            await sock.send(garbage)
            events = await _next_events(sock, client)
        assert isinstance(events[0], CloseConnection) and events[0].code in (1002, 1006)
        # The server goes on serving.
        sock, client = await _open_raw(port)
        async with sock:
            create = {"type": "response.create", "model": "m", "input": "still here"}
            await sock.send(client.send(TextMessage(data=json.dumps(create))))
            (event,) = await _next_events(sock, client)
        assert json.loads(event.data)["response"]["echo"] == "still here"
        await _until(lambda: not server.connections)


# --- clients that do not read, ping floods, the body budget, sockets per key ------------------


def test_a_ping_flood_from_a_client_that_never_reads_is_bounded(stack: StackFactory) -> None:
    """Before: each ping's pong was a write that waited for the client while the transport
    kept reading (46 → 3247 MB in 4 s). Now the server stops reading: what the client gets to
    send is what the socket buffers hold."""
    # On uvloop, as `twserve serve` runs: its reads take 256 KiB at a time.
    st = stack(
        {"a": _up("openai-responses", {})},
        ws_limits=WebSocketLimits(max_owed_pongs=10**9),
        uvloop=True,
    )
    ping = ws_ping()
    with flood_socket(st.port) as sock:
        # The pings follow the upgrade in its very write: the server's first read finds
        # bytes queued behind the request.
        sent, closed = flood(sock, ws_upgrade("/v1/responses", KEY), ping * (65536 // len(ping)))
    assert not closed
    assert sent < 48 * 1024 * 1024, sent


def test_a_ping_flood_is_dropped(stack: StackFactory) -> None:
    """Pings whose pongs wait unread in the socket's buffer, more than `max_owed_pongs` of
    them: the client is dropped. (Their 16-byte payload makes the pongs fill the socket's
    buffers soon, yet many fit in the output bound.)"""
    st = stack({"a": _up("openai-responses", {"text": TEXT})}, config=fallback("a"))
    ping = ws_ping(b"p" * 16)
    with flood_socket(st.port) as sock:
        upgrade = ws_upgrade("/v1/responses", KEY)
        sent, closed = flood(sock, upgrade, ping * (65536 // len(ping)), stall=15)
    assert closed
    assert sent < 48 * 1024 * 1024, sent


def test_a_client_that_stops_reading_frees_its_turns_slot_and_permit(
    stack: StackFactory,
) -> None:
    """Before: a turn's write to a client that read nothing waited for ever, holding the
    upstream slot and the key's permit. Now it has the server's write timeout, as over
    HTTP/1.1."""
    st = stack(
        {"a": _up("anthropic", {"chunks": 20000, "chunk_size": 512}, max_concurrent=1)},
        config={
            **fallback("a"),
            "clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}],
        },
        limits=base.ServerLimits(write_timeout=1.0),
    )
    with flood_socket(st.port) as sock:
        ws = ws_connect(sock, "/v1/responses", KEY)
        create = {"type": "response.create", "model": MODEL, "input": "x"}
        sock.sendall(ws.send(TextMessage(data=json.dumps(create))))
        deadline = time.monotonic() + 5
        while _in_flight(st, "a") == 0:
            assert time.monotonic() < deadline, "the turn never started"
            time.sleep(0.02)
        deadline = time.monotonic() + 20
        while _in_flight(st, "a"):
            assert time.monotonic() < deadline, "the turn still holds its slot"
            time.sleep(0.05)
        (row,) = st.wait_rows(1)
        assert row["cancelled"] == 1
    # The key's permit is free too: the next request of the key is served.
    reply = httpx2.post(
        st.url + "/v1/responses",
        json={"model": MODEL, "input": "hi"},
        headers={"authorization": f"Bearer {KEY}", "x-mock-script": '{"chunks": 1}'},
        timeout=10,
    )
    assert reply.status_code == 200


async def test_queued_messages_draw_on_the_body_budget() -> None:
    """Before: turns queued on a socket held their bodies outside the server's budget (three
    sockets × eight queued 30 MB turns: 888 MB). Now a message that does not fit is refused
    with 503, the socket carries on, and what the socket held is given back when it ends."""
    release = anyio.Event()
    started: list[int] = []

    async def slow(request: Request, responder: Responder) -> None:
        started.append(len(request.body))
        await release.wait()
        await responder.start(200, _SSE_HEAD)
        await responder.send(_sse("response.completed", response={}))
        await responder.end()

    budget = base.BodyBudget(250_000)
    limits = WebSocketLimits(max_queued_turns=8)
    async with _transport(slow, limits, budget=budget) as (port, _):
        async with _connect(port) as ws:
            big = json.dumps({"type": "response.create", "model": "m", "input": "x" * 100_000})
            await ws.send(big)  # runs
            await _until(lambda: len(started) == 1)
            await ws.send(big)  # waits in the queue
            await ws.send(big)  # does not fit: refused, not queued
            with anyio.fail_after(TIMEOUT):
                busy = json.loads(await ws.recv())
            assert (busy["type"], busy["status"]) == ("error", 503)
            assert busy["error"]["code"] == "gw.request.bodies_busy"
            assert 200_000 <= budget.used <= 250_000
            release.set()
            with anyio.fail_after(TIMEOUT):
                done = [json.loads(await ws.recv())["type"] for _ in range(2)]
            assert done == ["response.completed"] * 2
            await _until(lambda: budget.used == 0)
            await ws.send(big)  # room again
            with anyio.fail_after(TIMEOUT):
                assert json.loads(await ws.recv())["type"] == "response.completed"
        release = anyio.Event()
        async with _connect(port) as ws:
            await ws.send(big)
            await ws.send(big)
            await _until(lambda: budget.used > 150_000)
        # The socket ended with a turn running and one queued: all of it is given back.
        await _until(lambda: budget.used == 0)
    assert len(started) == 5


async def test_a_message_over_the_default_cap_closes_1009() -> None:
    async def unused(request: Request, responder: Responder) -> None:
        raise AssertionError("no turn is taken")

    cap = WebSocketLimits().max_message_bytes
    assert cap is not None and cap < base.ServerLimits().max_body_bytes
    async with _transport(unused) as (port, _):
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/v1/responses",
            additional_headers={"authorization": f"Bearer {KEY}"},
            open_timeout=5,
            close_timeout=5,
            max_size=None,
        ) as ws:
            await ws.send(json.dumps({"type": "response.create", "input": "x" * (cap + 1)}))
            with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
                await ws.recv()
    assert ws.close_code == 1009


async def test_sockets_per_key_are_capped(stack: StackFactory) -> None:
    st = stack(
        {"a": _up("openai-responses", {"text": TEXT})},
        config={
            **fallback("a"),
            "clients": [{"name": "tester", "key": KEY}, {"name": "other", "key": "other-key"}],
        },
        ws_limits=WebSocketLimits(max_sockets_per_key=2),
    )
    async with _raw(st), _raw(st):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with _raw(st):
                pass
        response = refused.value.response
        assert response.status_code == 429
        assert json.loads(response.body)["error"]["code"] == "gw.ws.too_many_sockets"
        # Another key has sockets of its own.
        async with websockets.connect(
            f"ws://127.0.0.1:{st.port}/v1/responses",
            additional_headers={"authorization": "Bearer other-key"},
            open_timeout=5,
        ) as other:
            turn = await _raw_turn(other, {"type": "response.create", "model": MODEL, "input": "x"})
            assert turn[-1]["type"] == "response.completed"
    # Closed sockets count no more.
    async with _raw(st) as ws:
        turn = await _raw_turn(ws, {"type": "response.create", "model": MODEL, "input": "x"})
        assert turn[-1]["type"] == "response.completed"
