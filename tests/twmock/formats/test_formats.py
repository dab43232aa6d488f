"""The mock writes what the real APIs write: compared with the recorded fixtures.

For every format, whole and streamed answers are planned directly (no event loop) and compared
with tests/data/fixtures: the same event names in the same order (runs of repeated events
collapsed), the same field names in the same order where the fixture is a verbatim capture, the
same JSON style byte for byte (compact, indented, Google's SSE spacing, CRLF), and the text,
tool calls, reasoning and usage the script asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twmock import Plan, RequestInfo, Script, parse_script, plan

FIXTURES = Path(__file__).parents[2] / "data" / "fixtures"

# --------------------------------------------------------------------------------------------
# helpers (also used by the other mock tests)


def parse_sse(data: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE event; accepts LF and CRLF line ends."""
    text = data.decode().replace("\r\n", "\n")
    events: list[tuple[str | None, str]] = []
    for block in text.split("\n\n"):
        name: str | None = None
        lines: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                lines.append(line[5:].removeprefix(" "))
        if lines:
            events.append((name, "\n".join(lines)))
    return events


def sse_json(data: bytes) -> list[tuple[str | None, Any]]:
    return [(name, None if d == "[DONE]" else json.loads(d)) for name, d in parse_sse(data)]


def collapse(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        if not out or out[-1] != name:
            out.append(name)
    return out


def keys(obj: Any) -> list[str]:
    assert isinstance(obj, dict), obj
    return list(obj)


def run(
    path: str,
    body: dict[str, Any] | bytes,
    script: Script | dict[str, Any] | None = None,
    *,
    query: str = "",
    headers: tuple[tuple[bytes, bytes], ...] = (),
    number: int = 1,
    draw: float = 1.0,
) -> Plan:
    if not isinstance(script, Script):
        script = parse_script(script or {})
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    info = RequestInfo(
        method="POST",
        path=path,
        query=query,
        headers=headers,
        body=data,
        number=number,
        draw=draw,
        seed=42,
        now=1_767_000_000,
    )
    return plan(info, script)


ANTHROPIC_BODY: dict[str, Any] = {
    "model": "claude-test-1",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hello"}],
}
CHAT_BODY: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES_BODY: dict[str, Any] = {"model": "gpt-5-test", "input": "hi"}
GEMINI_BODY: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GEMINI_STREAM = "/v1beta/models/gemini-test:streamGenerateContent"


def fixture_events(name: str) -> list[tuple[str | None, Any]]:
    return sse_json((FIXTURES / "streams" / name).read_bytes())


def first(events: list[tuple[str | None, Any]], name: str) -> Any:
    return next(data for n, data in events if n == name)


def anthropic_stream(script: dict[str, Any]) -> list[tuple[str | None, Any]]:
    p = run("/v1/messages", {**ANTHROPIC_BODY, "stream": True}, script)
    assert p.status == 200 and p.outcome == "stream"
    assert p.header(b"content-type") == b"text/event-stream; charset=utf-8"
    return sse_json(p.body)


# --------------------------------------------------------------------------------------------
# Anthropic


def test_anthropic_text_stream_matches_fixture() -> None:
    ours = anthropic_stream({"text": "Hello there, world", "usage": {"input": 135}})
    real = fixture_events("anthropic-text.sse")
    assert collapse([n for n, _ in ours if n]) == collapse([n for n, _ in real if n])
    for name in ("message_start", "content_block_start", "content_block_delta", "message_delta"):
        assert keys(first(ours, name)) == keys(first(real, name)), name
    start, real_start = first(ours, "message_start"), first(real, "message_start")
    assert keys(start["message"]) == keys(real_start["message"])
    assert keys(start["message"]["usage"]) == keys(real_start["message"]["usage"])
    assert start["message"]["model"] == "claude-test-1"
    assert start["message"]["id"].startswith("msg_01") and len(start["message"]["id"]) == 28
    delta = first(ours, "message_delta")
    assert keys(delta["usage"]) == keys(first(real, "message_delta")["usage"])
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    text = "".join(d["delta"]["text"] for n, d in ours if n == "content_block_delta")
    assert text == "Hello there, world"
    assert delta["usage"]["input_tokens"] == 135


def test_anthropic_ping_and_error_use_spaced_json() -> None:
    p = run("/v1/messages", {**ANTHROPIC_BODY, "stream": True}, {})
    assert b'event: ping\ndata: {"type": "ping"}\n\n' in p.body


def test_anthropic_thinking_stream_matches_fixture() -> None:
    ours = anthropic_stream({"reasoning": "Let me think.", "text": "Answer."})
    real = fixture_events("anthropic-thinking-signature-text.sse")
    assert collapse([n for n, _ in ours if n]) == collapse([n for n, _ in real if n])
    deltas = [d["delta"] for n, d in ours if n == "content_block_delta"]
    real_deltas = [d["delta"] for n, d in real if n == "content_block_delta"]
    assert [d["type"] for d in collapse_dicts(deltas)] == [
        d["type"] for d in collapse_dicts(real_deltas)
    ]
    thinking = "".join(d.get("thinking", "") for d in deltas)
    assert thinking == "Let me think."
    # The empty thinking delta right before the signature, as recorded.
    index = next(i for i, d in enumerate(deltas) if d["type"] == "signature_delta")
    assert deltas[index - 1] == {"type": "thinking_delta", "thinking": ""}
    assert len(deltas[index]["signature"]) > 100
    block = first(ours, "content_block_start")["content_block"]
    assert block == first(real, "content_block_start")["content_block"]


def collapse_dicts(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if not out or out[-1]["type"] != item["type"]:
            out.append(item)
    return out


def test_anthropic_parallel_tool_use_stream() -> None:
    ours = anthropic_stream({"tool_calls": 2, "tool_pieces": 3})
    real = fixture_events("anthropic-parallel-tool-use.sse")
    starts = [d for n, d in ours if n == "content_block_start"]
    real_starts = [d for n, d in real if n == "content_block_start"]
    assert [b["content_block"]["type"] for b in starts] == ["tool_use", "tool_use"]
    assert keys(starts[0]["content_block"]) == keys(real_starts[1]["content_block"])
    assert [b["index"] for b in starts] == [0, 1]
    for index in (0, 1):
        pieces = [
            d["delta"]["partial_json"]
            for n, d in ours
            if n == "content_block_delta" and d["index"] == index
        ]
        assert pieces[0] == ""  # opened with an empty delta, as recorded
        assert len(pieces) == 4
        assert json.loads("".join(pieces)) == {
            "location": "Paris, France",
            "unit": "celsius",
            "call": index,
        }
    assert first(ours, "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_anthropic_tool_names_come_from_the_request() -> None:
    body = {**ANTHROPIC_BODY, "stream": True, "tools": [{"name": "Read"}, {"name": "Write"}]}
    events = sse_json(run("/v1/messages", body, {"tool_calls": 3}).body)
    names = [d["content_block"]["name"] for n, d in events if n == "content_block_start"]
    assert names == ["Read", "Write", "Read"]


def test_anthropic_usage_and_cache() -> None:
    script = {"usage": {"input": 60, "output": 33, "cache_read": 40, "cache_write": 5}}
    events = anthropic_stream(script)
    usage = first(events, "message_start")["message"]["usage"]
    assert usage["input_tokens"] == 60
    assert usage["cache_read_input_tokens"] == 40
    assert usage["cache_creation_input_tokens"] == 5
    assert usage["cache_creation"] == {
        "ephemeral_5m_input_tokens": 5,
        "ephemeral_1h_input_tokens": 0,
    }
    assert usage["output_tokens"] == 1
    assert first(events, "message_delta")["usage"]["output_tokens"] == 33


def test_anthropic_whole_matches_fixture() -> None:
    p = run("/v1/messages", ANTHROPIC_BODY, {"text": "Hi!", "reasoning": "think"})
    assert p.status == 200 and p.outcome == "answer"
    assert p.header(b"content-type") == b"application/json"
    assert p.header(b"content-length") == str(len(p.body)).encode()
    assert p.body == orjson.dumps(orjson.loads(p.body))  # compact, like the API
    ours = json.loads(p.body)
    real = json.loads((FIXTURES / "whole" / "anthropic-text.json").read_bytes())
    assert keys(ours) == keys(real)
    # A thinking answer also counts its thinking, as newer models' answers do.
    assert [k for k in keys(ours["usage"]) if k != "output_tokens_details"] == keys(real["usage"])
    assert ours["usage"]["output_tokens_details"]["thinking_tokens"] > 0
    thinking = json.loads((FIXTURES / "whole" / "anthropic-thinking.json").read_bytes())
    assert [keys(b) for b in ours["content"]] == [keys(b) for b in thinking["content"]]
    assert ours["content"][0]["thinking"] == "think"
    assert ours["content"][1] == {"type": "text", "text": "Hi!"}
    assert ours["stop_reason"] == "end_turn"


def test_anthropic_whole_tool_use_and_length() -> None:
    ours = json.loads(run("/v1/messages", ANTHROPIC_BODY, {"tool_calls": 2}).body)
    real = json.loads((FIXTURES / "whole" / "anthropic-parallel-tool-use.json").read_bytes())
    assert sorted(keys(ours["content"][0])) == sorted(keys(real["content"][1]))
    assert [b["type"] for b in ours["content"]] == ["tool_use", "tool_use"]
    assert ours["content"][1]["input"]["call"] == 1
    assert ours["stop_reason"] == "tool_use"
    ours = json.loads(run("/v1/messages", ANTHROPIC_BODY, {"finish": "length"}).body)
    assert ours["stop_reason"] == "max_tokens"


# --------------------------------------------------------------------------------------------
# OpenAI Chat


def chat_stream(script: dict[str, Any], **body: Any) -> list[Any]:
    p = run("/chat/completions", {**CHAT_BODY, "stream": True, **body}, script)
    assert p.status == 200 and p.outcome == "stream"
    events = sse_json(p.body)
    assert all(name is None for name, _ in events)
    assert events[-1] == (None, None)  # data: [DONE]
    return [data for _, data in events[:-1]]


def test_chat_text_stream_with_usage_matches_fixture() -> None:
    chunks = chat_stream(
        {"text": "The answer", "usage": {"input": 60, "cache_read": 40, "output": 7}},
        stream_options={"include_usage": True},
    )
    real = [d for _, d in fixture_events("openai-chat-text-include-usage.sse") if d is not None]
    assert keys(chunks[0]) == keys(real[0])
    assert keys(chunks[0]["choices"][0]) == keys(real[0]["choices"][0])
    assert chunks[0]["choices"][0]["delta"] == real[0]["choices"][0]["delta"]
    assert keys(chunks[1]["choices"][0]["delta"]) == keys(real[1]["choices"][0]["delta"])
    # finish chunk, then the usage chunk with no choices
    assert chunks[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert chunks[-1]["choices"] == [] and keys(chunks[-1]) == keys(real[-1])
    usage, real_usage = chunks[-1]["usage"], real[-1]["usage"]
    assert keys(usage) == keys(real_usage)
    assert keys(usage["prompt_tokens_details"]) == keys(real_usage["prompt_tokens_details"])
    assert keys(usage["completion_tokens_details"]) == keys(real_usage["completion_tokens_details"])
    assert usage["prompt_tokens"] == 100 and usage["prompt_tokens_details"]["cached_tokens"] == 40
    assert usage["completion_tokens"] == 7 and usage["total_tokens"] == 107
    assert all(c["usage"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == "The answer"
    assert all(c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["id"].startswith("chatcmpl-") and chunks[0]["model"] == "gpt-test"


def test_chat_usage_only_when_asked() -> None:
    chunks = chat_stream({})
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_parallel_tool_calls_match_fixture() -> None:
    chunks = chat_stream({"tool_calls": 2})
    real = [d for _, d in fixture_events("openai-chat-parallel-tool-calls.sse") if d]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    real_deltas = [c["choices"][0]["delta"] for c in real if c["choices"]]
    opening = [d for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    real_opening = [d for d in real_deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    assert [keys(d["tool_calls"][0]) for d in opening] == [
        keys(d["tool_calls"][0]) for d in real_opening
    ]
    assert [d["tool_calls"][0]["index"] for d in opening] == [0, 1]
    assert all(d["tool_calls"][0]["id"].startswith("call_") for d in opening)
    for index in (0, 1):
        args = "".join(
            d["tool_calls"][0]["function"]["arguments"]
            for d in deltas
            if "tool_calls" in d and d["tool_calls"][0]["index"] == index
        )
        assert json.loads(args)["call"] == index
    piece = next(d for d in deltas if "tool_calls" in d and "id" not in d["tool_calls"][0])
    real_piece = next(
        d for d in real_deltas if "tool_calls" in d and "id" not in d["tool_calls"][0]
    )
    assert keys(piece["tool_calls"][0]) == keys(real_piece["tool_calls"][0])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_reasoning_content_like_deepseek() -> None:
    chunks = chat_stream({"reasoning": "Hmm", "text": "Hi", "chunk_size": 1})
    real = [d for _, d in fixture_events("openai-chat-reasoning-content-deepseek.sse") if d]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    real_deltas = [c["choices"][0]["delta"] for c in real if c["choices"]]
    assert deltas[0] == real_deltas[0]
    assert keys(deltas[1]) == keys(real_deltas[1]) and deltas[1]["content"] is None
    content = next(d for d in deltas if d.get("content"))
    real_content = next(d for d in real_deltas if d.get("content"))
    assert keys(content) == keys(real_content) and content["reasoning_content"] is None
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Hmm"
    assert "".join(d.get("content") or "" for d in deltas) == "Hi"


def test_chat_whole_matches_fixture() -> None:
    p = run("/v1/chat/completions", CHAT_BODY, {"text": "Hello", "usage": {"output": 3}})
    assert p.status == 200
    real_bytes = (FIXTURES / "whole" / "openai-chat-text.json").read_bytes()
    # OpenAI indents by two spaces and ends with a newline; so does the mock.
    assert p.body == orjson.dumps(orjson.loads(p.body), option=orjson.OPT_INDENT_2) + b"\n"
    assert real_bytes.endswith(b"}\n")
    ours, real = json.loads(p.body), json.loads(real_bytes)
    assert keys(ours) == keys(real)
    assert keys(ours["choices"][0]) == keys(real["choices"][0])
    assert keys(ours["choices"][0]["message"]) == keys(real["choices"][0]["message"])
    assert keys(ours["usage"]) == keys(real["usage"])
    assert ours["choices"][0]["message"]["content"] == "Hello"
    assert ours["object"] == "chat.completion" and ours["model"] == "gpt-test"


def test_chat_whole_tools_and_reasoning() -> None:
    ours = json.loads(run("/chat/completions", CHAT_BODY, {"tool_calls": 2, "reasoning": "r"}).body)
    message = ours["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"] == "r"
    real = json.loads((FIXTURES / "whole" / "openai-chat-parallel-tool-calls.json").read_bytes())
    real_call = real["choices"][0]["message"]["tool_calls"][0]
    assert keys(message["tool_calls"][0]) == keys(real_call)
    assert ours["choices"][0]["finish_reason"] == "tool_calls"
    assert ours["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1


# --------------------------------------------------------------------------------------------
# OpenAI Responses


def responses_stream(script: dict[str, Any], **body: Any) -> list[tuple[str | None, Any]]:
    p = run("/v1/responses", {**RESPONSES_BODY, "stream": True, **body}, script)
    assert p.status == 200 and p.outcome == "stream"
    events = sse_json(p.body)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(name == d["type"] for name, d in events)
    return events


def test_responses_text_stream_matches_fixture() -> None:
    ours = responses_stream({"text": "Why did it", "usage": {"input": 11, "output": 18}})
    real = fixture_events("openai-responses-text.sse")
    assert collapse([n for n, _ in ours if n]) == collapse([n for n, _ in real if n])
    for (name, data), (_, real_data) in zip(
        collapse_events(ours), collapse_events(real), strict=True
    ):
        assert keys(data) == keys(real_data), name
    created, real_created = ours[0][1]["response"], real[0][1]["response"]
    assert keys(created) == keys(real_created)
    completed = ours[-1][1]["response"]
    assert keys(completed) == keys(real[-1][1]["response"])
    assert keys(completed["usage"]) == keys(real[-1][1]["response"]["usage"])
    assert completed["usage"]["input_tokens"] == 11 and completed["usage"]["total_tokens"] == 29
    assert completed["output"][0]["content"][0]["text"] == "Why did it"
    assert completed["id"] == created["id"] and created["id"].startswith("resp_")
    assert len(created["id"]) == len(real_created["id"])
    assert created["model"] == "gpt-5-test"
    deltas = [d for n, d in ours if n == "response.output_text.delta"]
    # The padding brings each delta and its obfuscation to 16 characters, as recorded.
    assert all(len(d["delta"]) + len(d["obfuscation"]) == 16 for d in deltas)


def collapse_events(
    events: list[tuple[str | None, Any]],
) -> list[tuple[str | None, Any]]:
    out: list[tuple[str | None, Any]] = []
    for name, data in events:
        if not out or out[-1][0] != name:
            out.append((name, data))
    return out


def test_responses_reasoning_with_encrypted_content_matches_fixture() -> None:
    ours = responses_stream(
        {"reasoning": "Preparing", "text": "Hello"}, include=["reasoning.encrypted_content"]
    )
    real = fixture_events("openai-responses-reasoning-summary-encrypted.sse")
    assert collapse([n for n, _ in ours if n]) == collapse([n for n, _ in real if n])
    for (name, data), (_, real_data) in zip(
        collapse_events(ours)[2:-1], collapse_events(real)[2:-1], strict=True
    ):
        assert keys(data) == keys(real_data), name
        if "item" in data:
            assert keys(data["item"]) == keys(real_data["item"]), name
    item = first(ours, "response.output_item.done")["item"]
    assert item["encrypted_content"].startswith("gAAAAAB")
    assert item["summary"] == [{"type": "summary_text", "text": "Preparing"}]
    assert ours[-1][1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_responses_encrypted_content_only_when_included() -> None:
    ours = responses_stream({"reasoning": "x"})
    assert "encrypted_content" not in first(ours, "response.output_item.added")["item"]


def test_responses_function_calls_match_fixture() -> None:
    ours = responses_stream({"tool_calls": 2}, stream_options={"include_obfuscation": False})
    real = fixture_events("openai-responses-function-call-args.sse")
    ours_names = [n for n, _ in ours]
    assert ours_names.count("response.function_call_arguments.done") == 2
    for name in (
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ):
        real_keys = set(keys(first(real, name))) - {"obfuscation"}
        assert set(keys(first(ours, name))) == real_keys, name
    added = [d["item"] for n, d in ours if n == "response.output_item.added"]
    real_added = [d["item"] for n, d in real if n == "response.output_item.added"]
    assert keys(added[0]) == keys(real_added[1])
    assert [a["type"] for a in added] == ["function_call", "function_call"]
    output = ours[-1][1]["response"]["output"]
    assert [json.loads(o["arguments"])["call"] for o in output] == [0, 1]
    assert all(o["call_id"].startswith("call_") and o["id"].startswith("fc_") for o in output)


def test_responses_echo_request_parameters() -> None:
    ours = responses_stream(
        {},
        instructions="be brief",
        store=False,
        prompt_cache_key="session-1",
        reasoning={"effort": "high"},
        tools=[{"type": "function", "name": "f", "parameters": {}}],
    )
    created = ours[0][1]["response"]
    assert created["instructions"] == "be brief"
    assert created["store"] is False
    assert created["prompt_cache_key"] == "session-1"
    assert created["reasoning"] == {"effort": "high", "summary": None}
    assert created["tools"][0]["name"] == "f"


def test_responses_length_is_incomplete() -> None:
    ours = responses_stream({"finish": "length"})
    assert ours[-1][0] == "response.incomplete"
    assert ours[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_whole_matches_fixture() -> None:
    p = run("/responses", RESPONSES_BODY, {"text": "Hi", "reasoning": "r"})
    ours = json.loads(p.body)
    assert p.body == orjson.dumps(ours, option=orjson.OPT_INDENT_2)
    real = json.loads((FIXTURES / "whole" / "openai-responses-text.json").read_bytes())
    # That capture predates completed_at and prompt_cache_retention; the streamed one has them.
    assert set(keys(real)) <= set(keys(ours))
    assert keys(ours) == keys(fixture_events("openai-responses-text.sse")[-1][1]["response"])
    real_reasoning = json.loads(
        (FIXTURES / "whole" / "openai-responses-reasoning-encrypted.json").read_bytes()
    )
    assert [o["type"] for o in ours["output"]] == ["reasoning", "message"]
    assert set(keys(ours["output"][0])) <= set(keys(real_reasoning["output"][0]))
    assert keys(ours["output"][1]) == keys(real["output"][0])
    assert ours["output"][1]["content"][0]["text"] == "Hi"
    assert ours["status"] == "completed"


# --------------------------------------------------------------------------------------------
# Gemini


def gemini_sse(script: dict[str, Any]) -> list[Any]:
    p = run(GEMINI_STREAM, GEMINI_BODY, script, query="alt=sse")
    assert p.status == 200 and p.header(b"content-type") == b"text/event-stream"
    # Google's framing and spacing, byte for byte.
    assert p.body.endswith(b"}\r\n\r\n")
    raw = p.body.split(b"\r\n\r\n")
    assert raw[-1] == b""
    out = []
    for event in raw[:-1]:
        assert event.startswith(b"data: ")
        obj = json.loads(event[6:])
        assert json.dumps(obj, separators=(",", ": "), ensure_ascii=False).encode() == event[6:]
        out.append(obj)
    return out


def gemini_array(script: dict[str, Any]) -> list[Any]:
    p = run(GEMINI_STREAM, GEMINI_BODY, script)
    assert p.header(b"content-type") == b"application/json; charset=UTF-8"
    objects = json.loads(p.body)
    # "[{", "\n,\r\n{" between objects, "\n]" at the end, objects indented by two spaces.
    rebuilt = (
        b"["
        + b"\n,\r\n".join(orjson.dumps(o, option=orjson.OPT_INDENT_2) for o in objects)
        + b"\n]"
    )
    assert p.body == rebuilt
    return list(objects)


def test_gemini_sse_thought_stream_matches_fixture() -> None:
    ours = gemini_sse({"reasoning": "Thinking", "text": "Hello you", "chunk_size": 4})
    real = [d for _, d in fixture_events("gemini-sse-thought-parts.sse")]
    assert keys(ours[0]) == keys(real[0])
    assert keys(ours[0]["candidates"][0]) == keys(real[0]["candidates"][0])
    assert keys(ours[0]["usageMetadata"]) == keys(real[0]["usageMetadata"])
    assert keys(ours[-1]["candidates"][0]) == keys(real[-1]["candidates"][0])
    assert keys(ours[-1]["usageMetadata"]) == keys(real[-1]["usageMetadata"])
    parts = [o["candidates"][0]["content"]["parts"][0] for o in ours]
    assert "".join(p["text"] for p in parts if p.get("thought")) == "Thinking"
    assert "".join(p["text"] for p in parts if not p.get("thought")) == "Hello you"
    first_text = next(p for p in parts if not p.get("thought"))
    assert "thoughtSignature" in first_text
    assert ours[-1]["candidates"][0]["finishReason"] == "STOP"
    assert all(o["modelVersion"] == "gemini-test" for o in ours)
    assert len({o["responseId"] for o in ours}) == 1


def test_gemini_sse_text_and_usage() -> None:
    script = {"text": "Paris", "usage": {"input": 10, "cache_read": 5, "output": 8}}
    ours = gemini_sse(script)
    usage = ours[-1]["usageMetadata"]
    assert usage["promptTokenCount"] == 15
    assert usage["cachedContentTokenCount"] == 5
    assert usage["candidatesTokenCount"] == 8
    assert usage["totalTokenCount"] == 23
    assert "thoughtsTokenCount" not in usage


def test_gemini_function_calls_match_fixture() -> None:
    ours = gemini_sse({"tool_calls": 2, "reasoning": "r"})
    real = [d for _, d in fixture_events("gemini-sse-functioncall-thoughtsignature.sse")]
    calls = [
        o["candidates"][0]["content"]["parts"][0]
        for o in ours
        if "functionCall" in o["candidates"][0]["content"]["parts"][0]
    ]
    real_call = real[0]["candidates"][0]["content"]["parts"][0]
    assert keys(calls[0]) == keys(real_call)
    assert keys(calls[0]["functionCall"]) == keys(real_call["functionCall"])
    assert "thoughtSignature" not in calls[1]
    assert [c["functionCall"]["args"]["call"] for c in calls] == [0, 1]
    last = ours[-1]["candidates"][0]
    assert last["finishReason"] == "STOP"
    assert last["finishMessage"] == "Model generated function call(s)."
    assert ours[-1]["usageMetadata"]["thoughtsTokenCount"] == 1


def test_gemini_json_array_matches_fixture() -> None:
    ours = gemini_array({"reasoning": "Considering", "text": "Scoop"})
    real_bytes = (FIXTURES / "streams" / "gemini-jsonarray-text-thought.json").read_bytes()
    real = json.loads(real_bytes)
    assert keys(ours[0]) == keys(real[0])
    assert ours[0]["candidates"][0]["content"]["parts"][0]["thought"] is True
    assert (
        "".join(
            o["candidates"][0]["content"]["parts"][0]["text"]
            for o in ours
            if not o["candidates"][0]["content"]["parts"][0].get("thought")
        )
        == "Scoop"
    )


def test_gemini_whole_matches_fixture() -> None:
    p = run(
        "/v1beta/models/gemini-test:generateContent",
        GEMINI_BODY,
        {"text": "Hello!", "reasoning": "hm"},
    )
    assert p.header(b"content-type") == b"application/json; charset=UTF-8"
    assert p.body == orjson.dumps(orjson.loads(p.body), option=orjson.OPT_INDENT_2) + b"\n"
    ours = json.loads(p.body)
    real = json.loads((FIXTURES / "whole" / "gemini-thought-parts.json").read_bytes())
    assert set(keys(ours)) == set(keys(real))
    assert set(keys(ours["candidates"][0])) == set(keys(real["candidates"][0]))
    assert set(keys(ours["usageMetadata"])) <= set(keys(real["usageMetadata"])) | {
        "candidatesTokenCount"
    }
    parts = ours["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": "hm", "thought": True}
    assert parts[1]["text"] == "Hello!" and "thoughtSignature" in parts[1]


def test_gemini_whole_function_call_matches_fixture() -> None:
    p = run("/v1beta/models/g:generateContent", GEMINI_BODY, {"tool_calls": 1})
    ours = json.loads(p.body)
    real = json.loads(
        (FIXTURES / "whole" / "gemini-functioncall-thoughtsignature.json").read_bytes()
    )
    assert keys(ours["candidates"][0]) == keys(real["candidates"][0])
    part, real_part = (
        ours["candidates"][0]["content"]["parts"][0],
        real["candidates"][0]["content"]["parts"][0],
    )
    assert keys(part) == keys(real_part)


def test_gemini_length_finish() -> None:
    ours = gemini_sse({"finish": "length"})
    assert ours[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"


# --------------------------------------------------------------------------------------------
# echo, counting, listing


@pytest.mark.parametrize(
    ("path", "body", "query"),
    [
        (
            "/v1/messages",
            {
                **ANTHROPIC_BODY,
                "system": "s",
                "tools": [{"name": "a"}, {"name": "b"}],
                "messages": [
                    {"role": "user", "content": "one"},
                    {"role": "assistant", "content": "two"},
                    {"role": "user", "content": [{"type": "text", "text": "three"}]},
                ],
            },
            "",
        ),
        (
            "/chat/completions",
            {
                "model": "claude-test-1",
                "max_tokens": 100,
                "tools": [
                    {"type": "function", "function": {"name": "a"}},
                    {"type": "function", "function": {"name": "b"}},
                ],
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "one"},
                    {"role": "user", "content": "three"},
                ],
            },
            "",
        ),
        (
            "/responses",
            {
                "model": "claude-test-1",
                "max_output_tokens": 100,
                "instructions": "s",
                "tools": [{"type": "function", "name": "a"}, {"type": "custom", "name": "b"}],
                "input": [
                    {"role": "user", "content": "one"},
                    {"type": "function_call_output", "call_id": "c", "output": "x"},
                    {"role": "user", "content": [{"type": "input_text", "text": "three"}]},
                ],
            },
            "",
        ),
        (
            "/v1beta/models/claude-test-1:generateContent",
            {
                "systemInstruction": {"parts": [{"text": "s"}]},
                "generationConfig": {"maxOutputTokens": 100},
                "tools": [{"functionDeclarations": [{"name": "a"}, {"name": "b"}]}],
                "contents": [
                    {"role": "user", "parts": [{"text": "one"}]},
                    {"role": "model", "parts": [{"text": "two"}]},
                    {"role": "user", "parts": [{"text": "three"}]},
                ],
            },
            "",
        ),
    ],
)
def test_echo_reports_the_request(path: str, body: dict[str, Any], query: str) -> None:
    p = run(path, body, {"echo": True, "chunk_size": 1000})
    text = json.dumps(json.loads(p.body), ensure_ascii=False)
    expected = (
        "[echo] model=claude-test-1 stream=false messages=3 tools=2 names=a,b "
        "system=true max_tokens=100 last=three"
    )
    assert expected in text


def test_unknown_model_is_answered_with_its_name() -> None:
    body = {**CHAT_BODY, "model": "no-such-model-anywhere"}
    assert json.loads(run("/chat/completions", body).body)["model"] == "no-such-model-anywhere"
    gemini = json.loads(run("/v1beta/models/odd-model:generateContent", GEMINI_BODY).body)
    assert gemini["modelVersion"] == "odd-model"


def test_count_tokens() -> None:
    p = run("/v1/messages/count_tokens", {"model": "m", "messages": []}, {"usage": {"input": 42}})
    assert json.loads(p.body) == {"input_tokens": 42}
    p = run("/v1beta/models/g:countTokens", GEMINI_BODY, {"usage": {"input": 7}})
    assert json.loads(p.body)["totalTokens"] == 7


def get(path: str, headers: tuple[tuple[bytes, bytes], ...] = (), method: str = "GET") -> Plan:
    return plan(RequestInfo(method=method, path=path, headers=headers), Script())


def test_model_listings() -> None:
    openai = json.loads(get("/v1/models").body)
    assert openai["object"] == "list" and openai["data"][0]["object"] == "model"
    anthropic = json.loads(get("/v1/models", ((b"anthropic-version", b"2023-06-01"),)).body)
    assert anthropic["data"][0]["type"] == "model" and anthropic["has_more"] is False
    gemini = json.loads(get("/v1beta/models").body)
    assert gemini["models"][0]["name"].startswith("models/")
    one = json.loads(get("/v1/models/gpt-x").body)
    assert one["id"] == "gpt-x"
    assert get("/healthz").body == b"ok"
    head = get("/healthz", method="HEAD")
    assert head.status == 200 and head.body == b""


def test_unknown_path() -> None:
    p = get("/v2/nothing")
    assert p.status == 404
    assert json.loads(p.body)["error"]["message"] == "Invalid URL (GET /v2/nothing)"
    assert get("/", method="HEAD").body == b""


# --------------------------------------------------------------------------------------------
# property: a stream reassembles to the whole answer, for any text, in every format

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


def _from_stream(fmt: str, body: bytes) -> tuple[str, str, list[Any]]:
    text, reasoning = "", ""
    args: dict[Any, str] = {}
    if fmt == "anthropic":
        for name, data in sse_json(body):
            if name == "content_block_delta":
                delta = data["delta"]
                text += delta.get("text", "")
                reasoning += delta.get("thinking", "")
                if delta["type"] == "input_json_delta":
                    args[data["index"]] = args.get(data["index"], "") + delta["partial_json"]
    elif fmt == "chat":
        for _, data in sse_json(body):
            if data is None or not data["choices"]:
                continue
            delta = data["choices"][0]["delta"]
            text += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls", ()):
                args[call["index"]] = args.get(call["index"], "") + call["function"]["arguments"]
    elif fmt == "responses":
        for name, data in sse_json(body):
            if name == "response.output_text.delta":
                text += data["delta"]
            elif name == "response.reasoning_summary_text.delta":
                reasoning += data["delta"]
            elif name == "response.function_call_arguments.delta":
                args[data["item_id"]] = args.get(data["item_id"], "") + data["delta"]
    else:
        for i, (_, data) in enumerate(sse_json(body)):
            for part in data["candidates"][0]["content"]["parts"]:
                if "functionCall" in part:
                    args[i] = json.dumps(part["functionCall"]["args"])
                elif part.get("thought"):
                    reasoning += part["text"]
                else:
                    text += part["text"]
    return text, reasoning, [json.loads(v) for v in args.values()]


def _from_whole(fmt: str, body: bytes) -> tuple[str, str, list[Any]]:
    obj = json.loads(body)
    if fmt == "anthropic":
        blocks = obj["content"]
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        reasoning = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        return text, reasoning, [b["input"] for b in blocks if b["type"] == "tool_use"]
    if fmt == "chat":
        message = obj["choices"][0]["message"]
        calls = [json.loads(c["function"]["arguments"]) for c in message.get("tool_calls", ())]
        return message["content"] or "", message.get("reasoning_content", ""), calls
    if fmt == "responses":
        out = obj["output"]
        text = "".join(c["text"] for o in out if o["type"] == "message" for c in o["content"])
        reasoning = "".join(
            s["text"] for o in out if o["type"] == "reasoning" for s in o["summary"]
        )
        calls = [json.loads(o["arguments"]) for o in out if o["type"] == "function_call"]
        return text, reasoning, calls
    parts = obj["candidates"][0]["content"]["parts"]
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    reasoning = "".join(p["text"] for p in parts if p.get("thought"))
    return text, reasoning, [p["functionCall"]["args"] for p in parts if "functionCall" in p]


_FORMATS = {
    "anthropic": ("/v1/messages", {**ANTHROPIC_BODY}, ""),
    "chat": ("/chat/completions", {**CHAT_BODY}, ""),
    "responses": ("/responses", {**RESPONSES_BODY}, ""),
    "gemini": ("/v1beta/models/g:generateContent", GEMINI_BODY, ""),
}


@pytest.mark.parametrize("fmt", list(_FORMATS))
@settings(max_examples=30, deadline=None)
@given(
    text=_TEXT,
    size=st.integers(1, 7),
    tools=st.integers(0, 3),
    reasoning=st.one_of(st.none(), _TEXT.filter(bool)),
)
def test_stream_reassembles_to_the_whole_answer(
    fmt: str, text: str, size: int, tools: int, reasoning: str | None
) -> None:
    script = {"text": text, "chunk_size": size, "tool_calls": tools, "reasoning": reasoning}
    path, body, _ = _FORMATS[fmt]
    whole = run(path, body, script)
    if fmt == "gemini":
        streamed = run(GEMINI_STREAM.replace("gemini-test", "g"), body, script, query="alt=sse")
    else:
        streamed = run(path, {**body, "stream": True}, script)
    expected_args = [
        {"location": "Paris, France", "unit": "celsius", "call": i} for i in range(tools)
    ]
    assert _from_whole(fmt, whole.body) == (text, reasoning or "", expected_args)
    assert _from_stream(fmt, streamed.body) == (text, reasoning or "", expected_args)


def test_chat_refuses_an_image_in_a_tool_message_as_the_api_does() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [image]},
    ]
    p = run("/v1/chat/completions", {**CHAT_BODY, "messages": messages})
    assert p.status == 400 and p.outcome == "bad_request"
    assert json.loads(p.body)["error"]["message"] == (
        "Invalid 'messages[2]'. Image URLs are only allowed for messages with role 'user', "
        "but this message with role 'tool' contains an image URL."
    )
    assert (
        run(
            "/v1/chat/completions",
            {**CHAT_BODY, "messages": [{"role": "user", "content": [image]}]},
        ).status
        == 200
    )
