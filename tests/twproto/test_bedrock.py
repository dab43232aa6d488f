"""twproto.bedrock: the InvokeModel request, and its event-stream answer read back as Anthropic
SSE (split anywhere, exception frames as Anthropic error events), without an event loop."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twproto import Dialect
from twproto.bedrock import (
    COUNT_UNSUPPORTED_MESSAGE,
    AwsAuth,
    InvokeStreamReframer,
    bedrock_base_url,
    count_answer,
    count_invoke_body,
    count_unsupported,
    invoke_body,
    invoke_path,
    invoke_request,
)
from twproto.eventstream import eventstream_event, eventstream_exception
from twproto.failures import FailureKind, classify_stream_error
from twproto.paths import Operation
from twproto.sigv4 import AwsCredentials, verify_request
from twproto.sse import SSEDecoder
from twproto.stream.upstream import FirstContent, UpstreamStream
from twproto.upstream_request import ClientCall, UpstreamTarget, upstream_request

CREDS = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "tok")
EVENTS = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 5}},
]


def _chunk(event: dict[str, object]) -> bytes:
    raw = json.dumps(event, separators=(",", ":")).encode()
    return eventstream_event("chunk", b'{"bytes":"' + base64.b64encode(raw) + b'"}')


STREAM = b"".join(_chunk(e) for e in EVENTS)


def test_body_loses_model_and_stream_and_gains_version_and_betas() -> None:
    body = b'{"model":"m","stream":true,"max_tokens":5,"messages":[],"anthropic_beta":["a"]}'
    out = json.loads(invoke_body(body, [(b"anthropic-beta", b"a, b"), (b"other", b"x")]))
    assert out == {
        "max_tokens": 5,
        "messages": [],
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["a", "b"],
    }


def test_path_encodes_the_whole_model_id() -> None:
    arn = "arn:aws:bedrock:us-east-1:123:inference-profile/us.anthropic.claude-v1:0"
    assert invoke_path(arn, stream=True) == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2F"
        "us.anthropic.claude-v1%3A0/invoke-with-response-stream"
    )
    assert invoke_path("m", stream=False) == "/model/m/invoke"


@pytest.mark.parametrize("base", ["http://127.0.0.1:9100", bedrock_base_url("us-west-2")])
def test_signed_request_verifies_with_the_host_the_client_sends(base: str) -> None:
    auth = AwsAuth(region="us-west-2", credentials=CREDS)
    url, headers, body = invoke_request(
        base,
        "anthropic.claude-v2:1",
        b'{"model":"x","messages":[]}',
        stream=True,
        auth=auth,
        key="",
        headers=[(b"x-mock-script", b"{}")],
        now=1_750_000_000.0,
    )
    names = [k for k, _ in headers]
    assert b"host" not in names and b"authorization" in names and b"x-amz-security-token" in names
    host = base.split("//")[1].removesuffix(":443").encode()
    sent = [(b"host", host), *headers]
    check = verify_request(
        "POST", url, sent, body, region="us-west-2", credentials=CREDS, now=1_750_000_010.0
    )
    assert check == "valid"
    # Another Host than the one signed (a port the client would not write) is refused.
    assert (
        verify_request(
            "POST",
            url,
            [(b"host", host + b":1"), *headers],
            body,
            region="us-west-2",
            credentials=CREDS,
            now=1_750_000_010.0,
        )
        == "mismatch"
    )


def test_api_key_is_a_bearer_token() -> None:
    _, headers, _ = invoke_request(
        "https://x", "m", b"{}", stream=False, auth=AwsAuth(region="r"), key="k1", now=0.0
    )
    assert (b"authorization", b"Bearer k1") in headers
    assert (b"accept", b"application/json") in headers


def _sse(data: bytes) -> list[tuple[str, dict[str, object]]]:
    decoder = SSEDecoder()
    events = decoder.feed(data) + decoder.end()
    return [(e.event or "", json.loads(e.data)) for e in events]


def test_chunks_become_the_anthropic_events_they_carry() -> None:
    out = InvokeStreamReframer().feed(STREAM)
    assert _sse(out) == [(e["type"], e) for e in EVENTS]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=12))
def test_reframing_is_split_insensitive(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    reframer = InvokeStreamReframer()
    out = b"".join(reframer.feed(p) for p in pieces) + reframer.end()
    assert out == InvokeStreamReframer().feed(STREAM)


@given(
    at=st.integers(min_value=0, max_value=len(STREAM) - 1),
    cuts=st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=8),
)
def test_a_fault_after_the_last_messages_is_reported_however_split(
    at: int, cuts: list[int]
) -> None:
    # The decoder hands out the messages before a fault and raises at its next call: the
    # reframer's end asks for that call, so a fault in the last piece is not lost.
    damaged = bytearray(STREAM)
    damaged[at] ^= 0x10
    data = bytes(damaged)
    points = sorted(set(cuts))
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    split_reframer, whole_reframer = InvokeStreamReframer(), InvokeStreamReframer()
    split_out = b"".join(split_reframer.feed(p) for p in pieces) + split_reframer.end()
    whole_out = whole_reframer.feed(data) + whole_reframer.end()
    assert split_out == whole_out
    assert whole_out.count(b"event: error") == 1  # every byte is under a checksum


@pytest.mark.parametrize(
    ("exception", "message", "kind"),
    [
        ("throttlingException", "Too many requests, please wait", FailureKind.RATE_LIMITED),
        ("serviceUnavailableException", "Service unavailable", FailureKind.OVERLOADED),
        ("internalServerException", "Internal error", FailureKind.SERVER),
        ("modelStreamErrorException", "Model stream error", FailureKind.SERVER),
        (
            "validationException",
            "Input is too long for requested model.",
            FailureKind.CONTEXT_OVERFLOW,
        ),
    ],
)
def test_exception_frames_become_error_events_of_the_same_kind(
    exception: str, message: str, kind: FailureKind
) -> None:
    frame = eventstream_exception(exception, json.dumps({"message": message}).encode())
    reframer = InvokeStreamReframer()
    out = reframer.feed(_chunk(EVENTS[0]) + frame + _chunk(EVENTS[1]))
    events = _sse(out)
    assert [name for name, _ in events] == ["message_start", "error"]  # nothing after it
    failure = classify_stream_error(Dialect.ANTHROPIC, events[1][1], now=0.0)
    assert failure.kind is kind


def test_corrupt_frame_is_an_api_error_and_ends_the_reading() -> None:
    bad = bytearray(_chunk(EVENTS[0]))
    bad[-1] ^= 0xFF
    reframer = InvokeStreamReframer()
    ((name, event),) = _sse(reframer.feed(bytes(bad)))
    assert name == "error" and event["error"]["type"] == "api_error"  # type: ignore[index]
    assert reframer.feed(STREAM) == b""


def test_a_chunk_without_bytes_is_an_error_and_a_type_not_first_is_still_named() -> None:
    odd = {"index": 0, "type": "content_block_stop"}
    raw = json.dumps(odd).encode()
    frame = eventstream_event("chunk", b'{"bytes":"' + base64.b64encode(raw) + b'"}')
    assert _sse(InvokeStreamReframer().feed(frame)) == [("content_block_stop", odd)]
    empty = eventstream_event("chunk", b'{"p":"abc"}')
    ((name, _),) = _sse(InvokeStreamReframer().feed(empty))
    assert name == "error"


@pytest.mark.parametrize("client", list(Dialect))
def test_upstream_stream_reads_bedrock_for_every_client(client: Dialect) -> None:
    opening = UpstreamStream(Dialect.ANTHROPIC, client, client_model="c", eventstream=True)
    out = b""
    translator = None
    for i in range(0, len(STREAM), 13):
        piece = STREAM[i : i + 13]
        if translator is None:
            outcome = opening.feed(piece, now=0.0)
            if isinstance(outcome, FirstContent):
                translator = outcome.translator
                out += outcome.data
        else:
            out += translator.feed(piece)
    assert translator is not None
    out += translator.end()
    assert translator.finished
    assert translator.usage is not None and translator.usage.output_tokens == 2
    assert b"Hi" in out


def test_usage_reported_before_a_failure_is_read_from_the_event_stream() -> None:
    from twproto.stream.upstream import reported_usage

    opening = _chunk(EVENTS[0]) + eventstream_exception("throttlingException", b'{"message":"x"}')
    usage = reported_usage(Dialect.ANTHROPIC, opening, eventstream=True)
    assert usage is not None and usage.input_tokens == 5
    assert reported_usage(Dialect.ANTHROPIC, opening) is None  # read as SSE it says nothing


def test_a_count_is_countTokens_with_the_invoke_body_as_base64() -> None:
    target = UpstreamTarget(
        dialect=Dialect.ANTHROPIC,
        base_url="http://127.0.0.1:9100",
        key="",
        model="anthropic.claude-v2:1",
        aws=AwsAuth(region="us-west-2", credentials=CREDS),
    )
    call = ClientCall(
        dialect=Dialect.ANTHROPIC,
        operation=Operation.COUNT_TOKENS,
        stream=False,
        headers=[(b"anthropic-beta", b"b1")],
    )
    body = b'{"model":"x","messages":[{"role":"user","content":"hi"}]}'
    req = upstream_request(target, call, body, now=1_750_000_000.0)
    assert req.url == "http://127.0.0.1:9100/model/anthropic.claude-v2%3A1/count-tokens"
    sent = json.loads(req.body)
    inner = json.loads(base64.b64decode(sent["input"]["invokeModel"]["body"], validate=True))
    assert inner == {
        "messages": [{"role": "user", "content": "hi"}],
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["b1"],
        "max_tokens": 1,
    }
    headers = [(b"host", b"127.0.0.1:9100"), *req.headers]
    check = verify_request(
        "POST", req.url, headers, req.body, region="us-west-2", credentials=CREDS, now=1.75e9
    )
    assert check == "valid"
    # A body that sets its own output limit keeps it.
    assert (
        json.loads(
            base64.b64decode(
                json.loads(count_invoke_body(b'{"max_tokens":9}'))["input"]["invokeModel"]["body"]
            )
        )["max_tokens"]
        == 9
    )


@pytest.mark.parametrize(
    ("dialect", "want"),
    [
        (Dialect.ANTHROPIC, {"input_tokens": 42}),
        (Dialect.GEMINI, {"totalTokens": 42}),
        (Dialect.OPENAI_RESPONSES, {"object": "response.input_tokens", "input_tokens": 42}),
    ],
)
def test_the_count_answer_is_the_clients_shape(dialect: Dialect, want: dict[str, Any]) -> None:
    out = count_answer(b'{"inputTokens":42}', dialect)
    assert out is not None and json.loads(out) == want
    for bad in (b"[]", b"{}", b'{"inputTokens":"42"}', b'{"inputTokens":-1}', b"nope"):
        assert count_answer(bad, dialect) is None


def test_an_unsupported_model_is_recognised_by_its_400() -> None:
    message = json.dumps({"message": COUNT_UNSUPPORTED_MESSAGE}).encode()
    assert count_unsupported(400, message)
    assert not count_unsupported(403, message)
    assert not count_unsupported(400, b'{"message":"Malformed input request"}')
    assert not count_unsupported(400, b"not json")
