"""End-to-end overhead on loopback: the gateway against a raw byte-copy proxy and a direct call.

Three paths to the same mock upstream, measured side by side in one run:

    direct   client → mock
    raw      client → rawproxy (copies bytes, parses nothing) → mock
    gateway  client → twserve → mock

Each proxy runs in its own process so its CPU time can be read from /proc. Reported, as the
median of several runs:

* CPU time per 1,000 streamed chunks of each proxy, and the gateway's ratio to the raw proxy;
* time to first byte of each path, and the gateway's ratio to the raw proxy's;
* requests/s at concurrency 32 and the peak RSS of each proxy.

Machines are noisy: compare the ratios, not the absolute numbers.

    python -m benchmarks.e2e.e2e_overhead [--chunks 1000] [--requests 20] [--runs 5]
        [--mode passthrough|convert|routing]

``convert`` sends Chat Completions requests to an Anthropic-format upstream (both directions
converted); ``routing`` puts a load-balance group of three mock upstreams behind a route.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpcore

from benchmarks.support.harness import (
    KEY,
    SUPPORT,
    cpu_seconds,
    free_port,
    gateway_yaml,
    memory_kib,
    wait_port,
)


def gateway_config(mock_port: int, port: int, mode: str) -> str:
    """Two upstream sets on one mock: ``bench`` answers the long streams, ``bench-rps`` (the
    mock's ``rps`` profile) the short ones of the requests/s phase; the model picks."""
    lines = []
    for model, prefix in (("bench", "/long"), ("bench-rps", "/rps")):
        base = f"http://127.0.0.1:{mock_port}{prefix}"
        count = 3 if mode == "routing" else 1
        for i in range(count):
            lines.append(
                f"  - {{name: {model}-{i}, protocol: anthropic, base_url: '{base}', key: k,"
                f" models: [{model}]}}"
            )
    extra = ""
    if mode == "routing":
        extra = """
groups:
  - name: pool
    type: load-balance
    providers: [{name: bench-0, weight: 5}, {name: bench-1, weight: 3}, bench-2]
  - name: pool-rps
    type: load-balance
    providers: [{name: bench-rps-0, weight: 5}, {name: bench-rps-1, weight: 3}, bench-rps-2]
routes:
  - name: default
    rules:
      - {name: long, when: {model: bench}, to: pool}
      - {name: short, when: {model: bench-rps}, to: pool-rps}
"""
    return gateway_yaml(port, "\n".join(lines)) + extra


def request_for(mode: str, model: str) -> tuple[str, list[tuple[bytes, bytes]], bytes]:
    """The client's request: Chat Completions in ``convert`` mode, else Anthropic Messages.

    Direct and raw-proxy calls reach the mock's profile through the path (``/long``,
    ``/rps``); through the gateway the model chooses the upstream that carries that path.
    """
    messages = [{"role": "user", "content": "benchmark"}]
    if mode == "convert":
        body: dict[str, object] = {"model": model, "stream": True, "messages": messages}
        headers = [(b"authorization", b"Bearer " + KEY.encode())]
        path = "/v1/chat/completions"
    else:
        body = {"model": model, "max_tokens": 4096, "stream": True, "messages": messages}
        headers = [(b"x-api-key", KEY.encode()), (b"anthropic-version", b"2023-06-01")]
        path = "/v1/messages"
    headers.append((b"content-type", b"application/json"))
    return path, headers, json.dumps(body).encode()


def direct_request(model: str) -> tuple[str, list[tuple[bytes, bytes]], bytes]:
    path, headers, body = request_for("passthrough", model)
    prefix = "/long" if model == "bench" else "/rps"
    return prefix + path, headers, body


async def one(
    pool: httpcore.AsyncConnectionPool, url: str, headers: Any, body: bytes
) -> tuple[float, float]:
    start = time.perf_counter()
    first = 0.0
    async with pool.stream("POST", url, headers=headers, content=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.aread()!r}")
        async for chunk in resp.aiter_stream():
            if chunk and not first:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def sequential(port: int, path: str, headers: Any, body: bytes, n: int) -> list[float]:
    url = f"http://127.0.0.1:{port}{path}"
    ttfbs = []
    async with httpcore.AsyncConnectionPool() as pool:
        for _ in range(n):
            ttfb, _total = await one(pool, url, headers, body)
            ttfbs.append(ttfb)
    return ttfbs


async def concurrent(
    port: int, path: str, headers: Any, body: bytes, total: int, conc: int
) -> float:
    url = f"http://127.0.0.1:{port}{path}"
    remaining = total
    async with httpcore.AsyncConnectionPool(max_connections=conc) as pool:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(pool, url, headers, body)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(conc):
                tg.start_soon(worker)
        return total / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--concurrent-requests", type=int, default=640)
    ap.add_argument(
        "--rps-chunks", type=int, default=20, help="chunks per answer in the requests/s phase"
    )
    ap.add_argument("--mode", choices=["passthrough", "convert", "routing"], default="passthrough")
    ap.add_argument(
        "--chunk-delay",
        type=float,
        default=0.001,
        help="seconds between chunks; 0 lets TCP coalesce chunks, which favours the raw proxy",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="twserve-bench-"))
    mock_port, raw_port, gw_port = free_port(), free_port(), free_port()
    cfg = tmp / "config.yaml"
    cfg.write_text(gateway_config(mock_port, gw_port, args.mode))
    env = {**os.environ, "TWSERVE_HOME": str(tmp)}
    py = sys.executable
    procs = {
        "mock": subprocess.Popen(
            [
                *(py, "-m", "twserve.cli.main", "mock-upstream", "--port", str(mock_port)),
                "--profile",
                "long="
                + json.dumps(
                    {"chunks": args.chunks, "chunk_size": 8, "chunk_delay": args.chunk_delay}
                ),
                "--profile",
                "rps=" + json.dumps({"chunks": args.rps_chunks, "chunk_size": 8}),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        ),
        "raw": subprocess.Popen(
            [
                py,
                str(SUPPORT / "rawproxy.py"),
                "--port",
                str(raw_port),
                "--target",
                str(mock_port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        ),
        "gateway": subprocess.Popen(
            [py, "-m", "twserve.cli.main", "serve", "--config", str(cfg), "--data-dir", str(tmp)],
            env=env,
            stdout=subprocess.DEVNULL,
        ),
    }
    try:
        for port in (mock_port, raw_port, gw_port):
            wait_port(port)
        path, headers, body = request_for(args.mode, "bench")
        up_path, up_headers, up_body = direct_request("bench")
        targets = {
            "direct": (mock_port, up_path, up_headers, up_body, None),
            "raw": (raw_port, up_path, up_headers, up_body, procs["raw"].pid),
            "gateway": (gw_port, path, headers, body, procs["gateway"].pid),
        }
        for port, p, h, b, _ in targets.values():  # warm up connections and code paths
            anyio.run(sequential, port, p, h, b, 5)
        cpu: dict[str, list[float]] = {k: [] for k in targets}
        ttfb: dict[str, list[float]] = {k: [] for k in targets}
        for _ in range(args.runs):
            for name, (port, p, h, b, pid) in targets.items():
                before = cpu_seconds(pid, fine=name == "raw") if pid else 0.0
                t = anyio.run(sequential, port, p, h, b, args.requests)
                chunks_sent = args.requests * args.chunks
                if pid:  # CPU milliseconds per 1,000 chunks
                    cpu[name].append(
                        (cpu_seconds(pid, fine=name == "raw") - before) / chunks_sent * 1_000_000
                    )
                ttfb[name].append(statistics.median(t) * 1000)
        small = request_for(args.mode, "bench-rps")
        small_up = direct_request("bench-rps")
        rps = {}
        cpu_per_request: dict[str, float] = {}
        for name, (port, *_rest, pid) in targets.items():
            p, h, b = small if name == "gateway" else small_up
            before = cpu_seconds(pid, fine=name == "raw") if pid else 0.0
            rps[name] = anyio.run(concurrent, port, p, h, b, args.concurrent_requests, 32)
            if pid:  # CPU milliseconds per request (short answers, concurrency 32)
                cpu_per_request[name] = (
                    (cpu_seconds(pid, fine=name == "raw") - before) / args.concurrent_requests * 1e3
                )
        med = {k: statistics.median(v) for k, v in cpu.items() if v}
        tt = {k: statistics.median(v) for k, v in ttfb.items()}
        figures = {
            "mode": args.mode,
            "chunks_per_request": args.chunks,
            "chunk_delay_s": args.chunk_delay,
            "cpu_ms_per_1000_chunks": med,
            "cpu_ratio_gateway_to_raw": med["gateway"] / med["raw"],
            "ttfb_ms": tt,
            "ttfb_ratio_gateway_to_raw": tt["gateway"] / tt["raw"],
            "ttfb_added_ms_vs_direct": tt["gateway"] - tt["direct"],
            "cpu_ms_per_request": cpu_per_request,
            "rps_concurrency_32": rps,
            "rps_ratio_gateway_to_raw": rps["gateway"] / rps["raw"],
            "peak_rss_kib": {
                "raw": memory_kib(procs["raw"].pid)["VmHWM"],
                "gateway": memory_kib(procs["gateway"].pid)["VmHWM"],
            },
        }
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(10)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
