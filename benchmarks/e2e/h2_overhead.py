"""Per-request overhead of HTTP/2 (h2c) against HTTP/1.1 between a client and the gateway.

The gateway and a mock upstream run in processes of their own on loopback; the gateway talks
HTTP/1.1 to the mock either way (h2c with `--upstream-h2`), so only the client side's transport
differs. Measured in one
run, alternating the two transports so that drift in the machine's load hits both:

* sequential: short streamed answers one after another on one kept-alive connection (HTTP/1.1)
  or one HTTP/2 connection: wall time and gateway CPU time per request;
* concurrent: the same answers, `--concurrency` at a time: HTTP/1.1 over that many connections,
  HTTP/2 multiplexed on one. Requests/s and gateway CPU per request.

Reported as medians over `--runs`, with the ratio h2 ÷ HTTP/1.1 (below 1: HTTP/2 is cheaper).
Machines are noisy: read the ratios.

    python -m benchmarks.e2e.h2_overhead [--requests 200] [--runs 5] [--concurrency 32]
        [--upstream-h2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import time

import anyio
import httpcore

from benchmarks.support.harness import (
    KEY,
    cpu_seconds,
    gateway_yaml,
    medians,
    mock_and_gateway,
    ratio,
    report,
)


def config(mock_port: int, port: int, upstream_h2: bool) -> str:
    return gateway_yaml(
        port,
        f"""  - name: up
    protocol: anthropic
    base_url: 'http://127.0.0.1:{mock_port}'
    key: k
    http2: {"true" if upstream_h2 else "false"}
""",
    )


BODY = json.dumps(
    {
        "model": "bench",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "benchmark"}],
    }
).encode()
HEADERS = [
    (b"x-api-key", KEY.encode()),
    (b"anthropic-version", b"2023-06-01"),
    (b"content-type", b"application/json"),
]


def pool(h2: bool, connections: int) -> httpcore.AsyncConnectionPool:
    if h2:
        return httpcore.AsyncConnectionPool(http1=False, http2=True, max_connections=1)
    return httpcore.AsyncConnectionPool(max_connections=connections)


async def one(p: httpcore.AsyncConnectionPool, url: str) -> None:
    async with p.stream("POST", url, headers=HEADERS, content=BODY) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.aread()!r}")
        async for _ in resp.aiter_stream():
            pass


async def sequential(url: str, h2: bool, n: int) -> float:
    """Seconds per request, one after another on one connection."""
    async with pool(h2, 1) as p:
        await one(p, url)  # the connection is open before the clock starts
        start = time.perf_counter()
        for _ in range(n):
            await one(p, url)
        return (time.perf_counter() - start) / n


async def concurrent(url: str, h2: bool, n: int, conc: int) -> float:
    """Requests per second, `conc` at a time."""
    remaining = n
    async with pool(h2, conc) as p:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(p, url)

        async with anyio.create_task_group() as tg:  # open the connections first
            for _ in range(conc):
                tg.start_soon(one, p, url)
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(conc):
                tg.start_soon(worker)
        return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=20, help="chunks per answer")
    ap.add_argument(
        "--upstream-h2", action="store_true", help="the gateway talks h2c to the mock as well"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    script = json.dumps({"chunks": args.chunks, "chunk_size": 8})
    seq: dict[str, list[float]] = {"http1": [], "h2": []}
    seq_cpu: dict[str, list[float]] = {"http1": [], "h2": []}
    rps: dict[str, list[float]] = {"http1": [], "h2": []}
    rps_cpu: dict[str, list[float]] = {"http1": [], "h2": []}
    with mock_and_gateway(
        lambda mock_port, port: config(mock_port, port, args.upstream_h2),
        ["--script", script],
        prefix="twserve-h2-bench-",
    ) as served:
        url = f"http://127.0.0.1:{served.gateway_port}/v1/messages"
        pid = served.gateway_pid
        for h2 in (False, True):  # warm up both paths
            anyio.run(sequential, url, h2, 20)
        for _ in range(args.runs):
            for name, h2 in (("http1", False), ("h2", True)):
                before = cpu_seconds(pid)
                seq[name].append(anyio.run(sequential, url, h2, args.requests) * 1e3)
                seq_cpu[name].append((cpu_seconds(pid) - before) / args.requests * 1e3)
                before = cpu_seconds(pid)
                rps[name].append(anyio.run(concurrent, url, h2, args.requests, args.concurrency))
                rps_cpu[name].append((cpu_seconds(pid) - before) / args.requests * 1e3)

    figures: dict[str, object] = {
        "chunks_per_answer": args.chunks,
        "upstream": "h2c" if args.upstream_h2 else "http/1.1",
        "sequential_ms_per_request": medians(seq),
        "sequential_gateway_cpu_ms_per_request": medians(seq_cpu),
        f"rps_concurrency_{args.concurrency}": medians(rps),
        "concurrent_gateway_cpu_ms_per_request": medians(rps_cpu),
    }
    figures["ratio_h2_to_http1"] = {
        "sequential_ms": ratio(seq, "h2", "http1"),
        "sequential_cpu": ratio(seq_cpu, "h2", "http1"),
        "rps": ratio(rps, "h2", "http1"),
        "concurrent_cpu": ratio(rps_cpu, "h2", "http1"),
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
