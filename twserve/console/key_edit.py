"""Edits of the config file's ``clients`` section that leave every other byte alone.

The same splicing as `twserve.config.edit`: the file is parsed only to learn where each node
sits, and whole lines are inserted, replaced or deleted there. A new key entry is written in
block style after the last one, with the indentation the section already uses; a field is one
line (`limits` in flow style: ``limits: [{per: day, requests: 100}]``). A key written in flow
style, or a section written as a flow list, is not spliced: the operator edits such a file by
hand (`EditError` with ``what == "layout"``).

Functions here take the file's text and return the new text; they check nothing a config's
validation stages check (the caller applies the result through `LiveConfig.apply`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from twserve.config.check import load_document
from twserve.config.edit import (
    EditError,
    _end_line,
    _entry_span,
    _is_flow,
    _Lines,
    _trailing_comment,
    render_scalar,
)

__all__ = [
    "add_client",
    "client_key_text",
    "limits_value",
    "remove_client",
    "set_client_field",
]

# The order fields are written in a new entry (the order docs/configuration.md lists them).
_FIELD_ORDER = (
    "name",
    "key",
    "route",
    "max_concurrent",
    "disabled",
    "expires_at",
    "allowed_models",
    "limits",
)


def _clients(doc: Any) -> CommentedSeq | None:
    if not isinstance(doc, CommentedMap) or "clients" not in doc:
        return None
    seq = doc["clients"]
    if seq is None:
        return None
    if not isinstance(seq, CommentedSeq):
        raise EditError("layout", "clients is not a list")
    if _is_flow(seq) and len(seq):
        raise EditError("layout", "clients is written as a flow list; edit the file")
    return seq


def _index(seq: CommentedSeq | None, name: str) -> int:
    for i, item in enumerate(seq or ()):
        if isinstance(item, CommentedMap) and item.get("name") == name:
            if _is_flow(item):
                raise EditError("layout", f"key {name!r} is written in flow style; edit the file")
            return i
    raise EditError("key", f"the config has no key named {name!r}")


def _item_span(seq: CommentedSeq, i: int, lines: list[str]) -> tuple[int, int]:
    """First and last line of item `i` of a block sequence (from its ``-``)."""
    first = int(seq.lc.item(i)[0])
    if i + 1 < len(seq):
        last = int(seq.lc.item(i + 1)[0]) - 1
        while last > first and (not lines[last].strip() or lines[last].lstrip().startswith("#")):
            last -= 1
        return first, last
    end = _end_line(seq[i])
    return first, max(first, end if end is not None else first)


def _flow(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{render_scalar(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return render_scalar(str(value))


def limits_value(limits: Sequence[Mapping[str, Any]]) -> str:
    """A key's limits as one flow-style YAML value."""
    return _flow(list(limits))


def add_client(text: str, fields: Mapping[str, Any]) -> str:
    """Append a key entry (`fields`: name, key and any of route, max_concurrent, disabled,
    limits) to ``clients``; the section is added at the end of the file when absent."""
    doc = load_document(text)
    lines = _Lines(text)
    seq = _clients(doc)
    ordered = [(k, fields[k]) for k in _FIELD_ORDER if fields.get(k) is not None]
    if seq is not None and len(seq):
        first_line, col = (int(x) for x in seq.lc.item(0))
        dash = lines.lines[first_line].index("-")
        _, last = _item_span(seq, len(seq) - 1, lines.lines)
        at = last + 1
    else:
        dash, col = 2, 4
        if isinstance(doc, CommentedMap) and "clients" in doc:
            # `clients:` or `clients: []` with nothing in it: the entry takes its place.
            top, last = _entry_span(doc, "clients", lines.lines)
            lines.replace(top, last, ["clients:"])
            at = top + 1
        else:
            if lines.lines and lines.lines[-1].strip():
                lines.insert(len(lines.lines), [""])
            lines.insert(len(lines.lines), ["clients:"])
            at = len(lines.lines)
    new = []
    for n, (k, v) in enumerate(ordered):
        lead = " " * dash + "-" + " " * (col - dash - 1) if n == 0 else " " * col
        new.append(f"{lead}{k}: {_flow(v)}")
    lines.insert(at, new)
    return lines.text()


def remove_client(text: str, name: str) -> str:
    """Delete the key entry called `name` (its comments above it stay)."""
    doc = load_document(text)
    lines = _Lines(text)
    seq = _clients(doc)
    i = _index(seq, name)
    assert seq is not None
    first, last = _item_span(seq, i, lines.lines)
    if len(seq) == 1:
        top, end = _entry_span(doc, "clients", lines.lines)
        lines.replace(top, end, ["clients: []"])
    else:
        lines.replace(first, last, [])
    return lines.text()


def set_client_field(text: str, name: str, field: str, value: Any) -> str:
    """Set one field of the key entry `name` to `value` (None removes the field); the field's
    line is replaced in place (its end-of-line comment kept) or added after ``name:``."""
    doc = load_document(text)
    lines = _Lines(text)
    seq = _clients(doc)
    item = seq[_index(seq, name)] if seq is not None else None
    assert isinstance(item, CommentedMap)
    if field in item:
        first, last = _entry_span(item, field, lines.lines)
        if value is None:
            lines.replace(first, last, [])
            return lines.text()
        col = item.lc.key(field)[1]
        comment = _trailing_comment(lines.lines[first]) if first == last else ""
        lines.replace(first, last, [" " * col + f"{field}: {_flow(value)}" + comment])
        return lines.text()
    if value is None:
        return text
    _, after = _entry_span(item, "name", lines.lines) if "name" in item else (0, 0)
    col = item.lc.key("name")[1]
    lines.insert(after + 1, [" " * col + f"{field}: {_flow(value)}"])
    return lines.text()


def client_key_text(text: str, name: str) -> str | None:
    """The key of entry `name` as the file writes it (a ``${VAR}`` reference stays one)."""
    doc = load_document(text)
    seq = _clients(doc)
    item = seq[_index(seq, name)] if seq is not None else None
    assert isinstance(item, CommentedMap)
    value = item.get("key")
    return None if value is None else str(value)
