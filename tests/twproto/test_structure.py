"""The structural check of request bodies, per format: the first field of the wrong JSON kind."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twproto.dialect import Dialect
from twproto.structure import SHAPES, JsonKind, check_structure

A, C, R, G = Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.GEMINI

GOOD: dict[Dialect, dict[str, Any]] = {
    A: {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
        ],
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
    },
    C: {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        ],
    },
    R: {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}]},
    G: {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_well_formed_bodies_pass(dialect: Dialect) -> None:
    assert check_structure(dialect, GOOD[dialect]) is None


def test_responses_input_may_be_text() -> None:
    assert check_structure(R, {"model": "m", "input": "hi"}) is None


@pytest.mark.parametrize(
    ("dialect", "body", "path", "found"),
    [
        (A, {"messages": "hi"}, "messages", JsonKind.TEXT),
        (A, {"messages": {"role": "user"}}, "messages", JsonKind.OBJECT),
        (A, {"messages": [{"role": "user", "content": "a"}, 7]}, "messages[1]", JsonKind.NUMBER),
        (A, {"messages": [{"content": "a"}]}, "messages[0].role", None),
        (
            A,
            {"messages": [{"role": "user", "content": ["x"]}]},
            "messages[0].content[0]",
            JsonKind.TEXT,
        ),
        (A, {}, "messages", None),
        (A, {"messages": [], "system": 3}, "system", JsonKind.NUMBER),
        (C, {"messages": None}, "messages", JsonKind.NULL),
        (C, {"messages": ["hi"]}, "messages[0]", JsonKind.TEXT),
        (C, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", JsonKind.NUMBER),
        (C, {"messages": [], "tools": {"a": 1}}, "tools", JsonKind.OBJECT),
        (R, {"input": 5}, "input", JsonKind.NUMBER),
        (R, {"input": ["hi"]}, "input[0]", JsonKind.TEXT),
        (G, {"contents": {"parts": []}}, "contents", JsonKind.OBJECT),
        (G, {"contents": [{"parts": "hi"}]}, "contents[0].parts", JsonKind.TEXT),
        (G, {"contents": [[]]}, "contents[0]", JsonKind.LIST),
    ],
)
def test_first_wrong_field_is_named(
    dialect: Dialect, body: dict[str, Any], path: str, found: JsonKind | None
) -> None:
    fault = check_structure(dialect, body)
    assert fault is not None
    assert (fault.path, fault.found) == (path, found)
    assert path in fault.message


def test_message_reads_well() -> None:
    fault = check_structure(A, {"messages": "hi"})
    assert fault is not None and fault.message == "messages must be a list, not text"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.sampled_from(list(SHAPES)),
    st.dictionaries(
        st.sampled_from(["messages", "contents", "input", "system", "tools", "role", "x"]),
        json_values,
        max_size=4,
    ),
)
def test_any_json_object_is_checked_without_raising(dialect: Dialect, body: dict[str, Any]) -> None:
    fault = check_structure(dialect, body)
    assert fault is None or fault.message


def _reference(dialect: Dialect, body: dict[str, Any]) -> tuple[str, JsonKind | None] | None:
    """The table read path by path on every call (the check before its shapes were taken apart
    once): the compiled check must name the same first fault."""

    def at(where: str, key: str | int) -> str:
        if isinstance(key, int):
            return f"{where}[{key}]"
        return f"{where}.{key}" if where else key

    for shape in SHAPES[dialect]:
        *parents, last = shape.path.split(".")
        found: list[tuple[str, Any]] = [("", body)]
        for segment in parents:
            name = segment.removesuffix("[]")
            step: list[tuple[str, Any]] = []
            for where, node in found:
                if isinstance(node, dict) and name in node:
                    here = at(where, name)
                    if not segment.endswith("[]"):
                        step.append((here, node[name]))
                    elif isinstance(node[name], list):
                        step.extend((at(here, i), v) for i, v in enumerate(node[name]))
            found = step
        name = last.removesuffix("[]")
        for where, parent in found:
            if not isinstance(parent, dict):
                continue
            if name not in parent:
                if shape.required and not last.endswith("[]"):
                    return at(where, name), None
                continue
            value = parent[name]
            values = enumerate(value) if last.endswith("[]") and isinstance(value, list) else ()
            if not last.endswith("[]"):
                kind = _kind_of(value)
                if kind not in shape.kinds:
                    return at(where, name), kind
            for i, item in values:
                kind = _kind_of(item)
                if kind not in shape.kinds:
                    return at(at(where, name), i), kind
    return None


def _kind_of(value: object) -> JsonKind | None:
    if value is None:
        return JsonKind.NULL
    if isinstance(value, bool):
        return JsonKind.BOOLEAN
    if isinstance(value, int | float):
        return JsonKind.NUMBER
    if isinstance(value, str):
        return JsonKind.TEXT
    if isinstance(value, dict):
        return JsonKind.OBJECT
    return JsonKind.LIST if isinstance(value, list) else None


message_like = st.fixed_dictionaries(
    {},
    optional={
        "role": json_values,
        "content": st.one_of(json_values, st.lists(json_values, max_size=3)),
        "parts": st.one_of(json_values, st.lists(json_values, max_size=3)),
        "tool_calls": st.one_of(json_values, st.lists(json_values, max_size=3)),
    },
)


@given(
    st.sampled_from(list(SHAPES)),
    st.dictionaries(
        st.sampled_from(["messages", "contents", "input", "system", "tools", "instructions"]),
        st.one_of(json_values, st.lists(st.one_of(message_like, json_values), max_size=4)),
        max_size=4,
    ),
)
def test_compiled_check_names_what_the_table_says(dialect: Dialect, body: dict[str, Any]) -> None:
    fault = check_structure(dialect, body)
    got = None if fault is None else (fault.path, fault.found)
    assert got == _reference(dialect, body)
