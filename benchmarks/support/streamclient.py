"""The many-streams load generator: opens N streams to one port and reads them to their end,
each on its own connection, and prints one JSON line of what it saw.

A process of its own (``benchmarks/e2e/many_streams.py`` starts one or more), so that its CPU is
neither the gateway's nor the benchmark's, and it reports that CPU: on a small machine it is the
first thing to run out. Plain asyncio protocols on uvloop when it is installed; the body is not
parsed beyond the chunk delays: every text delta of an agent stream
(``support/fakeupstream.py``) carries ``@`` and the upstream's ``time.monotonic_ns()`` at its
write, and each read's markers are subtracted from the clock at that read.

    python benchmarks/support/streamclient.py --port P --request FILE --streams N --ramp S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import time
from array import array
from collections import Counter
from pathlib import Path

MARK = re.compile(rb"@(\d{19})")
TAIL = 24  # bytes kept from the last read, for a marker split across two reads
END = b"\r\n0\r\n\r\n"


MESSAGE = re.compile(rb'"message":\s*"([^"]{0,200})')
CODE = re.compile(rb'"code":\s*"([a-z_.]{1,80})"')
NUMBER = re.compile(r"\d[\d,.]*")
CATEGORY = re.compile(rb"\r\nx-thinkwatch-error:\s*([a-z_]+)", re.IGNORECASE)
LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
BODY_MAX = 4096  # bytes of a refusal's body read before it is judged
# The message codes of the gateway's own refusals, by their message's start, for the shapes that
# carry no code (Anthropic's, Gemini's): each code's message is its own (docs/codes.md).
CODES_BY_MESSAGE = (
    ("the gateway is overloaded", "gw.overloaded"),
    ("this address has", "gw.listen.address_busy"),
    ("the gateway is holding as many request bodies", "gw.request.bodies_busy"),
)


def refusal(status: str, body: bytes, head: bytes = b"") -> str:
    """An error's key: the status, the ``x-thinkwatch-error`` category, the message code, and
    the start of the message with its numbers as N, so that refusals of one kind count together
    ("HTTP 503 rate_limited gw.overloaded: the gateway is overloaded (event loop N ms behind…").

    The code is the body's where it carries one (OpenAI's shapes); Anthropic's error shape has
    none, so the gateway's own refusals are named by their message (`CODES_BY_MESSAGE`)."""
    m = CATEGORY.search(head)
    key = f"HTTP {status}" + (f" {m.group(1).decode()}" if m else "")
    m = MESSAGE.search(body)
    text = m.group(1).decode("utf-8", "replace") if m else ""
    if not text:  # not a JSON error: its first bytes, as they are
        text = body[:60].decode("utf-8", "replace") or "(no body)"
    code = CODE.search(body)
    name = code.group(1).decode() if code else ""
    for start, known in CODES_BY_MESSAGE:
        if not name and text.startswith(start):
            name = known
    text = NUMBER.sub("N", text)[:80]
    return f"{key} {name}: {text}" if name else f"{key}: {text}"


class Stats:
    def __init__(self) -> None:
        self.delays_us = array("q")
        self.errors: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.completed = 0
        self.open = 0
        self.peak_open = 0


class _Stream(asyncio.Protocol):
    __slots__ = (
        "body",
        "body_len",
        "done",
        "finished",
        "head",
        "refused",
        "request",
        "stats",
        "tail",
        "transport",
    )

    def __init__(self, stats: Stats, request: bytes, done: asyncio.Future[None]) -> None:
        self.stats = stats
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.tail = b""
        self.done = done
        self.finished = False
        self.refused = b""  # the head of a refusal whose body is being read
        self.body = b""
        self.body_len = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.transport.write(self.request)
        self.stats.open += 1
        self.stats.peak_open = max(self.stats.peak_open, self.stats.open)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.refused:
            self._refusal_body(data)
            return
        if self.head is not None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self.head[9:12].decode("latin-1")
            self.stats.statuses[status] += 1
            data = self.head[end + 4 :]
            head = self.head[: end + 2]
            self.head = None  # type: ignore[assignment]
            if status != "200":
                # The body may come in later packets: read it (bounded) before judging.
                self.refused = head
                m = LENGTH.search(head)
                self.body_len = min(BODY_MAX, int(m.group(1))) if m else BODY_MAX
                self._refusal_body(data)
                return
        window = self.tail + data
        skip = len(self.tail)
        delays = self.stats.delays_us
        for m in MARK.finditer(window):
            if m.end() > skip:
                delays.append((now - int(m.group(1))) // 1000)
        self.tail = window[-TAIL:]
        if self.tail.endswith(END):
            self._finish(None)

    def _refusal_body(self, data: bytes) -> None:
        self.body = (self.body + data)[:BODY_MAX]
        if len(self.body) >= self.body_len:
            self._refused()

    def _refused(self) -> None:
        status = self.refused[9:12].decode("latin-1")
        self._finish(refusal(status, self.body, self.refused))

    def _finish(self, error: str | None) -> None:
        if self.finished:
            return
        self.finished = True
        if error is None:
            self.stats.completed += 1
        else:
            self.stats.errors[error] += 1
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.open -= 1
        if self.refused:
            self._refused()  # a refusal framed by the connection's close
        self._finish("closed before the end")


async def _one(port: int, request: bytes, stats: Stats, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        _transport, stream = await asyncio.wait_for(
            loop.create_connection(lambda: _Stream(stats, request, done), "127.0.0.1", port), 10
        )
    except (OSError, TimeoutError) as err:
        stats.errors[f"connect: {type(err).__name__} {getattr(err, 'errno', '') or ''}"] += 1
        return
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        stream._finish("timed out")


async def run(args: argparse.Namespace) -> dict[str, object]:
    request = Path(args.request).read_bytes()
    stats = Stats()
    tasks = []
    start = time.monotonic()
    for i in range(args.streams):
        # Spread over the ramp: stream i starts at i/N of it.
        delay = start + args.ramp * i / args.streams - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(_one(args.port, request, stats, args.timeout)))
    await asyncio.gather(*tasks)
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    delays = sorted(stats.delays_us)

    def pct(q: float) -> float:
        return delays[min(len(delays) - 1, int(q * len(delays)))] / 1000 if delays else 0.0

    return {
        "streams": args.streams,
        "completed": stats.completed,
        "errors": dict(stats.errors),
        "statuses": dict(stats.statuses),
        "peak_open": stats.peak_open,
        "chunks": len(delays),
        "delay_ms": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999), "max": pct(1.0)},
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--request", required=True, help="file holding the request's bytes")
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds over which streams start")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one stream may take")
    args = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
    except ImportError:
        out = asyncio.run(run(args))
    else:
        out = uvloop.run(run(args))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
