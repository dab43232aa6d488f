"""Every config field the schema accepts takes effect somewhere, or is refused as not built.

The walk goes over `twengine.config.schema.SECTIONS` — the very table the validator reads
mappings through — so a field added to the schema without code that reads it fails here.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

from twengine.config import ConfigError, build_config
from twengine.config.schema import FIELD_USES, NOT_BUILT, PENDING, SECTIONS

ROOT = Path(__file__).resolve().parents[3]
# The modules of build_config's stages: reading a field there is not the field taking effect.
STAGES = ("fields", "sections", "providers", "cloud", "routing", "consistency", "notify")
VALIDATOR = frozenset(
    (
        "twengine.config.build",
        "twengine.config.schema",
        "twengine.config.stages",
        *(f"twengine.config.stages.{name}" for name in STAGES),
    )
)
# The config package's other modules: the model, its defaults and the values the runtime reads.
NOT_STAGES = frozenset(
    f"twengine.config.{name}"
    for name in (
        "model",
        "listen",
        "defaults",
        "credentials",
        "cloud_access",
        "problem",
        "template",
    )
)


def accepted_fields() -> list[str]:
    paths: list[str] = []
    for section, names in SECTIONS.items():
        for name in names:
            paths.append(f"{section}.{name}" if section else name)
    return paths


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin).read_text(encoding="utf-8")


def test_every_accepted_field_is_read_refused_or_pending() -> None:
    unaccounted = [
        path
        for path in accepted_fields()
        if path not in FIELD_USES and path not in NOT_BUILT and path not in PENDING
    ]
    assert unaccounted == [], f"fields accepted but read by nothing: {unaccounted}"


def test_the_tables_name_only_accepted_fields() -> None:
    # A stale entry (a field renamed or removed) would let a new field slip through unread.
    accepted = set(accepted_fields())
    for table in (FIELD_USES, NOT_BUILT, PENDING):
        assert set(table) - accepted == set()
    assert not set(FIELD_USES) & set(NOT_BUILT)
    assert not set(FIELD_USES) & set(PENDING)
    assert not set(NOT_BUILT) & set(PENDING)


def test_the_validator_modules_are_the_config_package_s_stages() -> None:
    # A stage module renamed or added would otherwise count as a place where a field acts.
    import twengine.config
    import twengine.config.stages

    stages = {
        info.name
        for info in pkgutil.iter_modules(twengine.config.__path__, "twengine.config.")
        if info.name not in NOT_STAGES
    } | {
        info.name
        for info in pkgutil.iter_modules(twengine.config.stages.__path__, "twengine.config.stages.")
    }
    assert stages == VALIDATOR


@pytest.mark.parametrize("path", sorted(p for p, u in FIELD_USES.items() if u.module))
def test_the_named_reader_reads_the_field(path: str) -> None:
    use = FIELD_USES[path]
    assert use.module is not None
    assert use.module not in VALIDATOR, f"{path} is read by the validator, not where it acts"
    source = _source(use.module)
    assert re.search(rf"\.{use.attribute}\b", source), (
        f"{use.module} does not read .{use.attribute} (for {path})"
    )


@pytest.mark.parametrize("path", sorted(p for p, u in FIELD_USES.items() if not u.module))
def test_validator_only_fields_say_why(path: str) -> None:
    assert FIELD_USES[path].why


def _with(path: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1}
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return data


@pytest.mark.parametrize("path", sorted(p for p in NOT_BUILT if "." not in p))
def test_not_built_sections_are_refused(path: str) -> None:
    field = SECTIONS[path][0]
    with pytest.raises(ConfigError) as info:
        build_config(_with(f"{path}.{field}", "x://y"))
    assert [(p.code, p.path) for p in info.value.problems] == [("config.not_built", path)]


def test_operations_doc_lists_exactly_what_is_not_built() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("## Not built yet", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))
    # Each top-level not-built field or pending field group is listed once, by its shortest path.
    wanted = {p for p in (*NOT_BUILT, *PENDING) if not _covered_by_parent(p)}
    assert listed == wanted


def _covered_by_parent(path: str) -> bool:
    tables = {*NOT_BUILT, *PENDING}
    parts = path.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent in tables or parent.removesuffix("[]") in tables:
            return True
    return False
