"""The mock's Bedrock writers and endpoint, planned without an event loop: event-stream framing
of an Anthropic plan, Bedrock's error bodies, and AWS's 403 for a bad signature."""

from __future__ import annotations

import base64
import json
from typing import Any

from twmock.formats.bedrock import bedrock_plan, count_plan
from twmock.formats.converse import START_WITH_USER, converse_plan
from twmock.plan import Chunk, RequestInfo, plan
from twmock.script import MockSettings, parse_script
from twmock.serve.bedrock import (
    as_anthropic,
    as_anthropic_count,
    as_converse,
    bedrock_call,
    bedrock_refusal,
    validation_plan,
)
from twproto.bedrock import AwsAuth, invoke_request
from twproto.eventstream import EventStreamDecoder
from twproto.sigv4 import AwsCredentials

CREDS = AwsCredentials("AKIDMOCK", "secret")
BODY = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}'  # noqa: E501


def _planned(script: dict[str, object], *, stream: bool = True) -> tuple[int | None, bytes]:
    call = bedrock_call("POST", "/model/m%3A0/invoke" + ("-with-response-stream" if stream else ""))
    assert call is not None and call.model == "m:0"
    info = as_anthropic(RequestInfo(method="POST", path="/model/m%3A0/x", body=BODY), call)
    assert isinstance(info, RequestInfo)
    out = bedrock_plan(plan(info, parse_script(script)), stream=stream)
    return out.status, b"".join(s.data for s in out.steps if isinstance(s, Chunk))


def test_stream_is_chunk_events_carrying_anthropic_events() -> None:
    status, data = _planned({"text": "Hello there"})
    assert status == 200
    messages = EventStreamDecoder().feed(data)
    events = [json.loads(base64.b64decode(json.loads(m.payload)["bytes"])) for m in messages]
    assert {m.event_type for m in messages} == {"chunk"}
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "Hello there"


def test_stream_error_is_an_exception_frame() -> None:
    _, data = _planned({"text": "abc", "stream_error_after": 1, "error": {"status": 429}})
    last = EventStreamDecoder().feed(data)[-1]
    assert last.message_type == "exception" and last.exception_type == "throttlingException"


def test_error_status_is_bedrocks_body_and_header() -> None:
    call = bedrock_call("POST", "/model/m/invoke")
    assert call is not None
    info = as_anthropic(RequestInfo(method="POST", path="/", body=BODY), call)
    assert isinstance(info, RequestInfo)
    out = bedrock_plan(plan(info, parse_script({"error": {"status": 529}})), stream=False)
    assert out.status == 503
    assert (out.header(b"x-amzn-errortype") or b"").startswith(b"ServiceUnavailableException:")
    assert set(json.loads(out.body)) == {"message"}


def test_body_with_model_or_without_version_is_refused_like_bedrock() -> None:
    call = bedrock_call("POST", "/model/m/invoke")
    assert call is not None
    bad = as_anthropic(RequestInfo(method="POST", path="/", body=b'{"model":"m"}'), call)
    assert isinstance(bad, str) and "anthropic_version" in bad


def test_signature_is_verified_and_refused_with_awss_403() -> None:
    settings = MockSettings(aws_credentials=CREDS)
    url, headers, body = invoke_request(
        "http://127.0.0.1:9",
        "m:0",
        b"{}",
        stream=False,
        auth=AwsAuth(region="us-east-1", credentials=CREDS),
        key="",
        now=1000.0,
    )
    target = url.removeprefix("http://127.0.0.1:9").encode()
    sent = ((b"host", b"127.0.0.1:9"), *headers)
    assert bedrock_refusal(settings, target, sent, body, 1000.0) is None
    refused = bedrock_refusal(settings, target, sent, body + b" ", 1000.0)
    assert refused is not None and refused.status == 403
    assert (refused.header(b"x-amzn-errortype") or b"").startswith(b"InvalidSignatureException")
    assert "signature" in json.loads(refused.body)["message"]
    late = bedrock_refusal(settings, target, sent, body, 1000.0 + 3600)
    assert late is not None and late.status == 403


def test_throttling_keeps_its_retry_hint() -> None:
    call = bedrock_call("POST", "/model/m/invoke-with-response-stream")
    assert call is not None
    info = as_anthropic(RequestInfo(method="POST", path="/", body=BODY), call)
    assert isinstance(info, RequestInfo)
    script = parse_script({"error": {"status": 429, "retry_after": 7}})
    out = bedrock_plan(plan(info, script), stream=True)
    assert out.status == 429
    assert (out.header(b"x-amzn-errortype") or b"").startswith(b"ThrottlingException:")
    assert out.header(b"retry-after") == b"7"


def _counted(model: str, body: bytes, script: dict[str, object]) -> tuple[int | None, object]:
    call = bedrock_call("POST", f"/model/{model}/count-tokens")
    assert call is not None and call.count and not call.stream
    info = as_anthropic_count(RequestInfo(method="POST", path="/", body=body), call)
    if isinstance(info, str):
        out = validation_plan(info)
    else:
        out = count_plan(plan(info, parse_script(script)))
    return out.status, json.loads(out.body)


def test_count_tokens_answers_input_tokens() -> None:
    wrapped = json.dumps({"input": {"invokeModel": {"body": base64.b64encode(BODY).decode()}}})
    status, body = _counted("anthropic.claude-x%3A0", wrapped.encode(), {"usage": {"input": 77}})
    assert (status, body) == (200, {"inputTokens": 77})
    # Without a scripted figure: the mock's own estimate of the wrapped request.
    status, body = _counted("anthropic.claude-x%3A0", wrapped.encode(), {})
    assert status == 200 and isinstance(body, dict) and body["inputTokens"] > 0


def test_count_tokens_refuses_like_bedrock() -> None:
    wrapped = json.dumps({"input": {"invokeModel": {"body": base64.b64encode(BODY).decode()}}})
    assert _counted("meta.llama3-70b-instruct-v1%3A0", wrapped.encode(), {}) == (
        400,
        {"message": "The provided model doesn't support counting tokens."},
    )
    status, body = _counted("anthropic.c", b'{"input": {"invokeModel": {"body": "%%"}}}', {})
    assert status == 400 and "Malformed input request" in str(body)
    unversioned = base64.b64encode(b'{"max_tokens":1,"messages":[]}').decode()
    status, body = _counted(
        "anthropic.c", json.dumps({"input": {"invokeModel": {"body": unversioned}}}).encode(), {}
    )
    assert status == 400 and "anthropic_version" in str(body)
    status, _ = _counted("anthropic.c", wrapped_error(), {"error": {"status": 429}})
    assert status == 429


def wrapped_error() -> bytes:
    inner = base64.b64encode(BODY).decode()
    return json.dumps({"input": {"invokeModel": {"body": inner}}}).encode()


def _conversed(body: dict[str, object], script: dict[str, object], *, stream: bool) -> Any:
    action = "converse-stream" if stream else "converse"
    call = bedrock_call("POST", f"/model/anthropic.claude-x%3A0/{action}")
    assert call is not None and call.converse and call.stream is stream
    info = as_converse(RequestInfo(method="POST", path="/", body=json.dumps(body).encode()), call)
    if isinstance(info, str):
        return validation_plan(info)
    return converse_plan(plan(info, parse_script(script)), stream=stream)


_HI = {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}


def test_converse_refuses_what_bedrock_refuses() -> None:
    cases = [
        ({"messages": [{"role": "assistant", "content": [{"text": "x"}]}]}, START_WITH_USER),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"text": "a"}]},
                    {"role": "user", "content": [{"text": "b"}]},
                ]
            },
            "A conversation must alternate between user and assistant roles.",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"text": "a"}]},
                    {
                        "role": "assistant",
                        "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}],
                    },
                ]
            },
            "The toolConfig field must be defined",
        ),
        ({"messages": "no"}, "Malformed input request"),
    ]
    for body, message in cases:
        out = _conversed(body, {"text": "never"}, stream=False)
        assert out.status == 400
        assert message in json.loads(out.body)["message"]
        assert (out.header(b"x-amzn-errortype") or b"").startswith(b"ValidationException:")


def test_converse_whole_answer_and_stream_events() -> None:
    out = _conversed(
        _HI, {"text": "Hello", "tool_calls": 1, "usage": {"input": 5, "output": 3}}, stream=False
    )
    answer = json.loads(out.body)
    kinds = [next(iter(b)) for b in answer["output"]["message"]["content"]]
    assert kinds == ["text", "toolUse"] and answer["stopReason"] == "tool_use"
    assert answer["usage"]["inputTokens"] == 5 and answer["usage"]["outputTokens"] == 3
    out = _conversed(_HI, {"text": "Hello", "reasoning": "hm"}, stream=True)
    assert out.header(b"content-type") == b"application/vnd.amazon.eventstream"
    messages = EventStreamDecoder().feed(out.body)
    types = [m.event_type for m in messages]
    assert types[0] == "messageStart" and types[-2:] == ["messageStop", "metadata"]
    deltas = [
        json.loads(m.payload)["delta"] for m in messages if m.event_type == "contentBlockDelta"
    ]
    assert "".join(d.get("text", "") for d in deltas) == "Hello"
    assert any("signature" in d.get("reasoningContent", {}) for d in deltas)


def test_converse_stream_faults_are_exception_frames_before_or_after_content() -> None:
    before = _conversed(_HI, {"stream_error_after": 0, "error": {"status": 429}}, stream=True)
    (only,) = [m for m in EventStreamDecoder().feed(before.body) if m.message_type != "event"]
    assert only.exception_type == "throttlingException"
    after = _conversed(
        _HI,
        {"text": "abcdef", "chunks": 3, "stream_error_after": 2, "error": {"status": 529}},
        stream=True,
    )
    messages = EventStreamDecoder().feed(after.body)
    assert any(m.event_type == "contentBlockDelta" for m in messages)
    assert messages[-1].exception_type == "serviceUnavailableException"
    http = _conversed(_HI, {"error": {"status": 429}}, stream=True)
    assert http.status == 429 and (http.header(b"x-amzn-errortype") or b"").startswith(
        b"Throttling"
    )
