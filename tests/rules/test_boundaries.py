"""The packages' boundaries, checked on the syntax tree (so an import hidden in a function body
is caught too):

* twproto, twengine and the pure part of twmock import no IO, clock, randomness or logging
  (docs/library.md, "The sans-IO contract");
* no package — twserve, twmock, the benchmarks and the tests of another package included —
  reaches into another package's `_`-prefixed modules or names (docs/library.md): what another
  package needs is made public.
"""

from __future__ import annotations

import ast
import re
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


# --- No reach into another package's private modules ----------------------------------------

PACKAGES = tuple(PACKAGE_DIRS)
# Where code that is no package's own lives; tests/<package>/ may test that package's insides.
CONSUMERS = (ROOT / "benchmarks", ROOT / "tests")
_PACKAGE_NAMES = "|".join(PACKAGES)
_DOTTED_PRIVATE = re.compile(rf"(?:{_PACKAGE_NAMES})(?:\.\w+)*\._[A-Za-z]\w*(?:\.\w+)*")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(path: Path) -> str | None:
    for package, folder in PACKAGE_DIRS.items():
        if path.is_relative_to(folder) or path.is_relative_to(ROOT / "tests" / package):
            return package
    return None


def _attribute_chain(node: ast.Attribute) -> list[str]:
    chain = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name):
        return []
    return [value.id, *reversed(chain)]


def _private_reaches(tree: ast.AST, owner: str | None) -> list[tuple[int, str]]:
    """Each place `tree` names a private module (or a private name) of a package not `owner`:
    an import, an attribute path from a package's name, or a dotted path in a string (what
    ``monkeypatch.setattr("pkg._mod.f", ...)`` and ``importlib.import_module`` take)."""
    found: list[tuple[int, str]] = []

    def foreign(parts: list[str]) -> bool:
        return bool(parts) and parts[0] in PACKAGES and parts[0] != owner

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if foreign(parts) and any(_private(p) for p in parts[1:]):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if not foreign(parts):
                continue
            if any(_private(p) for p in parts[1:]):
                found.append((node.lineno, node.module))
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            chain = _attribute_chain(node)
            if foreign(chain):
                found.append((node.lineno, ".".join(chain)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _DOTTED_PRIVATE.fullmatch(node.value)
            if match and foreign(node.value.split(".")):
                found.append((node.lineno, node.value))
    return found


def _all_sources() -> list[Path]:
    paths = {p for folder in PACKAGE_DIRS.values() for p in folder.rglob("*.py")}
    paths |= {p for folder in CONSUMERS for p in folder.rglob("*.py")}
    return sorted(paths)


def test_no_package_reaches_into_another_packages_private_modules() -> None:
    """docs/library.md: what another package needs is public; a `_`-module is its own business.
    twserve and twmock included, and the benchmarks and tests other than that package's own."""
    problems = []
    for path in _all_sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, name in _private_reaches(tree, _owner(path)):
            problems.append(f"{path.relative_to(ROOT)}:{line} reaches {name}")
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "from twproto._json import loads",
        "from twproto import _json",
        "import twproto.formats._common",
        "from twproto.formats import _common",
        "from twproto.stream.translators import _Restorer",
        "import twproto\ntwproto._json.loads(b'{}')",
        "monkeypatch.setattr('twproto._json.loads', len)",
    ],
)
def test_checker_catches_a_private_reach(source: str) -> None:
    assert _private_reaches(ast.parse(source), "twserve") != []


@pytest.mark.parametrize(
    "source",
    [
        "from twproto import json_loads, ir",
        "import twproto.stream.hold",
        "from twproto.formats import FORMATS",
        "import twproto\ntwproto.__all__",
        "x = 'twproto.stream.hold'",
    ],
)
def test_checker_lets_public_names_through(source: str) -> None:
    assert _private_reaches(ast.parse(source), "twserve") == []


def test_a_package_may_use_its_own_private_modules() -> None:
    tree = ast.parse("from twproto import _json\nfrom twproto.formats._common import as_dict\n")
    assert _private_reaches(tree, "twproto") == []
    assert _owner(PACKAGE_DIRS["twproto"] / "formats" / "_codec.py") == "twproto"
    assert _owner(ROOT / "tests" / "twproto" / "test_sse.py") == "twproto"
    assert _owner(ROOT / "benchmarks" / "bench_sse.py") is None
