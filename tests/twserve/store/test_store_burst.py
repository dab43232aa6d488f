"""A burst of concurrent streamed requests leaves exactly one complete row each (docs/operations.md,
"The request row").

The requests are anyio tasks over one httpcore pool (no threads), all in flight together: the
mock paces each stream over a few chunks, so rows are finished and queued for the store
writer while other streams are still running.
"""

from __future__ import annotations

import json
import time

import anyio
import httpcore
import pytest

from tests.twserve.conftest import KEY, MODELS, StackFactory, attempts
from tests.twserve.support.stack import Upstream
from twmock.script import MockSettings, parse_script

pytestmark = pytest.mark.anyio

REQUESTS = 100
USAGE = {"input": 1200, "cache_read": 3400, "cache_write": 56, "output": 78}


async def test_burst_of_streams_leaves_one_row_each(stack: StackFactory) -> None:
    script = {"chunks": 5, "chunk_delay": 0.02, "usage": USAGE}
    st = stack({"up": Upstream("anthropic", MockSettings(script=parse_script(script)))})
    body = json.dumps(
        {
            "model": MODELS["anthropic"],
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    statuses: list[int] = []
    bodies: list[bytes] = []

    async with httpcore.AsyncConnectionPool(max_connections=REQUESTS, retries=0) as pool:

        async def one() -> None:
            response = await pool.request(
                "POST",
                st.url + "/v1/messages",
                headers=[(b"x-api-key", KEY.encode()), (b"content-type", b"application/json")],
                content=body,
                extensions={"timeout": {"connect": 5, "read": 5, "write": 5, "pool": 5}},
            )
            statuses.append(response.status)
            bodies.append(response.content)

        started = time.monotonic()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for _ in range(REQUESTS):
                    tg.start_soon(one)
        elapsed = time.monotonic() - started

    assert statuses == [200] * REQUESTS
    assert all(b.rstrip().endswith(b'data: {"type":"message_stop"}') for b in bodies)

    rows = await anyio.to_thread.run_sync(st.wait_rows, REQUESTS)
    assert len(rows) == REQUESTS
    assert len({row["id"] for row in rows}) == REQUESTS
    for row in rows:
        assert (row["status"], row["provider"], row["stream"], row["cancelled"]) == (
            200,
            "up",
            1,
            0,
        )
        assert row["ttfb_ms"] is not None and row["duration_ms"] is not None
        assert 0 <= row["ttfb_ms"] <= row["duration_ms"]
        assert (
            row["input_tokens"],
            row["cache_read_tokens"],
            row["cache_write_tokens"],
            row["output_tokens"],
        ) == (1200, 3400, 56, 78)
        assert [a["outcome"] for a in attempts(row)] == ["ok"]
    assert st.mock("up").count() == REQUESTS
    # The streams overlapped: one after another they could not end before 100 × 80 ms of
    # pacing. (A logical bound, not a speed budget: speed is for benchmarks/.)
    assert elapsed < REQUESTS * 0.08
