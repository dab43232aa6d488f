"""The benchmark commands the docs give name files and modules that exist, and each end-to-end
benchmark starts as documented (``python -m benchmarks.e2e.<name> --help``, from the root).

benchmarks/ has two tiers in two folders (docs/benchmarks.md): `hot/` for pytest-benchmark
files, `e2e/` for modules run with ``python -m``, `support/` for what they share. A move that
leaves a page naming the old path, or a module that no longer imports, fails here rather than
in the hands of whoever runs the benchmark next.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.layout import ROOT

BENCHMARKS = ROOT / "benchmarks"
_PATH = re.compile(r"\bbenchmarks/[\w/]+\.py\b")
_MODULE = re.compile(r"-m (benchmarks(?:\.\w+)+)(?![.\w])")


def _texts() -> dict[str, str]:
    """Every page and benchmark file that may name a benchmark, by its path from the root."""
    paths = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    paths += sorted(BENCHMARKS.rglob("*.py"))
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths}


def _module_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _e2e_modules() -> list[str]:
    return sorted(
        p.stem for p in (BENCHMARKS / "e2e").glob("*.py") if not p.name.startswith(("_", "test_"))
    )


def test_every_named_benchmark_file_exists() -> None:
    texts = _texts()
    named = {(page, m.group()) for page, text in texts.items() for m in _PATH.finditer(text)}
    assert any(path == "benchmarks/e2e/load.py" for _, path in named)
    missing = sorted(f"{page} names {path}" for page, path in named if not (ROOT / path).is_file())
    assert missing == []


def test_every_named_benchmark_module_exists() -> None:
    texts = _texts()
    named = {(page, m.group(1)) for page, text in texts.items() for m in _MODULE.finditer(text)}
    assert any(module == "benchmarks.e2e.load" for _, module in named)
    missing = sorted(
        f"{page} runs {module}" for page, module in named if not _module_path(module).is_file()
    )
    assert missing == []


def test_the_tiers_are_the_folders() -> None:
    """hot/ holds only pytest-benchmark files, e2e/ only runnable modules and their smoke tests,
    and docs/benchmarks.md gives the command of every end-to-end benchmark."""
    hot = [p.name for p in (BENCHMARKS / "hot").glob("*.py") if p.name != "__init__.py"]
    assert hot and all(name.startswith("bench_") for name in hot), hot
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    e2e = _e2e_modules()
    assert {"load", "e2e_overhead", "h2_overhead"} <= set(e2e)
    for name in e2e:
        source = (BENCHMARKS / "e2e" / f"{name}.py").read_text(encoding="utf-8")
        assert 'if __name__ == "__main__":' in source, name
        assert f"benchmarks/e2e/{name}.py" in page or f"benchmarks.e2e.{name}" in page, name
    assert [p.name for p in BENCHMARKS.glob("*.py")] == ["__init__.py"]


@pytest.mark.parametrize("name", _e2e_modules())
def test_an_end_to_end_benchmark_starts_as_documented(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.e2e.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:"), done.stdout
