"""The converters survive malformed input: recorded events and bodies with values swapped for
arbitrary JSON either convert or raise the one typed error (`TranslationError` for bodies); a
stream never raises, it drops what it cannot read and says so."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.twproto.conftest import DIALECTS, FIXTURES, fixture, fixture_dialect
from twproto import json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.errors import ErrorCategory, GatewayError
from twproto.stream import new_stream_translator
from twproto.translate import (
    TranslationError,
    translate_request,
    translate_response,
)

ERR = GatewayError(status=502, category=ErrorCategory.UPSTREAM, code="gw.test", message="bad")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for n, sub in enumerate(value):
            out += _paths(sub, (*prefix, n))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


def _sse_events(name: str) -> list[tuple[str, Any]]:
    raw = fixture(f"streams/{name}").replace(b"\r\n", b"\n").decode()
    events = []
    for block in raw.split("\n\n"):
        name_line = ""
        data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name_line = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None and data != "[DONE]":
            events.append((name_line, json_loads(data)))
    return events


SSE_STREAMS = [
    *sorted(
        p.name
        for p in (FIXTURES / "streams").iterdir()
        if p.suffix == ".sse" and "gemini" not in p.name
    ),
    "gemini-sse-text.sse",
    "gemini-sse-functioncall-thoughtsignature.sse",
]


@pytest.mark.parametrize("name", SSE_STREAMS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streams_survive_mutated_events(name: str, data: st.DataObject) -> None:
    events = _sse_events(name)
    which = data.draw(st.integers(0, len(events) - 1))
    event_name, obj = events[which]
    path = data.draw(st.sampled_from(_paths(obj)))
    events[which] = (event_name, _replace(obj, path, data.draw(JSON)))
    body = b"".join(
        (f"event: {n}\n" if n else "").encode() + b"data: " + json_dumps(o) + b"\n\n"
        for n, o in events
    )
    upstream = fixture_dialect(name)
    for client in DIALECTS:
        for client_stream in (True, False):
            translator = new_stream_translator(
                upstream, client, client_model="m", client_stream=client_stream
            )
            translator.feed(body)
            translator.end()
            if not translator.finished:
                ending = translator.fail(ERR)
                # Nothing more when the upstream's own error already ended the stream.
                assert ending or translator.error is not None


WHOLE = sorted(p.name for p in (FIXTURES / "whole").iterdir())


@pytest.mark.parametrize("name", WHOLE)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_answers_survive_mutation(name: str, data: st.DataObject) -> None:
    obj = json_loads(fixture(f"whole/{name}"))
    path = data.draw(st.sampled_from(_paths(obj)))
    body = json_dumps(_replace(obj, path, data.draw(JSON)))
    upstream = fixture_dialect(name)
    for client in DIALECTS:
        try:
            translate_response(body, upstream, client, client_model="m")
        except TranslationError as exc:
            assert exc.error_status_hint == 502


REQUESTS: dict[Dialect, dict[str, Any]] = {
    Dialect.ANTHROPIC: {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
            },
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
        "thinking": {"type": "enabled", "budget_tokens": 2000},
    },
    Dialect.OPENAI_CHAT: {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
                ],
            },
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "x"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {}}},
    },
    Dialect.OPENAI_RESPONSES: {
        "model": "m",
        "instructions": "s",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
            {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "e"},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {
                "type": "namespace",
                "name": "n",
                "description": "d",
                "tools": [{"type": "custom", "name": "g"}],
            },
        ],
        "reasoning": {"effort": "high"},
    },
    Dialect.GEMINI: {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "hi"},
                    {"inlineData": {"mimeType": "image/png", "data": "AA=="}},
                ],
            },
            {
                "role": "model",
                "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "AA=="}],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "f", "response": {"output": "x"}}}],
            },
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]}],
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 100}},
    },
}


@pytest.mark.parametrize("source", DIALECTS, ids=str)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_requests_survive_mutation(source: Dialect, data: st.DataObject) -> None:
    obj = REQUESTS[source]
    path = data.draw(st.sampled_from(_paths(obj)))
    body = json_dumps(_replace(obj, path, data.draw(JSON)))
    for target in DIALECTS:
        try:
            translate_request(body, source, target, model="m")
        except TranslationError as exc:
            assert exc.error_status_hint == 400
