"""A client that leaves mid-stream cancels the upstream call, frees the slot and still leaves
a row with the attempts made (docs/operations.md, "What a client may send")."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import openai

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twmock.script import MockSettings, Script
from twserve.events import Event, RequestFailed, RequestFinished
from twserve.server.base import Handler, Request, Responder
from twserve.store.sqlite import usage_totals


def test_leaving_mid_stream_is_recorded_and_frees_the_slot(tmp_path: Path) -> None:
    slow = MockSettings(script=Script(chunks=200, chunk_delay=0.02))
    ups = {"a": Upstream("anthropic", slow, extra={"max_concurrent": 1})}
    with running_stack(tmp_path, ups) as st:
        body = json.dumps(
            {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        head = (
            f"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", st.port), timeout=5) as sock:
            sock.sendall(head + body)
            got = b""
            while b"content_block_delta" not in got:
                got += sock.recv(65536)
        # The client is gone: the slot (max_concurrent 1) must free up for the next request.
        deadline = time.monotonic() + 5
        slots = st.app.gateway.router.slots
        while slots.in_flight("a") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slots.in_flight("a") == 0
        (row,) = st.wait_rows(1)
    assert row["cancelled"] == 1 and row["provider"] == "a" and row["status"] == 200
    attempts = json.loads(row["routing"])["attempts"]
    assert [(a["provider"], a["outcome"]) for a in attempts] == [("a", "cancelled")]


class _LateEnd:
    """A responder whose body ends a while after its last event: an upstream whose stream's
    end (the chunked terminator) comes in a later packet than its final event."""

    def __init__(self, inner: Responder, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def end(self) -> None:
        await anyio.sleep(self.delay)
        await self.inner.end()


def _ending_late(delay: float) -> Callable[[Handler], Handler]:
    def wrap(mock: Handler) -> Handler:
        async def handler(request: Request, responder: Responder) -> None:
            await mock(request, _LateEnd(responder, delay))

        return handler

    return wrap


def test_a_client_that_leaves_after_the_last_event_had_the_whole_answer(tmp_path: Path) -> None:
    # The OpenAI SDK stops at `data: [DONE]` and closes the connection; the upstream's own end
    # comes 0.3 s later. Each answer was delivered whole: a success of its upstream (with its
    # first-content sample), a row that is not cancelled, RequestFinished, no error in usage.
    script = Script(text="a delivered answer, every word of it", chunks=6)
    ups = {"a": Upstream("openai-chat", MockSettings(script=script), wrap=_ending_late(0.3))}
    with running_stack(tmp_path, ups) as st:
        events: list[Event] = []
        st.app.events.listeners.append(events.append)
        client = openai.OpenAI(base_url=st.url + "/v1", api_key=KEY, max_retries=0, timeout=5)
        for _ in range(20):
            stream = client.chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "hi"}]
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            stream.close()
            assert text == "a delivered answer, every word of it"
        client.close()
        rows = st.wait_rows(20)
        health = st.app.gateway.router.health
        deadline = time.monotonic() + 5
        while len(events) < 40 and time.monotonic() < deadline:  # started + ended, each
            time.sleep(0.02)
        ended = [e for e in events if isinstance(e, RequestFinished | RequestFailed)]
        totals = usage_totals(st.data_dir / "requests.sqlite3", by="key")
        samples = health.sample_count("a")
    assert len(rows) == 20
    assert [r["cancelled"] for r in rows] == [0] * 20
    assert {r["status"] for r in rows} == {200}
    outcomes = [[a["outcome"] for a in json.loads(r["routing"])["attempts"]] for r in rows]
    assert outcomes == [["ok"]] * 20
    assert samples == 20
    assert [type(e) for e in ended] == [RequestFinished] * 20
    assert [(t["requests"], t["errors"]) for t in totals] == [(20, 0)]
