"""A fake Anthropic upstream for load tests: as cheap as it can be, so the machine's CPU goes to
what is measured, and each SSE event written with its own write.

Any POST answers with a streamed Anthropic Messages answer. The first path segment chooses the
shape: ``/e200`` is a stream of 200 SSE events (195 text deltas between the five framing
events) written one after another with no delay; ``/e200p`` paces them ``--pace`` seconds
apart, as a model's tokens are. Keep-alive, HTTP/1.1 chunked framing, one chunk per event.
Plain asyncio protocols on uvloop when it is installed.

An *agent* shape, ``/at<µs>-<µs>g<µs>-<µs>d<µs>-<µs>`` (``benchmarks/e2e/many_streams.py``), is an
agent's answer: its head and first framing events at once, then silence for a "thinking" time
drawn from the ``t`` range, then a text delta every ``g`` microseconds (each gap drawn from the
range) until the ``d`` range's draw has passed, then the closing events. Each delta's text is
``@`` and the upstream's ``time.monotonic_ns()`` at the write, 19 digits, so a client on the same
machine reads each chunk's delay through whatever stands between. Timers are ``call_later``
callbacks, no task per stream.

    python benchmarks/support/fakeupstream.py --port 9200 [--pace 0.001]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time

FRAMING = 5  # message_start, content_block_start, content_block_stop, message_delta, message_stop
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"request-id: req_bench\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _event(name: str, obj: object) -> bytes:
    data = f"event: {name}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def stream_events(total: int) -> list[bytes]:
    """The chunked-framed events of one answer with `total` SSE events."""
    deltas = max(1, total - FRAMING)
    message = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "bench",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    events = [
        _event("message_start", {"type": "message_start", "message": message}),
        _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for i in range(deltas):
        delta = {"type": "text_delta", "text": f"word{i % 10} "}
        events.append(
            _event(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
        )
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": deltas},
            },
        )
    )
    events.append(_event("message_stop", {"type": "message_stop"}))
    return events


class _Upstream(asyncio.Protocol):
    def __init__(self, pace: float, cache: dict[int, list[bytes]]) -> None:
        self.pace = pace
        self.cache = cache
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        path = head.split(" ", 2)[1]
        shape = path.split("/")[1] if path.count("/") > 1 else "e200"
        agent = AGENT.fullmatch(shape)
        if agent is not None:
            assert self.transport is not None
            self.busy = True
            _Agent(self, [int(x) / 1e6 for x in agent.groups()]).start()
            return
        paced = shape.endswith("p")
        total = int(shape.strip("ep") or 200)
        events = self.cache.get(total)
        if events is None:
            events = self.cache[total] = stream_events(total)
        assert self.transport is not None
        self.transport.write(HEAD)
        if paced and self.pace > 0:
            self.busy = True
            asyncio.get_running_loop().create_task(self._paced(events))
        else:
            for event in events:  # one write per event, no delay
                self.transport.write(event)
            self.transport.write(b"0\r\n\r\n")
            self._next()

    async def _paced(self, events: list[bytes]) -> None:
        assert self.transport is not None
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(self.pace)
            if self.transport.is_closing():
                return
            self.transport.write(event)
        self.transport.write(b"0\r\n\r\n")
        self.busy = False
        self._next()


AGENT = re.compile(r"at(\d+)-(\d+)g(\d+)-(\d+)d(\d+)-(\d+)")
_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"@%019d"}}\n\n'
)
_DELTA_CHUNK = b"%x\r\n%s\r\n" % (len(_DELTA % 0), _DELTA)


_FRAMES = stream_events(6)  # the framing events around an agent's deltas


class _Agent:
    """One agent answer on `up`'s connection, driven by loop timers (see the module's doc)."""

    __slots__ = ("end", "gap", "gap_hi", "gap_lo", "loop", "tokens", "up")

    def __init__(self, up: _Upstream, ranges: list[float]) -> None:
        self.up = up
        t_lo, t_hi, self.gap_lo, self.gap_hi, d_lo, d_hi = ranges
        self.loop = asyncio.get_running_loop()
        self.tokens = 0
        think = random.uniform(t_lo, t_hi)
        self.end = self.loop.time() + think + random.uniform(d_lo, d_hi)
        self.gap = think

    def start(self) -> None:
        events = _FRAMES
        transport = self.up.transport
        assert transport is not None
        transport.write(HEAD + events[0] + events[1])
        self.loop.call_later(self.gap, self.tick)

    def tick(self) -> None:
        transport = self.up.transport
        assert transport is not None
        if transport.is_closing():
            return
        if self.loop.time() >= self.end:
            closing = _FRAMES[-3:]
            transport.write(b"".join(closing) + b"0\r\n\r\n")
            self.up.busy = False
            self.up._next()
            return
        transport.write(_DELTA_CHUNK % time.monotonic_ns())
        self.tokens += 1
        self.loop.call_later(random.uniform(self.gap_lo, self.gap_hi), self.tick)


async def serve(port: int, pace: float) -> None:
    loop = asyncio.get_running_loop()
    cache: dict[int, list[bytes]] = {}
    server = await loop.create_server(lambda: _Upstream(pace, cache), "127.0.0.1", port)
    print(f"fake upstream on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pace", type=float, default=0.001, help="seconds between paced events")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.pace))
    else:
        uvloop.run(serve(args.port, args.pace))


if __name__ == "__main__":
    main()
