"""twmock's import graph: no circle inside the package, and the answer writers import no IO.

The graph is read from the syntax tree, so an import inside a function or under
``TYPE_CHECKING`` is an edge too: both were once how a circle between the mock's server and
its Responses socket endpoint was kept importable, and neither makes it less of a circle.
A module's parent packages are not edges (Python runs them first whatever the module imports);
``from package import name`` is an edge to ``package.name`` when that is a module, else to the
package's ``__init__``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.support.layout import PACKAGE_DIRS

# What the writers in twmock/formats/ must never import: they turn an answer into bytes, and
# the serve/ folder alone puts bytes on a wire.
FORMATS_FORBIDDEN = {"anyio", "asyncio", "socket", "ssl", "h11", "h2", "wsproto", "twserve"}


def _module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIRS[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(package, p): p for p in sorted(PACKAGE_DIRS[package].rglob("*.py"))}


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative imports resolved against `path`)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    # A package's own module name is its folder; a plain module's package is one level up.
    drop = node.level - 1 if _is_package(path) else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, *([node.module] if node.module else [])])


def import_edges(sources: Mapping[str, tuple[Path, str]]) -> dict[str, set[str]]:
    """For each module (name -> (path, source)), the modules of the same set it imports."""
    known = set(sources)
    edges: dict[str, set[str]] = {name: set() for name in sources}
    for name, (path, text) in sources.items():
        for node in ast.walk(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for target in targets:
                # ``import a.b.c`` runs a.b.c (its parents are not edges, see the docstring).
                if target in known and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def _sources(package: str) -> dict[str, tuple[Path, str]]:
    return {n: (p, p.read_text(encoding="utf-8")) for n, p in _modules(package).items()}


def test_twmock_has_no_import_cycle() -> None:
    edges = import_edges(_sources("twmock"))
    # The graph is really read: the server reaches the handler, the plan reaches its writers.
    assert "twmock.serve.handler" in edges["twmock.serve.server"]
    assert "twmock.formats.anthropic" in edges["twmock.plan"]
    assert cycles(edges) == []


def test_twmock_formats_import_no_io() -> None:
    formats = PACKAGE_DIRS["twmock"] / "formats"
    paths = sorted(formats.glob("*.py"))
    assert {"anthropic.py", "gemini.py", "openai_chat.py", "openai_responses.py"} <= {
        p.name for p in paths
    }
    problems = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in FORMATS_FORBIDDEN or name.startswith("twmock.serve"):
                    problems.append(f"formats/{path.name}:{node.lineno} imports {name}")
    assert problems == []


def _fake(modules: Mapping[str, str]) -> dict[str, tuple[Path, str]]:
    root = Path("/pkg")
    out = {}
    for name, text in modules.items():
        parts = name.split(".")
        is_pkg = name.endswith(".__init__")
        mod = ".".join(parts[:-1]) if is_pkg else name
        out[mod] = (root.joinpath(*parts).with_suffix(".py"), text)
    return out


def test_cycle_checker_finds_a_circle_through_a_function_level_import() -> None:
    sources = _fake(
        {
            "m.__init__": "",
            "m.a": "from m.b import x\n",
            "m.b": "def f():\n    from m import a\n",
            "m.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n",
            "m.d": "import m.c\n",
            "m.e": "from m.a import y\n",
        }
    )
    assert cycles(import_edges(sources)) == [["m.a", "m.b"], ["m.c", "m.d"]]


def test_cycle_checker_counts_the_facade_but_not_parents() -> None:
    # m.a is imported by the facade; m.a importing a name from the facade closes a circle, but
    # m.a importing a sibling module does not (the facade running first is not an edge).
    with_facade = _fake({"m.__init__": "from m.a import x\n", "m.a": "from m import Name\n"})
    assert cycles(import_edges(with_facade)) == [["m", "m.a"]]
    siblings = _fake({"m.__init__": "from m.a import x\n", "m.a": "from m import b\n", "m.b": ""})
    assert cycles(import_edges(siblings)) == []
