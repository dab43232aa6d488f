"""Every runtime dependency a distribution declares is imported by its own code.

A dependency nothing imports is installed on every machine for nothing and reads as if the
code relied on it. The check is on the syntax tree of each distribution's packages: an import
anywhere in a module counts, and so does a module looked up by name
(``importlib.util.find_spec("uvloop")``: anyio then loads uvloop itself). A package that is only
data (IANA time zones for zoneinfo) is named in `DATA_ONLY` with its user.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from tests.support.layout import PACKAGE_DIRS, ROOT

# Distribution -> (its pyproject.toml, the packages it ships).
DISTRIBUTIONS = {
    "twserve": (ROOT / "pyproject.toml", ("twserve", "twmock")),
    "twproto": (ROOT / "libs" / "twproto" / "pyproject.toml", ("twproto",)),
    "twengine": (ROOT / "libs" / "twengine" / "pyproject.toml", ("twengine",)),
}
# Installed for what they hold, not imported: zoneinfo reads tzdata's files when the system has
# no time zone database.
DATA_ONLY = {"tzdata"}
# Where a distribution's import name is not its name with "-" as "_".
IMPORT_NAMES = {"ruamel.yaml": "ruamel"}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def declared(pyproject: Path) -> list[str]:
    """The names of the runtime dependencies `pyproject` declares (extras not included)."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    names = []
    for spec in deps:
        found = _NAME.match(spec)
        assert found, spec
        names.append(found.group().lower())
    return names


_BY_NAME = {"find_spec", "import_module"}


def imported(packages: tuple[str, ...]) -> set[str]:
    """The top-level modules the code of `packages` imports or looks up by name."""
    tops: set[str] = set()
    for package in packages:
        for path in PACKAGE_DIRS[package].rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    tops.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    tops.add(node.module.split(".")[0])
                elif isinstance(node, ast.Call) and _called(node) in _BY_NAME and node.args:
                    first = node.args[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        tops.add(first.value.split(".")[0])
    return tops


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def unused(names: list[str], tops: set[str]) -> list[str]:
    return [
        n
        for n in names
        if n not in DATA_ONLY and IMPORT_NAMES.get(n, n.replace("-", "_")) not in tops
    ]


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_every_declared_dependency_is_imported(distribution: str) -> None:
    pyproject, packages = DISTRIBUTIONS[distribution]
    names = declared(pyproject)
    assert names, pyproject
    assert unused(names, imported(packages)) == []


def test_the_checker_finds_a_dependency_nothing_imports() -> None:
    names = ["msgpack", "ruamel.yaml", "typing-extensions", "tzdata", "orjson"]
    assert unused(names, {"ruamel", "typing_extensions", "orjson"}) == ["msgpack"]


def test_a_module_looked_up_by_name_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loop.py").write_text(
        "import importlib.util\nfrom importlib import import_module\n"
        "def f():\n    return importlib.util.find_spec('uvloop'), import_module('rich.table')\n"
    )
    monkeypatch.setitem(PACKAGE_DIRS, "probe", tmp_path)
    assert {"importlib", "uvloop", "rich"} <= imported(("probe",))
