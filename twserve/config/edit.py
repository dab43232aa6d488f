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
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from twserve.config.check import compose_document, load_document, split_lines

__all__ = [
    "EditError",
    "SecretSpan",
    "Verbatim",
    "render_scalar",
    "replace_secrets",
    "secret_spans",
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
        # Lines as YAML counts them, so that ruamel's line N is lines[N] (a U+2028 inside a
        # value is no line break).
        self.lines = split_lines(text, keepends=True)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretSpan:
    """One secret value of a config file (a key, a header value, a DSN): its field's path, its
    parsed value, and where its text sits (`start`/`end`, offsets into the file's text, from
    the first character of the scalar — a quote, a ``|`` — to the end of its last line)."""

    path: str
    value: str
    start: int
    end: int
    block: bool = False

    def source(self, text: str) -> str:
        return text[self.start : self.end]


@dataclass(frozen=True, slots=True)
class Verbatim:
    """YAML text a `replace_secrets` choice puts in as it is, instead of a value to write."""

    text: str


_SECRET_FIELDS = frozenset({"key", "previous_key", "redis_url", "postgres_dsn"})
# A value that reads back as itself when written plain: no indicator, quote, comment or space.
_PLAIN_SAFE = re.compile(r"[^\s#:'\"\[\]{},&*!|>%@`][^\s#'\"\[\]{},]*")


def secret_spans(text: str) -> list[SecretSpan]:
    """Every secret value in `text`, found on the parsed nodes, so a value written as a block
    scalar, over several lines, quoted with escapes or in flow style is found whole (raises
    ruamel's `YAMLError` when `text` does not parse)."""
    spans: list[SecretSpan] = []
    root = compose_document(text)
    if root is not None:
        _walk_spans(root, "", False, spans)
    return spans


def _walk_spans(node: Node, path: str, under_headers: bool, out: list[SecretSpan]) -> None:
    if isinstance(node, MappingNode):
        for key_node, value in node.value:
            name = str(key_node.value) if isinstance(key_node, ScalarNode) else "?"
            here = f"{path}.{name}" if path else name
            secret = under_headers or name in _SECRET_FIELDS
            if isinstance(value, ScalarNode) and secret:
                if value.value == "" and not value.style:
                    continue  # `key:` with nothing: nothing to hide
                out.append(
                    SecretSpan(
                        path=here,
                        value=str(value.value),
                        start=value.start_mark.index,
                        end=value.end_mark.index,
                        block=value.style in ("|", ">"),
                    )
                )
            else:
                _walk_spans(value, here, name == "headers", out)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _walk_spans(item, f"{path}[{i}]", under_headers, out)


_NUMBER_LIKE = re.compile(
    r"[-+]?(?:[\d_]+(?:\.[\d_]*)?|\.[\d_]+)(?:e[-+]?\d+)?|0x[0-9a-f_]+|0o[0-7_]+|[-+]?\.(?:inf|nan)",
    re.I,
)


def render_scalar(value: str) -> str:
    """`value` as a one-line YAML scalar: plain when that reads back as the same text, else in
    double quotes."""
    if (
        _PLAIN_SAFE.fullmatch(value)
        and value.lower() not in _RESERVED
        and value not in ("-", "?")
        and not _NUMBER_LIKE.fullmatch(value)
    ):
        return value
    return json.dumps(value, ensure_ascii=False)


def replace_secrets(text: str, choose: Callable[[str, str], str | Verbatim | None]) -> str:
    """Each secret value in the file (keys, header values, DSNs) passed to `choose(path,
    value)`; a returned value is written in its place (a `Verbatim` as it is), None leaves it.
    Only the value's own text changes, however it was written. Used to mask the file for
    reading and to put masked secrets back on a write."""
    pieces: list[str] = []
    at = 0
    for span in secret_spans(text):
        new = choose(span.path, span.value)
        if new is None or new == span.value:
            continue
        old = span.source(text)
        # A block scalar's text ends with its line break (and blank lines kept with it).
        body = old.rstrip("\r\n") if span.block else old
        rendered = new.text if isinstance(new, Verbatim) else render_scalar(new)
        pieces.append(text[at : span.start])
        pieces.append(rendered + old[len(body) :])
        at = span.end
    pieces.append(text[at:])
    return "".join(pieces)
