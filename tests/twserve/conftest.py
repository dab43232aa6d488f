"""Shared pieces of the end-to-end tests: a running gateway, raw HTTP, and the official SDKs.

* `stack` is a factory fixture: ``stack({"a": Upstream(...)}, config={...})`` starts the gateway
  and its mock upstreams (tests/twserve/support/stack.py) and stops them when the test ends.
* `http` sends one raw request (httpcore, no client-side retries or redirects) and returns a
  `Reply`; `mock_origin` is a mock's own address, for asking it directly what it would have
  sent.
* `sdks` makes official SDK clients pointed at the gateway, retries off, short timeouts. `ask`
  sends the same small request through any of the four SDKs, whole or streamed, and reduces the
  answer to an `Answer` (text, tool calls, usage), so one test body can check every format.
* `frozen_mock_clock` fixes the mocks' clock, so two mocks with the same seed answer the same
  request with the same bytes (the only other input of their answers is the clock: `created`).
"""

from __future__ import annotations

import itertools
import json
import types as pytypes
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpcore
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes

import twmock.serve.handler
from tests.twserve.support.stack import KEY, Stack, Upstream, running_stack
from twserve.server import base, http2
from twserve.server.websocket import WebSocketLimits

__all__ = [
    "ERRORS",
    "FORMATS",
    "KEY",
    "MODELS",
    "TIMEOUT",
    "Answer",
    "Reply",
    "Sdks",
    "StackFactory",
    "StreamReportedError",
    "ask",
    "attempts",
    "fallback",
    "http",
    "mock_origin",
]

TIMEOUT = 5.0  # every client call is bounded by this; nothing in these tests takes a second

FORMATS = ("anthropic", "openai-chat", "openai-responses", "gemini")

# Model names no SDK has an opinion on (the Anthropic SDK warns about deprecated ones).
MODELS = {
    "anthropic": "claude-e2e-1",
    "openai-chat": "gpt-e2e-1",
    "openai-responses": "gpt-e2e-1",
    "gemini": "gemini-e2e-1",
}


class StreamReportedError(Exception):
    """The SDK handed over an error event instead of raising (Responses ``response.failed``)."""


# What each SDK raises for an error answer (status errors and broken streams alike); `ask`
# raises StreamReportedError where the SDK reports a failed stream as an event.
ERRORS: dict[str, type[Exception] | tuple[type[Exception], ...]] = {
    "anthropic": anthropic.APIError,
    "openai-chat": openai.APIError,
    "openai-responses": (openai.APIError, StreamReportedError),
    "gemini": genai_errors.APIError,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- the running gateway --------------------------------------------------------------------

StackFactory = Callable[..., Stack]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackFactory]:
    """Start a gateway with mock upstreams; everything started is stopped after the test."""
    with ExitStack() as exits:
        numbers = itertools.count()

        def start(
            upstreams: Mapping[str, Upstream],
            *,
            config: Mapping[str, Any] | None = None,
            limits: base.ServerLimits | None = None,
            env: Mapping[str, str] | None = None,
            ws_limits: WebSocketLimits | None = None,
            h2_limits: http2.Http2Limits | None = None,
            uvloop: bool = False,
        ) -> Stack:
            data_dir = tmp_path / f"stack-{next(numbers)}"
            data_dir.mkdir()
            return exits.enter_context(
                running_stack(
                    data_dir,
                    upstreams,
                    config=config,
                    limits=limits,
                    env=env,
                    ws_limits=ws_limits,
                    h2_limits=h2_limits,
                    uvloop=uvloop,
                )
            )

        yield start


@pytest.fixture
def frozen_mock_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(twmock.serve.handler, "time", pytypes.SimpleNamespace(time=lambda: 1.8e9))


def fallback(*names: str, **failover: Any) -> dict[str, Any]:
    """Config routing every request to a fallback group of `names`, in that order.

    ``wait_secs`` defaults to 1 s: shorter than the first retry pause (2 s ± 20%), so a request
    whose last candidate failed temporarily ends at once instead of retrying.
    """
    return {
        "groups": [{"name": "pool", "type": "fallback", "providers": list(names)}],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
        "failover": {"wait_secs": 1, **failover},
    }


def attempts(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The attempts of a stored request row."""
    routing = json.loads(row["routing"])
    result: list[dict[str, Any]] = routing["attempts"]
    return result


def mock_origin(stack: Stack, name: str) -> str:
    """Where the mock upstream `name` listens (scheme, host and port)."""
    return f"http://127.0.0.1:{stack.mocks[name][1]}"


# --- raw HTTP ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        for k, v in self.headers:
            if k.lower() == key:
                return v.decode("latin-1")
        return None

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    url: str,
    method: str = "POST",
    *,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    timeout: float = TIMEOUT,
) -> Reply:
    """One request on a fresh connection, read to the end."""
    with httpcore.ConnectionPool(retries=0) as pool:
        resp = pool.request(
            method,
            url,
            headers=[(k.encode(), v.encode()) for k, v in headers],
            content=body,
            extensions={
                "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
            },
        )
    return Reply(status=resp.status, headers=tuple(resp.headers), body=resp.content)


# --- the official SDKs ------------------------------------------------------------------------


class Sdks:
    """Official SDK clients pointed at a gateway, retries off, every call bounded by `timeout`.

    Making an SDK client loads the CA bundle (~50 ms a client, a lot over a few hundred tests),
    so the Anthropic and OpenAI clients share one HTTP client for the session, and google-genai
    is one client for the session that is pointed at the gateway per request (`http_options`
    with the gateway's ``base_url``, the way a request overrides a client's options).
    """

    def __init__(self, http_client: httpx2.Client, gemini: genai.Client) -> None:
        self._http = http_client
        self._gemini = gemini

    def anthropic(
        self, stack: Stack, key: str = KEY, timeout: float = TIMEOUT
    ) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=stack.url,
            api_key=key,
            max_retries=0,
            timeout=timeout,
            http_client=self._http,
        )

    def openai(self, stack: Stack, key: str = KEY, timeout: float = TIMEOUT) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=stack.url + "/v1",
            api_key=key,
            max_retries=0,
            timeout=timeout,
            http_client=self._http,
        )

    def genai(
        self, stack: Stack, key: str = KEY, timeout: float = TIMEOUT
    ) -> tuple[genai.Client, gtypes.HttpOptions]:
        return self._gemini, gtypes.HttpOptions(
            base_url=stack.url,
            headers={"x-goog-api-key": key},
            timeout=int(timeout * 1000),
            retry_options=gtypes.HttpRetryOptions(attempts=1),
        )


@pytest.fixture(scope="session")
def _sdk_session() -> Iterator[tuple[httpx2.Client, genai.Client]]:
    with httpx2.Client() as http_client:
        gemini = genai.Client(
            api_key="set-per-request",
            http_options=gtypes.HttpOptions(
                base_url="http://127.0.0.1:9", retry_options=gtypes.HttpRetryOptions(attempts=1)
            ),
        )
        try:
            yield http_client, gemini
        finally:
            gemini.close()


@pytest.fixture
def sdks(_sdk_session: tuple[httpx2.Client, genai.Client]) -> Sdks:
    return Sdks(*_sdk_session)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a client relies on: the text, the tool calls, and usage as (uncached input, cache
    read, output) whatever the format reports."""

    text: str
    tool_calls: tuple[tuple[str, dict[str, Any]], ...]
    usage: tuple[int, int, int]


TOOLS = (
    ("get_weather", "The weather at a place."),
    ("get_time", "The local time at a place."),
)
_SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"],
}
PROMPT = "What is the weather in Paris?"


def ask(
    sdks: Sdks,
    stack: Stack,
    fmt: str,
    *,
    stream: bool,
    tools: bool = False,
    key: str = KEY,
    timeout: float = TIMEOUT,
) -> Answer:
    """Ask through the official SDK of `fmt`; an error answer raises that SDK's error type."""
    if fmt == "anthropic":
        return _ask_anthropic(sdks.anthropic(stack, key, timeout), stream=stream, tools=tools)
    if fmt == "openai-chat":
        return _ask_chat(sdks.openai(stack, key, timeout), stream=stream, tools=tools)
    if fmt == "openai-responses":
        return _ask_responses(sdks.openai(stack, key, timeout), stream=stream, tools=tools)
    assert fmt == "gemini"
    client, options = sdks.genai(stack, key, timeout)
    return _ask_gemini(client, options, stream=stream, tools=tools)


def _ask_anthropic(client: anthropic.Anthropic, *, stream: bool, tools: bool) -> Answer:
    kwargs: dict[str, Any] = {
        "model": MODELS["anthropic"],
        "max_tokens": 256,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if tools:
        kwargs["tools"] = [{"name": n, "description": d, "input_schema": _SCHEMA} for n, d in TOOLS]
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    text = "".join(b.text for b in message.content if b.type == "text")
    calls = tuple((b.name, dict(b.input)) for b in message.content if b.type == "tool_use")
    u = message.usage
    return Answer(text, calls, (u.input_tokens, u.cache_read_input_tokens or 0, u.output_tokens))


def _ask_chat(client: openai.OpenAI, *, stream: bool, tools: bool) -> Answer:
    kwargs: dict[str, Any] = {
        "model": MODELS["openai-chat"],
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if tools:
        kwargs["tools"] = [
            {"type": "function", "function": {"name": n, "description": d, "parameters": _SCHEMA}}
            for n, d in TOOLS
        ]
    if not stream:
        completion = client.chat.completions.create(**kwargs)
        msg = completion.choices[0].message
        calls = tuple(
            (c.function.name, json.loads(c.function.arguments))
            for c in msg.tool_calls or ()
            if c.type == "function"
        )
        assert completion.usage is not None
        return Answer(msg.content or "", calls, _openai_usage(completion.usage))
    text: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    usage = None
    with client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ) as chunks:
        for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    text.append(choice.delta.content)
                for call in choice.delta.tool_calls or ():
                    if call.function and call.function.name:
                        names[call.index] = call.function.name
                    if call.function and call.function.arguments:
                        args[call.index] = args.get(call.index, "") + call.function.arguments
    assert usage is not None, "no usage chunk"
    calls = tuple((names[i], json.loads(args.get(i, "{}"))) for i in sorted(names))
    return Answer("".join(text), calls, _openai_usage(usage))


def _openai_usage(u: Any) -> tuple[int, int, int]:
    if hasattr(u, "prompt_tokens"):  # Chat
        cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
        return (u.prompt_tokens - (cached or 0), cached or 0, u.completion_tokens)
    cached = u.input_tokens_details.cached_tokens if u.input_tokens_details else 0
    return (u.input_tokens - (cached or 0), cached or 0, u.output_tokens)


def _ask_responses(client: openai.OpenAI, *, stream: bool, tools: bool) -> Answer:
    kwargs: dict[str, Any] = {"model": MODELS["openai-responses"], "input": PROMPT}
    if tools:
        kwargs["tools"] = [
            {"type": "function", "name": n, "description": d, "parameters": _SCHEMA}
            for n, d in TOOLS
        ]
    if stream:
        with client.responses.stream(**kwargs) as events:
            for event in events:
                if event.type == "response.failed":
                    error = event.response.error
                    raise StreamReportedError(error.message if error else "response.failed")
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    calls = tuple(
        (item.name, json.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    )
    assert response.usage is not None
    return Answer(response.output_text, calls, _openai_usage(response.usage))


def _ask_gemini(
    client: genai.Client, options: gtypes.HttpOptions, *, stream: bool, tools: bool
) -> Answer:
    config = gtypes.GenerateContentConfig(
        http_options=options,
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    if tools:
        config.tools = [
            gtypes.Tool(
                function_declarations=[
                    gtypes.FunctionDeclaration(
                        name=n, description=d, parameters_json_schema=_SCHEMA
                    )
                    for n, d in TOOLS
                ]
            )
        ]
    model = MODELS["gemini"]
    if stream:
        responses = list(
            client.models.generate_content_stream(model=model, contents=PROMPT, config=config)
        )
    else:
        responses = [client.models.generate_content(model=model, contents=PROMPT, config=config)]
    text: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    usage = None
    for r in responses:
        if r.usage_metadata is not None:
            usage = r.usage_metadata
        for cand in r.candidates or ():
            for part in (cand.content.parts if cand.content else None) or ():
                if part.text and not part.thought:
                    text.append(part.text)
                if part.function_call is not None:
                    calls.append(
                        (part.function_call.name or "", dict(part.function_call.args or {}))
                    )
    assert usage is not None, "no usage metadata"
    prompt = usage.prompt_token_count or 0
    cached = usage.cached_content_token_count or 0
    output = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
    return Answer("".join(text), tuple(calls), (prompt - cached, cached, output))
