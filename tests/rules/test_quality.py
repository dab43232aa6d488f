"""The tree stays lint-clean and typed: ruff (lint and format) and mypy as configured in
pyproject.toml (strict on twproto and twengine)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.layout import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (it is part of the test extra)")
    return found


def test_ruff_lint() -> None:
    result = _run(_tool("ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run(_tool("ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


_SPEC_CITATION = re.compile("SPEC \u00a7|\u00a7 ?[0-9]")


def test_citations_point_into_the_repository() -> None:
    """Code, tests and docs cite the docs/ page that describes a behaviour, never a section of
    a specification that is not in the repository."""
    found = []
    for pattern in ("**/*.py", "**/*.md"):
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith((".venv/", "build/")):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _SPEC_CITATION.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], found
