"""The observability cost benchmark still runs end to end (a handful of requests; no figure is
judged): every variant that can run here runs, and one that cannot is skipped with its reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.support.harness import ROOT, benchmark_command


def test_observe_cost_runs_its_variants(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    args = ["--runs", "1", "--requests", "20", "--json", str(out)]
    done = subprocess.run(
        benchmark_command("e2e.observe_cost", *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    ran = set(report["cpu_ms_per_request"])
    assert {"all_off", "logs_text", "logs_json"} <= ran
    traces = {"traces", "traces_only", "traces_every"}
    assert ran | set(report["skipped"]) == {"all_off", "logs_text", "logs_json"} | traces
    for name in report["skipped"]:
        assert f"skipping {name}: " in done.stderr
    # 50 warm-up requests and 20 timed ones: an access line each, none with access_log off.
    lines = report["stderr_lines"]
    assert lines["logs_text"] >= 70 and lines["logs_json"] >= 70 and lines["all_off"] < 10
