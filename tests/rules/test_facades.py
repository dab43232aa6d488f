"""The public API of `twproto` and `twengine` is tiered, as anyio's is (docs/library.md, "What is
where").

* **The top** (``import twproto``, ``import twengine``) is a short, explicit list: the verbs and
  types a proxy calls, about fifty per package, each one also reachable from its door (or, for
  the error family and the JSON codec, whose modules are private, only from the top).
* **Doors**: every public module directly under a package (`twproto.paths`, `twengine.limits`)
  and every public subpackage that exports names (`twproto.ir`, `twproto.stream`,
  `twengine.config`, `twengine.attempt`, each format of `twproto.formats`) is a door. A door
  subpackage exports every public name of the modules inside it; a subpackage exporting nothing
  (`twengine.config.stages`) is only a folder. `SUB_DOORS` names the two tables that are read by
  module instead (``defaults.PORT``).
* Every public module, at any depth (no part of its dotted name starts with ``_``), declares a
  tuple ``__all__`` of public names that resolve, listing every class and function it defines,
  and ``from m import *`` gives exactly that (anyio's tests/test_all_attributes.py).
* **No name means two things**: wherever a name is exported, in either package, it is the same
  object, so ``from twproto import *; from twengine import *`` or a door beside the top never
  shadows silently. The four format packages are exempt: each is a `twproto.formats.Format`, the
  same surface by design, and is spelled by its module (``anthropic.StreamDecoder``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import twengine
import twproto

PACKAGES = {"twproto": twproto, "twengine": twengine}

# About fifty verbs and types at the top of each package; a name past this is a door's.
TOP_MAX = 60

# Modules inside a door that are doors of their own: tables read by module (``defaults.PORT``).
SUB_DOORS = {"twengine.config.defaults", "twengine.config.schema"}

# The JSON codec's error is the codec's own class, re-exported on purpose.
FOREIGN_OK = {"JSONDecodeError"}

# The four formats share one surface (the `Format` protocol); they are spelled by module.
SAME_SURFACE = "twproto.formats."

LIBRARY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _public_modules(package: ModuleType) -> list[ModuleType]:
    """The package and all its public modules and subpackages, at every depth."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if _is_public(info.name):
            found.append(importlib.import_module(info.name))
    return found


MODULES = [module for package in PACKAGES.values() for module in _public_modules(package)]
BY_NAME = {module.__name__: module for module in MODULES}


def _module_id(module: ModuleType) -> str:
    return module.__name__


def _is_package(module: ModuleType) -> bool:
    return hasattr(module, "__path__")


def _is_door(module: ModuleType) -> bool:
    name = module.__name__
    if name in PACKAGES:
        return False  # the top is a selection, not a door
    if name.count(".") == 1 or name in SUB_DOORS:
        return True
    return _is_package(module) and bool(module.__all__)


def _door_of(module: ModuleType) -> ModuleType:
    """The door a module's names are reached through: itself, or the nearest door above it."""
    name = module.__name__
    while not _is_door(BY_NAME[name]):
        name = name.rpartition(".")[0]
    return BY_NAME[name]


def _doors(package: str) -> list[ModuleType]:
    return [m for m in MODULES if m.__name__.split(".")[0] == package and _is_door(m)]


def _collisions(modules: list[ModuleType]) -> dict[str, list[str]]:
    """Each name exported as two different objects, with the modules exporting it."""
    seen: dict[str, dict[int, list[str]]] = {}
    for module in modules:
        for item in module.__all__:
            by_object = seen.setdefault(item, {})
            by_object.setdefault(id(getattr(module, item)), []).append(module.__name__)
    return {
        item: sorted(names[0] for names in objects.values())
        for item, objects in seen.items()
        if len(objects) > 1
    }


def test_the_walk_reaches_every_depth() -> None:
    assert {
        "twproto.stream.hold",
        "twproto.sockets.responses",
        "twproto.formats.anthropic",
        "twproto.formats.anthropic.stream",
        "twengine.config.credentials",
        "twengine.config.build",
    } <= set(BY_NAME)
    assert not any("._" in name for name in BY_NAME)


@pytest.mark.parametrize("module", MODULES, ids=_module_id)
def test_all_is_a_tuple_of_public_names_that_resolve(module: ModuleType) -> None:
    names = getattr(module, "__all__", None)
    assert isinstance(names, tuple), f"{module.__name__}.__all__ is {type(names).__name__}"
    assert len(set(names)) == len(names)
    for item in names:
        assert not item.startswith("_"), item
        assert hasattr(module, item), item


@pytest.mark.parametrize("module", MODULES, ids=_module_id)
def test_all_lists_every_public_class_and_function_defined_here(module: ModuleType) -> None:
    defined = {
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert sorted(defined - set(module.__all__)) == []


@pytest.mark.parametrize("module", MODULES, ids=_module_id)
def test_star_import_gives_exactly_all(module: ModuleType) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module.__name__} import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(module.__all__)


@pytest.mark.parametrize("module", MODULES, ids=_module_id)
def test_nothing_leaks_from_another_package(module: ModuleType) -> None:
    package = module.__name__.split(".")[0]
    for item in module.__all__:
        obj = getattr(module, item)
        home = getattr(obj, "__module__", None)
        if item not in FOREIGN_OK and (isinstance(obj, type) or inspect.isfunction(obj)):
            assert home is not None and home.split(".")[0] == package, (item, home)


@pytest.mark.parametrize("name", PACKAGES)
def test_the_top_is_about_fifty_names(name: str) -> None:
    assert 40 <= len(PACKAGES[name].__all__) <= TOP_MAX


@pytest.mark.parametrize("name", PACKAGES)
def test_every_top_name_is_also_behind_its_door(name: str) -> None:
    # The top re-exports; the one exception is what lives in a private module (the error family,
    # the JSON codec), which has no door but the top.
    package = PACKAGES[name]
    doors = _doors(name)
    homeless = []
    for item in package.__all__:
        obj = getattr(package, item)
        if any(item in door.__all__ and getattr(door, item) is obj for door in doors):
            continue
        home = getattr(obj, "__module__", "") or ""
        if not (home.startswith(f"{name}._") or item in FOREIGN_OK):
            homeless.append(item)
    assert homeless == []


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_module_name_is_reachable_from_its_door(name: str) -> None:
    missing = []
    for module in MODULES:
        if module.__name__.split(".")[0] != name or module.__name__ == name:
            continue
        door = _door_of(module)
        for item in module.__all__:
            if item not in door.__all__ or getattr(door, item) is not getattr(module, item):
                missing.append(f"{module.__name__}.{item} (door {door.__name__})")
    assert missing == []


def test_the_vocabularies_have_doors() -> None:
    for door in (
        "twproto.ir",
        "twproto.formats",
        "twproto.stream",
        "twproto.sockets",
        "twproto.failures",
        "twproto.eventstream",
        "twproto.sigv4",
        "twengine.config",
        "twengine.attempt",
    ):
        assert _is_door(BY_NAME[door]) and BY_NAME[door].__all__, door
    assert {"State", "Input", "TRANSITIONS", "AttemptMachine"} <= set(twengine.attempt.__all__)
    assert _door_of(BY_NAME["twproto.stream.hold"]).__name__ == "twproto.stream"
    assert _door_of(BY_NAME["twengine.config.credentials"]).__name__ == "twengine.config"
    assert _door_of(BY_NAME["twengine.config.stages.routing"]).__name__ == "twengine.config"


def test_no_name_means_two_things() -> None:
    shared = [m for m in MODULES if not m.__name__.startswith(SAME_SURFACE)]
    assert _collisions(shared) == {}


def test_a_collision_is_found() -> None:
    # The check above is only as good as `_collisions`: two modules exporting one name for two
    # classes (as `Finish` once was, the IR's stop event and the attempt machine's end action).
    first, second, again = ModuleType("a"), ModuleType("b"), ModuleType("c")
    first.Finish, second.Finish = type("Finish", (), {}), type("Finish", (), {})  # type: ignore[attr-defined]
    again.Finish = first.Finish  # type: ignore[attr-defined]
    for module in (first, second, again):
        module.__all__ = ("Finish",)  # type: ignore[attr-defined]
    assert _collisions([first, again]) == {}
    assert _collisions([first, second, again]) == {"Finish": ["a", "b"]}


def _what_is_where() -> dict[str, set[str]]:
    """docs/library.md's "What is where" table: each row's first cell (a package or a door) and
    the code names the row lists."""
    page = LIBRARY_PAGE.read_text(encoding="utf-8")
    section = page.split("## What is where", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].split("`")[1]] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


@pytest.mark.parametrize("name", PACKAGES)
def test_the_library_page_lists_the_top_exactly(name: str) -> None:
    assert _what_is_where()[name] == set(PACKAGES[name].__all__)


def test_the_library_page_names_every_door() -> None:
    rows = _what_is_where()
    doors = {d.__name__ for name in PACKAGES for d in _doors(name)}
    top_level = {d for d in doors if d.count(".") == 1 or d in SUB_DOORS}
    assert set(rows) - set(PACKAGES) <= doors
    assert top_level <= set(rows)


def test_json_codec_has_a_public_home() -> None:
    assert twproto.json_loads(twproto.json_dumps({"a": [1, "é"]})) == {"a": [1, "é"]}
    with pytest.raises(twproto.JSONDecodeError):
        twproto.json_loads(b"{")
