"""The Python examples in docs/ run as written.

Every ```python block of docs/library.md runs, and on the other pages under docs/ every block
whose fence directly follows a line ``<!-- runnable -->`` (blank lines between are allowed).
Each block runs on its own, in a fresh namespace, as a script would: an exception or a failed
assertion fails the test, named by the page and the line of the block.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
ALL_BLOCKS = ("library.md",)
MARKER = "<!-- runnable -->"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    source: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: str, text: str) -> list[Block]:
    """The runnable python blocks of one page (see the module docstring)."""
    run_all = page in ALL_BLOCKS
    lines = text.splitlines()
    found: list[Block] = []
    marked = False
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m is None:
            if line.strip() == MARKER:
                marked = True
            elif line.strip():
                marked = False
            i += 1
            continue
        # A fenced block: find its end (the same fence character, at least as long).
        fence = m["fence"]
        indent = len(m["indent"])
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        i += 1
        language = m["info"].strip().split(" ")[0].lower()
        if language in ("python", "py") and (run_all or marked):
            found.append(Block(page=page, line=start + 1, source="\n".join(body) + "\n"))
        elif marked and not run_all:
            raise AssertionError(f"{page}:{start + 1}: {MARKER} is not followed by a python block")
        marked = False
    return found


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for path in sorted(DOCS.glob("*.md")):
        out += blocks_of(path.name, path.read_text(encoding="utf-8"))
    return out


BLOCKS = all_blocks()


def test_library_page_has_examples() -> None:
    assert sum(b.page == "library.md" for b in BLOCKS) >= 8


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_example_runs(block: Block) -> None:
    # The code object is named after the page, and every line number is shifted to the page's
    # own, so a traceback points into the markdown file.
    filename = str(DOCS / block.page)
    source = "\n" * block.line + block.source
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.name}: the example does not compile (line {exc.lineno}): {exc.msg}")
    namespace: dict[str, object] = {"__name__": f"docs_example_{block.line}"}
    try:
        exec(code, namespace)
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        where = f"line {frames[-1].lineno}" if frames else "unknown line"
        detail = "".join(traceback.format_exception_only(exc)).strip()
        pytest.fail(f"{block.name}: the example failed at {where}: {detail}")


def test_marker_finds_blocks() -> None:
    page = "\n".join(
        [
            "<!-- runnable -->",
            "",
            "```python",
            "x = 1",
            "```",
            "",
            "```python",
            "not run",
            "```",
            "<!-- runnable -->",
            "text in between",
            "```python",
            "not run either",
            "```",
        ]
    )
    (block,) = blocks_of("other.md", page)
    assert (block.line, block.source) == (3, "x = 1\n")
    assert len(blocks_of("library.md", page)) == 3
