"""Per-chunk cost of a Bedrock stream (``bedrock-anthropic``, ``bedrock-converse``) beside the
same Anthropic stream (docs/bedrock.md, "Cost per chunk").

Run with::

    pytest benchmarks/hot/bench_bedrock.py --benchmark-enable -p no:cacheprovider

The stream is 2000 text deltas of 12 characters between Anthropic's opening and closing
events, each upstream read holding one event: as Anthropic SSE, and as Bedrock's event-stream
``chunk`` messages carrying the same events, and as ConverseStream's events of the same answer
(``messageStart``, 2000 ``contentBlockDelta``, ``contentBlockStop``, ``messageStop``,
``metadata``). Each is translated for an Anthropic client (the relay; for Bedrock the reframing
in front of it, which for Converse is decode → IR → Anthropic SSE) and for a Chat client
(decode → IR → encode).
``extra_info["chunks"]`` is the read count: the mean divided by it is the cost per chunk.
"""

from __future__ import annotations

import base64
import json

import pytest

from twproto import Dialect, new_stream_translator
from twproto.bedrock import EventStreamTranslator, InvokeStreamReframer
from twproto.bedrock.converse import ConverseStreamReframer
from twproto.eventstream import eventstream_event
from twproto.stream import StreamTranslator

_START = {
    "type": "message_start",
    "message": {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    },
}
_EVENTS = [
    _START,
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    *(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "x" * 12},
        }
        for _ in range(2000)
    ),
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
]
_JSON = [json.dumps(e, separators=(",", ":")).encode() for e in _EVENTS]
SSE = [
    b"event: " + e["type"].encode() + b"\ndata: " + j + b"\n\n"
    for e, j in zip(_EVENTS, _JSON, strict=True)
]
BEDROCK = [eventstream_event("chunk", b'{"bytes":"' + base64.b64encode(j) + b'"}') for j in _JSON]
_DELTA = b'{"contentBlockIndex":0,"delta":{"text":"' + b"x" * 12 + b'"},"p":"abcdefgh"}'
CONVERSE = [
    eventstream_event("messageStart", b'{"role":"assistant","p":"abc"}'),
    *(eventstream_event("contentBlockDelta", _DELTA) for _ in range(2000)),
    eventstream_event("contentBlockStop", b'{"contentBlockIndex":0,"p":"ab"}'),
    eventstream_event("messageStop", b'{"stopReason":"end_turn","p":"abcd"}'),
    eventstream_event(
        "metadata",
        b'{"usage":{"inputTokens":10,"outputTokens":9,"totalTokens":19},"metrics":{"latencyMs":5}}',
    ),
]


def _run(client: Dialect, upstream: str) -> int:
    inner = new_stream_translator(Dialect.ANTHROPIC, client, client_model="claude")
    translator: StreamTranslator = inner
    chunks = SSE
    if upstream == "bedrock":
        translator, chunks = EventStreamTranslator(inner, InvokeStreamReframer()), BEDROCK
    elif upstream == "converse":
        reframer = ConverseStreamReframer(model="claude")
        translator, chunks = EventStreamTranslator(inner, reframer), CONVERSE
    feed = translator.feed
    n = 0
    for chunk in chunks:
        n += len(feed(chunk))
    n += len(translator.end())
    assert translator.finished
    return n


@pytest.mark.parametrize("upstream", ["anthropic-sse", "bedrock", "converse"])
@pytest.mark.parametrize("client", [Dialect.ANTHROPIC, Dialect.OPENAI_CHAT], ids=str)
def test_stream_per_chunk(benchmark: pytest.FixtureRequest, client: Dialect, upstream: str) -> None:
    n = benchmark.pedantic(_run, args=(client, upstream), rounds=15, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(chunks=len(SSE))  # type: ignore[attr-defined]
    assert n > 0
