"""Throughput at saturation of ``twserve serve --workers 1`` beside ``--workers 2``, in one run.

One fake upstream (``support/fakeupstream.py``), one Redis (``redis-server``: workers need
``state.redis_url``; both gateways get it, so they do the same work), and two gateways, each its
own process tree: one with one worker, one with two. Each round sends ``--requests`` short
unpaced streaming requests (20 SSE events, Anthropic passthrough) at concurrency
``--concurrency`` (64) over keep-alive connections to each gateway in turn, and to the
byte-copy proxy (``support/rawproxy.py``) as the floor. The client is this process (asyncio
protocols, uvloop when installed).

Per target it reports requests/s, the gateway's CPU per request (every process of its tree:
supervisor and workers, from /proc) and requests per gateway-CPU-second, with the client's and
the whole machine's CPU share over the phase, so that what the load generator and the upstream
take from the same cores is visible. Figures are medians over ``--runs`` rounds; the ratio
``--workers 2`` / ``--workers 1`` is given per round and as a median.

    python -m benchmarks.e2e.workers [--runs 3] [--requests 4000] [--concurrency 64] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.e2e.load import _uvloop_run, anthropic_request, fetch, load
from benchmarks.support.harness import SUPPORT, cpu_seconds, free_port, gateway_yaml, wait_port


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            total += cpu_seconds(p)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def machine_busy() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def config(upstream_port: int, port: int, redis_url: str, shed_ms: int = 0) -> str:
    """The gateway's config: one upstream, Redis, no access line, and loop-lag shedding at
    `shed_ms` (0, off, by default: at saturation the loop falls behind by design, and shedding
    would measure refusals instead of throughput)."""
    provider = (
        f"  - {{name: e20, protocol: anthropic, key: k, models: [e20],"
        f" base_url: 'http://127.0.0.1:{upstream_port}/e20'}}"
    )
    text = gateway_yaml(port, provider)
    text = text.replace(f"port: {port}}}", f"port: {port}, shed_loop_lag_ms: {shed_ms}}}")
    return text + f"state: {{redis_url: '{redis_url}'}}\nobservability: {{access_log: false}}\n"


def measure(
    port: int, pid: int, request: bytes, args: argparse.Namespace, others: dict[str, int]
) -> dict[str, float]:
    """One phase against one target; `pid` the top of its process tree. The single-threaded
    byte-copy proxy's CPU is read from ``schedstat`` (nanoseconds), a gateway tree's from
    ``stat``."""
    proxy = port == args.proxy_port
    cpu = (lambda: cpu_seconds(pid, fine=True)) if proxy else (lambda: tree_cpu(pid))
    before = cpu()
    others0 = {name: cpu_seconds(p, fine=True) for name, p in others.items()}
    busy0, client0 = machine_busy(), time.process_time()
    wall, ttfbs = _uvloop_run(load(port, request, args.requests, args.concurrency))
    used = cpu() - before
    busy1, client = machine_busy(), time.process_time() - client0
    shares = {
        f"{name}_cpu_share": (cpu_seconds(p, fine=True) - others0[name]) / wall
        for name, p in others.items()
    }
    return {
        "requests_per_s": args.requests / wall,
        "cpu_ms_per_request": used / args.requests * 1e3,
        "requests_per_cpu_s": args.requests / used if used else 0.0,
        "ttfb_p99_ms": sorted(ttfbs)[int(0.99 * len(ttfbs))] * 1e3,
        "client_cpu_share": client / wall,
        "target_cpu_share": used / wall,
        **shares,
        "machine_busy": (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4000, help="per target and round")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--shed-loop-lag-ms", type=int, default=0, help="the gateways' shed_loop_lag_ms (0: off)"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    redis = shutil.which("redis-server")
    if redis is None:
        sys.exit("redis-server is not installed (the workers need state.redis_url)")
    tmp = Path(tempfile.mkdtemp(prefix="twserve-workers-"))
    ports = {n: free_port() for n in ("redis", "upstream", "proxy", "workers=1", "workers=2")}
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    py, quiet = sys.executable, subprocess.DEVNULL
    commands = {
        "redis": [
            redis,
            "--port",
            str(ports["redis"]),
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp),
        ],
        "upstream": [py, str(SUPPORT / "fakeupstream.py"), "--port", str(ports["upstream"])],
        "proxy": [
            py,
            str(SUPPORT / "rawproxy.py"),
            "--port",
            str(ports["proxy"]),
            "--target",
            str(ports["upstream"]),
        ],
    }
    procs = {k: subprocess.Popen(c, stdout=quiet, cwd=tmp) for k, c in commands.items()}
    wait_port(ports["redis"], procs["redis"])
    for n in (1, 2):
        name = f"workers={n}"
        home = tmp / f"w{n}"
        home.mkdir()
        (home / "config.yaml").write_text(
            config(ports["upstream"], ports[name], redis_url, args.shed_loop_lag_ms)
        )
        cmd = [py, "-m", "twserve.cli.main", "serve", "--config", str(home / "config.yaml")]
        cmd += ["--data-dir", str(home), "--workers", str(n)]
        env = {**os.environ, "TWSERVE_HOME": str(home)}
        procs[name] = subprocess.Popen(cmd, env=env, stdout=quiet)
    args.proxy_port = ports["proxy"]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    figures: dict[str, list[dict[str, float]]] = {"proxy": [], "workers=1": [], "workers=2": []}
    try:
        for name, port in ports.items():
            wait_port(port, procs[name])
        requests = {}
        for name in figures:
            path = "/v1/messages" if name.startswith("workers") else "/e20/v1/messages"
            requests[name] = anthropic_request(ports[name], path, "e20")
            body = asyncio.run(fetch(ports[name], requests[name]))
            if body.count(b"data:") < 15:
                raise RuntimeError(f"{name}: {body[:500]!r}")
            _uvloop_run(load(ports[name], requests[name], 200, args.concurrency))  # warm up
        for round_ in range(args.runs):
            for name in figures:
                others = {k: procs[k].pid for k in ("upstream", "redis")}
                row = measure(ports[name], procs[name].pid, requests[name], args, others)
                figures[name].append(row)
            print(f"round {round_ + 1}/{args.runs} done", file=sys.stderr, flush=True)
    finally:
        # The gateways first, then what they use (Redis last: a gateway that loses it warns).
        order = ["workers=1", "workers=2", "proxy", "upstream", "redis"]
        for group in (order[:2], order[2:]):
            for name in group:
                if name in procs:
                    procs[name].terminate()
            for name in group:
                if name in procs:
                    try:
                        procs[name].wait(20)
                    except subprocess.TimeoutExpired:
                        procs[name].kill()
                        procs[name].wait()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    ratios = [
        b["requests_per_s"] / a["requests_per_s"]
        for a, b in zip(figures["workers=1"], figures["workers=2"], strict=True)
    ]
    cpu_ratios = [
        b["requests_per_cpu_s"] / a["requests_per_cpu_s"]
        for a, b in zip(figures["workers=1"], figures["workers=2"], strict=True)
        if a["requests_per_cpu_s"]
    ]
    med = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for name, rows in figures.items()
    }
    print(
        f"\n{args.requests} requests of 20 events per target and round, c={args.concurrency},"
        f" medians of {args.runs} rounds; {os.cpu_count()} cores;"
        f" load average before {' '.join(load_before)}, after {' '.join(load_after)}\n"
    )
    print("| | byte-copy proxy | --workers 1 | --workers 2 |\n|---|---|---|---|")
    rows = (
        ("requests/s", "requests_per_s", "{:,.0f}"),
        ("CPU per request of the target", "cpu_ms_per_request", "{:.3f} ms"),
        ("requests per CPU-second of the target", "requests_per_cpu_s", "{:,.0f}"),
        ("time to first byte p99", "ttfb_p99_ms", "{:.1f} ms"),
        ("target's CPU (cores)", "target_cpu_share", "{:.2f}"),
        ("client's CPU (cores)", "client_cpu_share", "{:.2f}"),
        ("upstream's CPU (cores)", "upstream_cpu_share", "{:.2f}"),
        ("Redis's CPU (cores)", "redis_cpu_share", "{:.2f}"),
        ("machine busy", "machine_busy", "{:.0%}"),
    )
    for label, key, fmt in rows:
        cells = [fmt.format(med[n][key]) for n in ("proxy", "workers=1", "workers=2")]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(
        f"\n--workers 2 / --workers 1: requests/s {statistics.median(ratios):.2f}×"
        f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); requests per gateway CPU-second"
        f" {statistics.median(cpu_ratios) if cpu_ratios else float('nan'):.2f}×"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "load_before": load_before,
                    "load_after": load_after,
                    "rounds": figures,
                    "medians": med,
                    "ratio_requests_per_s": ratios,
                    "ratio_requests_per_cpu_s": cpu_ratios,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
