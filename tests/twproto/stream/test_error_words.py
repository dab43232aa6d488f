"""Errors after content, written only with the error types the client's API documents."""

from __future__ import annotations

import pytest

from twproto import json_loads
from twproto.dialect import Dialect
from twproto.errors import (
    ANTHROPIC_ERROR_TYPES,
    RESPONSES_ERROR_CODES,
    ErrorCategory,
    GatewayError,
)
from twproto.stream.translators import new_stream_translator

CHAT_TEXT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
)


def _data(out: bytes, event: bytes) -> dict[str, object]:
    for block in out.split(b"\n\n"):
        if event in block:
            line = next(x for x in block.split(b"\n") if x.startswith(b"data: "))
            return json_loads(line[6:])
    raise AssertionError(f"no {event!r} in {out!r}")


@pytest.mark.parametrize(
    ("error", "anthropic_type"),
    [
        (b'{"message":"The server had an error","type":"server_error"}', "api_error"),
        (
            b'{"message":"The server is overloaded or not ready yet.","type":"server_error"}',
            "overloaded_error",
        ),
        (b'{"message":"slow","type":"tokens","code":"rate_limit_exceeded"}', "rate_limit_error"),
        (b'{"message":"odd","type":"made_up_error"}', "api_error"),
    ],
)
def test_chat_error_reaches_anthropic_with_an_anthropic_type(
    error: bytes, anthropic_type: str
) -> None:
    t = new_stream_translator(Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, client_model="c")
    out = t.feed(CHAT_TEXT) + t.feed(b'data: {"error":' + error + b"}\n\n")
    body = _data(out, b"event: error")
    err = body["error"]
    assert isinstance(err, dict)
    assert err["type"] == anthropic_type
    assert err["type"] in ANTHROPIC_ERROR_TYPES


@pytest.mark.parametrize(
    ("status", "code"), [(429, "rate_limit_exceeded"), (400, "server_error"), (529, "server_error")]
)
def test_responses_failure_code_is_a_responses_code(status: int, code: str) -> None:
    t = new_stream_translator(Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, client_model="c")
    t.feed(CHAT_TEXT)
    err = GatewayError(status=status, category=ErrorCategory.UPSTREAM, code="x", message="m")
    failed = _data(t.fail(err), b"response.failed")
    response = failed["response"]
    assert isinstance(response, dict)
    assert response["error"]["code"] == code
    assert code in RESPONSES_ERROR_CODES


def test_gemini_overload_code_is_the_http_status_of_unavailable() -> None:
    t = new_stream_translator(Dialect.ANTHROPIC, Dialect.GEMINI, client_model="c")
    t.feed(
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        b'"type":"message","role":"assistant","model":"m","content":[],"usage":'
        b'{"input_tokens":1,"output_tokens":1}}}\n\n'
    )
    out = t.feed(
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n'
    )
    assert _data(out, b'"error"')["error"] == {
        "code": 503,
        "message": "Overloaded",
        "status": "UNAVAILABLE",
    }
