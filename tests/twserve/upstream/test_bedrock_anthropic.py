"""A ``bedrock-anthropic`` upstream through the real gateway, driven by the official SDKs.

The upstream is the mock speaking Bedrock's InvokeModel / InvokeModelWithResponseStream: it
verifies each request's SigV4 signature (or its Bedrock API key), answers in the event-stream
framing, and plays the same scripts as its Anthropic endpoint. Every client format reaches it,
streamed and whole, with tools; its answers must be what a first-party Anthropic upstream
gives for the same script. Exception frames before content fail over, both ways between
Bedrock and a first-party upstream; after content they end the client's stream.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.twserve.conftest import ERRORS, FORMATS, MODELS, Sdks, StackFactory, ask, attempts
from tests.twserve.conftest import fallback as _fallback
from tests.twserve.support.stack import Stack, Upstream
from twmock.script import MockSettings, parse_script
from twproto.sigv4 import AwsCredentials

CREDS = AwsCredentials("AKIDMOCKBEDROCK", "mock/secret+key", "mock-session-token")
ENV = {
    "BEDROCK_KEY_ID": CREDS.access_key_id,
    "BEDROCK_SECRET": CREDS.secret_access_key,
    "BEDROCK_TOKEN": "mock-session-token",
}
SIGNED = {
    "key": None,
    "region": "us-east-1",
    "aws_access_key_id": "${BEDROCK_KEY_ID}",
    "aws_secret_access_key": "${BEDROCK_SECRET}",
    "aws_session_token": "${BEDROCK_TOKEN}",
}
TEXT = "Sunny in Paris, 21 degrees."
MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def _settings(script: dict[str, Any], **kw: Any) -> MockSettings:
    return MockSettings(script=parse_script(script), aws_credentials=CREDS, seed=7, **kw)


def _bedrock(script: dict[str, Any], extra: dict[str, Any] | None = None, **kw: Any) -> Upstream:
    return Upstream("bedrock-anthropic", _settings(script, **kw), extra={**SIGNED, **(extra or {})})


def _config(*names: str) -> dict[str, Any]:
    config = _fallback(*names, failures_to_pause=5)
    config["aliases"] = {m: [MODEL_ID] for m in set(MODELS.values())}
    return config


def _start(stack: StackFactory, ups: dict[str, Upstream], *order: str) -> Stack:
    return stack(ups, config=_config(*(order or tuple(ups))), env=ENV)


def _invocations(st: Stack, name: str) -> list[Any]:
    return [r for r in st.mock(name).received if r.path.startswith("/model/")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_bedrock_as_it_reaches_anthropic(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "usage": {"input": 31, "output": 9}}
    st = _start(stack, {"bedrock": _bedrock(script)})
    answer = ask(sdks, st, fmt, stream=stream, tools=True)
    assert TEXT in answer.text or answer.tool_calls
    assert answer.tool_calls and answer.tool_calls[0][0] == "get_weather"
    assert answer.usage[2] == 9
    (seen,) = _invocations(st, "bedrock")
    action = "invoke-with-response-stream" if stream else "invoke"
    assert seen.path == f"/model/{MODEL_ID.replace(':', '%3A')}/{action}"
    body = seen.json()
    assert body["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in body and "stream" not in body
    assert body["tools"][0]["name"] == "get_weather"
    assert seen.header("x-amz-security-token") == "mock-session-token"
    assert (seen.header("authorization") or "").startswith("AWS4-HMAC-SHA256 Credential=AKID")
    assert seen.header("x-api-key") is None and seen.header("anthropic-version") is None


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_bedrock_answer_equals_first_party_answer(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    script = {"text": TEXT, "tool_calls": 1, "reasoning": "thinking it over"}
    via_bedrock = _start(stack, {"bedrock": _bedrock(script)})
    got = ask(sdks, via_bedrock, fmt, stream=stream, tools=True)
    direct = stack(
        {"direct": Upstream("anthropic", MockSettings(script=parse_script(script), seed=7))},
        config=_config("direct"),
    )
    want = ask(sdks, direct, fmt, stream=stream, tools=True)
    assert got == want


def test_anthropic_stream_is_relayed_with_its_events(stack: StackFactory, sdks: Sdks) -> None:
    """An Anthropic client gets Bedrock's events as Anthropic SSE, thinking signature and all."""
    st = _start(stack, {"bedrock": _bedrock({"text": TEXT, "reasoning": "let me see"})})
    client = sdks.anthropic(st)
    kwargs: dict[str, Any] = {
        "model": MODELS["anthropic"],
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "weather?"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_headers": {"anthropic-beta": "interleaved-thinking-2025-05-14"},
    }
    with client.messages.stream(**kwargs) as events:
        kinds = [e.type for e in events]
        message = events.get_final_message()
    assert kinds[0] == "message_start" and "content_block_delta" in kinds
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking and thinking[0].thinking == "let me see" and thinking[0].signature
    assert "".join(b.text for b in message.content if b.type == "text") == TEXT
    (seen,) = _invocations(st, "bedrock")
    body = seen.json()
    assert body["anthropic_beta"] == ["interleaved-thinking-2025-05-14"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize("fmt", FORMATS)
def test_exception_frame_before_content_fails_over_to_first_party(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    failing = {"stream_error_after": 0, "error": {"status": 429, "message": "Too many requests"}}
    st = _start(
        stack,
        {
            "bedrock": _bedrock(failing),
            "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
        },
    )
    answer = ask(sdks, st, fmt, stream=True)
    assert answer.text == TEXT
    (row,) = st.wait_rows(1)
    tried = attempts(row)
    assert [a["provider"] for a in tried] == ["bedrock", "direct"]
    assert tried[0]["error"] == "rate_limited"


@pytest.mark.parametrize("fmt", ["anthropic", "openai-chat"])
def test_first_party_failure_fails_over_to_bedrock(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    st = _start(
        stack,
        {
            "direct": Upstream("anthropic", MockSettings(script=parse_script({"error": {}}))),
            "bedrock": _bedrock({"text": TEXT}),
        },
        "direct",
        "bedrock",
    )
    for stream in (True, False):
        assert ask(sdks, st, fmt, stream=stream).text == TEXT
    assert len(_invocations(st, "bedrock")) == 2


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"status": 429, "retry_after": 7}, "rate_limited"),
        ({"status": 503}, "overloaded"),
        ({"status": 500}, "server"),
    ],
)
def test_bedrock_http_errors_fail_over(
    stack: StackFactory, sdks: Sdks, error: dict[str, Any], kind: str
) -> None:
    st = _start(
        stack,
        {
            "bedrock": _bedrock({"error": error}),
            "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
        },
    )
    assert ask(sdks, st, "openai-chat", stream=False).text == TEXT
    (row,) = st.wait_rows(1)
    assert attempts(row)[0]["error"] == kind


@pytest.mark.parametrize("fmt", FORMATS)
def test_exception_frame_after_content_ends_the_clients_stream(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    script = {"text": TEXT, "chunks": 4, "stream_error_after": 2, "error": {"status": 529}}
    st = _start(stack, {"bedrock": _bedrock(script)})
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


@pytest.mark.parametrize("fmt", ["anthropic", "gemini"])
def test_cut_stream_is_an_error_for_the_client(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    st = _start(stack, {"bedrock": _bedrock({"text": TEXT, "chunks": 4, "break_after": 2})})
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


def test_wrong_secret_is_refused_by_the_mock_with_awss_403(stack: StackFactory, sdks: Sdks) -> None:
    wrong = {**SIGNED, "aws_secret_access_key": "not-the-secret"}
    st = _start(
        stack,
        {
            "bedrock": _bedrock({"text": TEXT}, extra=wrong),
            "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
        },
    )
    assert ask(sdks, st, "anthropic", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    first = attempts(row)[0]
    assert first["provider"] == "bedrock" and first["error"] == "auth_rejected"
    (refused,) = st.mock("bedrock").received
    assert refused.status == 403


def test_bedrock_api_key_goes_as_a_bearer_token(stack: StackFactory, sdks: Sdks) -> None:
    up = Upstream(
        "bedrock-anthropic",
        MockSettings(script=parse_script({"text": TEXT}), bedrock_api_key="brk-key-1"),
        extra={"key": "${BEDROCK_API_KEY}", "region": "eu-west-1"},
    )
    st = stack({"bedrock": up}, config=_config("bedrock"), env={"BEDROCK_API_KEY": "brk-key-1"})
    assert ask(sdks, st, "openai-responses", stream=True).text == TEXT
    (seen,) = _invocations(st, "bedrock")
    assert seen.header("authorization") == "Bearer brk-key-1"
    assert seen.header("x-amz-date") is None


def test_credentials_that_cannot_sign_skip_the_upstream(stack: StackFactory, sdks: Sdks) -> None:
    missing = {**SIGNED, "aws_secret_access_key": "${NOT_SET_ANYWHERE}"}
    st = _start(
        stack,
        {
            "bedrock": _bedrock({"text": "never"}, extra=missing),
            "direct": Upstream("anthropic", MockSettings(script=parse_script({"text": TEXT}))),
        },
    )
    assert ask(sdks, st, "gemini", stream=False).text == TEXT
    assert _invocations(st, "bedrock") == []


def test_rows_price_a_bedrock_model_id_by_the_vendors_model(
    stack: StackFactory, sdks: Sdks
) -> None:
    config = _config("bedrock")
    config["aliases"] = {
        MODELS["openai-chat"]: ["global.anthropic.claude-sonnet-4-5-20250929-v1:0"]
    }
    script = {"text": TEXT, "usage": {"input": 1000, "output": 100}}
    st = stack({"bedrock": _bedrock(script)}, config=config, env=ENV)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    # claude-sonnet-4-5: 3 $/M input, 15 $/M output.
    assert (row["cost_micros"], row["cost_state"]) == (3000 + 1500, "known"), row
