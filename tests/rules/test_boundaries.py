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
# twmock's IO lives in these modules and nowhere else; its pure modules may not import them.
TWMOCK_IO = {
    "twmock/__init__.py",
    "twmock/__main__.py",
    "twmock/server.py",
    "twmock/cli.py",
    "twmock/realtime.py",
    "twmock/responses_socket.py",
    "twmock/upgrade.py",
}
TWMOCK_IO_MODULES = {
    "twmock",
    "twmock.__main__",
    "twmock.server",
    "twmock.cli",
    "twmock.realtime",
    "twmock.responses_socket",
    "twmock.upgrade",
}


def _modules(package: str) -> list[Path]:
    paths = sorted(PACKAGE_DIRS[package].rglob("*.py"))
    if package == "twmock":
        paths = [p for p in paths if p.relative_to(ROOT).as_posix() not in TWMOCK_IO]
    return paths


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
            if (
                name in FORBIDDEN
                or top in FORBIDDEN
                or top in DISALLOWED_PACKAGES[package]
                or name in TWMOCK_IO_MODULES
            ):
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


def test_twmock_pure_modules_are_the_planner_and_writers() -> None:
    """A new twmock module is pure unless it is added to TWMOCK_IO on purpose."""
    pure = {p.relative_to(PACKAGE_DIRS["twmock"]).as_posix() for p in _modules("twmock")}
    assert {"plan.py", "script.py", "answer.py", "shapes.py", "anthropic.py"} <= pure
    assert all((ROOT / p).is_file() for p in TWMOCK_IO)


def test_checker_catches_twmock_io_import_in_a_pure_module() -> None:
    tree = ast.parse("from twmock.server import MockHandler\nimport twmock.cli\n")
    assert {n for _, n in _imports(tree)} <= TWMOCK_IO_MODULES
