"""The structural check of a request body: is each field the kind of JSON value its API expects?

A same-format request is passed upstream byte for byte, without being decoded into the IR, so a
body whose ``messages`` is a string or whose message is a number would otherwise reach the
upstream — or trip up the gateway's own reading of it later. `check_structure` reads the body
against a small table per format (`SHAPES`) and returns the first field of the wrong kind, so
the gateway can refuse the request with a 400 in the client's format before any upstream sees
it (docs/operations.md: a refused request never reaches an upstream).

Only the shape is checked — lists, objects and text where the API has them — not values:
whether a role or a model exists is the upstream's to say. Fields outside the table are not
looked at, so a field an API adds later passes.

A path in the table is dotted; ``name[]`` stands for every item of the list ``name``. A row
applies wherever its path exists; `required` rows must exist where their parent does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from twproto.dialect import Dialect

__all__ = ["SHAPES", "FieldShape", "JsonKind", "StructureFault", "check_structure"]


class JsonKind(StrEnum):
    OBJECT = "an object"
    LIST = "a list"
    TEXT = "text"
    NUMBER = "a number"
    BOOLEAN = "true or false"
    NULL = "null"


def _kind(value: object) -> JsonKind | None:
    if value is None:
        return JsonKind.NULL
    if isinstance(value, bool):
        return JsonKind.BOOLEAN
    if isinstance(value, int | float):
        return JsonKind.NUMBER
    if isinstance(value, str):
        return JsonKind.TEXT
    if isinstance(value, Mapping):
        return JsonKind.OBJECT
    if isinstance(value, list | tuple):
        return JsonKind.LIST
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldShape:
    """Field `path` must be one of `kinds`; with `required`, it must be present."""

    path: str
    kinds: frozenset[JsonKind]
    required: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StructureFault:
    """The first field of the wrong kind: where (``messages[2]``), and what it should be."""

    path: str
    expected: tuple[JsonKind, ...]
    found: JsonKind | None  # None: the field is missing

    @property
    def message(self) -> str:
        """The fault in words for the client's error body."""
        wanted = " or ".join(k.value for k in self.expected)
        if self.found is None:
            return f"{self.path} is required ({wanted})"
        return f"{self.path} must be {wanted}, not {self.found.value}"


def _shape(path: str, *kinds: JsonKind, required: bool = False) -> FieldShape:
    return FieldShape(path=path, kinds=frozenset(kinds), required=required)


_O, _L, _T, _N = JsonKind.OBJECT, JsonKind.LIST, JsonKind.TEXT, JsonKind.NULL

SHAPES: Mapping[Dialect, tuple[FieldShape, ...]] = {
    Dialect.ANTHROPIC: (
        _shape("messages", _L, required=True),
        _shape("messages[]", _O),
        _shape("messages[].role", _T, required=True),
        _shape("messages[].content", _T, _L, required=True),
        _shape("messages[].content[]", _O),
        _shape("system", _T, _L),
        _shape("system[]", _O),
        _shape("tools", _L),
        _shape("tools[]", _O),
        _shape("tool_choice", _O),
        _shape("thinking", _O),
        _shape("metadata", _O),
    ),
    Dialect.OPENAI_CHAT: (
        _shape("messages", _L, required=True),
        _shape("messages[]", _O),
        _shape("messages[].role", _T, required=True),
        _shape("messages[].content", _T, _L, _N),
        _shape("messages[].content[]", _O),
        _shape("messages[].tool_calls", _L, _N),
        _shape("messages[].tool_calls[]", _O),
        _shape("tools", _L),
        _shape("tools[]", _O),
        _shape("stream_options", _O, _N),
    ),
    Dialect.OPENAI_RESPONSES: (
        _shape("input", _T, _L),
        _shape("input[]", _O),
        _shape("input[].content", _T, _L, _N),  # reasoning items carry content: null
        _shape("input[].content[]", _O),
        _shape("instructions", _T, _N),
        _shape("tools", _L),
        _shape("tools[]", _O),
        _shape("reasoning", _O, _N),
    ),
    Dialect.GEMINI: (
        _shape("contents", _L),
        _shape("contents[]", _O),
        _shape("contents[].parts", _L),
        _shape("contents[].parts[]", _O),
        _shape("contents[].role", _T),
        _shape("systemInstruction", _O),
        _shape("system_instruction", _O),
        _shape("tools", _L),
        _shape("tools[]", _O),
        _shape("generationConfig", _O),
        _shape("generation_config", _O),
    ),
}


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _nodes(body: Mapping[str, object], path: str) -> list[tuple[str, Mapping[str, object], str]]:
    """(where, parent object, field name) for each place field `path` belongs, present or not."""
    *parents, last = path.split(".")
    found: list[tuple[str, object]] = [("", body)]
    for segment in parents:
        name = segment.removesuffix("[]")
        step: list[tuple[str, object]] = []
        for where, node in found:
            if not isinstance(node, Mapping) or name not in node:
                continue
            value, here = node[name], _at(where, name)
            if segment.endswith("[]"):
                if isinstance(value, list | tuple):
                    step.extend((_at(here, i), item) for i, item in enumerate(value))
            else:
                step.append((here, value))
        found = step
    return [(where, node, last) for where, node in found if isinstance(node, Mapping)]


def check_structure(dialect: Dialect, body: Mapping[str, object]) -> StructureFault | None:
    """The first field of `body` whose JSON kind `dialect`'s API does not take, or None."""
    for shape in SHAPES[dialect]:
        expected = tuple(k for k in JsonKind if k in shape.kinds)
        for where, parent, last in _nodes(body, shape.path):
            name = last.removesuffix("[]")
            if name not in parent:
                if shape.required and not last.endswith("[]"):
                    return StructureFault(path=_at(where, name), expected=expected, found=None)
                continue
            value = parent[name]
            if last.endswith("[]"):
                items: Sequence[object] = value if isinstance(value, list | tuple) else ()
                for i, item in enumerate(items):
                    kind = _kind(item)
                    if kind not in shape.kinds:
                        return StructureFault(
                            path=_at(_at(where, name), i), expected=expected, found=kind
                        )
                continue
            kind = _kind(value)
            if kind not in shape.kinds:
                return StructureFault(path=_at(where, name), expected=expected, found=kind)
    return None
