"""The gateway under streaming load, side by side with a byte-copy proxy and a direct call.

One run measures, against one fake upstream (`support/fakeupstream.py`: each SSE event its own
write):

    direct              client → upstream
    byte-copy proxy     client → support/rawproxy.py (copies bytes, parses nothing) → upstream
    passthrough         Anthropic client → ``twserve serve`` → Anthropic upstream
    convert             OpenAI Chat client → ``twserve serve`` → Anthropic upstream

with the upstream writing its events back to back ("unpaced") and ``--pace`` seconds apart
("paced"). Each proxy is its own process; CPU is read from ``/proc/<pid>/stat`` of that
process only (the gateway's store thread included, the client and upstream excluded).
Per target and round, three phases:

* 200-event streams at concurrency 16: CPU per 1,000 chunks and per request;
* 20-event streams at concurrency 32, then 64: requests/s, CPU per request and the time to
  first byte's p99 under that load;
* 20-event streams one at a time: time to first byte, p50 and p99.

The targets alternate within each round; figures are medians over ``--runs`` rounds, with the
spread (min–max of the ratio to the byte-copy proxy) printed so the noise is visible. The
client is plain asyncio protocols (uvloop when installed) in this process.

    python -m benchmarks.e2e.load [--runs 3] [--pacing unpaced,paced] [--baseline-root DIR]

``--baseline-root`` also runs a gateway from another checkout (``PYTHONPATH``: its root, and its
``libs/twproto`` and ``libs/twengine`` when it has them) for a before/after comparison in one run
of the same harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.support.harness import (
    KEY,
    SUPPORT,
    cpu_seconds,
    free_port,
    gateway_yaml,
    memory_kib,
    wait_port,
)

LONG, SHORT = 200, 20  # SSE events per answer


def gateway_config(upstream_port: int, port: int) -> str:
    """One upstream per stream shape; the model picks it (``e200``, ``e20p``, ...)."""
    lines = [
        f"  - {{name: {shape}, protocol: anthropic, key: k, models: [{shape}],"
        f" base_url: 'http://127.0.0.1:{upstream_port}/{shape}'}}"
        for shape in (f"e{LONG}", f"e{SHORT}", f"e{LONG}p", f"e{SHORT}p")
    ]
    return gateway_yaml(port, "\n".join(lines))


def request_bytes(port: int, path: str, headers: dict[str, str], body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(data)}", "", ""]
    return "\r\n".join(lines).encode() + data


def anthropic_request(port: int, path: str, model: str) -> bytes:
    body = {
        "model": model,
        "max_tokens": 1024,
        "stream": True,
        "messages": [{"role": "user", "content": "benchmark"}],
    }
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    return request_bytes(port, path, headers, body)


def chat_request(port: int, model: str) -> bytes:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "benchmark"}]}
    headers = {"authorization": f"Bearer {KEY}"}
    return request_bytes(port, "/v1/chat/completions", headers, body)


class _Client(asyncio.Protocol):
    """One keep-alive connection that sends one request at a time and reads a chunked (or
    sized) response to its end without parsing the body."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[float] | None = None
        self.closed = False
        self.keep: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def send(self, request: bytes, keep: bool = False) -> asyncio.Future[float]:
        self.done = asyncio.get_running_loop().create_future()
        self.first = 0.0
        self.head: bytes | None = None
        self.pending = b""
        self.tail = b""
        self.remaining = -1
        self.keep = [] if keep else None
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()
        if self.head is None:
            self.pending += data
            end = self.pending.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head = self.pending[:end].lower()
            data = self.pending[end + 4 :]
            if not self.head.startswith(b"http/1.1 200"):
                self._finish(RuntimeError(f"HTTP {self.head[:200]!r} {data[:300]!r}"))
                return
            if b"transfer-encoding: chunked" not in self.head:
                for line in self.head.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        self.remaining = int(line.split(b":")[1])
        if self.keep is not None:
            self.keep.append(data)
        if self.remaining >= 0:
            self.remaining -= len(data)
            if self.remaining <= 0:
                self._finish(None)
            return
        # The body is never parsed: a chunked body ends with the zero-size chunk, and no
        # SSE event of these streams holds a bare CR.
        self.tail = (self.tail + data)[-7:]
        if self.tail == b"\r\n0\r\n\r\n":
            self._finish(None)

    def _finish(self, error: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            if error is None:
                self.done.set_result(self.first)
            else:
                self.done.set_exception(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(ConnectionError(f"connection closed before the response ended: {exc}"))


async def _connect(port: int) -> _Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(_Client, "127.0.0.1", port)
    return client


async def load(
    port: int, request: bytes, total: int, concurrency: int
) -> tuple[float, list[float]]:
    """`total` requests over `concurrency` keep-alive connections; wall seconds and TTFBs."""
    remaining = total
    ttfbs: list[float] = []

    async def worker() -> None:
        nonlocal remaining
        client = await _connect(port)
        try:
            while remaining > 0:
                remaining -= 1
                if client.closed:
                    client = await _connect(port)
                start = time.perf_counter()
                # A stuck answer fails the run rather than hanging it.
                first = await asyncio.wait_for(client.send(request), 60)
                ttfbs.append(first - start)
        finally:
            assert client.transport is not None
            client.transport.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, ttfbs


async def fetch(port: int, request: bytes) -> bytes:
    client = await _connect(port)
    try:
        await client.send(request, keep=True)
        assert client.keep is not None
        return b"".join(client.keep)
    finally:
        assert client.transport is not None
        client.transport.close()


@dataclass(slots=True)
class Target:
    name: str
    port: int
    pid: int | None
    requests: dict[str, bytes]  # stream shape (``e200``, ``e20p``) → request bytes
    figures: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, pacing: str, name: str, value: float) -> None:
        self.figures.setdefault(pacing, {}).setdefault(name, []).append(value)


def measure(target: Target, pacing: str, args: argparse.Namespace) -> None:
    suffix = "p" if pacing == "paced" else ""
    pid, fine = target.pid, target.name == "raw"
    cpu = (lambda: cpu_seconds(pid, fine=fine)) if pid else (lambda: 0.0)
    run = asyncio.run if args.no_uvloop else _uvloop_run

    long_request = target.requests[f"e{LONG}{suffix}"]
    before = cpu()
    run(load(target.port, long_request, args.long_requests, 16))
    used = cpu() - before
    target.add(pacing, "cpu_ms_per_1000_chunks", used / (args.long_requests * LONG) * 1e6)
    target.add(pacing, "cpu_ms_per_long_request", used / args.long_requests * 1e3)

    short_request = target.requests[f"e{SHORT}{suffix}"]
    for concurrency in (32, 64):
        before = cpu()
        wall, loaded = run(load(target.port, short_request, args.short_requests, concurrency))
        used = cpu() - before
        target.add(pacing, f"requests_per_s_c{concurrency}", args.short_requests / wall)
        key = "cpu_ms_per_short_request" + ("" if concurrency == 32 else "_c64")
        target.add(pacing, key, used / args.short_requests * 1e3)
        target.add(pacing, f"ttfb_p99_ms_c{concurrency}", p99(loaded) * 1e3)

    _, ttfbs = run(load(target.port, short_request, args.ttfb_requests, 1))
    target.add(pacing, "ttfb_p50_ms", statistics.median(ttfbs) * 1e3)
    target.add(pacing, "ttfb_p99_ms", p99(ttfbs) * 1e3)


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank): the largest of fewer than 100 values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _uvloop_run(coro):  # type: ignore[no-untyped-def]
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


ROWS = (
    ("CPU per 1,000 streamed chunks", "cpu_ms_per_1000_chunks", "ms"),
    (f"CPU per request ({LONG} chunks, c=16)", "cpu_ms_per_long_request", "ms"),
    (f"CPU per request ({SHORT} chunks, c=32)", "cpu_ms_per_short_request", "ms"),
    (f"CPU per request ({SHORT} chunks, c=64)", "cpu_ms_per_short_request_c64", "ms"),
    (f"requests/s, c=32, {SHORT} chunks", "requests_per_s_c32", ""),
    (f"requests/s, c=64, {SHORT} chunks", "requests_per_s_c64", ""),
    ("time to first byte p99, c=32", "ttfb_p99_ms_c32", "ms"),
    ("time to first byte p99, c=64", "ttfb_p99_ms_c64", "ms"),
    ("added time to first byte p50 vs direct", "ttfb_added_ms", "ms"),
    ("added time to first byte p99 vs direct", "ttfb_added_p99_ms", "ms"),
)


def summarise(targets: list[Target], pacing: str) -> dict[str, dict[str, float]]:
    """Medians per figure, ratios to the byte-copy proxy (median and spread over the runs)."""
    by_name = {t.name: t.figures[pacing] for t in targets}
    direct_ttfb = by_name["direct"]["ttfb_p50_ms"]
    out: dict[str, dict[str, float]] = {}
    for name, figs in by_name.items():
        pairs = zip(figs["ttfb_p50_ms"], direct_ttfb, strict=True)
        figs["ttfb_added_ms"] = [t - d for t, d in pairs]
        pairs = zip(figs["ttfb_p99_ms"], by_name["direct"]["ttfb_p99_ms"], strict=True)
        figs["ttfb_added_p99_ms"] = [t - d for t, d in pairs]
        row = {k: statistics.median(v) for k, v in figs.items()}
        if name not in ("direct", "raw"):
            raw = by_name["raw"]
            keys = ("cpu_ms_per_1000_chunks", "cpu_ms_per_short_request", "requests_per_s_c32")
            for key in (*keys, "cpu_ms_per_short_request_c64", "requests_per_s_c64"):
                ratios = [a / b for a, b in zip(figs[key], raw[key], strict=True) if b]
                if ratios:
                    row[key + "_ratio"] = statistics.median(ratios)
                    row[key + "_ratio_min"] = min(ratios)
                    row[key + "_ratio_max"] = max(ratios)
        out[name] = row
    return out


def table(summary: dict[str, dict[str, float]], memory: dict[str, dict[str, int]]) -> str:
    names = [n for n in summary if n != "direct"]
    titles = {"raw": "byte-copy proxy"}
    lines = [
        "| | " + " | ".join(titles.get(n, n) for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, key, unit in ROWS:
        cells = []
        for n in names:
            row = summary[n]
            value = row.get(key)
            text = (
                "–" if value is None else (f"{value:,.0f}" if not unit else f"{value:.3g} {unit}")
            )
            ratio = row.get(key + "_ratio")
            if ratio is not None:
                lo, hi = row[key + "_ratio_min"], row[key + "_ratio_max"]
                text += f" ({ratio:.3g}×, {lo:.3g}–{hi:.3g})"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    rss = [f"{memory[n]['VmHWM'] / 1024:.0f} MB" if n in memory else "–" for n in names]
    lines.append("| peak RSS | " + " | ".join(rss) + " |")
    return "\n".join(lines)


def baseline_path(root: Path) -> str:
    """The PYTHONPATH that runs the gateway of the checkout at `root`: the root, and the
    libraries' own folders when they are distributions of their own (else this venv's editable
    twproto and twengine would be imported beside that checkout's twserve)."""
    root = root.resolve()
    libs = [root / "libs" / name for name in ("twproto", "twengine")]
    return os.pathsep.join(str(p) for p in [root, *libs] if p == root or p.is_dir())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pacing", default="unpaced,paced")
    ap.add_argument("--pace", type=float, default=0.001, help="seconds between paced events")
    ap.add_argument("--long-requests", type=int, default=160)
    ap.add_argument("--short-requests", type=int, default=640)
    ap.add_argument("--ttfb-requests", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=32, help="long requests per target before timing")
    ap.add_argument("--modes", default="passthrough,convert")
    ap.add_argument(
        "--baseline-root",
        help="also run a second gateway from this checkout (PYTHONPATH), as targets "
        "'passthrough@base' and 'convert@base', alternated with the first in the same run",
    )
    ap.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for the second gateway only (e.g. TWSERVE_EVENT_LOOP=asyncio)",
    )
    ap.add_argument("--gateway-wrap", default="", help="prefix the gateway's command (profilers)")
    ap.add_argument("--no-uvloop", action="store_true", help="the client on the stdlib loop")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if min(args.long_requests, args.short_requests, args.ttfb_requests) < 1:
        ap.error("each phase needs at least one request")
    pacings = [p for p in args.pacing.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]

    tmp = Path(tempfile.mkdtemp(prefix="twserve-load-"))
    up_port, raw_port = free_port(), free_port()
    env = {**os.environ, "TWSERVE_HOME": str(tmp)}
    py = sys.executable
    quiet = subprocess.DEVNULL
    upstream_cmd = [py, str(SUPPORT / "fakeupstream.py"), "--port", str(up_port)]
    upstream_cmd += ["--pace", str(args.pace)]
    raw_cmd = [py, str(SUPPORT / "rawproxy.py"), "--port", str(raw_port), "--target", str(up_port)]
    procs = {
        "upstream": subprocess.Popen(upstream_cmd, env=env, stdout=quiet),
        "raw": subprocess.Popen(raw_cmd, env=env, stdout=quiet),
    }
    ports = {"upstream": up_port, "raw": raw_port}
    gateways = {"": None} if not args.baseline_root else {"": None, "@base": args.baseline_root}
    for label, root in gateways.items():
        home = tmp / f"gateway{label.strip('@')}"
        home.mkdir()
        port = ports["gateway" + label] = free_port()
        (home / "config.yaml").write_text(gateway_config(up_port, port))
        gw_env = {**env, "TWSERVE_HOME": str(home)}
        if label:
            gw_env["PYTHONPATH"] = baseline_path(Path(root))
            gw_env.update(item.split("=", 1) for item in args.baseline_env)
        # The command line's module: twserve/cli/main.py, or twserve/cli.py in a checkout from
        # before twserve had folders.
        flat_cli = label and (Path(root) / "twserve" / "cli.py").exists()
        cli = "twserve.cli" if flat_cli else "twserve.cli.main"
        gw_cmd = [*args.gateway_wrap.split(), py, "-m", cli, "serve"]
        gw_cmd += ["--config", str(home / "config.yaml"), "--data-dir", str(home)]
        procs["gateway" + label] = subprocess.Popen(gw_cmd, env=gw_env, stdout=quiet, cwd=root)
    load_before = os.getloadavg()
    memory: dict[str, dict[str, int]] = {}
    wrapped: list[int] = []
    try:
        for name, port in ports.items():
            wait_port(port, procs[name])
        shapes = [f"e{n}{s}" for n in (LONG, SHORT) for s in ("", "p")]
        targets = [
            Target(
                "direct",
                up_port,
                None,
                {s: anthropic_request(up_port, f"/{s}/v1/messages", s) for s in shapes},
            ),
            Target(
                "raw",
                raw_port,
                procs["raw"].pid,
                {s: anthropic_request(raw_port, f"/{s}/v1/messages", s) for s in shapes},
            ),
        ]
        gw_pids = {}
        for label in gateways:
            pid = procs["gateway" + label].pid
            if args.gateway_wrap:  # with a wrapper (py-spy record ...) the gateway is its child
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                pid = int(children[0]) if children else pid
                wrapped.append(pid)
            gw_pids[label] = pid
            port = ports["gateway" + label]
            if "passthrough" in modes:
                requests = {s: anthropic_request(port, "/v1/messages", s) for s in shapes}
                targets.append(Target("passthrough" + label, port, pid, requests))
            if "convert" in modes:
                requests = {s: chat_request(port, s) for s in shapes}
                targets.append(Target("convert" + label, port, pid, requests))
        for t in targets:  # every answer complete and well-formed before anything is timed
            body = asyncio.run(fetch(t.port, t.requests[f"e{SHORT}"]))
            events = body.count(b"data:")
            if events < SHORT - 5:
                raise RuntimeError(f"{t.name}: {events} events in {body[:500]!r}")
            asyncio.run(load(t.port, t.requests[f"e{LONG}"], args.warmup, 16))  # warm up
        for round_ in range(args.runs):
            for pacing in pacings:
                for t in targets:
                    measure(t, pacing, args)
            print(f"round {round_ + 1}/{args.runs} done", file=sys.stderr, flush=True)
        memory["raw"] = memory_kib(procs["raw"].pid)
        for t in targets:
            if t.pid and t.name != "raw":
                memory[t.name] = memory_kib(t.pid)
    finally:
        for pid in wrapped:  # a wrapper (py-spy) may not pass its signal on to the gateway:
            with contextlib.suppress(ProcessLookupError):  # stop the gateway, and let the
                os.kill(pid, signal.SIGTERM)  # wrapper end with it (py-spy then writes its file)
        for label in gateways if wrapped else ():
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs["gateway" + label].wait(40)
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)  # configs and the gateways' SQLite files
    load_after = os.getloadavg()
    report: dict[str, object] = {
        "runs": args.runs,
        "pace_s": args.pace,
        "load_average_before_after": [load_before[0], load_after[0]],
        "memory_kib": memory,
    }
    for pacing in pacings:
        summary = summarise(targets, pacing)
        report[pacing] = summary
        shape = f"events {args.pace * 1000:g} ms apart" if pacing == "paced" else "back to back"
        print(
            f"\n{pacing} ({shape}), medians of {args.runs} rounds;"
            " (ratio to the byte-copy proxy, min–max over rounds)\n"
        )
        print(table(summary, memory))
    print(f"\nload average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
