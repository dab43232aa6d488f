"""Helpers for the converter tests: fixtures, stream feeding, decoding client output, summaries.

`summarize` reduces an answer to what a client relies on (text, reasoning, tool names with
parsed arguments and ids, a stop-reason class, usage) so that outputs in different formats can
be compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twproto import ir, json_loads
from twproto.dialect import Dialect
from twproto.formats import new_stream_decoder
from twproto.sse import JSONArrayDecoder, SSEDecoder

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
DIALECTS = tuple(Dialect)


def fixture(rel: str) -> bytes:
    return (FIXTURES / rel).read_bytes()


def fixture_dialect(name: str) -> Dialect:
    if name.startswith("anthropic"):
        return Dialect.ANTHROPIC
    if name.startswith("gemini"):
        return Dialect.GEMINI
    if name.startswith("openai-responses"):
        return Dialect.OPENAI_RESPONSES
    return Dialect.OPENAI_CHAT


def pieces(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` cut at the given offsets (sorted, deduplicated, clipped)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    out = []
    last = 0
    for point in points:
        out.append(data[last:point])
        last = point
    out.append(data[last:])
    return out


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def run_translator(make: Callable[[], Any], chunks: Sequence[bytes]) -> tuple[bytes, Any]:
    """Feed `chunks` to a fresh translator; the client bytes and the translator."""
    translator = make()
    out = [translator.feed(chunk) for chunk in chunks]
    out.append(translator.end())
    return b"".join(out), translator


def stream_events(dialect: Dialect, data: bytes, *, sse: bool = True) -> list[Any]:
    """The SSE events (or JSON-array elements) of a stream body."""
    if sse:
        decoder = SSEDecoder()
        return decoder.feed(data) + decoder.end()
    array = JSONArrayDecoder()
    return array.feed(data) + array.end()


@dataclass
class Decoded:
    answer: ir.Answer
    finished: bool
    error: ir.StreamErrorEvent | None
    dropped: list[str]


def decode_stream(dialect: Dialect, data: bytes, *, sse: bool = True) -> Decoded:
    """A client-format stream decoded back to an answer with the format's own decoder."""
    decoder = new_stream_decoder(dialect)
    builder = ir.AnswerBuilder()
    for event in stream_events(dialect, data, sse=sse):
        decoder.feed_into(event, builder)
    return Decoded(builder.answer(), decoder.finished, decoder.error, decoder.dropped)


STOP_CLASS = {
    ir.StopReason.END_TURN: "stop",
    ir.StopReason.STOP_SEQUENCE: "stop",
    ir.StopReason.PAUSE: "stop",
    ir.StopReason.MAX_TOKENS: "length",
    ir.StopReason.TOOL_USE: "tools",
    ir.StopReason.CONTENT_FILTER: "filter",
    ir.StopReason.REFUSAL: "filter",
    ir.StopReason.ERROR: "error",
    ir.StopReason.OTHER: "other",
}


def summarize(answer: ir.Answer) -> dict[str, Any]:
    calls = []
    for part in answer.parts:
        if isinstance(part, ir.ToolCall):
            calls.append((part.name, json_loads(part.arguments or "{}"), part.id))
    return {
        "text": "".join(p.text for p in answer.parts if isinstance(p, ir.Text)),
        "reasoning": "".join(p.text for p in answer.parts if isinstance(p, ir.Reasoning)),
        "calls": calls,
        "stop": STOP_CLASS[answer.stop_reason],
    }


def usage_view(usage: ir.Usage | None, upstream: Dialect, client: Dialect) -> dict[str, int]:
    """The usage fields both formats can express."""
    if usage is None:
        return {}
    view = {
        "total_input": usage.total_input_tokens,
        "cache_read": usage.cache_read_tokens,
        "output": usage.output_tokens,
    }
    no_write = {Dialect.GEMINI}
    if upstream not in no_write and client not in no_write:
        view["cache_write"] = usage.cache_write_tokens
    if Dialect.ANTHROPIC not in (upstream, client):
        view["reasoning"] = usage.reasoning_tokens
    return view
