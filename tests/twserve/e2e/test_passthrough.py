"""Same-format traffic through the real gateway: agents' requests and the official SDKs.

A request in the upstream's own format must reach it byte for byte, with the protocol headers
the client sent and the upstream's key instead of the gateway's, and the answer must come back
as the upstream wrote it (docs/conversion.md). "As the upstream wrote it" is checked against a twin
mock — same settings, same seed, same frozen clock — asked directly with the same request.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import h11
import pytest

from tests.data.agents.bodies import (
    CLAUDE_CODE_BETAS,
    AgentRequest,
    claude_code_request,
    codex_request,
)
from tests.twserve.conftest import (
    FORMATS,
    KEY,
    Answer,
    Reply,
    Sdks,
    StackFactory,
    ask,
    attempts,
    http,
    mock_origin,
)
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script

ONLY_UP = {"routes": [{"name": "default", "rules": [{"name": "up", "to": "up"}]}]}


def _twins(protocol: str, script: dict[str, Any]) -> dict[str, Upstream]:
    """`up` (routed to) and `twin` (never routed to): the same mock, twice."""
    settings = MockSettings(script=parse_script(script), seed=23)
    return {"up": Upstream(protocol, settings), "twin": Upstream(protocol, settings)}


def _send(st: Stack, req: AgentRequest, auth: tuple[str, str]) -> Reply:
    return http(st.url + req.path, body=req.body, headers=[*req.headers, auth])


def _direct(st: Stack, req: AgentRequest, upstream_path: str) -> Reply:
    # What the upstream would have answered this very request (the twin has played nothing yet).
    return http(mock_origin(st, "twin") + upstream_path, body=req.body, headers=req.headers)


def _assert_no_gateway_key(headers: tuple[tuple[bytes, bytes], ...]) -> None:
    for name, value in headers:
        assert KEY.encode() not in value, f"gateway key forwarded in {name!r}"


@pytest.mark.parametrize(
    "auth",
    [("x-api-key", KEY), ("authorization", f"Bearer {KEY}")],
    ids=["x-api-key", "bearer"],
)
def test_claude_code_turn_passes_through_unchanged(
    stack: StackFactory, frozen_mock_clock: None, auth: tuple[str, str]
) -> None:
    st = stack(
        _twins(
            "anthropic",
            {
                "reasoning": True,
                "text": "The schedule is 2, 4, 8, then 16 s — each ±20% jitter.",
                "tool_calls": 1,
                "usage": {"input": 900, "cache_read": 24000, "cache_write": 300, "output": 80},
            },
        ),
        config=ONLY_UP,
    )
    req = claude_code_request()
    assert 75_000 <= len(req.body) <= 120_000

    # Claude Code's warm-up probe comes first, without a key.
    started = time.monotonic()
    probe = http(st.url + "/", "HEAD")
    assert probe.status < 500 and time.monotonic() - started < 5.0

    reply = _send(st, req, auth)
    assert reply.status == 200, reply.body[:500]
    assert reply.header("content-type") == "text/event-stream"

    received = st.mock("up").received[-1]
    assert received.path == "/v1/messages"
    assert received.query == "beta=true"  # the client's query goes along to the same API
    assert received.body == req.body  # byte for byte
    sent = dict(req.headers)
    for name in sent:
        if name.startswith(("anthropic-", "x-stainless-", "x-claude-", "x-app", "user-agent")):
            assert received.header(name) == sent[name], name
    assert received.header("anthropic-beta") == ",".join(CLAUDE_CODE_BETAS)
    assert received.header("x-api-key") == "upstream-key-up"
    assert received.header("authorization") is None
    _assert_no_gateway_key(received.headers)

    direct = _direct(st, req, "/v1/messages")
    assert direct.status == 200
    assert reply.body == direct.body  # the stream comes back as the upstream wrote it
    assert b"event: message_stop" in reply.body

    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"], row["format"]) == (200, "up", "anthropic")
    assert row["session"] == sent["x-claude-code-session-id"]
    assert (row["input_tokens"], row["cache_read_tokens"], row["cache_write_tokens"]) == (
        900,
        24000,
        300,
    )
    assert row["output_tokens"] == 80


@pytest.mark.parametrize("path", ["/backend-api/codex/responses", "/v1/responses"])
def test_codex_turn_passes_through_unchanged(
    stack: StackFactory, frozen_mock_clock: None, path: str
) -> None:
    st = stack(
        _twins(
            "openai-responses",
            {
                "reasoning": True,
                "text": "tests/twengine/test_retry.py covers it.",
                "tool_calls": 2,
                "usage": {"input": 2000, "cache_read": 8000, "output": 120, "reasoning": 64},
            },
        ),
        config=ONLY_UP,
    )
    req = codex_request(path=path)
    assert 30_000 <= len(req.body) <= 50_000

    reply = _send(st, req, ("authorization", f"Bearer {KEY}"))
    assert reply.status == 200, reply.body[:500]

    received = st.mock("up").received[-1]
    assert received.path == "/v1/responses"
    assert received.body == req.body
    sent = dict(req.headers)
    for name in (
        "originator",
        "session-id",
        "thread-id",
        "x-client-request-id",
        "x-codex-turn-metadata",
        "x-codex-beta-features",
        "user-agent",
    ):
        assert received.header(name) == sent[name], name
    assert received.header("authorization") == "Bearer upstream-key-up"
    _assert_no_gateway_key(received.headers)

    direct = _direct(st, req, "/v1/responses")
    assert direct.status == 200
    assert reply.body == direct.body
    assert b"encrypted_content" in reply.body  # the mock honoured include[]
    assert b"event: response.completed" in reply.body

    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"], row["format"]) == (200, "up", "openai-responses")
    assert row["session"] == sent["session-id"]
    assert (row["input_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (
        2000,
        8000,
        120,
    )
    assert row["reasoning_tokens"] == 64
    assert [a["outcome"] for a in attempts(row)] == ["ok"]


# --- official SDKs, same format ----------------------------------------------------------------

TEXT = "Hello from the mock — sunny, 21 °C."
USAGE = {"input": 60, "cache_read": 40, "output": 12}
TOOL_CALLS = (
    ("get_weather", {"location": "Paris, France", "unit": "celsius", "call": 0}),
    ("get_time", {"location": "Paris, France", "unit": "celsius", "call": 1}),
)


@pytest.mark.sdk
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_same_format(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool, tools: bool
) -> None:
    script: dict[str, Any] = {"text": TEXT, "usage": USAGE}
    if tools:
        script["tool_calls"] = 2
    st = stack({"up": Upstream(fmt, MockSettings(script=parse_script(script)))})

    answer = ask(sdks, st, fmt, stream=stream, tools=tools)

    assert answer == Answer(TEXT, TOOL_CALLS if tools else (), (60, 40, 12))
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"], row["stream"]) == (200, "up", int(stream))
    assert (row["input_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (60, 40, 12)
    assert row["ttfb_ms"] is not None and row["duration_ms"] is not None


def test_a_client_that_falls_behind_gets_a_long_stream_whole_and_in_order(
    stack: StackFactory, frozen_mock_clock: None
) -> None:
    # A committed stream is written from the upstream connection's callback while the client
    # keeps up, and by the attempt's reader while it is behind (twserve/relay/stream.py,
    # AttemptStream.sink). Here the upstream pauses between events (so the callback path takes
    # over), and the client, with a small receive buffer, stops reading for a while, then reads in
    # sips: the answer switches between the two paths many times. What the client gets must
    # still be the upstream's stream, byte for byte.
    script = {"chunks": 400, "chunk_size": 8192, "chunk_delay": 0.001}
    st = stack(_twins("anthropic", script), config=ONLY_UP)
    body = json.dumps(
        {
            "model": "claude-e2e-1",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"anthropic-version: 2023-06-01\r\nx-api-key: %s\r\ncontent-length: %d\r\n\r\n"
    ) % (KEY.encode(), len(body))
    client = h11.Connection(h11.CLIENT)
    parts: list[bytes] = []
    status = 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", st.port))
        sock.sendall(head + body)
        client.send(h11.Request(method="POST", target="/", headers=[("host", "gw")]))
        sips = 0
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                sips += 1
                if sips == 4:
                    time.sleep(1.0)  # behind: the buffers between fill up
                client.receive_data(sock.recv(4096))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
    assert status == 200
    direct = http(
        mock_origin(st, "twin") + "/v1/messages",
        body=body,
        headers=[("content-type", "application/json"), ("anthropic-version", "2023-06-01")],
    )
    got = b"".join(parts)
    assert len(got) > 3_000_000  # far more than the buffers between hold
    assert got == direct.body
    (row,) = st.wait_rows(1)
    assert (row["status"], row["provider"], row["cancelled"]) == (200, "up", 0)
