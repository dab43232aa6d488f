"""``import twproto`` and ``import twengine`` are the public API (docs/library.md).

Every public module of either package, at any depth (a module is public when no part of its
dotted name starts with ``_``), declares its interface as a tuple ``__all__`` of public names
that all resolve, and lists there every class and function it defines under a public name
(anyio's tests/test_all_attributes.py holds its modules to the same).

Each package's facade (its ``__init__``) exports no name leaked from a dependency or another
package, and every name its public modules export — except the few listed below. A subpackage
whose ``__init__`` exports names (`twproto.formats`, `twengine.config`) is a facade of its own
and counts by its ``__init__``; one that exports none (`twproto.stream`, `twproto.sockets`) is
only a folder, whose modules answer to the facade above.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import twengine
import twproto

PACKAGES = {"twproto": twproto, "twengine": twengine}

# Names a public module exports that the facade leaves out, with where the facade's name of that
# spelling comes from instead (two modules still use one name for different things), or why.
NOT_IN_FACADE: dict[str, set[str]] = {
    "twproto": {
        "twproto.formats.get",  # the facade has FORMATS[dialect]
        "twproto.effort.gemini_budget_cap",  # the Gemini format's wire facts, not a proxy's verb
        "twproto.effort.gemini_uses_levels",
    },
    "twengine": {
        "twengine.attempt.SkipReason",  # twengine.SkipReason is routing's
        "twengine.config.State",  # twengine.State is the attempt machine's
        "twengine.balance.BalanceBy",  # the same enum as twengine.config.BalanceBy
        "twengine.groups.GroupType",  # the same enum as twengine.config.GroupType
    },
}


# The JSON codec's error is the codec's own class, re-exported on purpose.
FOREIGN_OK = {"JSONDecodeError"}


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _public_modules(package: ModuleType) -> list[ModuleType]:
    """The package and all its public modules and subpackages, at every depth."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if _is_public(info.name):
            found.append(importlib.import_module(info.name))
    return found


def _answering_to(package: ModuleType) -> list[ModuleType]:
    """The public modules whose names `package`'s facade must export: its own modules, those of
    its folders (subpackages exporting nothing), and each facade subpackage by its ``__init__``
    alone."""
    found = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if not _is_public(info.name):
            continue
        module = importlib.import_module(info.name)
        if info.ispkg and not module.__all__:
            found += _answering_to(module)
        else:
            found.append(module)
    return found


MODULES = [module for package in PACKAGES.values() for module in _public_modules(package)]


def _module_id(module: ModuleType) -> str:
    return module.__name__


def test_the_walk_reaches_every_depth() -> None:
    names = {module.__name__ for module in MODULES}
    assert {
        "twproto.stream.hold",
        "twproto.sockets.responses",
        "twproto.formats.anthropic",
        "twproto.formats.anthropic.stream",
        "twengine.config.credentials",
        "twengine.config.build",
    } <= names
    assert not any("._" in name for name in names)


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


@pytest.mark.parametrize("name", PACKAGES)
def test_nothing_leaks_from_another_package(name: str) -> None:
    package = PACKAGES[name]
    for item in package.__all__:
        obj = getattr(package, item)
        module = getattr(obj, "__module__", None)
        if item not in FOREIGN_OK and (isinstance(obj, type) or inspect.isfunction(obj)):
            assert module is not None and module.split(".")[0] == name, (item, module)


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_module_name_is_in_the_facade(name: str) -> None:
    package = PACKAGES[name]
    facade = set(package.__all__)
    missing = []
    for module in _answering_to(package):
        for item in module.__all__:
            qualified = f"{module.__name__}.{item}"
            if qualified in NOT_IN_FACADE[name]:
                continue
            if item not in facade:
                missing.append(qualified)
            elif getattr(package, item) is not getattr(module, item):
                missing.append(f"{qualified} (the facade's {item} is another object)")
    assert missing == []


def test_the_folders_are_folders() -> None:
    # twproto.stream and twproto.sockets show the pipeline; their names live in the facade.
    import twproto.sockets
    import twproto.stream

    assert twproto.stream.__all__ == () and twproto.sockets.__all__ == ()
    inner = {module.__name__ for module in _answering_to(twproto)}
    assert {"twproto.stream.hold", "twproto.stream.translators", "twproto.sockets.realtime"} <= (
        inner
    )


@pytest.mark.parametrize("name", PACKAGES)
def test_left_out_names_still_exist(name: str) -> None:
    # A stale entry in NOT_IN_FACADE would hide a name the facade should now have.
    for qualified in NOT_IN_FACADE[name]:
        module, _, item = qualified.rpartition(".")
        assert hasattr(importlib.import_module(module), item), qualified


def test_json_codec_has_a_public_home() -> None:
    assert twproto.json_loads(twproto.json_dumps({"a": [1, "é"]})) == {"a": [1, "é"]}
    with pytest.raises(twproto.JSONDecodeError):
        twproto.json_loads(b"{")
