"""Small edits to a config file's text that leave every other byte alone.

A write through the control plane changes one thing — a group's selected member, one model spec
— and the operator's file must come back as they wrote it: comments, blank lines, quoting, key
order, indentation. Dumping a whole ruamel round-trip document comes close but not all the way
(it respaces comments after flow collections, may move a key added at the end of a mapping past
a trailing comment, and normalises sequence indentation). So the edits here are *splices*: the
file is parsed with ruamel only to learn where each node sits (its line and column), and the
change is made by replacing, inserting or deleting whole lines at those positions. Lines outside
the edit are copied byte for byte.

New lines follow the file's own line ending and the indentation of the lines around them;
values are written in flow style on one line (``m: {context_window: 200000}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from twserve.configcheck import load_document

__all__ = [
    "EditError",
    "replace_secrets",
    "set_group_selected",
    "set_model_spec",
]

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./@+-]*$")
_RESERVED = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"})


class EditError(Exception):
    """The edit cannot be made: `what` says which name was not found (a provider, a group)."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what
        self.message = message


def scalar(value: str | int) -> str:
    """`value` as a YAML scalar: plain when that reads back the same, else double-quoted."""
    if isinstance(value, int):
        return str(value)
    if _PLAIN.match(value) and value.lower() not in _RESERVED:
        return value
    return json.dumps(value, ensure_ascii=False)


class _Lines:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.eol = "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"
        if self.lines and not self.lines[-1].endswith(("\n", "\r")):
            self.lines[-1] += self.eol

    def text(self) -> str:
        return "".join(self.lines)

    def insert(self, at: int, new: list[str]) -> None:
        self.lines[at:at] = [line + self.eol for line in new]

    def replace(self, first: int, last: int, new: list[str]) -> None:
        self.lines[first : last + 1] = [line + self.eol for line in new]


def _end_line(node: Any) -> int | None:
    """The last line any key, item or value of a container sits on."""
    if isinstance(node, CommentedMap):
        ends = []
        for key in node:
            ends.append(node.lc.key(key)[0])
            ends.append(node.lc.value(key)[0])
            child = _end_line(node[key])
            if child is not None:
                ends.append(child)
        return int(max(ends)) if ends else int(node.lc.line)
    if isinstance(node, CommentedSeq):
        ends = []
        for i, item in enumerate(node):
            ends.append(node.lc.item(i)[0])
            child = _end_line(item)
            if child is not None:
                ends.append(child)
        return int(max(ends)) if ends else int(node.lc.line)
    return None


def _entry_span(parent: CommentedMap, key: str, lines: list[str]) -> tuple[int, int]:
    """First and last line of `key` and its value in a block mapping."""
    first = parent.lc.key(key)[0]
    keys = list(parent)
    position = keys.index(key)
    if position + 1 < len(keys):
        last = parent.lc.key(keys[position + 1])[0] - 1
        # Blank and comment lines before the next key stay with it.
        while last > first and (not lines[last].strip() or lines[last].lstrip().startswith("#")):
            last -= 1
        return first, last
    value_end = _end_line(parent[key])
    return first, max(first, parent.lc.value(key)[0], value_end or first)


def _named(doc: Any, section: str, name: str, what: str) -> CommentedMap:
    items = doc.get(section) if isinstance(doc, CommentedMap) else None
    if isinstance(items, CommentedSeq):
        for item in items:
            if isinstance(item, CommentedMap) and item.get("name") == name:
                return item
    raise EditError(what, f"the config has no {what} named {name!r}")


def _is_flow(node: Any) -> bool:
    return bool(node.fa.flow_style()) if isinstance(node, (CommentedMap, CommentedSeq)) else False


def _anchor(item: CommentedMap) -> tuple[int, int]:
    """Where a new key goes in a block mapping: the line after its single-line ``name:`` (or
    first key), at that key's column."""
    key = "name" if "name" in item else next(iter(item))
    line, col = item.lc.key(key)
    if isinstance(item[key], (CommentedMap, CommentedSeq)):
        raise EditError("layout", f"cannot place a new field after {key!r}")
    return line + 1, col


def set_group_selected(text: str, group: str, member: str) -> str:
    """Set ``groups[<group>].selected`` to `member` (no check that it is a member: validation
    of the result does that)."""
    doc = load_document(text)
    lines = _Lines(text)
    item = _named(doc, "groups", group, "group")
    if _is_flow(item):
        raise EditError("layout", f"group {group!r} is written in flow style; edit the file")
    if "selected" in item:
        first, last = _entry_span(item, "selected", lines.lines)
        col = item.lc.key("selected")[1]
        old = lines.lines[first]
        comment = _trailing_comment(old) if first == last else ""
        lines.replace(first, last, [" " * col + "selected: " + scalar(member) + comment])
    else:
        at, col = _anchor(item)
        lines.insert(at, [" " * col + "selected: " + scalar(member)])
    return lines.text()


def _trailing_comment(line: str) -> str:
    """A ``  # comment`` at the end of a simple ``key: value`` line, kept through an edit."""
    match = re.search(r"(\s+#.*?)\s*$", line)
    if match is None or any(q in line[: match.start()] for q in "\"'"):
        return ""
    return match.group(1)


def _spec_value(spec: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in spec.items()) + "}"


def set_model_spec(text: str, provider: str, model: str, spec: Mapping[str, int] | None) -> str:
    """Set (or with `spec` None, clear) ``providers[<provider>].model_specs[<model>]``."""
    doc = load_document(text)
    lines = _Lines(text)
    item = _named(doc, "providers", provider, "provider")
    if _is_flow(item):
        raise EditError("layout", f"provider {provider!r} is written in flow style; edit the file")
    specs = item.get("model_specs")
    if "model_specs" in item and specs is not None and not isinstance(specs, CommentedMap):
        raise EditError("layout", f"providers[{provider!r}].model_specs is not a mapping")
    if isinstance(specs, CommentedMap) and _is_flow(specs):
        raise EditError(
            "layout", f"provider {provider!r} writes model_specs in flow style; edit the file"
        )
    entry = f"{scalar(model)}: {_spec_value(spec)}" if spec is not None else None
    if isinstance(specs, CommentedMap) and model in specs:
        first, last = _entry_span(specs, model, lines.lines)
        if entry is not None:
            lines.replace(first, last, [" " * specs.lc.key(model)[1] + entry])
        elif len(specs) > 1:
            lines.replace(first, last, [])
        else:
            # The last entry goes, and the empty `model_specs:` with it.
            top, _ = _entry_span(item, "model_specs", lines.lines)
            lines.replace(top, last, [])
        return lines.text()
    if entry is None:
        return text
    if isinstance(specs, CommentedMap) and len(specs):
        last_key = list(specs)[-1]
        _, last = _entry_span(specs, last_key, lines.lines)
        lines.insert(last + 1, [" " * specs.lc.key(last_key)[1] + entry])
        return lines.text()
    if "model_specs" in item:
        # `model_specs:` with nothing under it (or `{}`): write the entry in its place.
        first, last = _entry_span(item, "model_specs", lines.lines)
        col = item.lc.key("model_specs")[1]
        lines.replace(first, last, [" " * col + "model_specs:", " " * (col + 2) + entry])
        return lines.text()
    at, col = _anchor(item)
    lines.insert(at, [" " * col + "model_specs:", " " * (col + 2) + entry])
    return lines.text()


def replace_secrets(text: str, choose: Callable[[str, str], str | None]) -> str:
    """Each secret value in the file (keys, header values, DSNs) passed to `choose(path,
    value)`; a returned string takes its place on its own line, None leaves it. Used to mask
    the file for reading and to put masked secrets back on a write."""
    doc = load_document(text)
    lines = _Lines(text)
    edits: list[tuple[int, int, str, str]] = []
    _walk_secrets(doc, "", False, choose, edits)
    for line, col, old, new in edits:
        if 0 <= line < len(lines.lines):
            head, tail = lines.lines[line][:col], lines.lines[line][col:]
            if old in tail:
                lines.lines[line] = head + tail.replace(old, new, 1)
    return lines.text()


_SECRET_FIELDS = frozenset({"key", "redis_url", "postgres_dsn"})


def _walk_secrets(
    node: Any,
    path: str,
    under_headers: bool,
    choose: Callable[[str, str], str | None],
    edits: list[tuple[int, int, str, str]],
) -> None:
    if isinstance(node, CommentedMap):
        for key in node:
            value = node[key]
            here = f"{path}.{key}" if path else str(key)
            if isinstance(value, str) and (under_headers or str(key) in _SECRET_FIELDS):
                new = choose(here, value)
                if new is not None and new != value:
                    line, col = node.lc.value(key)
                    edits.append((line, col, value, new))
            else:
                _walk_secrets(value, here, str(key) == "headers", choose, edits)
    elif isinstance(node, CommentedSeq):
        for i, item in enumerate(node):
            _walk_secrets(item, f"{path}[{i}]", under_headers, choose, edits)
