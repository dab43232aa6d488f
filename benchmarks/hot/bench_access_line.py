"""Hot-path benchmark of the access line (docs/observability.md): µs per request, text and
JSON, for what the event loop pays (`ObservationLog.on_row` putting the row on the writer's
queue) and for the whole line (the loop's part, then the writer's thread formatting and writing
it to /dev/null, waited for), against the logging module's synchronous path, which serves a
gateway embedded without the writer.

    pytest benchmarks/hot/bench_access_line.py --benchmark-enable -p no:cacheprovider
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from twengine.config import LogFormat, build_config
from twserve.observe.logs import ObservationLog, configure_logging
from twserve.observe.writer import LineWriter
from twserve.store.sqlite import RequestRow

REQUESTS = 2000
CONFIG = build_config({"version": 1})


def _row(i: int) -> RequestRow:
    return RequestRow(
        id=f"81213989734200000{i:07d}",
        ts=1_796_205_600.0,
        path="/v1/chat/completions",
        key_name="me",
        format="openai-chat",
        model="gpt-5-mini",
        provider="openai",
        status=200,
        stream=True,
        ttfb_ms=412,
        duration_ms=1830,
        input_tokens=1620,
        output_tokens=310,
        cache_read_tokens=1024,
        cache_write_tokens=0,
        reasoning_tokens=128,
        cost_micros=2418,
        cost_state="known",
        routing={"attempts": [{"provider": "openai", "model": "gpt-5-mini", "outcome": "ok"}]},
        request_bytes=5120,
        answer_bytes=9876,
    )


ROWS = [_row(i) for i in range(REQUESTS)]


@pytest.fixture
def writer(request: pytest.FixtureRequest) -> Iterator[tuple[LineWriter, ObservationLog]]:
    fmt: LogFormat = request.param
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    with open(os.devnull, "w", encoding="utf-8") as null:
        handler = configure_logging(fmt, stream=null, queue_lines=REQUESTS * 2)
        observation = ObservationLog(lambda: CONFIG)
        observation.follow(handler, pinned=fmt)
        try:
            yield handler, observation
        finally:
            for h in list(root.handlers):
                root.removeHandler(h)
                h.close()
            for h in saved:
                root.addHandler(h)
            root.setLevel(level)


def _loop_side(writer: LineWriter, observation: ObservationLog) -> int:
    for row in ROWS:
        observation.on_row(row)
    return writer.dropped


def _whole_line(writer: LineWriter, observation: ObservationLog) -> int:
    for row in ROWS:
        observation.on_row(row)
    writer.flush()
    return writer.dropped


def _per_request(benchmark: Any) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_request"] = stats.stats.mean / REQUESTS * 1e6


@pytest.mark.parametrize("writer", [LogFormat.TEXT, LogFormat.JSON], indirect=True)
def test_loop_side(benchmark: Any, writer: tuple[LineWriter, ObservationLog]) -> None:
    handler, observation = writer
    # Each round starts with the writer's queue empty (the thread's work is not timed here).
    benchmark.pedantic(
        _loop_side, args=(handler, observation), setup=handler.flush, rounds=30, iterations=1
    )
    handler.flush()
    assert handler.dropped == 0
    _per_request(benchmark)


@pytest.mark.parametrize("writer", [LogFormat.TEXT, LogFormat.JSON], indirect=True)
def test_whole_line(benchmark: Any, writer: tuple[LineWriter, ObservationLog]) -> None:
    handler, observation = writer
    assert benchmark(_whole_line, handler, observation) == 0
    assert handler.written >= REQUESTS
    _per_request(benchmark)


@pytest.mark.parametrize("fmt", [LogFormat.TEXT, LogFormat.JSON])
def test_logging_module_path(benchmark: Any, fmt: LogFormat) -> None:
    """The line through the logging module, written at once (a gateway embedded with its own
    handlers): what every access line cost before the writer."""
    from twserve.observe.logs import JsonFormatter, TextFormatter

    access = logging.getLogger("twserve.access")
    with open(os.devnull, "w", encoding="utf-8") as null:
        handler = logging.StreamHandler(null)
        handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else TextFormatter())
        access.addHandler(handler)
        access.propagate, level = False, access.level
        access.setLevel(logging.INFO)
        observation = ObservationLog(lambda: CONFIG)
        try:
            benchmark(lambda: [observation.on_row(row) for row in ROWS])
        finally:
            access.removeHandler(handler)
            access.propagate = True
            access.setLevel(level)
    _per_request(benchmark)
