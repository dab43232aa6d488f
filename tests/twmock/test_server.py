"""The mock's handler and server: counters, profiles and the request log with an in-memory
responder; then a real loopback socket (twserve.server.http1 + httpcore) and the official SDKs."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore
import pytest

from tests.twmock.test_formats import ANTHROPIC_BODY, CHAT_BODY, GEMINI_BODY, parse_sse
from twmock import (
    MockHandler,
    MockSettings,
    ScriptError,
    make_handler,
    parse_script,
    run_mock,
)
from twmock.server import MockServer
from twserve.server.base import Request

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeResponder:
    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.times: list[float] = []
        self.ended = False
        self.aborted = False
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        assert not self._started
        self._started = True
        self.status, self.headers = status, headers

    async def send(self, data: bytes) -> None:
        assert self._started and not self.ended
        self.chunks.append(data)
        self.times.append(time.monotonic())

    async def end(self) -> None:
        self.ended = True

    async def abort(self) -> None:
        self.aborted = True

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def request(
    path: str,
    body: dict[str, Any] | bytes = b"",
    *,
    method: str = "POST",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Request:
    path, _, query = path.partition("?")
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Request(
        method=method,
        target=(path + ("?" + query if query else "")).encode(),
        path=path,
        query=query,
        headers=headers or [(b"content-type", b"application/json")],
        body=data,
    )


async def call(handler: MockHandler, req: Request) -> FakeResponder:
    responder = FakeResponder()
    await handler(req, responder)
    return responder


# --------------------------------------------------------------------------------------------
# handler with an in-memory responder


async def test_fail_first_counts_requests_and_logs_them() -> None:
    handler = make_handler(MockSettings(script=parse_script({"fail_first": 2, "error": 529})))
    statuses = [
        (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status for _ in "abc"
    ]
    assert statuses == [529, 529, 200]
    assert handler.count() == 3
    log = list(handler.received)
    assert [r.number for r in log] == [1, 2, 3]
    assert [r.outcome for r in log] == ["error", "error", "answer"]
    assert log[-1].json()["model"] == "claude-test-1"
    assert log[-1].header("Content-Type") == "application/json"
    handler.reset()
    assert handler.count() == 0 and not handler.received
    assert (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status == 529


async def test_fail_every_and_uncounted_requests() -> None:
    handler = make_handler(MockSettings(script=parse_script({"fail_every": 2, "error": 500})))
    statuses = []
    for _ in range(4):
        await call(handler, request("/v1/models", method="GET"))  # listings are not counted
        statuses.append((await call(handler, request("/chat/completions", CHAT_BODY))).status)
    assert statuses == [200, 500, 200, 500]
    assert handler.received[0].number == 0


async def test_fail_rate_is_seeded() -> None:
    def outcomes(seed: int) -> list[int | None]:
        settings = MockSettings(script=parse_script({"fail_rate": 0.5}), seed=seed)
        handler = make_handler(settings)
        return [handler.plan_for(request("/chat/completions", CHAT_BODY)).status for _ in range(40)]

    first = outcomes(3)
    assert first == outcomes(3)
    assert 5 < first.count(503) < 35
    assert first != outcomes(4)


async def test_profiles_have_their_own_script_and_counter() -> None:
    settings = MockSettings(profiles={"flaky": parse_script({"fail_first": 1, "error": 429})})
    handler = make_handler(settings)
    flaky = [
        (await call(handler, request("/flaky/v1/messages", ANTHROPIC_BODY))).status for _ in "ab"
    ]
    plain = (await call(handler, request("/v1/messages", ANTHROPIC_BODY))).status
    assert flaky == [429, 200] and plain == 200
    assert handler.count("flaky") == 2 and handler.count() == 1
    assert (
        handler.received[0].profile == "flaky" and handler.received[0].path == "/flaky/v1/messages"
    )


async def test_script_header_override_through_the_handler() -> None:
    handler = make_handler()
    headers = [(b"x-mock-script", b'{"text": "scripted", "chunk_size": 100}')]
    out = await call(handler, request("/v1/messages", ANTHROPIC_BODY, headers=headers))
    assert json.loads(out.body)["content"][0]["text"] == "scripted"
    off = make_handler(MockSettings(allow_script_header=False))
    out = await call(off, request("/v1/messages", ANTHROPIC_BODY, headers=headers))
    assert json.loads(out.body)["content"][0]["text"] != "scripted"


async def test_request_log_is_bounded() -> None:
    handler = make_handler(MockSettings(keep_received=3))
    for _ in range(5):
        await call(handler, request("/healthz", method="GET"))
    assert len(handler.received) == 3


async def test_unknown_shape_is_refused_up_front() -> None:
    with pytest.raises(ScriptError, match="unknown error shape"):
        make_handler(MockSettings(script=parse_script({"error": "nope"})))
    with pytest.raises(ScriptError, match="profile 'x'"):
        make_handler(MockSettings(profiles={"x": parse_script({"error": "nope"})}))


async def test_break_and_reset_abort() -> None:
    handler = make_handler(MockSettings(script=parse_script({"break_after": 1})))
    out = await call(handler, request("/v1/messages", {**ANTHROPIC_BODY, "stream": True}))
    assert out.status == 200 and out.aborted and not out.ended
    handler = make_handler(MockSettings(script=parse_script({"reset_before_head": True})))
    out = await call(handler, request("/v1/messages", ANTHROPIC_BODY))
    assert out.aborted and not out.started


async def test_silence_lasts_until_cancelled_or_the_limit() -> None:
    handler = make_handler(MockSettings(script=parse_script({"silence": True})))
    responder = FakeResponder()
    with anyio.move_on_after(0.1) as scope:
        await handler(request("/v1/messages", ANTHROPIC_BODY), responder)
    assert scope.cancelled_caught and responder.started and not responder.aborted
    limited = make_handler(
        MockSettings(script=parse_script({"silence": "before_head"}), silence_limit=0.05)
    )
    out = await call(limited, request("/v1/messages", ANTHROPIC_BODY))
    assert out.aborted and not out.started


async def test_delays_are_played() -> None:
    script = parse_script({"chunks": 3, "first_delay": 0.1, "chunk_delay": 0.05})
    handler = make_handler(MockSettings(script=script))
    start = time.monotonic()
    out = await call(handler, request("/chat/completions", {**CHAT_BODY, "stream": True}))
    assert out.ended
    content = [
        t - start
        for t, c in zip(out.times, out.chunks, strict=True)
        if b'"content":"' in c and b'"role"' not in c
    ]
    assert len(content) == 3
    assert content[0] >= 0.09 and content[2] - content[0] >= 0.09


# --------------------------------------------------------------------------------------------
# over a real loopback socket


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
