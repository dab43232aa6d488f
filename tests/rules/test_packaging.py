"""The three distributions declare what they import, and nothing else, at one version.

`twproto` (libs/twproto) and `twengine` (libs/twengine) are distributions of their own so that a
proxy reusing the converters installs only what they need; `twserve` (the root, with `twmock`)
depends on both. Each one's `dependencies` must equal the third-party distributions its source
imports, plus the few it needs without importing them (`RUNTIME_ONLY`); an optional extra may
hold what only an optional feature imports. A dependency nobody imports is weight every user
installs; an import nobody declares works only while some other package happens to pull it in.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.support.layout import PACKAGE_DIRS, ROOT

#: distribution → (its pyproject.toml, the package folders it ships)
DISTRIBUTIONS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "twproto": (ROOT / "libs" / "twproto" / "pyproject.toml", ("twproto",)),
    "twengine": (ROOT / "libs" / "twengine" / "pyproject.toml", ("twengine",)),
    "twserve": (ROOT / "pyproject.toml", ("twserve", "twmock")),
}

#: Needed at run time without an `import` naming them: distribution → (the stdlib module or
#: condition that needs it, why). `needs_module` None: always needed.
RUNTIME_ONLY: dict[str, tuple[str | None, str]] = {
    # zoneinfo reads the IANA database from the tzdata package where the system has none.
    "tzdata": ("zoneinfo", "zoneinfo's IANA database on systems without one"),
    # twserve.app.process finds it with importlib.util.find_spec; anyio loads it.
    "uvloop": (None, "the event loop of `twserve serve`, loaded by anyio"),
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a PEP 508 requirement names (``psycopg[binary]>=3.2; …`` → psycopg)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _normalise(match[1])


def pyproject(dist: str) -> dict[str, Any]:
    return tomllib.loads(DISTRIBUTIONS[dist][0].read_text(encoding="utf-8"))


# Namespace packages several distributions share: their modules are named with the next segment
# too (``google.auth``), and these name the distribution.
NAMESPACES = {"google.auth": "google-auth", "google.oauth2": "google-auth"}


def _top(module: str) -> str:
    top, _, rest = module.partition(".")
    named = f"{top}.{rest.partition('.')[0]}"
    return named if named in NAMESPACES else top


def top_level_imports(files: Iterable[Path]) -> set[str]:
    """Every top-level module name an absolute import in `files` names (a shared namespace's
    with its next segment, `NAMESPACES`)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(_top(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(_top(node.module))
    return names


@functools.cache
def _installed() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _distribution_of(module: str) -> str:
    if module in NAMESPACES:
        return NAMESPACES[module]
    found = _installed().get(module)
    assert found, f"no installed distribution provides the module {module!r}"
    return _normalise(found[0])


def full_imports(files: Iterable[Path]) -> set[str]:
    """Every module an absolute import in `files` names, dotted in full."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    return names


def _namespace_distributions(top: str, modules: set[str]) -> set[str]:
    """The distributions that ship the `modules` under namespace package `top` (several
    distributions share ``opentelemetry``): each module's file, found in a distribution's
    record of its files."""
    owners: dict[str, str] = {}
    for dist in _installed()[top]:
        for file in importlib.metadata.distribution(dist).files or ():
            owners.setdefault(file.as_posix(), _normalise(dist))
    found = set()
    for module in modules:
        base = module.replace(".", "/")
        for candidate in (f"{base}/__init__.py", f"{base}.py"):
            if candidate in owners:
                found.add(owners[candidate])
                break
        else:
            # `from opentelemetry import trace`: the names are modules of the namespace.
            assert module == top, f"no installed distribution ships {module!r}"
    return found


def imported_distributions(dist: str) -> tuple[set[str], set[str]]:
    """(third-party distributions `dist` imports, stdlib modules it imports)."""
    packages = DISTRIBUTIONS[dist][1]
    files = [p for pkg in packages for p in PACKAGE_DIRS[pkg].rglob("*.py")]
    modules = top_level_imports(files)
    stdlib = {m for m in modules if m in sys.stdlib_module_names}
    own = set(packages)
    third = {m for m in modules - stdlib - own if m not in ("twproto", "twengine")}
    # The other libraries of this repository are distributions by their own names.
    siblings = {m for m in modules - own if m in ("twproto", "twengine")}
    found = {_distribution_of(m) for m in third if len(_installed().get(m, ())) <= 1}
    namespaces = {m for m in third if len(_installed().get(m, ())) > 1}
    if namespaces:
        imported = full_imports(files) | _from_namespace(files, namespaces)
        for top in namespaces:
            under = {m for m in imported if m == top or m.startswith(top + ".")}
            found |= _namespace_distributions(top, under - {top})
    return found | siblings, stdlib


def _from_namespace(files: Iterable[Path], namespaces: set[str]) -> set[str]:
    """``from opentelemetry import trace`` imports the module ``opentelemetry.trace``."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in namespaces and node.level == 0:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def expected_dependencies(dist: str) -> set[str]:
    third, stdlib = imported_distributions(dist)
    runtime = {
        name
        for name, (module, _why) in RUNTIME_ONLY.items()
        if (module is None and dist == "twserve") or (module is not None and module in stdlib)
    }
    return third | runtime


def declared(dist: str) -> tuple[set[str], set[str]]:
    """(`dependencies`, every optional extra's requirements but the project's own)."""
    project = pyproject(dist)["project"]
    required = {requirement_name(r) for r in project.get("dependencies", [])}
    optional = {
        requirement_name(r)
        for extra, reqs in project.get("optional-dependencies", {}).items()
        if extra != "test"
        for r in reqs
    }
    return required, optional - {dist}


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_dependencies_are_what_the_code_imports(dist: str) -> None:
    required, optional = declared(dist)
    expected = expected_dependencies(dist)
    undeclared = expected - required - optional
    unused = required - expected
    assert not undeclared, f"{dist} imports {sorted(undeclared)} without declaring them"
    assert not unused, f"{dist} declares {sorted(unused)} but nothing in it needs them"
    # An optional extra holds only what the code imports.
    assert optional <= expected, f"{dist}'s extras name {sorted(optional - expected)}, unused"


def test_the_libraries_need_only_orjson_and_tzdata() -> None:
    # What docs/library.md promises a proxy that reuses the converters.
    assert declared("twproto")[0] == {"orjson", "tzdata"}
    assert declared("twengine")[0] == {"twproto"}


def test_versions_are_in_step() -> None:
    versions = {dist: pyproject(dist)["project"]["version"] for dist in DISTRIBUTIONS}
    assert len(set(versions.values())) == 1, versions
    (version,) = set(versions.values())
    # Each pins its siblings to exactly that version: the three are released together.
    pins = {
        (dist, requirement_name(r)): r
        for dist in DISTRIBUTIONS
        for r in pyproject(dist)["project"]["dependencies"]
        if requirement_name(r) in DISTRIBUTIONS
    }
    assert pins == {
        ("twengine", "twproto"): f"twproto=={version}",
        ("twserve", "twproto"): f"twproto=={version}",
        ("twserve", "twengine"): f"twengine=={version}",
    }


def test_checker_sees_an_undeclared_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import orjson\nfrom anyio.abc import TaskGroup\nfrom . import x\nimport os")
    assert top_level_imports([module]) == {"orjson", "anyio", "os"}
    assert requirement_name("psycopg[binary]>=3.2") == "psycopg"
    assert requirement_name("ruamel.yaml>=0.18") == "ruamel-yaml"
    assert _distribution_of("ruamel") == "ruamel-yaml"
