"""Hot-path benchmarks for what admission reads of every request body (docs/benchmarks.md).

Run with::

    pytest benchmarks/hot/bench_request_body.py --benchmark-enable -p no:cacheprovider

A coding agent's request carries its whole conversation: hundreds of messages, tool results and
tool calls, a long system prompt and its tools, often hundreds of KiB. Admission parses it,
checks its structure (`twproto.structure.check_structure`) and reads it for routing
(`twproto.summary.summarize`) before anything goes upstream, so these grow with the body. Two
bodies: a one-line question, and an agent's turn of about 240 KiB (150 tool round trips).
``extra_info`` carries the body's size.
"""

from __future__ import annotations

from typing import Any

import pytest

from twproto import json_dumps, json_loads
from twproto.dialect import Dialect
from twproto.structure import check_structure
from twproto.summary import summarize


def _agent_turn(round_trips: int = 150) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(round_trips):
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "x" * 800}
        messages.append({"role": "user", "content": [result]})
        call = {"type": "tool_use", "id": f"t{i + 1}", "name": "bash", "input": {"cmd": "ls"}}
        text = {"type": "text", "text": "y" * 300}
        messages.append({"role": "assistant", "content": [text, call]})
    tools = [
        {"name": f"tool{j}", "description": "d" * 500, "input_schema": {"type": "object"}}
        for j in range(20)
    ]
    return {
        "model": "m",
        "max_tokens": 8000,
        "stream": True,
        "system": [{"type": "text", "text": "s" * 20000}],
        "tools": tools,
        "messages": messages,
    }


BODIES = {
    "question": {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
    "agent_turn": _agent_turn(),
}


@pytest.mark.parametrize("body", list(BODIES))
def test_check_structure(benchmark: pytest.FixtureRequest, body: str) -> None:
    data = BODIES[body]
    fault = benchmark(check_structure, Dialect.ANTHROPIC, data)  # type: ignore[operator]
    benchmark.extra_info.update(bytes=len(json_dumps(data)))  # type: ignore[attr-defined]
    assert fault is None


@pytest.mark.parametrize("body", list(BODIES))
def test_summarize(benchmark: pytest.FixtureRequest, body: str) -> None:
    data = BODIES[body]
    summary = benchmark(summarize, data, Dialect.ANTHROPIC)  # type: ignore[operator]
    benchmark.extra_info.update(bytes=len(json_dumps(data)))  # type: ignore[attr-defined]
    assert summary.input_tokens > 0


@pytest.mark.parametrize("body", list(BODIES))
def test_parse(benchmark: pytest.FixtureRequest, body: str) -> None:
    raw = json_dumps(BODIES[body])
    parsed = benchmark(json_loads, raw)  # type: ignore[operator]
    benchmark.extra_info.update(bytes=len(raw))  # type: ignore[attr-defined]
    assert parsed == BODIES[body]
