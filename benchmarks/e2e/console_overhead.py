"""What the operator console costs the gateway per request, end to end on loopback
(docs/console.md, "What it costs").

Two gateways in their own processes serve the same mock upstream with the same config but for
one thing: ``plain`` has no control listener (no console at all), ``console`` has one (the page
at /ui/ is served there). The same short streamed requests go to each, alternating runs; every
other run of ``console`` has one ``/events`` subscriber reading the stream — what an open
Traffic page holds. The gateway processes' CPU time is read from /proc. Reported: CPU ms per
request (median of the runs) of ``plain``, of ``console`` with nobody watching, and of
``console`` with the page open, and each one's difference from ``plain`` in %.

    python -m benchmarks.e2e.console_overhead [--requests 400] [--runs 4] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import anyio
import httpcore

from benchmarks.e2e.e2e_overhead import concurrent
from benchmarks.support.harness import KEY, cpu_seconds, free_port, wait_port

CONTROL_KEY = "bench-control-key-0123456789"


def config(mock_port: int, port: int, control_port: int | None) -> str:
    control = (
        f"  control: {{bind: 127.0.0.1, port: {control_port}, key: {CONTROL_KEY}}}\n"
        if control_port is not None
        else ""
    )
    return f"""version: 1
listen:
  gateway: {{bind: 127.0.0.1, port: {port}}}
{control}clients:
  - name: bench
    key: {KEY}
providers:
  - {{name: up, protocol: anthropic, base_url: 'http://127.0.0.1:{mock_port}/rps', key: k}}
"""


class Subscriber:
    """One reader of ``GET /events`` in a thread, as the console page holds it; counts the
    events it read."""

    def __init__(self, control_port: int) -> None:
        self.url = f"http://127.0.0.1:{control_port}/events"
        self.events = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        headers = [(b"authorization", b"Bearer " + CONTROL_KEY.encode())]
        try:
            with (
                httpcore.ConnectionPool() as pool,
                pool.stream("GET", self.url, headers=headers) as r,
            ):
                for piece in r.iter_stream():
                    self.events += piece.count(b"\nid: ")
                    if self.stop.is_set():
                        return
        except httpcore.RemoteProtocolError:
            return  # the gateway stopped at the end of the benchmark

    def __enter__(self) -> Subscriber:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="twserve-console-bench-"))
    mock_port = free_port()
    ports = {"plain": free_port(), "console": free_port()}
    control_port = free_port()
    py = sys.executable
    procs = {
        "mock": subprocess.Popen(
            [
                *(py, "-m", "twserve.cli.main", "mock-upstream", "--port", str(mock_port)),
                "--profile",
                "rps=" + json.dumps({"chunks": args.chunks, "chunk_size": 8}),
            ],
            stdout=subprocess.DEVNULL,
        )
    }
    for name, port in ports.items():
        home = tmp / name
        home.mkdir()
        cfg = home / "config.yaml"
        cfg.write_text(config(mock_port, port, control_port if name == "console" else None))
        procs[name] = subprocess.Popen(
            [py, "-m", "twserve.cli.main", "serve", "--config", str(cfg), "--data-dir", str(home)],
            env={**os.environ, "TWSERVE_HOME": str(home)},
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
    cpu: dict[str, list[float]] = {"plain": [], "console closed": [], "console open": []}
    seen = 0

    def run(name: str, port: int) -> float:
        pid = procs[name].pid
        before = cpu_seconds(pid)
        anyio.run(concurrent, port, "/v1/messages", headers, body, args.requests, args.concurrency)
        return (cpu_seconds(pid) - before) / args.requests * 1000

    try:
        for port in (mock_port, *ports.values(), control_port):
            wait_port(port)
        for port in ports.values():  # warm up
            anyio.run(concurrent, port, "/v1/messages", headers, body, 50, args.concurrency)
        for _ in range(args.runs):
            cpu["plain"].append(run("plain", ports["plain"]))
            cpu["console closed"].append(run("console", ports["console"]))
            with Subscriber(control_port) as sub:
                cpu["console open"].append(run("console", ports["console"]))
                anyio.run(anyio.sleep, 0.2)
            seen += sub.events
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
        "extra_percent": {
            name: (value / med["plain"] - 1) * 100 for name, value in med.items() if name != "plain"
        },
        "events_read_by_the_open_page": seen,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
