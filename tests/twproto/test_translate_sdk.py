"""The official SDKs accept converted output.

Each SDK is given a canned HTTP response through its own HTTP client (``httpx2.Client`` with a
``MockTransport`` — the installed anthropic, openai and google-genai all use httpx2) and its own
stream accumulator must parse what the translator wrote from every upstream format: Anthropic
``messages.stream(...).get_final_message()``, OpenAI ``chat.completions.stream(...)`` and
``responses.stream(...)``, genai ``generate_content_stream``; whole answers through the
non-streaming calls; and the in-stream error ending raises in each SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from tests.twproto.conftest import DIALECTS, run_translator
from tests.twproto.test_convert_matrix import (
    SCENARIOS,
    play,
    upstream_stream,
    upstream_whole,
)
from twproto import ir, json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.formats import new_stream_encoder
from twproto.stream import new_stream_translator
from twproto.translate import translate_response

MODEL = "client-model"
SDK_SCENARIOS = ["text", "tools", "reasoning", "usage"]


def _transport(body: bytes, content_type: str = "text/event-stream") -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def _stream_for(upstream: Dialect, client: Dialect, scenario: str) -> bytes:
    data = upstream_stream(SCENARIOS[scenario], upstream)
    out, translator = run_translator(
        lambda: new_stream_translator(upstream, client, client_model=MODEL, created=1), [data]
    )
    assert translator.finished
    return out


def _whole_for(upstream: Dialect, client: Dialect, scenario: str) -> bytes:
    body = upstream_whole(SCENARIOS[scenario], upstream)
    return translate_response(body, upstream, client, client_model=MODEL, created=1).body


def _expected_calls(scenario: str) -> list[tuple[str, Any]]:
    return [
        (p.name, json_loads(p.arguments))
        for p in SCENARIOS[scenario].parts
        if isinstance(p, ir.ToolCall)
    ]


def _expected_text(scenario: str) -> str:
    return "".join(p.text for p in SCENARIOS[scenario].parts if isinstance(p, ir.Text))


def _anthropic(body: bytes, content_type: str = "text/event-stream") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://gateway.test",
        http_client=_transport(body, content_type),
        max_retries=0,
    )


def _openai(body: bytes, content_type: str = "text/event-stream") -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k",
        base_url="http://gateway.test/v1",
        http_client=_transport(body, content_type),
        max_retries=0,
    )


def _genai(body: bytes, content_type: str = "text/event-stream") -> genai.Client:
    return genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(
            base_url="http://gateway.test", httpx_client=_transport(body, content_type)
        ),
    )


USER = [{"role": "user", "content": "hi"}]


# ----------------------------------------------------------------------------------------------
# Streams


@pytest.mark.parametrize("scenario", SDK_SCENARIOS)
@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_anthropic_sdk_accumulates(upstream: Dialect, scenario: str) -> None:
    body = _stream_for(upstream, Dialect.ANTHROPIC, scenario)
    with _anthropic(body).messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    # The same format is relayed unchanged (the watch path); otherwise the client's model name.
    assert message.model == ("upstream-model" if upstream is Dialect.ANTHROPIC else MODEL)
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text == _expected_text(scenario)
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == _expected_calls(scenario)
    usage = SCENARIOS[scenario].usage
    assert usage is not None
    assert message.usage.output_tokens == usage.output_tokens
    assert (
        message.usage.input_tokens
        + (message.usage.cache_read_input_tokens or 0)
        + (message.usage.cache_creation_input_tokens or 0)
        == usage.total_input_tokens
    )
    if scenario == "reasoning":
        thinking = [b for b in message.content if b.type == "thinking"]
        assert thinking and thinking[0].thinking.startswith("Let me think")
        # Chat has no slot for a seal; every other format carries it through.
        sealed = upstream is not Dialect.OPENAI_CHAT
        assert thinking[0].signature == ("c2lnbmF0dXJl" if sealed else "")
    if scenario == "usage":
        assert message.usage.cache_read_input_tokens == 40
    assert message.stop_reason == ("tool_use" if scenario == "tools" else "end_turn")


@pytest.mark.parametrize("scenario", SDK_SCENARIOS)
@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_openai_chat_sdk_accumulates(upstream: Dialect, scenario: str) -> None:
    body = _stream_for(upstream, Dialect.OPENAI_CHAT, scenario)
    with _openai(body).chat.completions.stream(model=MODEL, messages=USER) as stream:  # type: ignore[arg-type]
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert completion.model == ("upstream-model" if upstream is Dialect.OPENAI_CHAT else MODEL)
    assert (choice.message.content or "") == _expected_text(scenario)
    calls = [
        (c.function.name, json_loads(c.function.arguments))
        for c in choice.message.tool_calls or []
        if c.type == "function"
    ]
    assert calls == _expected_calls(scenario)
    assert choice.finish_reason == ("tool_calls" if scenario == "tools" else "stop")
    usage = SCENARIOS[scenario].usage
    assert usage is not None and completion.usage is not None
    assert completion.usage.prompt_tokens == usage.total_input_tokens
    assert completion.usage.completion_tokens == usage.output_tokens
    if scenario == "usage":
        assert completion.usage.prompt_tokens_details is not None
        assert completion.usage.prompt_tokens_details.cached_tokens == 40


@pytest.mark.parametrize("scenario", SDK_SCENARIOS)
@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_openai_responses_sdk_accumulates(upstream: Dialect, scenario: str) -> None:
    body = _stream_for(upstream, Dialect.OPENAI_RESPONSES, scenario)
    with _openai(body).responses.stream(model=MODEL, input="hi") as stream:
        response = stream.get_final_response()
    assert response.model == ("upstream-model" if upstream is Dialect.OPENAI_RESPONSES else MODEL)
    assert response.output_text == _expected_text(scenario)
    calls = [
        (item.name, json_loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]
    assert calls == _expected_calls(scenario)
    usage = SCENARIOS[scenario].usage
    assert usage is not None and response.usage is not None
    assert response.usage.input_tokens == usage.total_input_tokens
    assert response.usage.output_tokens == usage.output_tokens
    if scenario == "reasoning":
        reasoning = [item for item in response.output if item.type == "reasoning"]
        sealed = upstream is not Dialect.OPENAI_CHAT
        assert reasoning and reasoning[0].encrypted_content == ("c2lnbmF0dXJl" if sealed else None)
        assert reasoning[0].summary[0].text.startswith("Let me think")
    if scenario == "usage":
        assert response.usage.input_tokens_details.cached_tokens == 40


@pytest.mark.parametrize("scenario", SDK_SCENARIOS)
@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_genai_sdk_stream(upstream: Dialect, scenario: str) -> None:
    body = _stream_for(upstream, Dialect.GEMINI, scenario)
    chunks = list(_genai(body).models.generate_content_stream(model=MODEL, contents="hi"))
    parts = [
        part
        for chunk in chunks
        for candidate in chunk.candidates or []
        if candidate.content is not None
        for part in candidate.content.parts or []
    ]
    text = "".join(p.text or "" for p in parts if not p.thought)
    assert text == _expected_text(scenario)
    calls = [(p.function_call.name, p.function_call.args) for p in parts if p.function_call]
    assert calls == _expected_calls(scenario)
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == genai_types.FinishReason.STOP
    usage = SCENARIOS[scenario].usage
    assert usage is not None and last.usage_metadata is not None
    assert last.usage_metadata.prompt_token_count == usage.total_input_tokens
    if scenario == "reasoning":
        thoughts = "".join(p.text or "" for p in parts if p.thought)
        assert thoughts.startswith("Let me think")
        sealed = upstream is not Dialect.OPENAI_CHAT
        assert any(p.thought_signature == b"signature" for p in parts) == sealed
    if scenario == "usage":
        assert last.usage_metadata.cached_content_token_count == 40


# ----------------------------------------------------------------------------------------------
# Whole answers


@pytest.mark.parametrize("scenario", ["tools", "reasoning"])
@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_sdks_parse_whole_answers(upstream: Dialect, scenario: str) -> None:
    json_type = "application/json"
    message = _anthropic(
        _whole_for(upstream, Dialect.ANTHROPIC, scenario), json_type
    ).messages.create(
        model=MODEL,
        max_tokens=10,
        messages=USER,  # type: ignore[arg-type]
    )
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == _expected_calls(
        scenario
    )
    completion = _openai(
        _whole_for(upstream, Dialect.OPENAI_CHAT, scenario), json_type
    ).chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
    assert (completion.choices[0].message.content or "") == _expected_text(scenario)
    response = _openai(
        _whole_for(upstream, Dialect.OPENAI_RESPONSES, scenario), json_type
    ).responses.create(model=MODEL, input="hi")
    assert response.output_text == _expected_text(scenario)
    result = _genai(
        _whole_for(upstream, Dialect.GEMINI, scenario), json_type
    ).models.generate_content(model=MODEL, contents="hi")
    calls = [(c.name, c.args) for c in result.function_calls or []]
    assert calls == _expected_calls(scenario)


# ----------------------------------------------------------------------------------------------
# In-stream errors


def _failed_stream(client: Dialect) -> bytes:
    """Some content, then the gateway ends the stream with an error (after content)."""
    encoder = new_stream_encoder(client, model=MODEL, created=1)
    encoder.message_start("up", "up-model", 1, None)
    encoder.part_start(0, ir.PartKind.TEXT, None)
    encoder.text(0, "partial")
    err = GatewayError(
        status=502, category=ErrorCategory.UPSTREAM, code="gw.test", message="upstream broke"
    )
    return encoder.take() + encoder.fail(err)


def test_anthropic_sdk_raises_on_error_event() -> None:
    client = _anthropic(_failed_stream(Dialect.ANTHROPIC))
    with (
        pytest.raises(anthropic.APIStatusError, match="upstream broke"),
        client.messages.stream(model=MODEL, max_tokens=10, messages=USER) as stream,  # type: ignore[arg-type]
    ):
        stream.get_final_message()


def test_openai_chat_sdk_raises_on_error_chunk() -> None:
    client = _openai(_failed_stream(Dialect.OPENAI_CHAT))
    with (
        pytest.raises(openai.APIError, match="upstream broke"),
        client.chat.completions.stream(model=MODEL, messages=USER) as stream,  # type: ignore[arg-type]
    ):
        stream.get_final_completion()


def test_openai_responses_sdk_sees_response_failed() -> None:
    client = _openai(_failed_stream(Dialect.OPENAI_RESPONSES))
    events = []
    with client.responses.stream(model=MODEL, input="hi") as stream:
        for event in stream:
            events.append(event)
    assert events[-1].type == "response.failed"
    failed: Any = events[-1]
    assert failed.response.error.message == "upstream broke"


def test_genai_sdk_raises_on_error_object() -> None:
    client = _genai(_failed_stream(Dialect.GEMINI))
    with pytest.raises(genai_errors.APIError, match="upstream broke"):
        list(client.models.generate_content_stream(model=MODEL, contents="hi"))


def _upstream_error_then(client: Dialect, upstream: Dialect) -> Callable[[], bytes]:
    def make() -> bytes:
        encoder = new_stream_encoder(upstream, model="up")
        play(
            ir.Answer(
                id="u",
                model="up",
                parts=(ir.Text(text="so far"),),
                stop_reason=ir.StopReason.END_TURN,
            ),
            _Truncated(encoder),
        )
        err = GatewayError(
            status=529,
            category=ErrorCategory.UPSTREAM,
            code="gw.test",
            message="Overloaded",
        )
        data = encoder.take() + encoder.fail(err)
        out, translator = run_translator(
            lambda: new_stream_translator(upstream, client, client_model=MODEL), [data]
        )
        assert translator.error is not None and not translator.finished
        return out

    return make


class _Truncated:
    """Passes everything but the ending through (the upstream fails before finishing)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("finish", "end", "usage"):
            return lambda *a: None
        return getattr(self._inner, name)


@pytest.mark.parametrize("upstream", DIALECTS, ids=str)
def test_upstream_in_stream_error_reaches_each_sdk(upstream: Dialect) -> None:
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        _anthropic(_upstream_error_then(Dialect.ANTHROPIC, upstream)()).messages.stream(
            model=MODEL,
            max_tokens=10,
            messages=USER,  # type: ignore[arg-type]
        ) as stream,
    ):
        stream.get_final_message()
    with (
        pytest.raises(openai.APIError, match="Overloaded"),
        _openai(_upstream_error_then(Dialect.OPENAI_CHAT, upstream)()).chat.completions.stream(
            model=MODEL,
            messages=USER,  # type: ignore[arg-type]
        ) as chat,
    ):
        chat.get_final_completion()
    with _openai(_upstream_error_then(Dialect.OPENAI_RESPONSES, upstream)()).responses.stream(
        model=MODEL, input="hi"
    ) as responses:
        kinds = [event.type for event in responses]
    assert kinds[-1] == "response.failed"
    with pytest.raises(genai_errors.APIError, match="Overloaded"):
        list(
            _genai(_upstream_error_then(Dialect.GEMINI, upstream)()).models.generate_content_stream(
                model=MODEL, contents="hi"
            )
        )
