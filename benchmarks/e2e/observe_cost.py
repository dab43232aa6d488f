"""What observability costs per request, end to end on loopback (docs/observability.md).

One gateway process per variant, all in front of the same mock upstream, each with the same
config but its ``observability`` (and environment):

    all_off      observability.access_log: false
    logs_text    the default: an access line per request, text
    logs_json    an access line per request, JSON
    traces       OpenTelemetry traces to a sink on loopback, sampled (``OTEL_TRACES_SAMPLER``
                 ``parentbased_traceidratio``, ``--trace-ratio``), text access lines too —
                 only where the ``otel`` extra is installed and twserve reads the
                 ``OTEL_EXPORTER_OTLP_*`` variables; else skipped with the reason printed
    traces_only  the same traces with ``access_log: false`` (traces on, logs off)
    traces_every traces with every request sampled (ratio 1.0), text access lines too
    baseline     with ``--baseline-root DIR``: the default config on another checkout's gateway

Each gateway's stderr goes to a file of its own (real writes, as to a journal). The same short
streamed requests go to each variant in turn, round after round; the gateway's CPU is read from
/proc (its threads included: the log's writer). Reported: CPU ms per request of each variant
(median over the rounds, with min–max), each one's extra over ``all_off``, and the default's over
the baseline when there is one.

    python -m benchmarks.e2e.observe_cost [--requests 400] [--runs 5] [--variants a,b] \
        [--baseline-root DIR]

A variant is one entry of `VARIANTS`: a name, the ``observability`` YAML, the environment it
adds and what it needs; adding one (traces with other settings) is one more entry.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio

from benchmarks.e2e.e2e_overhead import concurrent
from benchmarks.e2e.load import baseline_path
from benchmarks.support.harness import KEY, ROOT, cpu_seconds, free_port, wait_port


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    observability: str  # the config's observability section, YAML flow form ("" for none)
    env: Callable[[Sinks], dict[str, str]] = lambda sinks: {}
    # Why it cannot run here (None: it can).
    unavailable: Callable[[], str | None] = lambda: None
    root: Path | None = None  # another checkout (the baseline)


@dataclass
class Sinks:
    """Where the variants send what leaves the gateway besides answers (an OTLP sink)."""

    otlp_port: int = 0
    received: list[int] = field(default_factory=list)


def _traces_unavailable() -> str | None:
    if importlib.util.find_spec("opentelemetry") is None or (
        importlib.util.find_spec("opentelemetry.sdk") is None
    ):
        return "the otel extra is not installed (pip install -e '.[otel]')"
    sources = (ROOT / "twserve").rglob("*.py")
    if not any("OTEL_EXPORTER_OTLP" in p.read_text(encoding="utf-8") for p in sources):
        return "this twserve has no OpenTelemetry traces (no OTEL_EXPORTER_OTLP_* reader)"
    return None


def _trace_env(ratio: float) -> Callable[[Sinks], dict[str, str]]:
    def env(sinks: Sinks) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{sinks.otlp_port}/v1/traces",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(ratio),
        }

    return env


def variants(args: argparse.Namespace) -> list[Variant]:
    found = [
        Variant("all_off", "{access_log: false}"),
        Variant("logs_text", ""),
        Variant("logs_json", "{log_format: json}"),
        Variant("traces", "", env=_trace_env(args.trace_ratio), unavailable=_traces_unavailable),
        Variant(
            "traces_only",
            "{access_log: false}",
            env=_trace_env(args.trace_ratio),
            unavailable=_traces_unavailable,
        ),
        Variant("traces_every", "", env=_trace_env(1.0), unavailable=_traces_unavailable),
    ]
    if args.baseline_root:
        found.append(Variant("baseline", "", root=Path(args.baseline_root)))
    return found


def config(mock_port: int, port: int, observability: str) -> str:
    text = f"""version: 1
listen:
  gateway: {{bind: 127.0.0.1, port: {port}}}
clients:
  - {{name: bench, key: {KEY}}}
providers:
  - {{name: up, protocol: anthropic, base_url: 'http://127.0.0.1:{mock_port}/rps', key: k}}
"""
    return text + (f"observability: {observability}\n" if observability else "")


@contextmanager
def otlp_sink(sinks: Sinks) -> Iterator[None]:
    """An HTTP server that takes OTLP/HTTP exports and answers 200 (counting the bytes)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sinks.received.append(len(self.rfile.read(int(self.headers["content-length"] or 0))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sinks.otlp_port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per variant and round")
    ap.add_argument("--runs", type=int, default=5, help="rounds")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=20, help="streamed chunks per answer")
    ap.add_argument("--variants", default="", help="comma-separated names (default: all)")
    ap.add_argument("--trace-ratio", type=float, default=0.1, help="the traces' sampling ratio")
    ap.add_argument("--baseline-root", help="also run the default config on this checkout")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    wanted = {n for n in args.variants.split(",") if n}
    chosen: list[Variant] = []
    skipped: dict[str, str] = {}
    for variant in variants(args):
        if wanted and variant.name not in wanted:
            continue
        why = variant.unavailable()
        if why is not None:
            skipped[variant.name] = why
            print(f"skipping {variant.name}: {why}", file=sys.stderr)
        else:
            chosen.append(variant)

    tmp = Path(tempfile.mkdtemp(prefix="twserve-observe-bench-"))
    sinks = Sinks()
    mock_port = free_port()
    py = sys.executable
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    logs: dict[str, Path] = {}
    cpu: dict[str, list[float]] = {v.name: [] for v in chosen}
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
    with otlp_sink(sinks):
        procs["mock"] = subprocess.Popen(
            [
                *(py, "-m", "twserve.cli.main", "mock-upstream", "--port", str(mock_port)),
                "--profile",
                "rps=" + json.dumps({"chunks": args.chunks, "chunk_size": 8}),
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            for variant in chosen:
                home = tmp / variant.name
                home.mkdir()
                port = ports[variant.name] = free_port()
                cfg = home / "config.yaml"
                cfg.write_text(config(mock_port, port, variant.observability))
                env = {**os.environ, "TWSERVE_HOME": str(home), **variant.env(sinks)}
                if variant.root is not None:
                    env["PYTHONPATH"] = baseline_path(variant.root)
                logs[variant.name] = home / "stderr.log"
                serve = (py, "-m", "twserve.cli.main", "serve")
                with logs[variant.name].open("wb") as err:
                    procs[variant.name] = subprocess.Popen(
                        [*serve, "--config", str(cfg), "--data-dir", str(home)],
                        env=env,
                        cwd=variant.root or ROOT,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
            wait_port(mock_port, procs["mock"])
            for name, port in ports.items():
                wait_port(port, procs[name])  # fails at once when the gateway exited
            path = "/v1/messages"
            for port in ports.values():  # warm up
                anyio.run(concurrent, port, path, headers, body, 50, args.concurrency)
            for _ in range(args.runs):
                for variant in chosen:
                    pid = procs[variant.name].pid
                    before = cpu_seconds(pid)
                    anyio.run(
                        concurrent,
                        ports[variant.name],
                        path,
                        headers,
                        body,
                        args.requests,
                        args.concurrency,
                    )
                    used = cpu_seconds(pid) - before
                    cpu[variant.name].append(used / args.requests * 1000)
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(30)

    lines = {name: len(path.read_bytes().splitlines()) for name, path in logs.items()}
    shutil.rmtree(tmp, ignore_errors=True)

    med = {name: statistics.median(values) for name, values in cpu.items() if values}
    figures: dict[str, object] = {
        "requests_per_run": args.requests,
        "runs": args.runs,
        "cpu_ms_per_request": med,
        "cpu_ms_per_request_runs": cpu,
        "stderr_lines": lines,
        "skipped": skipped,
    }
    if med.get("all_off"):
        figures["extra_percent_over_all_off"] = {
            name: (value / med["all_off"] - 1) * 100 for name, value in med.items()
        }
    if "baseline" in med and "logs_text" in med and med["baseline"]:
        figures["default_extra_percent_over_baseline"] = (
            med["logs_text"] / med["baseline"] - 1
        ) * 100
    if sinks.received:
        figures["otlp_exports"] = len(sinks.received)
    print("| variant | CPU ms per request (median) | min–max | vs all_off |")
    print("|---|---|---|---|")
    extra = figures.get("extra_percent_over_all_off", {})
    assert isinstance(extra, dict)
    for name, value in med.items():
        runs = cpu[name]
        vs = f"{extra[name]:+.1f} %" if name in extra else "–"
        print(f"| {name} | {value:.3f} | {min(runs):.3f}–{max(runs):.3f} | {vs} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | | |")
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
