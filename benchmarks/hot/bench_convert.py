"""Hot-path benchmark of stream conversion (docs/benchmarks.md): µs per streamed chunk.

Run with::

    pytest benchmarks/hot/bench_convert.py --benchmark-enable -p no:cacheprovider

Each benchmark feeds a recorded transcript whose content events are repeated to ``EVENTS``
events, one SSE event per network chunk (how providers flush), through a fresh
`twproto.translate.StreamTranslator`: SSE bytes → event → IR → other format → SSE bytes. The
same-format cases are the watch path (bytes relayed unchanged, only usage/finish/errors parsed).
``extra_info["us_per_chunk"]`` is the mean time divided by the number of chunks; the
``sse_only`` case (SSE decoding alone) is the floor every path pays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from twproto.dialect import Dialect
from twproto.sse import SSEDecoder
from twproto.stream import new_stream_translator

STREAMS = Path(__file__).resolve().parents[2] / "tests" / "data" / "fixtures" / "streams"
EVENTS = 2000


def _chunks(name: str, content: bytes) -> list[bytes]:
    """The transcript's events, content events repeated to about `EVENTS`, one per chunk."""
    raw = (STREAMS / name).read_bytes().replace(b"\r\n", b"\n")
    blocks = [block + b"\n\n" for block in raw.split(b"\n\n") if block.strip()]
    first = next(i for i, b in enumerate(blocks) if content in b)
    last = max(i for i, b in enumerate(blocks) if content in b)
    body = blocks[first : last + 1]
    repeated = body * max(1, EVENTS // len(body))
    return blocks[:first] + repeated + blocks[last + 1 :]


ANTHROPIC = _chunks("anthropic-thinking-signature-text.sse", b"content_block_delta")
CHAT = _chunks("openai-chat-text-include-usage.sse", b'"content":"')

CASES = {
    "anthropic_to_chat": (Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, ANTHROPIC),
    "chat_to_anthropic": (Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, CHAT),
    "anthropic_watch": (Dialect.ANTHROPIC, Dialect.ANTHROPIC, ANTHROPIC),
    "chat_watch": (Dialect.OPENAI_CHAT, Dialect.OPENAI_CHAT, CHAT),
    # A Chat client that did not ask for usage: the usage-only chunk is left out.
    "chat_watch_hiding_usage": (Dialect.OPENAI_CHAT, Dialect.OPENAI_CHAT, CHAT),
    "anthropic_to_responses": (Dialect.ANTHROPIC, Dialect.OPENAI_RESPONSES, ANTHROPIC),
    "chat_to_gemini": (Dialect.OPENAI_CHAT, Dialect.GEMINI, CHAT),
}


def _run(upstream: Dialect, client: Dialect, chunks: list[bytes], hide: bool = False) -> int:
    translator = new_stream_translator(
        upstream, client, client_model="client-model", created=1, hide_usage_chunk=hide
    )
    feed = translator.feed
    size = 0
    for chunk in chunks:
        size += len(feed(chunk))
    size += len(translator.end())
    assert translator.finished
    return size


@pytest.mark.parametrize("case", sorted(CASES))
def test_convert_per_chunk(benchmark: Any, case: str) -> None:
    upstream, client, chunks = CASES[case]
    benchmark.extra_info["chunks"] = len(chunks)
    size = benchmark(_run, upstream, client, chunks, case.endswith("_hiding_usage"))
    assert size > 0
    stats = benchmark.stats.stats if benchmark.stats else None
    if stats is not None:
        benchmark.extra_info["us_per_chunk"] = round(stats.mean / len(chunks) * 1e6, 3)


@pytest.mark.parametrize("name", ["anthropic", "chat"])
def test_sse_only_per_chunk(benchmark: Any, name: str) -> None:
    chunks = ANTHROPIC if name == "anthropic" else CHAT

    def run() -> int:
        decoder = SSEDecoder()
        feed = decoder.feed
        return sum(len(feed(chunk)) for chunk in chunks)

    benchmark.extra_info["chunks"] = len(chunks)
    assert benchmark(run) >= len(chunks) - 1
    stats = benchmark.stats.stats if benchmark.stats else None
    if stats is not None:
        benchmark.extra_info["us_per_chunk"] = round(stats.mean / len(chunks) * 1e6, 3)
