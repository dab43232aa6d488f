"""An OpenAI Responses upstream called over its own WebSocket
(twserve/upstream/responses_socket.py).

The client is the openai SDK's ``responses.connect()`` through the real gateway; the upstreams
are mocks serving the Responses socket (twmock/serve/responses_socket.py) with
``responses_transport: websocket`` configured.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
import websockets

from tests.twserve.conftest import KEY, MODELS, StackFactory, attempts, fallback
from tests.twserve.support.responses_socket import WEATHER, socket_turn, turn_text
from tests.twserve.support.stack import Stack, Upstream
from tests.twserve.support.tls_front import certificates, tls_front
from twengine.config import ConfigError, build_config
from twmock.script import MockSettings, parse_script

pytestmark = pytest.mark.anyio

MODEL = MODELS["openai-responses"]
TEXT = "Über den Socket des Upstreams 🚀"
TIMEOUT = 10.0
WS = {"responses_transport": "websocket"}


def _up(script: dict[str, Any], fmt: str = "openai-responses", **extra: Any) -> Upstream:
    return Upstream(fmt, MockSettings(script=parse_script(script), seed=5), extra=extra)


def _client(st: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=5)


async def _turn(conn: Any, **fields: Any) -> list[Any]:
    return await socket_turn(conn, {"model": MODEL, "input": "hi", **fields}, timeout=TIMEOUT)


def _routing(row: dict[str, Any]) -> dict[str, Any]:
    routing: dict[str, Any] = json.loads(row["routing"])
    return routing


@pytest.mark.sdk
async def test_text_turns_go_over_the_upstream_socket(stack: StackFactory) -> None:
    st = stack(
        {"a": _up({"text": TEXT, "usage": {"input": 12, "output": 7}}, **WS)},
        config=fallback("a"),
    )
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn)
        second = await _turn(conn, input="again")
    for events in (first, second):
        assert events[-1].type == "response.completed"
        assert turn_text(events) == TEXT
        assert events[-1].response.usage.output_tokens == 7
    mock = st.mock("a")
    # One upstream socket carried both turns; nothing went over HTTP.
    assert mock.sockets.turns == [2]
    (upgrade,) = mock.sockets.upgrades
    assert upgrade.header(b"authorization") == b"Bearer upstream-key-a"
    assert all(r.method == "POST" for r in mock.received)
    sent = json.loads(mock.received[-1].body)
    assert sent["input"] == "again" and sent["model"] == MODEL
    rows = st.wait_rows(2)
    assert [(r["status"], r["provider"], r["output_tokens"]) for r in rows] == [(200, "a", 7)] * 2
    for row in rows:
        assert _routing(row)["upstream_transport"] == "websocket"
        (attempt,) = attempts(row)
        assert (attempt["outcome"], attempt["transport"]) == ("ok", "websocket")


@pytest.mark.sdk
async def test_a_tool_call_round_on_one_upstream_socket(stack: StackFactory) -> None:
    st = stack(
        {
            "a": _up(
                {"tool_calls": 1, "tool_name": "weather", "tool_arguments": '{"city":"Oslo"}'},
                **WS,
            )
        },
        config=fallback("a"),
    )
    question = {"role": "user", "content": "Weather in Oslo?"}
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn, input=[question], tools=WEATHER)
        done = first[-1].response
        (call,) = [o for o in done.output if o.type == "function_call"]
        assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
        mock = st.mock("a")
        mock.settings = replace(mock.settings, script=parse_script({"text": TEXT}))
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "-3 °C"}
        second = await _turn(conn, tools=WEATHER, previous_response_id=done.id, input=[output])
    assert second[-1].type == "response.completed" and turn_text(second) == TEXT
    # The continuation reached the same upstream socket, its previous_response_id with it.
    assert mock.sockets.turns == [2]
    sent = json.loads(mock.received[-1].body)
    assert sent["previous_response_id"] == done.id
    assert sent["input"] == [output]
    assert "stream_id" not in sent
    assert len(st.wait_rows(2)) == 2


@pytest.mark.sdk
@pytest.mark.parametrize(
    ("fault", "sockets"),
    [({"error": 503}, 1), ({"error": 429}, 1), ({"stream_error_after": 0}, 2)],
    ids=["503", "429", "error-event-in-stream"],
)
async def test_an_error_before_content_fails_over(
    stack: StackFactory, fault: dict[str, Any], sockets: int
) -> None:
    st = stack(
        {"a": _up({"text": "never heard", **fault}, **WS), "b": _up({"text": TEXT}, **WS)},
        config=fallback("a", "b"),
    )
    async with _client(st).responses.connect() as conn:
        events = await _turn(conn)
        again = await _turn(conn)
    assert events[-1].type == "response.completed" and turn_text(events) == TEXT
    assert again[-1].type == "response.completed"
    first_row = st.wait_rows(2)[0]
    assert (first_row["status"], first_row["provider"]) == (200, "b")
    failed, ok = attempts(first_row)[:2]
    assert (failed["provider"], failed["outcome"], failed["transport"]) == (
        "a",
        "failed",
        "websocket",
    )
    assert (ok["provider"], ok["outcome"]) == ("b", "ok")
    # An error event that refuses the turn leaves the socket usable: it is kept. One in a
    # response that had begun leaves it mid-response: it is closed, the next turn opens anew.
    assert len(st.mock("a").sockets.upgrades) == sockets
    assert st.mock("b").sockets.turns[0] >= 1


@pytest.mark.sdk
@pytest.mark.parametrize("status", [503, 401])
async def test_an_upstream_that_refuses_the_upgrade_fails_over(
    stack: StackFactory, status: int
) -> None:
    st = stack(
        {"a": _up({"text": "never"}, **WS), "b": _up({"text": TEXT})},
        config=fallback("a", "b"),
    )
    st.mock("a").sockets.refuse_status = status
    async with _client(st).responses.connect() as conn:
        events = await _turn(conn)
    assert turn_text(events) == TEXT
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"]) == (200, "b")
    refused, ok = attempts(row)
    assert (refused["provider"], refused["outcome"], refused["status"]) == ("a", "failed", status)
    assert ok["provider"] == "b" and "transport" not in ok
    assert _routing(row)["upstream_transport"] == "http"
    assert st.mock("a").received == type(st.mock("a").received)()  # no turn was played


@pytest.mark.sdk
async def test_a_refused_turn_then_a_good_turn_on_the_same_socket(stack: StackFactory) -> None:
    st = stack(
        {"a": _up({"text": TEXT}, **WS)},
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
    (failed,) = refused
    assert failed.type == "response.failed" and failed.status == 403
    assert good[-1].type == "response.completed" and turn_text(good) == TEXT
    rows = st.wait_rows(2)
    assert [r["status"] for r in rows] == [403, 200]
    assert _routing(rows[1])["upstream_transport"] == "websocket"


@pytest.mark.sdk
async def test_an_upstream_refusal_is_the_clients_error_and_the_socket_is_kept(
    stack: StackFactory,
) -> None:
    st = stack({"a": _up({"error": 400}, **WS)}, config=fallback("a"))
    async with _client(st).responses.connect() as conn:
        (refused,) = await _turn(conn)
        assert refused.type == "response.failed" and refused.status == 400
        mock = st.mock("a")
        mock.settings = replace(mock.settings, script=parse_script({"text": TEXT}))
        good = await _turn(conn)
    assert turn_text(good) == TEXT
    assert st.mock("a").sockets.turns == [2]


@pytest.mark.sdk
async def test_an_upstream_socket_closed_between_turns_is_opened_again(
    stack: StackFactory,
) -> None:
    st = stack({"a": _up({"text": TEXT}, **WS)}, config=fallback("a"))
    # The upstream ends its socket after each response (as an API does at its time limit).
    st.mock("a").sockets.close_after_turn = 1001
    async with _client(st).responses.connect() as conn:
        first = await _turn(conn)
        second = await _turn(conn)
    assert turn_text(first) == turn_text(second) == TEXT
    assert st.mock("a").sockets.turns == [1, 1]
    assert [r["status"] for r in st.wait_rows(2)] == [200, 200]


@pytest.mark.sdk
async def test_plain_http_requests_stay_on_http(stack: StackFactory) -> None:
    st = stack({"a": _up({"text": TEXT}, **WS)}, config=fallback("a"))
    async with _client(st) as client:
        answer = await client.responses.create(model=MODEL, input="hi")
        assert answer.output_text == TEXT
        stream = await client.responses.create(model=MODEL, input="hi", stream=True)
        async for _ in stream:
            pass
    assert st.mock("a").sockets.upgrades == []
    (row, _) = st.wait_rows(2)
    assert "upstream_transport" not in _routing(row)


@pytest.mark.sdk
async def test_a_client_socket_closing_closes_its_upstream_socket(stack: StackFactory) -> None:
    st = stack({"a": _up({"text": TEXT}, **WS)}, config=fallback("a"))
    async with _client(st).responses.connect() as conn:
        await _turn(conn)
        assert st.mock("a").sockets.open == 1
    with anyio.fail_after(5):
        while st.mock("a").sockets.open:
            await anyio.sleep(0.02)


def test_websocket_transport_needs_the_responses_protocol() -> None:
    base = {"version": 1, "clients": [{"name": "k", "key": "k-1"}]}
    provider = {"name": "a", "base_url": "http://127.0.0.1:9/v1", **WS}
    with pytest.raises(ConfigError) as refused:
        build_config({**base, "providers": [{**provider, "protocol": "openai-chat"}]}, {})
    assert "config.responses_transport_protocol" in str(refused.value)
    built = build_config({**base, "providers": [{**provider, "protocol": "openai-responses"}]}, {})
    assert built.providers[0].responses_transport.value == "websocket"
    with pytest.raises(ConfigError) as bad:
        build_config(
            {**base, "providers": [{**provider, "responses_transport": "carrier-pigeon"}]}, {}
        )
    assert "config.invalid_choice" in str(bad.value)


@pytest.mark.sdk
async def test_a_wss_upstream_socket(
    stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, context = certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    ports: dict[str, int] = {}
    async with tls_front(context, lambda: ports["a"]) as tls_port:
        st = stack(
            {"a": _up({"text": TEXT}, base_url=f"https://127.0.0.1:{tls_port}/v1", **WS)},
            config=fallback("a"),
        )
        ports["a"] = st.mocks["a"][1]
        async with _client(st).responses.connect() as conn:
            first = await _turn(conn)
            second = await _turn(conn)
    assert turn_text(first) == turn_text(second) == TEXT
    assert st.mock("a").sockets.turns == [2]
    assert _routing(st.wait_rows(2)[1])["upstream_transport"] == "websocket"


async def test_a_client_that_leaves_mid_turn_closes_the_upstream_socket(
    stack: StackFactory,
) -> None:
    st = stack(
        {"a": _up({"chunks": 300, "chunk_delay": 0.02}, max_concurrent=1, **WS)},
        config=fallback("a"),
    )
    mock = st.mock("a")
    async with websockets.connect(
        f"ws://127.0.0.1:{st.port}/v1/responses",
        additional_headers={"authorization": f"Bearer {KEY}"},
        open_timeout=5,
        close_timeout=2,
    ) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
        with anyio.fail_after(TIMEOUT):
            while json.loads(await ws.recv())["type"] != "response.output_text.delta":
                pass
        assert st.app.gateway.router.slots.in_flight("a") == 1
        assert mock.sockets.open == 1
    # The turn was cancelled: its upstream socket, left mid-response, is closed, the slot freed.
    with anyio.fail_after(TIMEOUT):
        while mock.sockets.open or st.app.gateway.router.slots.in_flight("a"):
            await anyio.sleep(0.02)
    (row,) = st.wait_rows(1)
    assert row["cancelled"] == 1
    assert _routing(row)["upstream_transport"] == "websocket"


@pytest.mark.sdk
async def test_a_stream_broken_mid_answer_leaves_a_new_socket_for_the_next_turn(
    stack: StackFactory,
) -> None:
    st = stack({"a": _up({"chunks": 5, "break_after": 2}, **WS)}, config=fallback("a"))
    mock = st.mock("a")
    async with _client(st).responses.connect() as conn:
        broken = await _turn(conn)
        assert broken[-1].type in ("error", "response.failed")
        mock.settings = replace(mock.settings, script=parse_script({"text": TEXT}))
        good = await _turn(conn)
    assert turn_text(good) == TEXT
    # The first socket dropped mid-response; the next turn opened another.
    assert mock.sockets.turns == [1, 1]
    rows = st.wait_rows(2)
    assert rows[1]["status"] == 200


@pytest.mark.sdk
async def test_a_rate_limit_event_pauses_the_upstream_for_its_retry_after(
    stack: StackFactory,
) -> None:
    # The 429 comes as an error event whose error.headers carry Retry-After: the upstream is
    # paused for it, as for an HTTP 429 with the header.
    st = stack(
        {
            "a": _up({"error": {"status": 429, "retry_after": 30}}, **WS),
            "b": _up({"text": TEXT}),
        },
        config=fallback("a", "b"),
    )
    async with _client(st).responses.connect() as conn:
        events = await _turn(conn)
    assert turn_text(events) == TEXT
    gw = st.app.gateway
    snap = gw.router.health.snapshot("a", gw.clock())
    # A rate limit pauses only for the wait it names: the Retry-After reached the classifier.
    assert snap.paused_until is not None
    assert snap.pause_reason is not None and snap.pause_reason.value == "rate_limit"


@pytest.mark.sdk
@pytest.mark.parametrize("first", ["sock", "plain"])
async def test_two_providers_on_one_base_url_keep_their_own_transport(
    stack: StackFactory, first: str
) -> None:
    # One upstream address, two providers, one of them configured for its own socket: each
    # turn reaches the upstream the way its own provider says, whichever is configured first.
    fields: dict[str, dict[str, Any]] = {"sock": dict(WS), "plain": {}}
    second = "plain" if first == "sock" else "sock"
    up = replace(_up({"text": TEXT}, **fields[first]), twins={second: fields[second]})
    config = {
        "routes": [
            {
                "name": "default",
                "rules": [
                    {"name": "sock", "when": {"model": "m-sock"}, "to": "sock"},
                    {"name": "plain", "when": {"model": "m-plain"}, "to": "plain"},
                ],
            }
        ]
    }
    st = stack({first: up}, config=config)
    async with _client(st).responses.connect() as conn:
        for model in ("m-sock", "m-plain", "m-sock", "m-plain"):
            events = await _turn(conn, model=model)
            assert events[-1].type == "response.completed" and turn_text(events) == TEXT
    mock = st.mock(first)
    # Only the socket provider's key opened an upstream socket, and that socket carried both
    # of its turns; the other provider's turns went over HTTP.
    keys = [u.header(b"authorization") for u in mock.sockets.upgrades]
    assert keys == [b"Bearer upstream-key-sock"] and mock.sockets.turns == [2]
    rows = st.wait_rows(4)
    assert [(r["provider"], _routing(r)["upstream_transport"]) for r in rows] == [
        ("sock", "websocket"),
        ("plain", "http"),
    ] * 2
    assert [attempts(r)[0].get("transport") for r in rows] == ["websocket", None] * 2
