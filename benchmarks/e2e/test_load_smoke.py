"""The load harness still runs end to end (a handful of requests; no figure is judged)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.support.harness import ROOT, benchmark_command


def test_load_harness_runs_every_phase_and_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    # Enough long requests that the gateway spends several clock ticks (10 ms each) on them:
    # about 5 µs a chunk, 200 chunks each, so 48 of them take some 50 ms.
    args = ["--runs", "1", "--long-requests", "48", "--short-requests", "4"]
    args += ["--ttfb-requests", "2"]
    args += ["--warmup", "1", "--pace", "0.0001"]
    done = subprocess.run(
        benchmark_command("e2e.load", *args, "--json", str(out)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| CPU per 1,000 streamed chunks |" in done.stdout
    assert "| requests/s, c=64, 20 chunks |" in done.stdout
    report = json.loads(out.read_text())
    for pacing in ("unpaced", "paced"):
        for target in ("direct", "raw", "passthrough", "convert"):
            row = report[pacing][target]
            assert row["requests_per_s_c32"] > 0 and row["requests_per_s_c64"] > 0
            assert row["ttfb_p50_ms"] > 0 and row["ttfb_p99_ms"] >= row["ttfb_p50_ms"]
            assert row["ttfb_p99_ms_c64"] > 0
        for target in ("passthrough", "convert"):
            assert report[pacing][target]["cpu_ms_per_1000_chunks_ratio"] > 0
    assert report["memory_kib"]["passthrough"]["VmHWM"] > 0
