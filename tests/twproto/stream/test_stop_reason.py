"""A translator reports why the upstream's answer ended (`stop_reason`), on the watch path
(same format, bytes relayed) and on the converting path alike, from the verbatim provider
streams in tests/data/fixtures/streams/."""

from __future__ import annotations

from pathlib import Path

import pytest

from twproto.dialect import Dialect
from twproto.ir import StopReason
from twproto.stream import new_stream_translator

STREAMS = Path(__file__).parents[2] / "data/fixtures/streams"
CASES = [
    ("anthropic-text.sse", Dialect.ANTHROPIC, StopReason.END_TURN),
    ("anthropic-tool-use-input-json-delta.sse", Dialect.ANTHROPIC, StopReason.TOOL_USE),
    ("openai-chat-text-include-usage.sse", Dialect.OPENAI_CHAT, StopReason.END_TURN),
    ("openai-chat-parallel-tool-calls.sse", Dialect.OPENAI_CHAT, StopReason.TOOL_USE),
    ("openai-responses-text.sse", Dialect.OPENAI_RESPONSES, StopReason.END_TURN),
    ("gemini-sse-text.sse", Dialect.GEMINI, StopReason.END_TURN),
]


@pytest.mark.parametrize(("name", "dialect", "reason"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("client", [None, Dialect.ANTHROPIC, Dialect.OPENAI_CHAT])
def test_stop_reason_is_known_once_the_stream_says(
    name: str, dialect: Dialect, reason: StopReason, client: Dialect | None
) -> None:
    data = (STREAMS / name).read_bytes()
    t = new_stream_translator(dialect, client or dialect, client_model="m")
    assert t.stop_reason is None
    for i in range(0, len(data), 97):
        t.feed(data[i : i + 97])
    t.end()
    assert t.stop_reason is reason


def test_a_stream_cut_before_its_finish_has_no_stop_reason() -> None:
    data = (STREAMS / "anthropic-text.sse").read_bytes()
    t = new_stream_translator(Dialect.ANTHROPIC, Dialect.ANTHROPIC, client_model="m")
    t.feed(data[: data.index(b"message_delta")])
    assert t.stop_reason is None and not t.finished
