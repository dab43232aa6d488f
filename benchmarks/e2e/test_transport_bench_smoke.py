"""The transport benchmarks still run end to end (a handful of frames and turns; no figure is
judged)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.support.harness import ROOT, benchmark_command


def _run(module: str, args: list[str], out: Path) -> dict[str, object]:
    done = subprocess.run(
        benchmark_command(f"e2e.{module}", *args, "--json", str(out)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures: dict[str, object] = json.loads(out.read_text())
    return figures


def test_the_realtime_benchmark_reports_every_figure(tmp_path: Path) -> None:
    figures = _run("realtime_overhead", ["--frames", "20", "--runs", "1"], tmp_path / "rt.json")
    wall = figures["wall_us_per_round_trip"]
    assert isinstance(wall, dict)
    assert wall["direct"] > 0 and wall["gateway"] > 0
    assert isinstance(figures["gateway_cpu_us_per_frame"], float)


def test_the_websocket_benchmark_runs_with_an_upstream_socket(tmp_path: Path) -> None:
    args = ["--turns", "5", "--runs", "1", "--upstream-transport", "websocket"]
    figures = _run("ws_overhead", args, tmp_path / "ws.json")
    assert figures["upstream_transport"] == "websocket"
    wall = figures["wall_ms_per_turn"]
    assert isinstance(wall, dict)
    assert wall["http"] > 0 and wall["websocket"] > 0
