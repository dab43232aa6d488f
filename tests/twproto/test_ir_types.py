"""The IR's own rules: validation on construction, usage arithmetic, stream events as calls and
back, accumulating a stream into an answer and playing an answer as a stream."""

from __future__ import annotations

import dataclasses

import pytest

from twproto import ir


def test_parts_validate() -> None:
    with pytest.raises(ValueError):
        ir.Image()
    with pytest.raises(ValueError):
        ir.Image(url="https://x", data="abc")
    with pytest.raises(ValueError):
        ir.ToolChoice(mode=ir.ToolChoiceMode.NAMED)
    with pytest.raises(ValueError):
        ir.ToolChoice(mode=ir.ToolChoiceMode.AUTO, name="f")
    text = ir.Text(text="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        text.text = "no"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ir.Text("positional")  # type: ignore[call-arg]


def test_usage_is_normalised() -> None:
    # Anthropic input 60 + cache read 40 is OpenAI's prompt_tokens 100 with 40 cached.
    usage = ir.Usage(input_tokens=60, cache_read_tokens=40, output_tokens=7)
    assert usage.total_input_tokens == 100
    assert usage.total_tokens == 107


def test_reasoning_seal_prefers_signature() -> None:
    assert ir.Reasoning(signature="s", encrypted_content="e").seal == "s"
    assert ir.Reasoning(encrypted_content="e").seal == "e"
    assert ir.Reasoning().seal is None


def test_derived_ids_are_deterministic_and_safe() -> None:
    assert ir.derive_call_id("resp/1 x", 2) == "call_resp_1_x_2"
    assert ir.derive_call_id("r", 0) == ir.derive_call_id("r", 0)


ANSWER = ir.Answer(
    id="a1",
    model="m",
    parts=(
        ir.Reasoning(text="hmm", signature="sig"),
        ir.Text(text="hello"),
        ir.ToolCall(id="c1", name="f", arguments='{"x":1}'),
    ),
    stop_reason=ir.StopReason.TOOL_USE,
    usage=ir.Usage(input_tokens=1, output_tokens=2),
    created=5,
)


def test_answer_plays_as_stream_and_accumulates_back() -> None:
    collector = ir.EventCollector()
    ir.answer_events(ANSWER, collector)
    kinds = [type(e).__name__ for e in collector.events]
    assert kinds[0] == "MessageStart" and kinds[-2:] == ["Finish", "StreamEnd"]
    builder = ir.AnswerBuilder()
    for event in collector.events:
        ir.dispatch(event, builder)
    assert builder.ended and builder.finished
    assert builder.answer() == ANSWER


def test_event_objects_dispatch_to_the_same_calls() -> None:
    first = ir.EventCollector()
    ir.answer_events(ANSWER, first)
    second = ir.EventCollector()
    for event in first.events:
        ir.dispatch(event, second)
    assert second.events == first.events
    error = ir.StreamErrorEvent(message="boom", type="overloaded_error", status=529)
    builder = ir.AnswerBuilder()
    ir.dispatch(error, builder)
    assert builder.error_event == error


def test_builder_infers_stop_reason_without_finish() -> None:
    builder = ir.AnswerBuilder()
    builder.message_start("x", "m", None, None)
    builder.tool_call_start(0, "c", "f", ir.ToolKind.FUNCTION, None, None)
    builder.tool_args(0, '{"a"')
    builder.tool_args(0, ":1}")
    answer = builder.answer()
    assert answer.stop_reason is ir.StopReason.TOOL_USE
    assert answer.parts == (ir.ToolCall(id="c", name="f", arguments='{"a":1}'),)
    assert not builder.finished


def test_tool_names_lookup() -> None:
    names = ir.ToolNames(entries=(("ns__f", ir.ToolName(name="f", namespace="ns")),))
    assert names and not ir.ToolNames()
    assert names.lookup("ns__f") == ir.ToolName(name="f", namespace="ns")
    assert names.lookup("g") is None
