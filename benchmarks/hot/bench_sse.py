"""Hot-path benchmarks for the SSE codec and first-content detection (docs/benchmarks.md).

Run with::

    pytest benchmarks/hot/bench_sse.py --benchmark-enable -p no:cacheprovider

Each decode benchmark feeds a ~1 MB stream, built by repeating the content events of a recorded
transcript, in 1-byte, 7-byte and 4 KiB pieces. ``extra_info`` carries the stream size and event
count, so MB/s = bytes / mean and events/s = events / mean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from twproto.dialect import Dialect
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEEvent, encode
from twproto.stream import OpeningHold, classify_event

STREAMS = Path(__file__).resolve().parents[2] / "tests" / "data" / "fixtures" / "streams"
TARGET = 1 << 20


def _events(raw: bytes) -> list[bytes]:
    return [block + b"\n\n" for block in raw.split(b"\n\n") if block.strip()]


def _long_stream(name: str, is_content: bytes) -> bytes:
    """Opening events, the content events repeated to ~1 MB, then the closing events."""
    blocks = _events((STREAMS / name).read_bytes())
    first = next(i for i, b in enumerate(blocks) if is_content in b)
    last = max(i for i, b in enumerate(blocks) if is_content in b)
    head, body, tail = blocks[:first], blocks[first : last + 1], blocks[last + 1 :]
    out = b"".join(head)
    unit = b"".join(body)
    out += unit * max(1, TARGET // len(unit))
    return out + b"".join(tail)


ANTHROPIC = _long_stream("anthropic-thinking-signature-text.sse", b"content_block_delta")
CHAT = _long_stream("openai-chat-text-include-usage.sse", b'"content":"')
STREAMS_BY_NAME = {"anthropic": ANTHROPIC, "chat": CHAT}


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _decode_all(pieces: list[bytes]) -> int:
    dec = SSEDecoder()
    feed = dec.feed
    n = 0
    for piece in pieces:
        n += len(feed(piece))
    return n + len(dec.end())


@pytest.mark.parametrize("size", [1, 7, 4096])
@pytest.mark.parametrize("stream", ["anthropic", "chat"])
def test_sse_decode(benchmark: pytest.FixtureRequest, stream: str, size: int) -> None:
    data = STREAMS_BY_NAME[stream]
    pieces = _pieces(data, size)
    rounds = 3 if size == 1 else 10
    n = benchmark.pedantic(_decode_all, args=(pieces,), rounds=rounds, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(bytes=len(data), events=n)  # type: ignore[attr-defined]
    assert n > 1000


def test_json_array_decode(benchmark: pytest.FixtureRequest) -> None:
    raw = (STREAMS / "gemini-jsonarray-text-thought.json").read_bytes()
    inner = raw.strip()[1:-1]
    data = b"[" + b",\r\n".join([inner] * (TARGET // len(inner))) + b"]"
    pieces = _pieces(data, 4096)

    def run() -> int:
        dec = JSONArrayDecoder()
        n = 0
        for piece in pieces:
            n += len(dec.feed(piece))
        return n + len(dec.end())

    n = benchmark.pedantic(run, rounds=5, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(bytes=len(data), events=n)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stream", "dialect"), [("anthropic", Dialect.ANTHROPIC), ("chat", Dialect.OPENAI_CHAT)]
)
def test_classify_per_event(
    benchmark: pytest.FixtureRequest, stream: str, dialect: Dialect
) -> None:
    events: list[SSEEvent] = SSEDecoder().feed(STREAMS_BY_NAME[stream])[:5000]

    def run() -> int:
        n = 0
        for event in events:
            classify_event(dialect, event)
            n += 1
        return n

    n = benchmark.pedantic(run, rounds=10, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(events=n)  # type: ignore[attr-defined]


def test_opening_hold_to_first_content(benchmark: pytest.FixtureRequest) -> None:
    """The whole per-request cost of holding: decode and classify up to the first content."""
    raw = (STREAMS / "openai-responses-reasoning-summary-encrypted.sse").read_bytes()
    pieces = _pieces(raw, 1400)

    def run() -> object:
        hold = OpeningHold(Dialect.OPENAI_RESPONSES)
        for piece in pieces:
            outcome = hold.feed(piece, now=0.0)
            if hold.finished:
                return outcome
        return hold.end(now=0.0)

    benchmark(run)  # type: ignore[operator]


def test_encode_fast_path(benchmark: pytest.FixtureRequest) -> None:
    payloads = [e.data.encode() for e in SSEDecoder().feed(CHAT)[:5000]]

    def run() -> int:
        return sum(len(encode(p)) for p in payloads)

    n = benchmark.pedantic(run, rounds=10, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(events=len(payloads), bytes=n)  # type: ignore[attr-defined]
