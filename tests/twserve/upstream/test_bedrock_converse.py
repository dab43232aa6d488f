"""A ``bedrock-converse`` upstream through the real gateway, driven by the official SDKs.

The upstream is the mock speaking Converse / ConverseStream: it verifies each request's SigV4
signature, checks the conversation as Bedrock does (a user message first, roles alternating,
tool blocks with a ``toolConfig``), answers in Converse's JSON or ConverseStream's event-stream
framing, and plays the same scripts as its Anthropic endpoint. Every client format reaches it,
streamed and whole, with tools and reasoning; its answers must be what a first-party Anthropic
upstream gives for the same script. Exception frames before content fail over, both ways
between Converse and a first-party upstream; after content they end the client's stream.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.twserve.conftest import ERRORS, FORMATS, MODELS, Sdks, StackFactory, ask, attempts
from tests.twserve.support.stack import Stack, Upstream
from tests.twserve.upstream.test_bedrock_anthropic import CREDS, ENV, SIGNED, _config
from twmock.formats.converse import START_WITH_USER
from twmock.script import MockSettings, parse_script

TEXT = "Sunny in Paris, 21 degrees."
MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 24).decode()


def _converse(script: dict[str, Any], extra: dict[str, Any] | None = None) -> Upstream:
    settings = MockSettings(script=parse_script(script), aws_credentials=CREDS, seed=7)
    return Upstream("bedrock-converse", settings, extra={**SIGNED, **(extra or {})})


def _direct(script: dict[str, Any]) -> Upstream:
    return Upstream("anthropic", MockSettings(script=parse_script(script), seed=7))


def _start(stack: StackFactory, ups: dict[str, Upstream], *order: str) -> Stack:
    return stack(ups, config=_config(*(order or tuple(ups))), env=ENV)


def _calls(st: Stack, name: str) -> list[Any]:
    return [r for r in st.mock(name).received if r.path.startswith("/model/")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reaches_converse_as_it_reaches_anthropic(
    stack: StackFactory, sdks: Sdks, fmt: str, stream: bool
) -> None:
    script = {
        "text": TEXT,
        "tool_calls": 1,
        "reasoning": "thinking it over",
        "usage": {"input": 31, "output": 9},
    }
    got = ask(sdks, _start(stack, {"converse": _converse(script)}), fmt, stream=stream, tools=True)
    want = ask(sdks, _start(stack, {"direct": _direct(script)}), fmt, stream=stream, tools=True)
    assert got == want
    assert got.tool_calls and got.tool_calls[0][0] == "get_weather"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_the_request_is_converses_and_signed(stack: StackFactory, sdks: Sdks, stream: bool) -> None:
    st = _start(stack, {"converse": _converse({"text": TEXT, "usage": {"input": 31, "output": 9}})})
    answer = ask(sdks, st, "openai-chat", stream=stream, tools=True)
    assert answer.text == TEXT and answer.usage == (31, 0, 9)
    (seen,) = _calls(st, "converse")
    action = "converse-stream" if stream else "converse"
    assert seen.path == f"/model/{MODEL_ID.replace(':', '%3A')}/{action}"
    assert seen.status == 200
    assert (seen.header("authorization") or "").startswith("AWS4-HMAC-SHA256 Credential=AKID")
    body = seen.json()
    assert "model" not in body and "modelId" not in body and "stream" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"text": "What is the weather in Paris?"}]}
    ]
    spec = body["toolConfig"]["tools"][0]["toolSpec"]
    assert spec["name"] == "get_weather" and spec["inputSchema"]["json"]["type"] == "object"


def test_reasoning_tools_images_and_tool_results_go_as_converse_blocks(
    stack: StackFactory, sdks: Sdks
) -> None:
    st = _start(stack, {"converse": _converse({"text": TEXT, "reasoning": "let me see"})})
    client = sdks.anthropic(st)
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in the picture, and the weather?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "c2lnLTE="},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"location": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "21 degrees",
                    "is_error": True,
                }
            ],
        },
    ]
    with client.messages.stream(
        model=MODELS["anthropic"],
        max_tokens=4096,
        system="Be brief.",
        messages=messages,  # type: ignore[arg-type]
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["END"],
    ) as events:
        message = events.get_final_message()
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking and thinking[0].thinking == "let me see" and thinking[0].signature
    assert "".join(b.text for b in message.content if b.type == "text") == TEXT
    (seen,) = _calls(st, "converse")
    body = seen.json()
    assert body["system"] == [{"text": "Be brief."}]
    assert body["inferenceConfig"] == {"maxTokens": 4096, "stopSequences": ["END"]}
    assert body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 1024}
    }
    assert body["toolConfig"]["toolChoice"] == {"any": {}}
    user, assistant, result = body["messages"]
    assert user["content"][1] == {"image": {"format": "png", "source": {"bytes": PNG}}}
    assert assistant["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Look it up.", "signature": "c2lnLTE="}}},
        {
            "toolUse": {
                "toolUseId": "toolu_1",
                "name": "get_weather",
                "input": {"location": "Paris"},
            }
        },
    ]
    assert result["content"] == [
        {
            "toolResult": {
                "toolUseId": "toolu_1",
                "content": [{"text": "21 degrees"}],
                "status": "error",
            }
        }
    ]


def test_a_chat_clients_reasoning_effort_is_claudes_thinking_on_converse(
    stack: StackFactory, sdks: Sdks
) -> None:
    st = _start(stack, {"converse": _converse({"text": TEXT, "reasoning": "weighing it"})})
    completion = sdks.openai(st).chat.completions.create(
        model=MODELS["openai-chat"],
        messages=[{"role": "user", "content": "Think, then answer."}],
        reasoning_effort="low",
        max_completion_tokens=4096,
    )
    assert completion.choices[0].message.content == TEXT
    (seen,) = _calls(st, "converse")
    thinking = seen.json()["additionalModelRequestFields"]["thinking"]
    assert thinking["type"] == "enabled" and 1024 <= thinking["budget_tokens"] < 4096
    assert seen.json()["inferenceConfig"]["maxTokens"] == 4096


def test_the_mock_refuses_a_conversation_bedrock_refuses(stack: StackFactory, sdks: Sdks) -> None:
    import anthropic

    st = _start(stack, {"converse": _converse({"text": TEXT})})
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdks.anthropic(st).messages.create(
            model=MODELS["anthropic"],
            max_tokens=64,
            messages=[{"role": "assistant", "content": "I start."}],
        )
    assert START_WITH_USER in str(caught.value)
    (seen,) = _calls(st, "converse")
    assert seen.status == 400


@pytest.mark.parametrize("fmt", FORMATS)
def test_exception_frame_before_content_fails_over_to_first_party(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    failing = {"stream_error_after": 0, "error": {"status": 429, "message": "Too many requests"}}
    st = _start(stack, {"converse": _converse(failing), "direct": _direct({"text": TEXT})})
    assert ask(sdks, st, fmt, stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    tried = attempts(row)
    assert [a["provider"] for a in tried] == ["converse", "direct"]
    assert tried[0]["error"] == "rate_limited"


@pytest.mark.parametrize("fmt", ["anthropic", "openai-responses", "gemini"])
def test_first_party_failure_fails_over_to_converse(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    st = _start(
        stack,
        {"direct": _direct({"error": {}}), "converse": _converse({"text": TEXT})},
        "direct",
        "converse",
    )
    for stream in (True, False):
        assert ask(sdks, st, fmt, stream=stream).text == TEXT
    assert len(_calls(st, "converse")) == 2


def test_http_throttling_fails_over(stack: StackFactory, sdks: Sdks) -> None:
    st = _start(
        stack,
        {"converse": _converse({"error": {"status": 429}}), "direct": _direct({"text": TEXT})},
    )
    assert ask(sdks, st, "openai-chat", stream=False).text == TEXT
    (row,) = st.wait_rows(1)
    assert attempts(row)[0]["error"] == "rate_limited"


@pytest.mark.parametrize("fmt", FORMATS)
def test_exception_frame_after_content_ends_the_clients_stream(
    stack: StackFactory, sdks: Sdks, fmt: str
) -> None:
    script = {"text": TEXT, "chunks": 4, "stream_error_after": 2, "error": {"status": 429}}
    st = _start(stack, {"converse": _converse(script)})
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


@pytest.mark.parametrize("fmt", ["anthropic", "openai-chat"])
def test_cut_stream_is_an_error_for_the_client(stack: StackFactory, sdks: Sdks, fmt: str) -> None:
    st = _start(stack, {"converse": _converse({"text": TEXT, "chunks": 4, "break_after": 2})})
    with pytest.raises(ERRORS[fmt]):
        ask(sdks, st, fmt, stream=True)


def test_a_count_goes_to_count_tokens_as_converse_input(stack: StackFactory, sdks: Sdks) -> None:
    st = _start(stack, {"converse": _converse({"usage": {"input": 321}})})
    raw = sdks.anthropic(st).messages.with_raw_response.count_tokens(
        model=MODELS["anthropic"], system="Be brief.", messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.parse().input_tokens == 321
    assert raw.headers.get("x-thinkwatch-local") is None
    (seen,) = _calls(st, "converse")
    assert seen.path.endswith("/count-tokens")
    assert json.loads(seen.body)["input"]["converse"] == {
        "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
        "system": [{"text": "Be brief."}],
    }


def test_rows_price_the_converse_model_id(stack: StackFactory, sdks: Sdks) -> None:
    config = _config("converse")
    config["aliases"] = {MODELS["openai-chat"]: ["us.anthropic.claude-sonnet-4-5-20250929-v1:0"]}
    script = {"text": TEXT, "usage": {"input": 1000, "output": 100}}
    st = stack({"converse": _converse(script)}, config=config, env=ENV)
    assert ask(sdks, st, "openai-chat", stream=True).text == TEXT
    (row,) = st.wait_rows(1)
    assert (row["cost_micros"], row["cost_state"]) == (3000 + 1500, "known"), row
