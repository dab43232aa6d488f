"""twproto and twengine stay pure: no IO, clock, randomness or logging (SPEC §2).

Checked on the syntax tree, so an import hidden in a function body is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "anyio",
    "asyncio",
    "socket",
    "ssl",
    "select",
    "selectors",
    "h11",
    "h2",
    "wsproto",
    "httpcore",
    "httpx",
    "time",
    "random",
    "secrets",
    "logging",
    "os",
    "subprocess",
    "sqlite3",
    "threading",
    "multiprocessing",
    "shutil",
    "tempfile",
    "pathlib",
    "io",
    "uuid",
    "urllib.request",
    "twserve",
}
# Calls that read the clock even through an allowed module.
FORBIDDEN_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "urandom"}
ALLOWED_IMPORTS = {"twproto": {"twengine"}, "twengine": set()}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", ["twproto", "twengine"])
def test_pure_packages_import_no_io(package: str) -> None:
    problems = []
    for path in _modules(package):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, name in _imports(tree):
            top = name.split(".")[0]
            if name in FORBIDDEN or top in FORBIDDEN or top in ALLOWED_IMPORTS[package]:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in FORBIDDEN_CALLS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"datetime", "date", "time", "os"}
            ):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} reads the clock")
    assert problems == []


def test_checker_catches_a_forbidden_import() -> None:
    tree = ast.parse("def f():\n    import time\n    from os import path\n")
    assert [n for _, n in _imports(tree)] == ["time", "os"]
