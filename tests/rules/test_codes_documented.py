"""The code registry, docs/codes.md and the source agree.

* every code in `twengine.codes.CODES` is listed in docs/codes.md with the same meaning, and the
  docs list no other code;
* every string literal in twproto, twengine and twserve shaped like a message code
  (``"gw.upstream.connect"``) is registered.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.layout import PACKAGE_DIRS, ROOT
from twengine.codes import CODES, PREFIXES

PACKAGES = ("twproto", "twengine", "twserve")
DOC_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")
CODE_SHAPE = re.compile(r"(?:gw|config|engine|control)(?:\.[a-z0-9_]+)+")
# File names share the shape (``config.yaml``); they are not codes.
NOT_CODES = re.compile(r".*\.(?:ya?ml|json|toml|py|md|txt|log|db|sqlite3?|lock|tmp|bak)")


def documented() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in (ROOT / "docs" / "codes.md").read_text(encoding="utf-8").splitlines():
        m = DOC_ROW.match(line)
        if m and m[1] != "code":
            assert m[1] not in rows, f"{m[1]} is listed twice in docs/codes.md"
            rows[m[1]] = m[2]
    return rows


def test_registry_shape() -> None:
    for code, meaning in CODES.items():
        assert code.startswith(PREFIXES), code
        assert CODE_SHAPE.fullmatch(code), code
        assert meaning.strip() and "\n" not in meaning and "|" not in meaning, code


def test_docs_list_every_code_with_its_meaning() -> None:
    docs = documented()
    assert sorted(set(CODES) - set(docs)) == [], "registered but not in docs/codes.md"
    assert sorted(set(docs) - set(CODES)) == [], "in docs/codes.md but not registered"
    differing = {c: (CODES[c], docs[c]) for c in CODES if CODES[c] != docs[c]}
    assert differing == {}


def literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_every_code_used_in_the_source_is_registered() -> None:
    unregistered = []
    for package in PACKAGES:
        for path in sorted(PACKAGE_DIRS[package].rglob("*.py")):
            for line, value in literals(path):
                shaped = CODE_SHAPE.fullmatch(value) and not NOT_CODES.fullmatch(value)
                if shaped and value not in CODES:
                    unregistered.append(f"{path.relative_to(ROOT)}:{line}: {value}")
    assert unregistered == []


def test_the_scan_sees_codes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('X = "gw.made_up.code"\nY = "config.yaml"\nZ = f"gw.{1}"\n')
    found = [v for _, v in literals(sample) if CODE_SHAPE.fullmatch(v)]
    assert [v for v in found if not NOT_CODES.fullmatch(v)] == ["gw.made_up.code"]
