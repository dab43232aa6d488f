"""twproto, twengine and the pure part of twmock import no IO, clock, randomness or logging.

docs/library.md ("What the pure packages may import") states the rule. Checked on the syntax
tree, so an import hidden in a function body is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.layout import PACKAGE_DIRS, ROOT

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
# Packages each pure package must not import (twserve is in FORBIDDEN for all of them).
DISALLOWED_PACKAGES = {"twproto": {"twengine", "twmock"}, "twengine": {"twmock"}, "twmock": set()}
# twmock's IO is in twmock/serve/ and nowhere else: every other twmock module is pure, and of
# those only the package's facade and its ``python -m`` entry point may import twmock.serve.
TWMOCK_IO = PACKAGE_DIRS["twmock"] / "serve"
TWMOCK_ENTRY_POINTS = {"__init__.py", "__main__.py"}


def _modules(package: str) -> list[Path]:
    paths = sorted(PACKAGE_DIRS[package].rglob("*.py"))
    if package == "twmock":
        paths = [p for p in paths if not p.is_relative_to(TWMOCK_IO)]
    return paths


def _imports_twmock_serve(tree: ast.AST) -> list[int]:
    """The lines of `tree` that import twmock.serve or any module in it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if any(n == "twmock.serve" or n.startswith("twmock.serve.") for n in names):
            found.append(node.lineno)
    return found


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", ["twproto", "twengine", "twmock"])
def test_pure_packages_import_no_io(package: str) -> None:
    modules = _modules(package)
    assert modules, package
    problems = []
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, name in _imports(tree):
            top = name.split(".")[0]
            if name in FORBIDDEN or top in FORBIDDEN or top in DISALLOWED_PACKAGES[package]:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        entry_point = path.parent == PACKAGE_DIRS["twmock"] and path.name in TWMOCK_ENTRY_POINTS
        if package == "twmock" and not entry_point:
            for line in _imports_twmock_serve(tree):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports twmock.serve")
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


def test_twmock_io_is_the_serve_folder() -> None:
    """Every twmock module outside serve/ is checked as pure (a new one is pure unless it is put
    in serve/), and serve/ holds the transports."""
    pure = {p.relative_to(PACKAGE_DIRS["twmock"]).as_posix() for p in _modules("twmock")}
    assert {"plan.py", "script.py", "answer.py", "shapes.py", "formats/anthropic.py"} <= pure
    assert {"formats/_wire.py", "formats/gemini.py", "__init__.py", "__main__.py"} <= pure
    assert not any(p.startswith("serve/") for p in pure)
    assert {"server.py", "handler.py", "cli.py"} <= {p.name for p in TWMOCK_IO.glob("*.py")}


def test_checker_catches_twmock_io_import_in_a_pure_module() -> None:
    tree = ast.parse(
        "from twmock.serve.server import run_mock\n"
        "import twmock.serve.cli\n"
        "from twmock import serve\n"
        "from twmock.plan import plan\n"
        "import twmock.servers_elsewhere\n"
    )
    assert _imports_twmock_serve(tree) == [1, 2, 3]
