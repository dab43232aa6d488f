"""The per-chunk conversion benchmark still runs (a few chunks, two rounds; no figure is judged):
every pair converts its stream to the end in a child of its own, this checkout measured beside
itself as the baseline, and the streams it builds are the transcript's with its deltas cycled."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.e2e.chunk_cost import PAIRS, stream_chunks
from benchmarks.support.harness import ROOT, benchmark_command


def test_streams_cycle_the_deltas_between_opening_and_closing() -> None:
    for name, pair in PAIRS.items():
        empty, full = stream_chunks(pair, 0), stream_chunks(pair, 7)
        assert len(full) == len(empty) + 7, name
        assert sum(map(pair.delta, full)) - sum(map(pair.delta, empty)) == 7, name
        assert all(chunk.endswith(b"\n\n") and chunk.count(b"\n\n") == 1 for chunk in full), name


def test_chunk_cost_runs_every_pair_beside_a_baseline(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    args = ["--chunks", "20", "--runs", "2", "--repeat", "2", "--baseline-root", str(ROOT)]
    done = subprocess.run(
        [*benchmark_command("e2e.chunk_cost", *args), "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["ns_per_chunk"]) == set(PAIRS)
    assert report["twproto"]["base"] == report["twproto"]["head"]
    assert report["twproto"]["head"] == str(ROOT / "libs" / "twproto" / "twproto")
    for name, row in report["ns_per_chunk"].items():
        assert len(report["ns_per_chunk_rounds"][name]["base"]) == 2, name
        assert row["head"]["min"] <= row["head"]["median"], name
    assert "| anthropic_to_chat |" in done.stdout
