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
