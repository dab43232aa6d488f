"""Every recorded provider stream and whole answer in tests/data/fixtures decodes to the expected
IR: text, reasoning, tool calls, usage, stop reason, in-stream errors. Streams are fed whole, byte
by byte and at Hypothesis-chosen splits, and must decode identically."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.twproto.conftest import (
    FIXTURES,
    bytewise,
    fixture,
    fixture_dialect,
    pieces,
)
from twproto import ir, json_loads
from twproto.dialect import Dialect
from twproto.formats import get, new_stream_decoder
from twproto.sse import JSONArrayDecoder, SSEDecoder


def _decode(name: str, chunks: list[bytes]) -> tuple[ir.Answer, Any, list[ir.StreamEvent]]:
    dialect = fixture_dialect(name)
    framing: SSEDecoder | JSONArrayDecoder = (
        JSONArrayDecoder() if name.endswith(".json") else SSEDecoder()
    )
    decoder = new_stream_decoder(dialect)
    builder = ir.AnswerBuilder()
    collector = ir.EventCollector()
    for chunk in chunks:
        for event in framing.feed(chunk):
            for item in decoder.feed(event):
                collector.events.append(item)
                ir.dispatch(item, builder)
    for event in framing.end():
        for item in decoder.feed(event):
            collector.events.append(item)
            ir.dispatch(item, builder)
    return builder.answer(), decoder, collector.events


def _usage(i: int, o: int, r: int = 0, w: int = 0, t: int = 0) -> ir.Usage:
    return ir.Usage(
        input_tokens=i,
        output_tokens=o,
        cache_read_tokens=r,
        cache_write_tokens=w,
        reasoning_tokens=t,
    )


# name → (text start, text end, reasoning start, calls [(name, args)], stop, usage, error type)
STREAMS: dict[str, tuple[Any, ...]] = {
    "anthropic-cache-read-compaction.sse": (
        "Hello!",
        "👋",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(181, 8),
        None,
    ),
    "anthropic-cache-usage.sse": (
        "The sum",
        "**650**.",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(6, 198, r=6289, w=3337),
        None,
    ),
    "anthropic-error-midstream-overloaded.sse": ("", "", "", [], None, _usage(18, 1), "api_error"),
    "anthropic-error-overloaded-docs.sse": ("", "", "", [], None, None, "overloaded_error"),
    "anthropic-parallel-tool-use.sse": (
        "",
        "",
        "The user wants me to read two files",
        [("Read", {"file_path": "/tmp/blah/foo"}), ("Read", {"file_path": "/tmp/blah/bar"})],
        ir.StopReason.TOOL_USE,
        _usage(2, 72, r=13993, w=22),
        None,
    ),
    "anthropic-text.sse": (
        "[12345,67890]",
        "]",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(135, 10),
        None,
    ),
    "anthropic-thinking-signature-text.sse": (
        "Here are",
        "streets.",
        "This is a straightforward question",
        [],
        ir.StopReason.END_TURN,
        _usage(43, 282),
        None,
    ),
    "anthropic-tool-use-input-json-delta.sse": (
        "",
        "",
        "",
        [("get_weather", {"location": "San Francisco, CA", "units": "f"})],
        ir.StopReason.TOOL_USE,
        _usage(656, 74),
        None,
    ),
    "gemini-jsonarray-text-thought.json": (
        "Scoop",
        "Scoop",
        "**Considering the Constraint**",
        [],
        ir.StopReason.END_TURN,
        _usage(11, 293, t=291),
        None,
    ),
    "gemini-jsonarray-thought-functioncall.json": (
        "",
        "",
        "**Generating Pelican Names**",
        [("pelican_name_generator", {})],
        ir.StopReason.TOOL_USE,
        _usage(32, 54, t=42),
        None,
    ),
    "gemini-sse-functioncall-thoughtsignature.sse": (
        "",
        "",
        "",
        [("get_country", {})],
        ir.StopReason.TOOL_USE,
        _usage(29, 212, t=202),
        None,
    ),
    "gemini-sse-text.sse": (
        "The capital",
        "Paris.\n",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(13, 8),
        None,
    ),
    "gemini-sse-thought-parts.sse": (
        "This is a great question!",
        "",
        "**Clarifying User Goals**",
        [],
        ir.StopReason.END_TURN,
        _usage(34, 1256, t=787),
        None,
    ),
    "openai-chat-midstream-error.sse": ("The question", '"', "", [], None, None, "server_error"),
    "openai-chat-parallel-tool-calls.sse": (
        "",
        "",
        "",
        [
            ("GetWeatherArgs", {"city": "Edinburgh", "country": "GB", "units": "c"}),
            ("get_stock_price", {"ticker": "AAPL", "exchange": "NASDAQ"}),
        ],
        ir.StopReason.TOOL_USE,
        _usage(149, 60),
        None,
    ),
    "openai-chat-reasoning-content-deepseek.sse": (
        "Hello there! 😊",
        "today?",
        "Hmm, the user just said",
        [],
        ir.StopReason.END_TURN,
        _usage(6, 212, t=198),
        None,
    ),
    "openai-chat-reasoning-content-glm.sse": (
        "4",
        "4",
        "\n1.  **Analyze",
        [],
        ir.StopReason.END_TURN,
        _usage(13, 564, t=561),
        None,
    ),
    "openai-chat-text-include-usage.sse": (
        'The question "How many angels',
        "",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(19, 238),
        None,
    ),
    "openai-responses-failed-docs.sse": ("", "", "", [], None, None, "server_error"),
    "openai-responses-failed-insufficient-quota.sse": (
        "",
        "",
        "",
        [],
        None,
        None,
        "insufficient_quota",
    ),
    "openai-responses-function-call-args.sse": (
        "",
        "",
        "",
        [("final_result", {"result": 6666})],
        ir.StopReason.TOOL_USE,
        _usage(53, 469, t=448),
        None,
    ),
    "openai-responses-reasoning-summary-encrypted.sse": (
        "Hello! Ready when you are.",
        "",
        "**Preparing simple response**",
        [],
        ir.StopReason.END_TURN,
        _usage(4006, 13),
        None,
    ),
    "openai-responses-text.sse": (
        "Why did the scarecrow",
        "in his field!",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(11, 18),
        None,
    ),
    "openrouter-chat-midstream-error.sse": (
        "",
        "",
        "We need to respond",
        [],
        ir.StopReason.MAX_TOKENS,
        None,
        "400",
    ),
}


def test_every_stream_fixture_has_an_expectation() -> None:
    names = {p.name for p in (FIXTURES / "streams").iterdir()}
    assert names == set(STREAMS)


def _check(name: str, answer: ir.Answer, decoder: Any) -> None:
    text_start, text_end, reasoning_start, calls, stop, usage, error = STREAMS[name]
    text = "".join(p.text for p in answer.parts if isinstance(p, ir.Text))
    reasoning = "".join(p.text for p in answer.parts if isinstance(p, ir.Reasoning))
    assert text.startswith(text_start)
    assert text.endswith(text_end)
    assert reasoning.startswith(reasoning_start)
    got_calls = [
        (p.name, json_loads(p.arguments)) for p in answer.parts if isinstance(p, ir.ToolCall)
    ]
    assert got_calls == calls
    if stop is not None:
        assert decoder.finished
        assert answer.stop_reason is stop
    if usage is not None:
        assert decoder.usage == usage
    if error is None:
        assert decoder.error is None
    else:
        assert decoder.error is not None and decoder.error.type == error
        assert not decoder.finished or name.startswith("openrouter")


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_fixture_decodes(name: str) -> None:
    data = fixture(f"streams/{name}")
    whole, decoder, events = _decode(name, [data])
    _check(name, whole, decoder)
    by_byte, _, byte_events = _decode(name, bytewise(data))
    assert byte_events == events
    assert by_byte == whole


@pytest.mark.parametrize("name", sorted(STREAMS))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=1, max_value=80_000), max_size=12))
def test_stream_fixture_any_split(name: str, cuts: list[int]) -> None:
    data = fixture(f"streams/{name}")
    _, _, events = _decode(name, [data])
    _, _, split_events = _decode(name, pieces(data, [c % len(data) for c in cuts]))
    assert split_events == events


def test_stream_ids_and_seals_are_kept() -> None:
    answer, _, _ = _decode(
        "anthropic-parallel-tool-use.sse", [fixture("streams/anthropic-parallel-tool-use.sse")]
    )
    assert [p.id for p in answer.parts if isinstance(p, ir.ToolCall)] == [
        "toolu_01ParallelFirst000000000",
        "toolu_01ParallelSecond00000000",
    ]
    reasoning = answer.parts[0]
    assert isinstance(reasoning, ir.Reasoning) and reasoning.signature is not None
    assert reasoning.signature.startswith("Eu8BCkYICxgCKkBR")

    answer, _, _ = _decode(
        "openai-responses-function-call-args.sse",
        [fixture("streams/openai-responses-function-call-args.sse")],
    )
    reasoning = answer.parts[0]
    assert isinstance(reasoning, ir.Reasoning)
    # The sealed content of output_item.done (the complete one), not of output_item.added.
    assert reasoning.encrypted_content is not None
    assert reasoning.encrypted_content.startswith("gAAAAABoyXvxI6jw")
    assert reasoning.item_id == "rs_0050471a34b36ae60068c97bac4dcc819595fd0f80d6b3c405"
    call = answer.parts[1]
    assert isinstance(call, ir.ToolCall) and call.id == "call_CWXgs68YprAjp6t0371hiPOI"

    answer, _, _ = _decode(
        "gemini-sse-functioncall-thoughtsignature.sse",
        [fixture("streams/gemini-sse-functioncall-thoughtsignature.sse")],
    )
    seal, call = answer.parts
    assert isinstance(seal, ir.Reasoning) and seal.signature and seal.signature.startswith("EpwI")
    assert isinstance(call, ir.ToolCall)
    assert call.id == ir.derive_call_id("QUVVadTSNJ6_qtsPvN7J8Q0", 0)


# name → (text start, reasoning start, calls, stop, usage)
WHOLE: dict[str, tuple[Any, ...]] = {
    "anthropic-cache-usage.json": (
        "Python is",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(3, 33, r=1111, w=418),
    ),
    "anthropic-parallel-tool-use.json": (
        "I'll help you",
        "",
        [("retrieve_entity_info", {"name": n}) for n in ("Alice", "Bob", "Charlie", "Daisy")],
        ir.StopReason.TOOL_USE,
        _usage(423, 202),
    ),
    "anthropic-programmatic-tool-call.json": (
        "I'll check",
        "",
        [("get_weather", {"location": "San Francisco, CA", "units": "c"})],
        ir.StopReason.TOOL_USE,
        _usage(3182, 237),
    ),
    "anthropic-text.json": (
        "The weather in SF",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(705, 25),
    ),
    "anthropic-thinking.json": (
        "925 ÷ 5 = 185",
        "925 divided by 5",
        [],
        ir.StopReason.END_TURN,
        _usage(69, 33),
    ),
    "gemini-functioncall-thoughtsignature.json": (
        "",
        "",
        [("weather", {"location": "San Francisco"})],
        ir.StopReason.TOOL_USE,
        _usage(29, 1816, t=1801),
    ),
    "gemini-text.json": (
        "Hello! How can I help",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(9, 43, t=34),
    ),
    "gemini-thought-parts.json": (
        "Crossing the street safely",
        "**A Safe Street-Crossing Guide",
        [],
        ir.StopReason.END_TURN,
        _usage(29, 1737, t=1001),
    ),
    "openai-chat-parallel-tool-calls.json": (
        "",
        "",
        [
            ("GetWeatherArgs", {"city": "Edinburgh", "country": "GB", "units": "c"}),
            ("get_stock_price", {"ticker": "AAPL", "exchange": "NASDAQ"}),
        ],
        ir.StopReason.TOOL_USE,
        _usage(149, 60),
    ),
    "openai-chat-reasoning-content-deepseek.json": (
        'The word "strawberry"',
        "We are asked",
        [],
        ir.StopReason.END_TURN,
        _usage(18, 345, t=315),
    ),
    "openai-chat-text.json": (
        'The question "How many angels',
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(19, 200),
    ),
    "openai-responses-parallel-function-calls.json": (
        "",
        "",
        [("get_location", {"loc_name": "Londos"}), ("get_location", {"loc_name": "London"})],
        ir.StopReason.TOOL_USE,
        _usage(0, 0),
    ),
    "openai-responses-reasoning-encrypted.json": (
        "12 + 7 = 19",
        "**Reporting final result**",
        [],
        ir.StopReason.END_TURN,
        _usage(865, 163, t=128),
    ),
    "openai-responses-text.json": (
        "I can't provide real-time",
        "",
        [],
        ir.StopReason.END_TURN,
        _usage(14, 50),
    ),
}


def test_every_whole_fixture_has_an_expectation() -> None:
    names = {p.name for p in (FIXTURES / "whole").iterdir()}
    assert names == set(WHOLE)


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_whole_fixture_decodes(name: str) -> None:
    answer = get(fixture_dialect(name)).decode_response(json_loads(fixture(f"whole/{name}")))
    text_start, reasoning_start, calls, stop, usage = WHOLE[name]
    text = "".join(p.text for p in answer.parts if isinstance(p, ir.Text))
    reasoning = "".join(p.text for p in answer.parts if isinstance(p, ir.Reasoning))
    assert text.startswith(text_start)
    assert reasoning.startswith(reasoning_start)
    got = [(p.name, json_loads(p.arguments)) for p in answer.parts if isinstance(p, ir.ToolCall)]
    assert got == calls
    assert answer.stop_reason is stop
    assert answer.usage == usage
    assert answer.id and answer.model


def test_whole_ids_signatures_and_opaque_parts() -> None:
    thinking = get(Dialect.ANTHROPIC).decode_response(
        json_loads(fixture("whole/anthropic-thinking.json"))
    )
    first = thinking.parts[0]
    assert isinstance(first, ir.Reasoning) and first.signature is not None
    programmatic = get(Dialect.ANTHROPIC).decode_response(
        json_loads(fixture("whole/anthropic-programmatic-tool-call.json"))
    )
    assert any(
        isinstance(p, ir.Opaque) and p.raw["type"] == "server_tool_use" for p in programmatic.parts
    )
    gemini = get(Dialect.GEMINI).decode_response(
        json_loads(fixture("whole/gemini-functioncall-thoughtsignature.json"))
    )
    seal, call = gemini.parts
    assert isinstance(seal, ir.Reasoning) and seal.signature == (
        "Eqo+Cqc+Ab4+9vtgONaaz6qwy6WXdp7gCd2w0X+Wz2gaBgY0Gv6A12JKo0y5vQwf9YQFyhMbKr1E9m17VT6HXd7jXzjaGYaE"
    )
    assert isinstance(call, ir.ToolCall) and call.id == ir.derive_call_id(gemini.id, 0)
    responses = get(Dialect.OPENAI_RESPONSES).decode_response(
        json_loads(fixture("whole/openai-responses-parallel-function-calls.json"))
    )
    ids = [(p.id, p.item_id) for p in responses.parts if isinstance(p, ir.ToolCall)]
    assert ids[0] == (
        "call_LWVp74L5HaH2KNvgVz9PJsrj",
        "fc_67e547c540648191bc7505ac667e023f0ae6111e84dd5c08",
    )
