"""Throughput of the AWS event-stream decoder (docs/bedrock.md).

Run with::

    pytest benchmarks/hot/bench_eventstream.py --benchmark-enable -p no:cacheprovider

The stream is ConverseStream-shaped (tests/support/converse_stream.py): about 1 MB of
``contentBlockDelta`` messages of some 150 bytes each, between the opening and closing events,
fed whole, in 4 KiB pieces and in 7-byte pieces. ``extra_info`` carries the stream size and
message count, so MB/s = bytes / mean and messages/s = messages / mean.
"""

from __future__ import annotations

import pytest

from tests.support.converse_stream import converse_stream
from twproto.eventstream import EventStreamDecoder

FRAMES = converse_stream(6500)
DATA = b"".join(FRAMES)


def _pieces(size: int) -> list[bytes]:
    if size == 0:
        return [DATA]
    return [DATA[i : i + size] for i in range(0, len(DATA), size)]


def _decode_all(pieces: list[bytes]) -> int:
    dec = EventStreamDecoder()
    feed = dec.feed
    n = 0
    for piece in pieces:
        n += len(feed(piece))
    dec.end()
    return n


@pytest.mark.parametrize("size", [0, 4096, 7], ids=["whole", "4KiB", "7B"])
def test_eventstream_decode(benchmark: pytest.FixtureRequest, size: int) -> None:
    pieces = _pieces(size)
    n = benchmark.pedantic(_decode_all, args=(pieces,), rounds=10, iterations=1)  # type: ignore[attr-defined]
    benchmark.extra_info.update(bytes=len(DATA), messages=n)  # type: ignore[attr-defined]
    assert n == len(FRAMES)
