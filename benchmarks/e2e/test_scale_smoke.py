"""The scale benchmarks still run end to end at CI size (a few seconds each): the many-streams
run and the workers' throughput. No timing is judged; the ratios are printed in the test
output (the benchmark's tables, with pytest's capture off for them)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.support.harness import ROOT, benchmark_command


def _run(module: str, args: list[str], timeout: float) -> str:
    done = subprocess.run(
        benchmark_command(module, *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_many_streams_runs_every_variant_beside_the_proxy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "streams.json"
    args = ["--streams", "40,80", "--same-rate", "40", "--think", "0.2-0.4", "--gap", "0.01-0.02"]
    args += ["--duration", "0.5-1", "--ramp", "0.3", "--probe-every", "0.05", "--json", str(out)]
    stdout = _run("e2e.many_streams", args, 180)
    with capsys.disabled():
        print("\n" + stdout)
    runs = json.loads(out.read_text())["runs"]
    # 40, 80, and 40 streams at the rate of 80; each through the gateway and the proxy.
    seen = {(r["target"], r["streams"], r["rate_of"]) for r in runs}
    assert seen == {
        (t, n, m) for t in ("gateway", "proxy") for n, m in ((40, 40), (80, 80), (40, 80))
    }
    for r in runs:
        assert r["completed"] == r["streams"], r
        assert r["errors"] == {}, r
        # 0.5–1 s of a token every 10–20 ms (or half that gap at the rate of 80): ≥ 25 each.
        assert r["chunks"] >= 25 * r["streams"]
        assert r["probes"]["target"] > 0 and r["probes"]["direct"] > 0
        assert r["delay_ms"]["p50"] > 0 and r["cpu_us_per_chunk"] > 0
        assert set(r["added_ttfb_all_open_ms"]) == {"p50", "p99"}
        assert set(r["refused_in_ms"]) == {"p50", "p99", "max"}
        assert set(r["answered_all_open_ms"]) == {"p50", "p99", "served", "refused"}
        assert r["limited_by"]
    faster = next(
        r for r in runs if r["target"] == "proxy" and r["rate_of"] == 80 and r["streams"] == 40
    )
    slower = next(
        r for r in runs if r["target"] == "proxy" and r["streams"] == 40 and r["rate_of"] == 40
    )
    assert faster["chunks"] > 1.4 * slower["chunks"]  # the same-rate variant's gaps are halved
    assert "| gateway |" in stdout and "| proxy |" in stdout


def test_workers_benchmark_measures_one_and_two_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "workers.json"
    stdout = _run("e2e.workers", ["--runs", "1", "--requests", "300", "--json", str(out)], 180)
    with capsys.disabled():
        print("\n" + stdout)
    report = json.loads(out.read_text())
    for name in ("proxy", "workers=1", "workers=2"):
        assert report["medians"][name]["requests_per_s"] > 0
    assert report["medians"]["workers=2"]["cpu_ms_per_request"] > 0
    assert len(report["ratio_requests_per_s"]) == 1
    assert "--workers 2 / --workers 1: requests/s" in stdout
