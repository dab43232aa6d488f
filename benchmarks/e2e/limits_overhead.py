"""Key limit accounting's CPU cost per request, end to end on loopback (docs/limits-and-costs.md).

Two gateways in their own processes serve the same mock upstream with the same config but for
one thing: the key of ``limited`` has four limits (requests per minute, tokens per hour, cost
per day, tokens per month — set high enough never to refuse), the key of ``plain`` none. Both
price every row (cost is on for everybody); the difference is the limits' admit, reservation
and settling. The same short streamed requests go to each, alternating runs; the gateway
processes' CPU time is read from /proc. Reported: CPU ms per request of each (median of the
runs) and the limited one's extra in %.

    python -m benchmarks.e2e.limits_overhead [--requests 400] [--runs 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

from benchmarks.e2e.e2e_overhead import concurrent
from benchmarks.support.harness import KEY, cpu_seconds, free_port, wait_port

LIMITS = """
    limits:
      - {per: minute, requests: 1000000}
      - {per: hour, tokens: 1000000000}
      - {per: day, cost: 1000000}
      - {per: month, tokens: 1000000000, cache_reads: true}"""


def config(mock_port: int, port: int, limited: bool) -> str:
    return f"""version: 1
listen:
  gateway: {{bind: 127.0.0.1, port: {port}}}
clients:
  - name: bench
    key: {KEY}{LIMITS if limited else ""}
providers:
  - {{name: up, protocol: anthropic, base_url: 'http://127.0.0.1:{mock_port}/rps', key: k}}
retention:
  row_days: 31
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="twserve-limits-bench-"))
    mock_port = free_port()
    ports = {"plain": free_port(), "limited": free_port()}
    env = {**os.environ}
    py = sys.executable
    procs = {
        "mock": subprocess.Popen(
            [
                *(py, "-m", "twserve.cli.main", "mock-upstream", "--port", str(mock_port)),
                "--profile",
                "rps=" + json.dumps({"chunks": args.chunks, "chunk_size": 8}),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
    }
    for name, port in ports.items():
        home = tmp / name
        home.mkdir()
        cfg = home / "config.yaml"
        cfg.write_text(config(mock_port, port, name == "limited"))
        procs[name] = subprocess.Popen(
            [py, "-m", "twserve.cli.main", "serve", "--config", str(cfg), "--data-dir", str(home)],
            env={**env, "TWSERVE_HOME": str(home)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    body = json.dumps(
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "benchmark"}],
        }
    ).encode()
    headers = [
        (b"x-api-key", KEY.encode()),
        (b"anthropic-version", b"2023-06-01"),
        (b"content-type", b"application/json"),
    ]
    cpu: dict[str, list[float]] = {name: [] for name in ports}
    try:
        for port in (mock_port, *ports.values()):
            wait_port(port)
        for port in ports.values():  # warm up
            anyio.run(concurrent, port, "/v1/messages", headers, body, 50, args.concurrency)
        for _ in range(args.runs):
            for name, port in ports.items():
                pid = procs[name].pid
                before = cpu_seconds(pid)
                anyio.run(
                    concurrent, port, "/v1/messages", headers, body, args.requests, args.concurrency
                )
                cpu[name].append((cpu_seconds(pid) - before) / args.requests * 1000)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(10)
    med = {name: statistics.median(values) for name, values in cpu.items()}
    figures = {
        "requests_per_run": args.requests,
        "runs": args.runs,
        "cpu_ms_per_request": med,
        "cpu_ms_per_request_runs": cpu,
        "limits_extra_percent": (med["limited"] / med["plain"] - 1) * 100,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
