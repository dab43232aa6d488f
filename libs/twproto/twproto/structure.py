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

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from twproto.dialect import Dialect

__all__ = ("SHAPES", "FieldShape", "JsonKind", "StructureFault", "check_structure")


class JsonKind(StrEnum):
    OBJECT = "an object"
    LIST = "a list"
    TEXT = "text"
    NUMBER = "a number"
    BOOLEAN = "true or false"
    NULL = "null"


# What a decoded JSON body holds, by exact type; anything else (a Mapping that is not a dict, a
# subclass) goes through `_kind_of`.
_KINDS: dict[type, JsonKind] = {
    dict: JsonKind.OBJECT,
    list: JsonKind.LIST,
    str: JsonKind.TEXT,
    int: JsonKind.NUMBER,
    float: JsonKind.NUMBER,
    bool: JsonKind.BOOLEAN,
    type(None): JsonKind.NULL,
}


def _kind(value: object) -> JsonKind | None:
    kind = _KINDS.get(type(value))
    return kind if kind is not None else _kind_of(value)


def _kind_of(value: object) -> JsonKind | None:
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


def _render(keys: tuple[str | int, ...]) -> str:
    where = ""
    for key in keys:
        where = _at(where, key)
    return where


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A `FieldShape` taken apart once: the steps to its parents (name, over a list's items),
    the field's name, and the kinds in `JsonKind` order for a fault's message."""

    steps: tuple[tuple[str, bool], ...]
    name: str
    items: bool  # ``name[]``: the kinds are those of the list's items
    kinds: frozenset[JsonKind]
    expected: tuple[JsonKind, ...]
    required: bool
    # The exact Python types a decoded body holds for `kinds`: a list whose items' types are
    # all among them passes without a look at each item (`set(map(type, ...))` runs in C).
    types: frozenset[type]


def _compile(shape: FieldShape) -> _Compiled:
    *parents, last = shape.path.split(".")
    return _Compiled(
        steps=tuple((p.removesuffix("[]"), p.endswith("[]")) for p in parents),
        name=last.removesuffix("[]"),
        items=last.endswith("[]"),
        kinds=shape.kinds,
        expected=tuple(k for k in JsonKind if k in shape.kinds),
        required=shape.required,
        types=frozenset(t for t, kind in _KINDS.items() if kind in shape.kinds),
    )


# Taken apart once, not on every request (the table is constant).
_COMPILED: Mapping[Dialect, tuple[_Compiled, ...]] = {
    dialect: tuple(_compile(shape) for shape in shapes) for dialect, shapes in SHAPES.items()
}

_Node = tuple[tuple[str | int, ...], Mapping[str, object]]


def _nodes(body: Mapping[str, object], steps: tuple[tuple[str, bool], ...]) -> list[_Node]:
    """(keys to it, parent object) for each place a field below `steps` belongs, present or
    not. The keys become a path string only for a fault."""
    found: list[tuple[tuple[str | int, ...], object]] = [((), body)]
    for name, over_items in steps:
        step: list[tuple[tuple[str | int, ...], object]] = []
        for keys, node in found:
            if not (type(node) is dict or isinstance(node, Mapping)) or name not in node:
                continue
            value, here = node[name], (*keys, name)
            if over_items:
                if type(value) is list or isinstance(value, list | tuple):
                    step.extend(((*here, i), item) for i, item in enumerate(value))
            else:
                step.append((here, value))
        found = step
    return [(keys, node) for keys, node in found if type(node) is dict or isinstance(node, Mapping)]


def check_structure(dialect: Dialect, body: Mapping[str, object]) -> StructureFault | None:
    """The first field of `body` whose JSON kind `dialect`'s API does not take, or None."""
    # Rows under the same parents (``messages[].role``, ``messages[].content``, ...) share one
    # walk to them; the rows are still checked in table order, so the fault reported is the same.
    walked: dict[tuple[tuple[str, bool], ...], list[_Node]] = {(): [((), body)]}
    for shape in _COMPILED[dialect]:
        name, kinds, steps = shape.name, shape.kinds, shape.steps
        parents = walked.get(steps)
        if parents is None:
            parents = walked[steps] = _nodes(body, steps)
        for keys, parent in parents:
            if name not in parent:
                if shape.required and not shape.items:
                    return StructureFault(
                        path=_render((*keys, name)), expected=shape.expected, found=None
                    )
                continue
            value = parent[name]
            if shape.items:
                if not isinstance(value, list | tuple) or set(map(type, value)) <= shape.types:
                    continue
                for i, item in enumerate(value):
                    kind = _kind(item)
                    if kind not in kinds:
                        return StructureFault(
                            path=_render((*keys, name, i)), expected=shape.expected, found=kind
                        )
                continue
            if type(value) in shape.types:
                continue
            kind = _kind(value)
            if kind not in kinds:
                return StructureFault(
                    path=_render((*keys, name)), expected=shape.expected, found=kind
                )
    return None
