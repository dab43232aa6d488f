"""The mock's server (twmock/serve/server.py) on a real loopback socket (twserve.server.http1 +
httpcore), read by the official SDKs too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore
import pytest

from tests.twmock.formats.test_formats import ANTHROPIC_BODY, CHAT_BODY, GEMINI_BODY, parse_sse
from twmock import MockSettings, parse_script, run_mock
from twmock.serve.server import MockServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def mock() -> AsyncIterator[MockServer]:
    async with run_mock(MockSettings(seed=1)) as server:
        yield server


async def post(
    server: MockServer,
    path: str,
    body: dict[str, Any],
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    timeout: float = 5.0,
) -> tuple[int, dict[str, str], bytes]:
    async with httpcore.AsyncConnectionPool() as pool:
        response = await pool.request(
            "POST",
            server.url + path,
            headers=[(b"content-type", b"application/json"), *(headers or [])],
            content=json.dumps(body).encode(),
            extensions={"timeout": {"read": timeout}},
        )
        head = {k.decode().lower(): v.decode() for k, v in response.headers}
        return response.status, head, response.content


async def test_loopback_stream_and_whole(mock: MockServer) -> None:
    status, head, body = await post(mock, "/v1/messages", {**ANTHROPIC_BODY, "stream": True})
    assert status == 200 and head["content-type"] == "text/event-stream; charset=utf-8"
    assert [n for n, _ in parse_sse(body)][-1] == "message_stop"
    status, head, body = await post(mock, "/v1/chat/completions", CHAT_BODY)
    assert status == 200 and json.loads(body)["object"] == "chat.completion"
    path = "/v1beta/models/gemini-test:streamGenerateContent"
    status, _, body = await post(mock, path + "?alt=sse", GEMINI_BODY)
    assert body.endswith(b"\r\n\r\n")
    status, _, body = await post(mock, path, GEMINI_BODY)
    assert body.startswith(b"[{") and body.endswith(b"\n]") and json.loads(body)
    assert [r.path for r in mock.received][-1] == path
    assert mock.received[-1].json() == GEMINI_BODY


async def test_loopback_errors_and_counters() -> None:
    settings = MockSettings(
        script=parse_script({"fail_first": 1, "error": {"status": 429, "retry_after": 3}})
    )
    async with run_mock(settings) as server:
        status, head, body = await post(server, "/v1/messages", ANTHROPIC_BODY)
        assert status == 429 and head["retry-after"] == "3"
        assert json.loads(body)["error"]["type"] == "rate_limit_error"
        status, _, _ = await post(server, "/v1/messages", ANTHROPIC_BODY)
        assert status == 200
        assert server.handler.count() == 2


async def test_loopback_break_and_reset(mock: MockServer) -> None:
    script = [(b"x-mock-script", b'{"break_after": 2}')]
    with pytest.raises(httpcore.RemoteProtocolError):
        await post(mock, "/v1/messages", {**ANTHROPIC_BODY, "stream": True}, headers=script)
    script = [(b"x-mock-script", b'{"reset_before_head": true}')]
    with pytest.raises(httpcore.RemoteProtocolError):
        await post(mock, "/v1/messages", ANTHROPIC_BODY, headers=script)
    assert [r.outcome for r in mock.received] == ["break", "reset"]


async def test_loopback_silence_times_out(mock: MockServer) -> None:
    script = [(b"x-mock-script", b'{"stall_after": 1}')]
    with pytest.raises(httpcore.ReadTimeout):
        await post(
            mock, "/chat/completions", {**CHAT_BODY, "stream": True}, headers=script, timeout=0.3
        )


async def test_loopback_many_chunks(mock: MockServer) -> None:
    script = [(b"x-mock-script", b'{"chunks": 3000}')]
    status, _, body = await post(
        mock, "/responses", {"model": "m", "input": "x", "stream": True}, headers=script
    )
    events = parse_sse(body)
    assert status == 200 and sum(1 for n, _ in events if n == "response.output_text.delta") == 3000


# --------------------------------------------------------------------------------------------
# the official SDKs read the mock's answers


def sdk_settings(**fields: Any) -> MockSettings:
    return MockSettings(script=parse_script(fields), seed=5)


async def test_anthropic_sdk() -> None:
    anthropic = pytest.importorskip("anthropic")
    script = {
        "reasoning": "hm",
        "text": "Hello SDK",
        "tool_calls": 2,
        "usage": {"input": 60, "cache_read": 40},
    }
    async with (
        run_mock(sdk_settings(**script)) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        async with client.messages.stream(
            model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            message = await stream.get_final_message()
        assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
        assert message.content[0].signature
        assert message.content[1].text == "Hello SDK"
        assert message.content[3].input["call"] == 1
        assert message.stop_reason == "tool_use"
        assert message.usage.input_tokens == 60 and message.usage.cache_read_input_tokens == 40
        whole = await client.messages.create(
            model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
        assert whole.content[1].text == "Hello SDK"
        count = await client.messages.count_tokens(
            model="claude-x", messages=[{"role": "user", "content": "hi"}]
        )
        assert count.input_tokens == 60
        headers = {"x-mock-script": json.dumps({"error": {"status": 429, "retry_after": 1}})}
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.create(
                model="claude-x",
                max_tokens=5,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            )
        headers = {"x-mock-script": json.dumps({"stream_error_after": 2, "error": 529})}
        with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
            async with client.messages.stream(
                model="claude-x",
                max_tokens=5,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            ) as stream:
                await stream.get_final_message()


async def test_openai_sdk_chat_and_responses() -> None:
    openai = pytest.importorskip("openai")
    script = {"text": "Hello SDK", "reasoning": "r", "usage": {"input": 60, "cache_read": 40}}
    async with (
        run_mock(sdk_settings(**script)) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client,
    ):
        stream = await client.chat.completions.create(
            model="gpt-x",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Hello SDK"
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens == 100
        assert usage.prompt_tokens_details.cached_tokens == 40
        whole = await client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}]
        )
        assert whole.choices[0].message.content == "Hello SDK"

        events = [
            e
            async for e in await client.responses.create(
                model="gpt-5",
                input="hi",
                stream=True,
                include=["reasoning.encrypted_content"],
            )
        ]
        assert events[-1].type == "response.completed"
        final = events[-1].response
        assert final.output_text == "Hello SDK"
        assert final.output[0].type == "reasoning" and final.output[0].encrypted_content
        assert final.usage.input_tokens_details.cached_tokens == 40
        whole_response = await client.responses.create(model="gpt-5", input="hi")
        assert whole_response.output_text == "Hello SDK"

        headers = {"x-mock-script": json.dumps({"tool_calls": 2})}
        tool_stream = await client.chat.completions.create(
            model="gpt-x",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers=headers,
        )
        calls: dict[int, str] = {}
        async for chunk in tool_stream:
            for call in chunk.choices[0].delta.tool_calls or ():
                calls[call.index] = calls.get(call.index, "") + (call.function.arguments or "")
        assert [json.loads(v)["call"] for _, v in sorted(calls.items())] == [0, 1]

        headers = {"x-mock-script": json.dumps({"error": "openai-insufficient-quota"})}
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(
                model="gpt-x",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            )
        assert caught.value.code == "insufficient_quota"


async def test_google_genai_sdk() -> None:
    genai = pytest.importorskip("google.genai")
    from google.genai import errors, types

    script = {"reasoning": "hm", "text": "Hello SDK", "usage": {"input": 10, "cache_read": 5}}
    async with run_mock(sdk_settings(**script)) as server:
        client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.url))
        async with client.aio as aio:
            response = await aio.models.generate_content(model="gemini-test", contents="hi")
            parts = response.candidates[0].content.parts
            assert parts[0].thought is True and parts[1].text == "Hello SDK"
            assert parts[1].thought_signature
            assert response.usage_metadata.cached_content_token_count == 5
            stream = await aio.models.generate_content_stream(model="gemini-test", contents="hi")
            chunks = [chunk async for chunk in stream]
            assert "".join(c.text or "" for c in chunks) == "Hello SDK"
            assert chunks[-1].usage_metadata.prompt_token_count == 15
            counted = await aio.models.count_tokens(model="gemini-test", contents="hi")
            assert counted.total_tokens == 10
            config = types.GenerateContentConfig(
                http_options=types.HttpOptions(headers={"x-mock-script": '{"error": 503}'})
            )
            with pytest.raises(errors.ServerError):
                await aio.models.generate_content(model="gemini-test", contents="hi", config=config)
        assert server.received[0].path.endswith("gemini-test:generateContent")


async def test_loopback_concurrent_streams() -> None:
    settings = MockSettings(script=parse_script({"chunks": 50, "chunk_delay": 0.001}))
    async with run_mock(settings) as server:
        results: list[int] = []

        async def one(i: int) -> None:
            path = ("/v1/messages", "/chat/completions", "/responses")[i % 3]
            body = (ANTHROPIC_BODY, CHAT_BODY, {"model": "m", "input": "x"})[i % 3]
            status, _, data = await post(server, path, {**body, "stream": True})
            assert status == 200
            results.append(len(parse_sse(data)))

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
        assert len(results) == 24 and min(results) >= 50
        assert server.handler.count() == 24
