"""The mock's scripting model: parsing, merging, the fail selectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from twmock import (
    ErrorSpec,
    MockSettings,
    Script,
    ScriptError,
    SilenceMode,
    parse_script,
)
from twmock.script import DEFAULT_REASONING, SCRIPT_FIELDS


def test_defaults() -> None:
    script = parse_script({})
    assert script == Script()
    assert not script.has_failure
    assert not script.has_selector


def test_every_field_parses() -> None:
    script = parse_script(
        {
            "text": "hello",
            "chunks": 3,
            "chunk_size": 2,
            "reasoning": "hmm",
            "tool_calls": 2,
            "tool_name": "read",
            "tool_arguments": {"path": "/tmp"},
            "tool_pieces": 4,
            "finish": "length",
            "usage": {"input": 10, "output": 5, "cache_read": 3, "cache_write": 2, "reasoning": 1},
            "echo": True,
            "validate": False,
            "head_delay": 0.1,
            "first_delay": 0.2,
            "chunk_delay": 0.01,
            "error": {"status": 429, "retry_after": 2, "retry_after_ms": 1500, "delay": 0.5},
            "stream_error_after": 2,
            "break_after": 3,
            "stall_after": 4,
            "silence": "after_head",
            "reset_before_head": True,
            "fail_first": 1,
            "fail_every": 2,
            "fail_rate": 0.5,
        }
    )
    assert script.text == "hello"
    assert script.tool_arguments == '{"path":"/tmp"}'
    assert script.usage.cache_read == 3
    assert script.error == ErrorSpec(status=429, retry_after=2.0, retry_after_ms=1500, delay=0.5)
    assert script.silence is SilenceMode.AFTER_HEAD
    assert script.has_failure and script.has_selector


def test_field_list_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "mock-upstream.md").read_text()
    for name in SCRIPT_FIELDS:
        assert f"`{name}`" in doc, name


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"nope": 1}, "unknown script field 'nope'"),
        ({"chunks": -1}, "chunks"),
        ({"chunks": True}, "chunks"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"fail_rate": 1.5}, "fail_rate"),
        ({"first_delay": "1"}, "first_delay"),
        ({"finish": "tool"}, "finish"),
        ({"silence": "later"}, "silence"),
        ({"tool_arguments": "[1]"}, "tool_arguments"),
        ({"usage": {"tokens": 1}}, "usage: unknown field"),
        ({"error": {"status": 200}}, "4xx or 5xx"),
        ({"error": {"colour": "red"}}, "error: unknown field"),
        ({"error": [429]}, "error"),
        ({"stream_error_before_content": 1}, "stream_error_before_content"),
        ([], "JSON object"),
    ],
)
def test_invalid_scripts(obj: object, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(obj)


def test_error_forms() -> None:
    assert parse_script({"error": 429}).error == ErrorSpec(status=429)
    assert parse_script({"error": "glm-1308"}).error == ErrorSpec(shape="glm-1308")
    assert parse_script({"error": True}).error == ErrorSpec()
    assert parse_script({"error": None}).error is None
    spec = parse_script({"error": {"status": 503, "headers": {"X-Why": "test"}}}).error
    assert spec is not None and spec.headers == (("x-why", "test"),)


def test_reasoning_forms() -> None:
    assert parse_script({"reasoning": True}).reasoning == DEFAULT_REASONING
    assert parse_script({"reasoning": False}).reasoning is None
    assert parse_script({"reasoning": "x"}).reasoning == "x"


def test_alias_stream_error_before_content() -> None:
    assert parse_script({"stream_error_before_content": True}).stream_error_after == 0
    assert parse_script({"stream_error_before_content": False}).stream_error_after is None


def test_merge_keeps_base_fields() -> None:
    base = parse_script({"chunks": 5, "usage": {"input": 100, "cache_read": 7}})
    merged = base.merged({"usage": {"output": 9}, "first_delay": 0.1})
    assert merged.chunks == 5
    assert merged.usage.input == 100 and merged.usage.cache_read == 7 and merged.usage.output == 9
    assert merged.first_delay == 0.1
    assert base.merged({}) is base


def test_parse_from_json_text() -> None:
    assert parse_script('{"chunks": 2}').chunks == 2
    assert parse_script(b'{"chunks": 2}').chunks == 2
    with pytest.raises(ScriptError, match="not JSON"):
        parse_script("{")


def test_without_selector_failure_applies_to_all() -> None:
    script = parse_script({"error": 500})
    assert all(script.fails(n, 0.99) for n in range(1, 10))
    assert not Script().fails(1, 0.0)


def test_fail_first() -> None:
    script = parse_script({"fail_first": 2, "error": 529})
    assert [script.fails(n, 0.99) for n in range(1, 6)] == [True, True, False, False, False]


def test_fail_every() -> None:
    script = parse_script({"fail_every": 3})
    assert [n for n in range(1, 10) if script.fails(n, 0.99)] == [3, 6, 9]


def test_fail_rate_uses_the_draw() -> None:
    script = parse_script({"fail_rate": 0.25})
    assert script.fails(1, 0.1)
    assert not script.fails(1, 0.25)
    assert not script.fails(1, 0.9)


def test_answer_only_drops_the_failure() -> None:
    script = parse_script({"error": 500, "break_after": 1, "silence": True, "fail_first": 1})
    plain = script.answer_only()
    assert not plain.has_failure
    assert plain.fail_first == 1


def test_profile_names_are_checked() -> None:
    MockSettings(profiles={"flaky": Script()})
    for bad in ("v1", "", "a/b", "v1beta"):
        with pytest.raises(ScriptError):
            MockSettings(profiles={bad: Script()})
