"""Many concurrent streams over flaky and capped upstreams: every request is answered, every
row is written, and no slot is left held (docs/failover.md, docs/balancing.md)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpcore

from tests.twserve.support.stack import KEY, Upstream, running_stack
from twmock.script import ErrorSpec, MockSettings, Script

N = 150


def test_concurrent_streams_over_flaky_and_capped_upstreams(tmp_path: Path) -> None:
    ups = {
        "flaky": Upstream(
            "anthropic",
            MockSettings(
                script=Script(fail_rate=0.4, error=ErrorSpec(status=529), chunks=5), seed=3
            ),
        ),
        "capped": Upstream(
            "openai-chat",
            MockSettings(script=Script(chunks=5, chunk_delay=0.01)),
            extra={"max_concurrent": 3},
        ),
        "steady": Upstream("gemini", MockSettings(script=Script(chunks=5))),
    }
    config = {
        "groups": [
            {
                "name": "pool",
                "type": "load-balance",
                "providers": [
                    {"name": "flaky", "weight": 3},
                    {"name": "capped", "weight": 2},
                    "steady",
                ],
            }
        ],
        "routes": [{"name": "default", "rules": [{"name": "all", "to": "pool"}]}],
        "failover": {"wait_secs": 10, "failures_to_pause": 100},
    }
    with running_stack(tmp_path, ups, config=config) as st:
        body = json.dumps(
            {
                "model": "m",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        statuses: list[int] = []
        texts: list[bool] = []

        async def one(pool: httpcore.AsyncConnectionPool) -> None:
            resp = await pool.request(
                "POST",
                st.url + "/v1/chat/completions",
                headers=[(b"authorization", b"Bearer " + KEY.encode())],
                content=body,
            )
            statuses.append(resp.status)
            texts.append(b"data: [DONE]" in resp.content)

        async def burst() -> None:
            async with httpcore.AsyncConnectionPool(max_connections=64) as pool:
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for _ in range(N):
                            tg.start_soon(one, pool)

        anyio.run(burst)
        rows = st.wait_rows(N)
        slots = st.app.gateway.router.slots
        held = {name: slots.in_flight(name) for name in ups}
    assert statuses == [200] * N and all(texts)
    assert len(rows) == N and all(r["status"] == 200 for r in rows)
    assert held == {"flaky": 0, "capped": 0, "steady": 0}
    providers = {r["provider"] for r in rows}
    assert providers == {"flaky", "capped", "steady"}
    failed_over = [r for r in rows if len(json.loads(r["routing"])["attempts"]) > 1]
    assert failed_over  # the flaky member failed some, invisibly
