"""``import twproto`` and ``import twengine`` are the public API (docs/library.md).

Each package's ``__all__`` is a tuple of names that all resolve, none private, each defined in
that package (not leaked from a dependency or another package), and every name a public module
of the package exports is in it — except the few listed below, which a module still shares
with another module.
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
# spelling comes from instead (two modules still use one name for different things).
NOT_IN_FACADE: dict[str, set[str]] = {
    "twproto": {"twproto.formats.get"},  # the facade has FORMATS[dialect]
    "twengine": {
        "twengine.attempt.SkipReason",  # twengine.SkipReason is routing's
        "twengine.config.State",  # twengine.State is the attempt machine's
        "twengine.balance.BalanceBy",  # the same enum as twengine.config.BalanceBy
        "twengine.groups.GroupType",  # the same enum as twengine.config.GroupType
    },
}


# The JSON codec's error is the codec's own class, re-exported on purpose.
FOREIGN_OK = {"JSONDecodeError"}


def _public_modules(package: ModuleType) -> list[ModuleType]:
    """The package's public modules one level down; a subpackage (twproto.formats,
    twengine.config) counts by its own ``__init__``, which is that subpackage's facade."""
    found = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if not info.name.rpartition(".")[2].startswith("_"):
            found.append(importlib.import_module(info.name))
    return found


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_a_tuple_of_public_names_that_resolve(name: str) -> None:
    package = PACKAGES[name]
    names = package.__all__
    assert isinstance(names, tuple)
    assert len(set(names)) == len(names)
    for item in names:
        assert not item.startswith("_"), item
        assert hasattr(package, item), item


@pytest.mark.parametrize("name", PACKAGES)
def test_star_import_gives_exactly_all(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(PACKAGES[name].__all__)


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
    for module in _public_modules(package):
        for item in getattr(module, "__all__", ()):
            qualified = f"{module.__name__}.{item}"
            if qualified in NOT_IN_FACADE[name]:
                continue
            if item not in facade:
                missing.append(qualified)
            elif getattr(package, item) is not getattr(module, item):
                missing.append(f"{qualified} (the facade's {item} is another object)")
    assert missing == []


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
