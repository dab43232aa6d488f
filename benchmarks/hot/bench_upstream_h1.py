"""Hot-path benchmark: reading an upstream's chunked SSE answer (docs/benchmarks.md).

Run with::

    pytest benchmarks/hot/bench_upstream_h1.py --benchmark-enable -p no:cacheprovider

A recorded Anthropic stream's content events, repeated to 200, each in its own chunk of HTTP/1.1
chunked coding and its own read (as a paced upstream sends them), read three ways: by h11 (what
the gateway's upstream connections used before), by the gateway's connection with its reader
taking each piece (`twserve.upstream.h1_connection`, llhttp underneath), and by the same connection
handing each piece to a sink in the read's callback (a committed stream). ``extra_info`` has
the event count: µs per event = mean / events.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11
import pytest

from tests.fuzz.test_fuzz_upstream_h1 import started_connection

STREAMS = Path(__file__).resolve().parents[2] / "tests" / "data" / "fixtures" / "streams"
EVENTS = 200


def _reads() -> list[bytes]:
    raw = (STREAMS / "anthropic-thinking-signature-text.sse").read_bytes()
    blocks = [b + b"\n\n" for b in raw.split(b"\n\n") if b"content_block_delta" in b]
    events = (blocks * (EVENTS // len(blocks) + 1))[:EVENTS]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"transfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


READS = _reads()


def _by_h11() -> int:
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method="POST", target="/", headers=[("host", "u"), ("content-length", "0")])
    )
    conn.send(h11.EndOfMessage())
    size = 0
    for data in READS:
        conn.receive_data(data)
        while True:
            event = conn.next_event()
            if type(event) is h11.Data:
                size += len(event.data)
            elif event is h11.NEED_DATA or type(event) is h11.EndOfMessage:
                break
    return size


def _by_the_reader() -> int:
    conn, _ = started_connection()
    size = 0
    for data in READS:
        conn.data_received(data)
        size += len(conn.take())
    assert conn.done
    return size


def _by_the_sink() -> int:
    conn, _ = started_connection()
    taken: list[int] = []
    conn.data_received(READS[0])
    conn.sink = lambda piece: taken.append(len(piece)) is None  # as H1Answer.divert does
    for data in READS[1:]:
        conn.data_received(data)
    assert conn.done
    return sum(taken)


@pytest.mark.parametrize(
    "read", [_by_h11, _by_the_reader, _by_the_sink], ids=["h11", "reader", "sink"]
)
def test_read_a_chunked_answer(benchmark: Any, read: Callable[[], int]) -> None:
    benchmark.extra_info["events"] = EVENTS
    size = benchmark(read)
    assert size == _by_h11() > 0
