"""What ``store.commit_before_end`` adds to an answer's end, SQLite and PostgreSQL.

One gateway in this process (its own event loop thread) over a mock upstream, the client in
the main thread over one keep-alive connection. For each store and with the option off and on:

* one request at a time: the median and 95th percentile of the whole request (sent → its end
  read), streamed and whole answers;
* 32 at a time: requests/s, where waiting answers share the writer's commits;
* with the option on, the wait itself (the row handed to the store → its commit), timed inside
  the gateway: the latency the option adds to an answer's end, free of the client's noise.

PostgreSQL is a throwaway local cluster, the test suite's (``fsync=off``: a commit there costs
a round trip and the server's work, not a disk flush; SQLite's WAL with ``synchronous=NORMAL``
does not flush per commit either).

    python -m benchmarks.e2e.commit_wait_overhead [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpcore
from anyio.from_thread import start_blocking_portal

from tests.support.servers import start_postgres
from twengine.config import build_config
from twmock.script import MockSettings, parse_script
from twmock.serve.handler import make_handler
from twserve.app.wiring import GatewayApp
from twserve.server import listener
from twserve.store.sqlite import Commit

WAITS: list[float] = []
_wait = Commit.wait


async def timed_wait(self: Commit, timeout: float) -> bool:
    started = time.perf_counter()
    try:
        return await _wait(self, timeout)
    finally:
        WAITS.append(time.perf_counter() - started)


Commit.wait = timed_wait  # type: ignore[method-assign]

KEY = "bench-key"


def body(stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "claude-bench",
            "max_tokens": 16,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()


def one(pool: httpcore.ConnectionPool, url: str, payload: bytes) -> float:
    started = time.perf_counter()
    response = pool.request("POST", url, headers=[(b"x-api-key", KEY.encode())], content=payload)
    assert response.status == 200, response.content
    return time.perf_counter() - started


async def many(url: str, count: int) -> None:
    """`count` streamed requests, 32 at a time, from one event loop (not 32 threads)."""
    left = iter(range(count))
    async with httpcore.AsyncConnectionPool(max_connections=32) as pool:

        async def worker() -> None:
            for _ in left:
                response = await pool.request(
                    "POST", url, headers=[(b"x-api-key", KEY.encode())], content=body(True)
                )
                assert response.status == 200

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(worker)


def measure(store: dict[str, Any], requests: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, start_blocking_portal() as portal:
        mock = make_handler(MockSettings(script=parse_script({"chunks": 4})))
        mock_fut, mock_port = portal.start_task(partial(listener.serve, mock, port=0))
        config = {
            "version": 1,
            "clients": [{"name": "bench", "key": KEY}],
            "providers": [
                {
                    "name": "up",
                    "protocol": "anthropic",
                    "key": "k",
                    "base_url": f"http://127.0.0.1:{mock_port}",
                }
            ],
            "store": store,
        }
        app = GatewayApp(build_config(config, {}), Path(tmp), env={}, port=0)
        app_fut, bound = portal.start_task(app.run)
        url = f"http://127.0.0.1:{bound.gateway_port}/v1/messages"
        out: dict[str, float] = {}
        with httpcore.ConnectionPool(max_connections=32) as pool:
            for _ in range(20):
                one(pool, url, body(True))
            WAITS.clear()
            for kind, stream in (("stream", True), ("whole", False)):
                times = sorted(one(pool, url, body(stream)) for _ in range(requests))
                out[f"{kind}_p50_ms"] = statistics.median(times) * 1000
                out[f"{kind}_p95_ms"] = times[int(len(times) * 0.95)] * 1000
            _waits(out, "wait_1")
            started = time.perf_counter()
            anyio.run(many, url, requests * 2)
            out["rps_32"] = requests * 2 / (time.perf_counter() - started)
            _waits(out, "wait_32")
        app_fut.cancel()
        mock_fut.cancel()
        return out


def _waits(out: dict[str, float], name: str) -> None:
    if WAITS:
        waits = sorted(WAITS)
        out[f"{name}_p50_ms"] = statistics.median(waits) * 1000
        out[f"{name}_p95_ms"] = waits[int(len(waits) * 0.95)] * 1000
    WAITS.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with ExitStack() as exits:
        server = exits.enter_context(start_postgres())
        rows = []
        for name, base in (("sqlite", {}), ("postgresql", {"postgres_dsn": server.dsn})):
            for on in (False, True):
                figures = measure({**base, "commit_before_end": on}, args.requests)
                rows.append((name, on, figures))
                print(name, "on" if on else "off", {k: round(v, 2) for k, v in figures.items()})
    print()
    print(
        "| store | commit_before_end | stream p50 / p95 | whole p50 / p95 | req/s at 32 "
        "| end's wait, 1 at a time, p50 / p95 | end's wait, 32 at a time, p50 / p95 |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, on, f in rows:
        waits = ["—", "—"]
        if on:
            waits = list(
                f"{f[n + '_p50_ms']:.2f} / {f[n + '_p95_ms']:.2f} ms" for n in ("wait_1", "wait_32")
            )
        print(
            f"| {name} | {'on' if on else 'off'} "
            f"| {f['stream_p50_ms']:.2f} / {f['stream_p95_ms']:.2f} ms "
            f"| {f['whole_p50_ms']:.2f} / {f['whole_p95_ms']:.2f} ms | {f['rps_32']:.0f} "
            f"| {waits[0]} | {waits[1]} |"
        )


if __name__ == "__main__":
    main()
