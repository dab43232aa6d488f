"""Resuming over the in-memory upstream: what the client receives, what the next upstream is
asked, and that every slot is given back and every upstream request closed afterwards."""

from __future__ import annotations

import json

import pytest

from tests.twproto.stream.test_resume import anthropic_stream, client_events
from tests.twserve.relay.test_relay_memory import SSE, Collected, Setup, by_host
from twproto import ir
from twproto.dialect import Dialect
from twserve.upstream.memory import MemoryAnswer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _text(body: bytes) -> str:
    return "".join(
        e.text for e in client_events(Dialect.ANTHROPIC, body) if isinstance(e, ir.TextDelta)
    )


async def test_a_break_is_resumed_and_everything_given_back() -> None:
    setup = Setup({"a": {}, "b": {}}, resume=True)
    up = by_host(
        a=MemoryAnswer(
            headers=SSE, chunks=(anthropic_stream(["The qu", "ick br"], end=False),), breaks=True
        ),
        b=MemoryAnswer(headers=SSE, chunks=(anthropic_stream(["uick br", "own fox."]),)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert client.ended and _text(client.body) == "The quick brown fox."
    assert (out.status, out.provider, out.error_code) == (200, "b", None)
    assert [(a.provider, a.resumed_from) for a in out.attempts] == [("a", None), ("b", 12)]
    asked = json.loads(up.requests[1].body)["messages"][-1]
    assert asked == {"role": "assistant", "content": [{"type": "text", "text": "The quick br"}]}
    assert set(out.attempt_usage) == {0, 1}  # both upstreams' tokens are billed
    setup.assert_all_given_back(up)


async def test_content_that_arrives_with_the_break_still_reaches_the_client() -> None:
    # The first content completes only at the end of the body (its event lacks the blank line),
    # and the body ends without the stream's end: the commit and the resume come together.
    setup = Setup({"a": {}, "b": {}}, resume=True)
    cut = anthropic_stream(["Hello"], end=False).removesuffix(b"\n\n")
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=(cut,)),
        b=MemoryAnswer(headers=SSE, chunks=(anthropic_stream([" world"]),)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert _text(client.body) == "Hello world"
    assert [a.provider for a in out.attempts] == ["a", "b"]
    setup.assert_all_given_back(up)


async def test_a_silent_answer_is_resumed() -> None:
    setup = Setup({"a": {}, "b": {}}, resume=True, idle_timeout_secs=0.2)
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=(anthropic_stream(["Hello"], end=False),), stalls=True),
        b=MemoryAnswer(headers=SSE, chunks=(anthropic_stream([" world"]),)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert _text(client.body) == "Hello world"
    assert [a.error for a in out.attempts] == ["idle_timeout", None]
    setup.assert_all_given_back(up)


async def test_a_full_next_upstream_is_waited_for_until_the_deadline() -> None:
    # a's chunks are written by its reader itself (they come with gaps); after the break the
    # next upstream is full, so the request waits for its slot and wakes at the deadline: the
    # answer ends with the break's error event.
    setup = Setup({"a": {}, "b": {"max_concurrent": 1}}, resume=True, wait_secs=0.5)
    held = setup.router.slots.try_acquire("b", owner="someone-else")
    assert held is not None
    first = anthropic_stream(["The qu", "ick br"], end=False)
    pieces = tuple(first[i : i + 40] for i in range(0, len(first), 40))
    up = by_host(
        a=MemoryAnswer(headers=SSE, chunks=pieces, gap=0.01, breaks=True),
        b=MemoryAnswer(headers=SSE, chunks=(anthropic_stream(["uick brown"]),)),
    )
    client = Collected()
    out = await setup.run(up, client)
    assert _text(client.body) == "The quick br" and b"event: error" in client.body
    assert (out.status, out.error_code) == (200, "gw.upstream.broken_after_content")
    assert [(a.provider, a.outcome.value) for a in out.attempts] == [
        ("a", "failed"),
        ("b", "skipped"),
    ]
    assert len(up.requests) == 1
    setup.hooks.release(held)
    setup.assert_all_given_back(up)
