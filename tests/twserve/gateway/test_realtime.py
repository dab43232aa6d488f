"""The Realtime WebSocket proxy (twserve/gateway/realtime.py) through the real gateway.

The ``websockets`` library is the client, the mock upstream's Realtime endpoint
(twmock/serve/realtime.py) the upstream, both on loopback sockets; rows are read from the SQLite
store.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from wsproto.events import TextMessage

from tests.twserve.conftest import KEY, MODELS, StackFactory, fallback
from tests.twserve.support.floods import flood, flood_socket, ws_connect, ws_ping, ws_upgrade
from tests.twserve.support.ports import refusing_port
from tests.twserve.support.stack import Stack, Upstream
from tests.twserve.support.tls_front import certificates, tls_front
from twmock.serve.realtime import REALTIME_TEXT, REALTIME_USAGE
from twproto.sockets import (
    RealtimeEvent,
    read_realtime_event,
    realtime_cancel_event,
    realtime_upstream_url,
    realtime_usage,
)
from twserve.server import base
from twserve.server.websocket import WebSocketLimits

pytestmark = pytest.mark.anyio

MODEL = MODELS["openai-responses"]
TIMEOUT = 10.0


def _rt(protocol: str = "openai-responses", **extra: Any) -> Upstream:
    return Upstream(protocol, extra={"realtime": True, **extra})


@asynccontextmanager
async def _connect(
    st: Stack, *, key: str = KEY, model: str = MODEL
) -> AsyncIterator[ClientConnection]:
    async with websockets.connect(
        f"ws://127.0.0.1:{st.port}/v1/realtime?model={model}",
        additional_headers={"authorization": f"Bearer {key}"},
        open_timeout=5,
        close_timeout=5,
        compression=None,
    ) as ws:
        yield ws


async def _until_type(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    got = []
    with anyio.fail_after(TIMEOUT):
        while True:
            event = json.loads(await ws.recv())
            got.append(event)
            if event["type"] == kind:
                return got


async def _until(condition: Any, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def _status_of_refusal(st: Stack, **kw: Any) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as caught:
        async with _connect(st, **kw):
            pass
    return caught.value


async def test_text_round_trip_and_usage_on_the_row(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    async with _connect(st) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert (await _until_type(ws, "session.updated"))[-1]["session"] == {"type": "realtime"}
        for _ in range(2):
            await ws.send(json.dumps({"type": "response.create"}))
            events = await _until_type(ws, "response.done")
            assert events[0]["type"] == "response.created"
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert text == REALTIME_TEXT
            assert events[-1]["response"]["usage"] == REALTIME_USAGE
    (row,) = st.wait_rows(1)
    assert row["path"] == "/v1/realtime"
    assert row["status"] == 101
    assert row["provider"] == "rt"
    assert row["model"] == MODEL
    cached = REALTIME_USAGE["input_token_details"]["cached_tokens"]
    assert row["input_tokens"] == 2 * (REALTIME_USAGE["input_tokens"] - cached)
    assert row["cache_read_tokens"] == 2 * cached
    assert row["output_tokens"] == 2 * REALTIME_USAGE["output_tokens"]
    # The upstream got the provider's key and the model in its query.
    (upgrade,) = st.mock("rt").realtime.upgrades
    assert (b"authorization", b"Bearer upstream-key-rt") in upgrade.headers
    assert upgrade.query == f"model={MODEL}"


async def test_the_openai_sdk_realtime_client(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    client = openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0)
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.response.create()
        text = []
        with anyio.fail_after(TIMEOUT):
            async for event in conn:
                if event.type == "response.output_text.delta":
                    text.append(event.delta)
                if event.type == "response.done":
                    assert event.response.usage is not None
                    assert event.response.usage.output_tokens == REALTIME_USAGE["output_tokens"]
                    break
    assert "".join(text) == REALTIME_TEXT
    (row,) = st.wait_rows(1)
    assert row["output_tokens"] == REALTIME_USAGE["output_tokens"]


async def test_a_binary_frame_passes_through(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    audio = bytes(range(256)) * 64
    async with _connect(st) as ws:
        await ws.recv()  # session.created
        await ws.send(audio)
        with anyio.fail_after(TIMEOUT):
            assert await ws.recv() == audio
        # A ping is answered on the client's hop.
        with anyio.fail_after(TIMEOUT):
            await (await ws.ping())


async def test_no_realtime_upstream_is_an_http_error_without_upgrade(
    stack: StackFactory,
) -> None:
    st = stack({"plain": Upstream("openai-responses"), "claude": _rt("anthropic")})
    refusal = await _status_of_refusal(st)
    assert refusal.response.status_code == 404
    error = json.loads(refusal.response.body or b"{}")["error"]
    assert error["code"] == "gw.realtime.no_upstream"
    assert not st.mock("plain").realtime.upgrades
    assert not st.mock("claude").realtime.upgrades
    (row,) = st.wait_rows(1)
    assert (row["status"], row["error_code"]) == (404, "gw.realtime.no_upstream")


async def test_a_missing_model_is_400(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    refusal = await _status_of_refusal(st, model="")
    assert refusal.response.status_code == 400


async def test_a_model_name_past_the_limit_is_400_and_cut_in_the_row(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    refusal = await _status_of_refusal(st, model="r" * 5000)
    assert refusal.response.status_code == 400
    assert b"gw.request.model_name_too_long" in (refusal.response.body or b"")
    (row,) = st.wait_rows(1)
    assert row["error_code"] == "gw.request.model_name_too_long"
    assert row["model"] == "r" * 256 + "…"


async def test_a_bad_key_is_401(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    refusal = await _status_of_refusal(st, key="not-a-key")
    assert refusal.response.status_code == 401
    assert json.loads(refusal.response.body or b"{}")["error"]["message"]
    assert not st.mock("rt").realtime.upgrades


async def test_the_first_usable_candidate_is_taken(stack: StackFactory) -> None:
    # "plain" comes first but takes no Realtime; "rt" is used.
    st = stack(
        {"plain": Upstream("openai-chat"), "rt": _rt("openai-chat")}, config=fallback("plain", "rt")
    )
    async with _connect(st) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
    assert len(st.mock("rt").realtime.upgrades) == 1
    assert (st.wait_rows(1)[0])["provider"] == "rt"


async def test_client_drop_closes_upstream_and_frees_the_slot(stack: StackFactory) -> None:
    st = stack({"rt": _rt(max_concurrent=1)})
    log = st.mock("rt").realtime
    slots = st.app.gateway.router.slots
    async with _connect(st) as ws:
        await ws.recv()
        assert slots.in_flight("rt") == 1
        # A second connection finds the only slot taken.
        refusal = await _status_of_refusal(st)
        assert refusal.response.status_code == 429
        assert json.loads(refusal.response.body or b"{}")["error"]["code"] == "gw.realtime.busy"
        # The client's TCP connection goes without a close frame.
        ws.transport.abort()
        await log.wait_ended(1)
    assert log.ended == [1001]
    await _until(lambda: slots.in_flight("rt") == 0)
    async with _connect(st) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_an_upstream_close_passes_its_code(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    async with _connect(st) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "mock.close", "code": 4004}))
        with pytest.raises(ConnectionClosed), anyio.fail_after(TIMEOUT):
            while True:
                await ws.recv()
    assert ws.close_code == 4004
    assert st.mock("rt").realtime.ended == [4004]
    await _until(lambda: st.app.gateway.router.slots.in_flight("rt") == 0)


async def test_a_client_close_passes_its_code(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    log = st.mock("rt").realtime
    async with _connect(st) as ws:
        await ws.recv()
        await ws.close(4100, "bye")
    await log.wait_ended(1)
    assert log.ended == [4100]


async def test_the_key_request_limit_counts_the_connection(stack: StackFactory) -> None:
    st = stack(
        {"rt": _rt()},
        config={
            "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "day", "requests": 1}]}]
        },
    )
    async with _connect(st) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "response.create"}))
        await _until_type(ws, "response.done")
    (row,) = st.wait_rows(1)
    assert row["counted"] == 1
    assert row["limit_tokens"] > 0
    refusal = await _status_of_refusal(st)
    assert refusal.response.status_code == 429
    assert json.loads(refusal.response.body or b"{}")["error"]["code"] == "insufficient_quota"
    assert len(st.mock("rt").realtime.upgrades) == 1
    refused = st.wait_rows(2)[1]
    assert (refused["status"], refused["counted"]) == (429, 0)


def test_realtime_usage_reads_response_done_only() -> None:
    done = {"type": "response.done", "response": {"usage": REALTIME_USAGE}}
    usage = realtime_usage(json.dumps(done))
    assert usage is not None
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (10, 2, 7)
    assert realtime_usage(json.dumps({"type": "response.created", "response": {}})) is None
    assert realtime_usage('{"type": "response.done", "response": {}}') is None
    assert realtime_usage("not json response.done") is None


def test_realtime_events_are_read_for_their_type_and_response() -> None:
    created = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
    assert read_realtime_event(json.dumps(created)) == RealtimeEvent("response.created", "resp_1")
    assert read_realtime_event('{"type": "response.create"}') == RealtimeEvent("response.create")
    for text in ("not json", "[1]", '{"type": 3}', '{"response": {"id": "r"}}'):
        assert read_realtime_event(text) == RealtimeEvent("")
    cancel = json.loads(realtime_cancel_event("resp_1"))
    assert (cancel["type"], cancel["response_id"]) == ("response.cancel", "resp_1")


def test_realtime_upstream_url() -> None:
    assert (
        realtime_upstream_url("https://api.openai.com/v1", "gpt-realtime")
        == "wss://api.openai.com/v1/realtime?model=gpt-realtime"
    )
    assert realtime_upstream_url("http://127.0.0.1:9/v1/", "a b") == (
        "ws://127.0.0.1:9/v1/realtime?model=a%20b"
    )


async def test_a_drain_closes_both_sides_1001_and_writes_the_row(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    log = st.mock("rt").realtime
    async with _connect(st) as ws:
        await ws.recv()
        drained = anyio.to_thread.run_sync(
            lambda: st.portal.call(st.app.gateway_server.drain, 10.0)
        )
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                assert await drained

            tg.start_soon(drain)
            with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
                while True:
                    await ws.recv()
    assert ws.close_code == 1001
    await log.wait_ended(1)
    assert log.ended == [1001]
    (row,) = st.wait_rows(1)
    assert row["status"] == 101


async def test_a_client_protocol_error_closes_it_1002_and_the_upstream_1001(
    stack: StackFactory,
) -> None:
    st = stack({"rt": _rt()})
    log = st.mock("rt").realtime
    async with _connect(st) as ws:
        await ws.recv()
        # A masked frame with the reserved opcode 0x3: a protocol error (RFC 6455, 5.2).
        ws.transport.write(b"\x83\x80\x00\x00\x00\x00")
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            while True:
                await ws.recv()
    assert ws.close_code == 1002
    await log.wait_ended(1)
    assert log.ended == [1001]


async def test_a_client_message_over_the_body_limit_is_closed_1009(stack: StackFactory) -> None:
    st = stack({"rt": _rt()}, limits=base.ServerLimits(max_body_bytes=4096))
    log = st.mock("rt").realtime
    async with _connect(st) as ws:
        await ws.recv()
        await ws.send(b"\x00" * 4000)  # under the limit: passes through
        with anyio.fail_after(TIMEOUT):
            assert len(await ws.recv()) == 4000
        await ws.send(b"\x00" * 5000)
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            while True:
                await ws.recv()
    assert ws.close_code == 1009
    await log.wait_ended(1)
    assert log.ended == [1001]


async def test_an_idle_connection_is_closed_on_both_sides(stack: StackFactory) -> None:
    st = stack({"rt": _rt()}, ws_limits=WebSocketLimits(idle_timeout=0.3))
    log = st.mock("rt").realtime
    async with _connect(st) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        # Nothing more either way: the gateway closes both sides.
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            while True:
                await ws.recv()
    assert (ws.close_code, ws.close_reason) == (1000, "idle timeout")
    await log.wait_ended(1)
    assert log.ended == [1000]
    (row,) = st.wait_rows(1)
    assert row["status"] == 101


async def test_an_upstream_message_over_the_limit_closes_both_1009(stack: StackFactory) -> None:
    st = stack({"rt": _rt()}, limits=base.ServerLimits(max_body_bytes=4096))
    log = st.mock("rt").realtime
    got: list[str | bytes] = []
    async with _connect(st) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "mock.big", "bytes": 1000}))  # under: passes
        assert json.loads(await ws.recv())["type"] == "mock.big"
        await ws.send(json.dumps({"type": "mock.big", "bytes": 5000}))
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosed):
            while True:
                got.append(await ws.recv())
    error = json.loads(got[-1])
    assert error["type"] == "error"
    assert error["error"]["code"] == "gw.realtime.upstream_too_big"
    assert "4096" in error["error"]["message"]
    assert ws.close_code == 1009
    await log.wait_ended(1)
    assert log.ended == [1009]


@pytest.mark.parametrize("status", [503, 401])
async def test_a_refused_upgrade_is_a_health_failure_and_an_open_one_a_success(
    stack: StackFactory, status: int
) -> None:
    st = stack({"bad": _rt(), "good": _rt()}, config=fallback("bad", "good"))
    st.mock("bad").realtime.refuse_status = status
    async with _connect(st) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
    assert st.mock("good").realtime.upgrades and not st.mock("bad").realtime.upgrades
    _assert_failed_once(st, "bad")
    good = st.app.gateway.router.health.snapshot("good", st.app.gateway.clock())
    assert (good.attempts, good.failures_in_row, good.paused_until) == (1, 0, None)
    assert (st.wait_rows(1)[0])["provider"] == "good"


def _assert_failed_once(st: Stack, name: str) -> None:
    """`name` has one health sample, a failure (counted in a row, or a pause it started)."""
    snap = st.app.gateway.router.health.snapshot(name, st.app.gateway.clock())
    assert snap.attempts == 1
    assert snap.failures_in_row == 1 or snap.paused_until is not None


async def test_an_unreachable_upstream_is_a_health_failure(stack: StackFactory) -> None:
    with refusing_port() as closed_port:
        st = stack(
            {"gone": _rt(base_url=f"http://127.0.0.1:{closed_port}/v1"), "good": _rt()},
            config=fallback("gone", "good"),
        )
        async with _connect(st) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
        _assert_failed_once(st, "gone")


async def test_a_wss_upstream_is_reached_over_tls(
    stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, context = certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    ports: dict[str, int] = {}
    async with tls_front(context, lambda: ports["rt"]) as tls_port:
        st = stack({"rt": _rt(base_url=f"https://127.0.0.1:{tls_port}/v1")})
        ports["rt"] = st.mocks["rt"][1]
        async with _connect(st) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "response.create"}))
            events = await _until_type(ws, "response.done")
    assert events[-1]["response"]["usage"] == REALTIME_USAGE
    (upgrade,) = st.mock("rt").realtime.upgrades
    assert upgrade.header(b"authorization") == b"Bearer upstream-key-rt"
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"]) == (101, "rt")


async def test_a_wss_upstream_with_an_untrusted_certificate_is_not_used(
    stack: StackFactory, tmp_path: Path
) -> None:
    # The default store does not know the test authority: TLS fails, a health failure.
    _, context = certificates(tmp_path)
    ports: dict[str, int] = {}
    async with tls_front(context, lambda: ports["rt"]) as tls_port:
        st = stack({"rt": _rt(base_url=f"https://127.0.0.1:{tls_port}/v1")})
        ports["rt"] = st.mocks["rt"][1]
        refusal = await _status_of_refusal(st)
    assert refusal.response.status_code == 502
    assert not st.mock("rt").realtime.upgrades
    _assert_failed_once(st, "rt")


# --- a client that does not read, ping floods, usage counted as it comes -----------------------


def test_a_client_that_stops_reading_frees_the_permit_and_the_slot(stack: StackFactory) -> None:
    """Before: the proxy's write to a client that read nothing waited for ever, and the
    connection held the key's permit and the upstream's slot with it. Now each write has the
    server's write timeout, as over HTTP/1.1."""
    st = stack(
        {"rt": _rt(max_concurrent=1)},
        config={"clients": [{"name": "tester", "key": KEY, "max_concurrent": 1}]},
        limits=base.ServerLimits(write_timeout=1.0),
    )
    slots = st.app.gateway.router.slots
    with flood_socket(st.port) as sock:
        ws = ws_connect(sock, f"/v1/realtime?model={MODEL}", KEY)
        assert slots.in_flight("rt") == 1
        # Far more than the socket's buffers hold, and never read.
        big = ws.send(TextMessage(data=json.dumps({"type": "mock.big", "bytes": 1 << 20})))
        sock.sendall(big * 32)
        deadline = time.monotonic() + 20
        while slots.in_flight("rt"):
            assert time.monotonic() < deadline, "the connection still holds its slot"
            time.sleep(0.05)
        (row,) = st.wait_rows(1)
        assert row["status"] == 101
    assert st.mock("rt").realtime.ended == [1001]


def test_a_ping_flood_on_realtime_is_dropped(stack: StackFactory) -> None:
    st = stack({"rt": _rt()})
    ping = ws_ping(b"p" * 16)
    with flood_socket(st.port) as sock:
        upgrade = ws_upgrade(f"/v1/realtime?model={MODEL}", KEY)
        sent, closed = flood(sock, upgrade, ping * (65536 // len(ping)), stall=15)
    assert closed
    assert sent < 48 * 1024 * 1024, sent
    _wait_for(lambda: st.mock("rt").realtime.ended == [1001])


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# REALTIME_USAGE as a key's token limit counts it: uncached input and output.
_TOKENS = (
    REALTIME_USAGE["input_tokens"]
    - REALTIME_USAGE["input_token_details"]["cached_tokens"]
    + REALTIME_USAGE["output_tokens"]
)


async def test_each_response_counts_against_the_key_as_it_ends(stack: StackFactory) -> None:
    """Before: a Realtime connection's usage reached its key's limits only when it closed (a
    key allowed 100 tokens a day used 510). Now each ``response.done`` is booked as it
    arrives, and once a token limit is spent the next ``response.create`` is refused with an
    ``error`` event, the connection staying open."""
    st = stack(
        {"rt": _rt()},
        config={
            "clients": [
                {"name": "tester", "key": KEY, "limits": [{"per": "day", "tokens": _TOKENS + 1}]}
            ]
        },
    )
    usage = st.app.gateway.usage
    client = openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0)
    async with client.realtime.connect(model=MODEL) as conn:
        for _ in range(2):  # the first leaves room, the second goes past the limit
            await conn.response.create()
            with anyio.fail_after(TIMEOUT):
                async for event in conn:
                    if event.type == "response.done":
                        break
        # Counted while the connection is still open.
        (day,) = usage.key_view("tester")
        assert day["used"] == 2 * _TOKENS
        await conn.response.create()
        with anyio.fail_after(TIMEOUT):
            async for event in conn:
                if event.type in ("error", "response.created"):
                    break
        assert event.type == "error"
        assert event.error.code == "gw.key_limit.period"
        # Still open: other events pass.
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        with anyio.fail_after(TIMEOUT):
            async for event in conn:
                if event.type == "session.updated":
                    break
    (row,) = st.wait_rows(1)
    assert row["limit_tokens"] == 2 * _TOKENS
    assert row["output_tokens"] == 2 * REALTIME_USAGE["output_tokens"]
    # Booked once: the settling at close adds nothing to what the responses booked.
    (day,) = usage.key_view("tester")
    assert day["used"] == 2 * _TOKENS
    assert len(st.mock("rt").realtime.upgrades) == 1


async def test_a_response_the_upstream_starts_itself_is_cancelled_once_the_limit_is_spent(
    stack: StackFactory,
) -> None:
    st = stack(
        {"rt": _rt()},
        config={
            "clients": [{"name": "tester", "key": KEY, "limits": [{"per": "day", "tokens": 1}]}]
        },
    )
    async with _connect(st) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "response.create"}))
        await _until_type(ws, "response.done")  # the limit is spent now
        # The upstream starts a response of its own (voice detection would): cancelled.
        await ws.send(json.dumps({"type": "mock.respond"}))
        done = (await _until_type(ws, "response.done"))[-1]
    assert done["response"]["status"] == "cancelled"
    assert st.mock("rt").realtime.cancelled == ["resp_mock_own"]
