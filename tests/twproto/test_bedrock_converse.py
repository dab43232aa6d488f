"""The Converse codec (twproto.bedrock.converse): an IR request written as bedrock-runtime's
``ConverseRequest`` (checked against botocore's service model), a Converse answer and a
ConverseStream read into the IR, and the stream reframed as Anthropic SSE — split-insensitive,
with exception frames and framing faults as Anthropic error events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import botocore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.twproto.test_eventstream import split
from twproto import Dialect, ir, new_stream_translator
from twproto.bedrock.converse import (
    ConverseStreamDecoder,
    ConverseStreamReframer,
    converse_answer_as_anthropic,
    converse_body,
    converse_count_body,
    converse_path,
    decode_converse_answer,
    encode_converse_request,
)
from twproto.eventstream import eventstream_event, eventstream_exception
from twproto.formats import anthropic

CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def _service_shapes() -> dict[str, Any]:
    root = Path(botocore.__file__).parent / "data" / "bedrock-runtime"
    (version,) = sorted(p for p in root.iterdir() if p.is_dir())[-1:]
    with gzip.open(version / "service-2.json.gz") as f:
        model: dict[str, Any] = json.loads(f.read())
    return model["shapes"]  # type: ignore[no-any-return]


SHAPES = _service_shapes()


def _members(shape: str) -> set[str]:
    return set(SHAPES[shape]["members"])


def _check_shape(value: Any, shape: str, path: str = "") -> None:
    """`value` uses only the member names bedrock-runtime's model gives `shape`, recursively."""
    spec = SHAPES[shape]
    if spec.get("document"):
        return  # free JSON (a tool's input, the model's own fields)
    if spec["type"] == "structure" or spec["type"] == "union":
        assert isinstance(value, dict), path
        unknown = set(value) - set(spec["members"])
        assert not unknown, f"{path}: {unknown} not in {shape}"
        if spec["type"] == "union":
            assert len(value) == 1, f"{path}: a union holds one member"
        for name, item in value.items():
            _check_shape(item, spec["members"][name]["shape"], f"{path}.{name}")
    elif spec["type"] == "list":
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            _check_shape(item, spec["member"]["shape"], f"{path}[{i}]")
    elif spec["type"] == "string" and "enum" in spec:
        assert value in spec["enum"], f"{path}: {value!r}"


BODY: dict[str, Any] = {
    "model": "x",
    "max_tokens": 2048,
    "system": [{"type": "text", "text": "Be brief."}],
    "temperature": 0.3,
    "stop_sequences": ["END"],
    "tools": [
        {"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}
    ],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "UkVE"},
                {"type": "tool_use", "id": "t1", "name": "get_time", "input": {"tz": "CET"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "noon"}],
        },
        {"role": "user", "content": "and now?"},
    ],
}


def test_a_request_is_converses_by_bedrock_runtimes_model() -> None:
    body, dropped = converse_body(json.dumps(BODY).encode(), CLAUDE)
    request = {**body, "modelId": CLAUDE}
    _check_shape(request, "ConverseRequest")
    assert body["system"] == [{"text": "Be brief."}]
    assert body["inferenceConfig"] == {
        "maxTokens": 2048,
        "temperature": 0.3,
        "stopSequences": ["END"],
    }
    tools = body["toolConfig"]["tools"]
    # get_time is only named by a past call: declared, as Bedrock requires a toolConfig for it.
    assert [t["toolSpec"]["name"] for t in tools] == ["get_weather", "get_time"]
    assert body["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}
    user, assistant, answer = body["messages"]
    assert user["content"] == [
        {"text": "Look"},
        {"image": {"format": "jpeg", "source": {"bytes": "AAAA"}}},
    ]
    assert assistant["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "hm", "signature": "sig"}}},
        {"reasoningContent": {"redactedContent": "UkVE"}},
        {"toolUse": {"toolUseId": "t1", "name": "get_time", "input": {"tz": "CET"}}},
    ]
    # Two user turns in a row are one, its tool result first.
    assert answer["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "noon"}], "status": "success"}},
        {"text": "and now?"},
    ]
    assert any("image" in d for d in dropped)


def test_reasoning_is_claudes_thinking_and_only_claudes() -> None:
    thinking = {**BODY, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    thinking.pop("temperature")
    body, _ = converse_body(json.dumps(thinking).encode(), CLAUDE)
    assert body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 1024}
    }
    other, dropped = converse_body(json.dumps(thinking).encode(), "meta.llama3-70b-instruct-v1:0")
    assert "additionalModelRequestFields" not in other
    assert "reasoning (this model's fields are not known)" in dropped


@pytest.mark.parametrize(
    ("choice", "want"),
    [
        ({"type": "auto"}, {"auto": {}}),
        ({"type": "any"}, {"any": {}}),
        ({"type": "none"}, None),
    ],
)
def test_tool_choice(choice: dict[str, Any], want: dict[str, Any] | None) -> None:
    body, dropped = converse_body(json.dumps({**BODY, "tool_choice": choice}).encode(), CLAUDE)
    assert body["toolConfig"].get("toolChoice") == want
    assert (want is None) == ("tool_choice none (Converse has none)" in dropped)


def test_the_count_input_is_converse_tokens_request() -> None:
    sent = json.loads(converse_count_body(json.dumps(BODY).encode(), CLAUDE))
    _check_shape(sent["input"], "CountTokensInput")
    assert set(sent["input"]["converse"]) <= _members("ConverseTokensRequest")
    assert converse_path("a:b/c", stream=True) == "/model/a%3Ab%2Fc/converse-stream"


ANSWER = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "why", "signature": "s1"}}},
                {"text": "Sunny."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"q": 1}}},
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 24, "cacheReadInputTokens": 5},
    "metrics": {"latencyMs": 80},
}


def test_an_answer_decodes_into_the_ir_and_reads_as_anthropics() -> None:
    _check_shape(ANSWER, "ConverseResponse")
    answer = decode_converse_answer(ANSWER, id="m1", model=CLAUDE)
    assert answer.parts == (
        ir.Reasoning(text="why", signature="s1"),
        ir.Text(text="Sunny."),
        ir.ToolCall(id="tooluse_1", name="get_weather", arguments='{"q":1}'),
    )
    assert answer.stop_reason is ir.StopReason.TOOL_USE
    assert answer.usage == ir.Usage(input_tokens=12, output_tokens=7, cache_read_tokens=5)
    message = json.loads(converse_answer_as_anthropic(json.dumps(ANSWER).encode(), CLAUDE))
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["stop_reason"] == "tool_use" and message["id"].startswith("msg_bdrk_")
    with pytest.raises(ValueError):
        converse_answer_as_anthropic(b"[]", CLAUDE)
    with pytest.raises(ValueError):
        converse_answer_as_anthropic(b"not json", CLAUDE)


def _frame(event_type: str, body: dict[str, Any]) -> bytes:
    return eventstream_event(event_type, json.dumps(body).encode())


def stream_frames(texts: list[str], args: list[str], thought: str) -> list[bytes]:
    """A ConverseStream answer: reasoning with its signature, text deltas, one tool call whose
    input arrives in `args` pieces, the stop and the usage."""
    frames = [_frame("messageStart", {"role": "assistant"})]
    frames.append(
        _frame(
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": thought}}},
        )
    )
    frames.append(
        _frame(
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sig"}}},
        )
    )
    frames.append(_frame("contentBlockStop", {"contentBlockIndex": 0}))
    for text in texts:
        frames.append(
            _frame("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": text}})
        )
    frames.append(_frame("contentBlockStop", {"contentBlockIndex": 1}))
    start = {"toolUse": {"toolUseId": "tooluse_9", "name": "get_weather"}}
    frames.append(_frame("contentBlockStart", {"contentBlockIndex": 2, "start": start}))
    for piece in args:
        frames.append(
            _frame(
                "contentBlockDelta",
                {"contentBlockIndex": 2, "delta": {"toolUse": {"input": piece}}},
            )
        )
    frames.append(_frame("contentBlockStop", {"contentBlockIndex": 2}))
    frames.append(_frame("messageStop", {"stopReason": "tool_use"}))
    usage = {"inputTokens": 40, "outputTokens": 9, "totalTokens": 49, "cacheReadInputTokens": 3}
    frames.append(_frame("metadata", {"usage": usage, "metrics": {"latencyMs": 120}}))
    return frames


def _reframe(pieces: list[bytes]) -> bytes:
    reframer = ConverseStreamReframer(model=CLAUDE)
    out = b"".join(reframer.feed(p, now=1.0) for p in pieces)
    return out + reframer.end()


def _as_anthropic_message(sse: bytes) -> tuple[list[ir.StreamEvent], ir.Usage | None]:
    decoder = anthropic.new_stream_decoder()
    translator = new_stream_translator(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model=CLAUDE)
    translator.feed(sse)
    translator.end()
    assert translator.finished and not translator.broken
    from twproto.sse import SSEDecoder

    events: list[ir.StreamEvent] = []
    for event in SSEDecoder().feed(sse):
        events += decoder.feed(event)
    return events, translator.usage


_TEXTS = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6)
_ARGS = st.lists(st.sampled_from(['{"loc', 'ation":', '"Paris"', "}"]), max_size=4).map(
    lambda p: ['{"location":"Paris"}'] if not p else ['{"location":', '"Paris"}']
)


@settings(max_examples=150, deadline=None)
@given(
    texts=_TEXTS,
    args=_ARGS,
    thought=st.text(max_size=20),
    points=st.lists(st.integers(0, 4000), max_size=12),
)
def test_the_reframed_stream_is_split_insensitive_and_carries_the_answer(
    texts: list[str], args: list[str], thought: str, points: list[int]
) -> None:
    data = b"".join(stream_frames(texts, args, thought))
    whole = _reframe([data])
    assert _reframe(split(data, points)) == whole
    events, usage = _as_anthropic_message(whole)
    text = "".join(e.text for e in events if isinstance(e, ir.TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ir.ReasoningDelta))
    assert text == "".join(texts) and reasoning == thought
    seals = [e.signature for e in events if isinstance(e, ir.ReasoningSeal)]
    assert seals == ["sig"]
    (call,) = [e for e in events if isinstance(e, ir.ToolCallStart)]
    assert (call.id, call.name) == ("tooluse_9", "get_weather")
    arguments = "".join(e.arguments for e in events if isinstance(e, ir.ToolArgsDelta))
    assert json.loads(arguments) == {"location": "Paris"}
    assert [e.reason for e in events if isinstance(e, ir.Finish)] == [ir.StopReason.TOOL_USE]
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (40, 9)
    assert usage.cache_read_tokens == 3


def test_an_exception_frame_is_an_anthropic_error_of_the_same_kind() -> None:
    frames = stream_frames(["Hel", "lo"], [], "")[:5]
    throttled = eventstream_exception("throttlingException", b'{"message":"Too many requests"}')
    out = _reframe([b"".join(frames) + throttled + frames[0]])
    events = out.split(b"\n\n")
    assert b"event: error" in events[-2] and b"rate_limit_error" in events[-2]
    assert out.count(b"event: error") == 1  # nothing is read after it


def test_a_corrupt_frame_or_a_malformed_event_is_an_api_error() -> None:
    data = bytearray(b"".join(stream_frames(["Hi"], [], "")))
    data[30] ^= 0x40
    assert b"api_error" in _reframe([bytes(data)])
    bad = _frame("contentBlockDelta", {"contentBlockIndex": "one", "delta": {"text": "x"}})
    assert b"a malformed contentBlockDelta event" in _reframe([bad])


def test_a_stream_cut_before_its_stop_is_left_open_and_one_without_metadata_is_ended() -> None:
    frames = stream_frames(["Hi"], [], "")
    cut = _reframe([b"".join(frames[:5])])
    assert b"message_stop" not in cut
    no_metadata = _reframe([b"".join(frames[:-1])])
    assert no_metadata.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_the_decoder_is_an_ir_stream_source() -> None:
    collector = ir.EventCollector()
    decoder = ConverseStreamDecoder(id="m", model=CLAUDE)
    for event_type, body in [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "a"}}),
        ("messageStop", {"stopReason": "max_tokens"}),
    ]:
        assert not decoder.feed_event(event_type, json.dumps(body).encode(), collector)
    assert decoder.feed_event(
        "metadata", b'{"usage":{"inputTokens":1,"outputTokens":2}}', collector
    )
    kinds = [type(e).__name__ for e in collector.events]
    assert kinds == ["MessageStart", "PartStart", "TextDelta", "PartStop", "Finish", "UsageUpdate"]
    assert decoder.usage == ir.Usage(input_tokens=1, output_tokens=2)


def test_encode_from_ir_drops_what_converse_cannot_carry() -> None:
    req = ir.Request(
        model="x",
        messages=(ir.Message(role=ir.Role.USER, parts=(ir.Text(text="hi"),)),),
        top_k=5,
        output_format=ir.OutputFormat(type="json_schema", schema={"type": "object"}),
    )
    body, dropped = encode_converse_request(req, model="amazon.nova-pro-v1:0")
    assert body == {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    assert "top_k" in dropped and "output_format:json_schema" in dropped
    claude, _ = encode_converse_request(req, model=CLAUDE)
    assert claude["additionalModelRequestFields"] == {"top_k": 5}
