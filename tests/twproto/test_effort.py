"""Reasoning effort: turning it off removes every switch; a refused level picks an accepted one;
what a request asks for is read in each format (docs/operations.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from twproto.dialect import Dialect
from twproto.effort import (
    level_after_refusal,
    requested_effort,
    sets_only_budget,
    without_reasoning_switches,
)
from twproto.ir import Effort, ReasoningLevel
from twproto.translate import translate_request

A, C, R, G = Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.GEMINI
MSG = [{"role": "user", "content": "hi"}]


def _off(body: dict[str, Any], source: Dialect, target: Dialect) -> dict[str, Any]:
    out = translate_request(json.dumps(body).encode(), source, target, reasoning=ReasoningLevel.OFF)
    parsed: dict[str, Any] = json.loads(out.body)
    return parsed


def test_off_removes_anthropic_thinking_and_effort() -> None:
    body = {
        "model": "m",
        "max_tokens": 100,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {}}},
        "messages": MSG,
    }
    out = _off(body, A, A)
    assert "thinking" not in out
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": {}}}
    only_effort = _off({**body, "output_config": {"effort": "max"}}, A, A)
    assert "output_config" not in only_effort and "thinking" not in only_effort


def test_off_removes_the_glm_thinking_switch() -> None:
    out = _off({"model": "glm-4.6", "thinking": {"type": "enabled"}, "messages": MSG}, C, C)
    assert "thinking" not in out and "reasoning_effort" not in out


def test_off_converted_to_anthropic_has_no_thinking() -> None:
    out = _off({"model": "m", "reasoning_effort": "high", "messages": MSG}, C, A)
    assert "thinking" not in out and "output_config" not in out


def test_extras_without_switches_keeps_the_rest() -> None:
    extras = {"thinking": {"type": "enabled"}, "output_config": {"effort": "low"}, "x": 1}
    assert without_reasoning_switches(extras) == {"x": 1}


@pytest.mark.parametrize(
    ("asked", "message", "expected"),
    [
        # The one the error names.
        (Effort.XHIGH, "effort must be 'high' for this model", Effort.HIGH),
        # The nearest listed; between two as near, the lower.
        (
            Effort.XHIGH,
            "does not support effort level 'xhigh'. Supported levels: high, low, max, medium.",
            Effort.HIGH,
        ),
        (
            Effort.NONE,
            "'reasoning_effort' does not support 'none'. Supported values are: 'minimal', 'low', "
            "'medium', and 'high'.",
            Effort.MINIMAL,
        ),
        (Effort.MINIMAL, "supported values are: low, medium, high", Effort.LOW),
        # Above every listed level: the ceiling.
        (Effort.MAX, "supported: low, medium, high", Effort.HIGH),
        (None, "supported: low, medium, high", Effort.HIGH),
        # Nothing named: resend without an effort.
        (Effort.HIGH, "reasoning_effort is not supported with this model", None),
        (Effort.HIGH, "this model does not support 'high'", None),
    ],
)
def test_level_after_refusal(asked: Effort | None, message: str, expected: Effort | None) -> None:
    assert level_after_refusal(asked, message) == expected


@pytest.mark.parametrize(
    ("dialect", "body", "effort", "budget_only"),
    [
        (A, {"thinking": {"type": "enabled", "budget_tokens": 31999}}, Effort.HIGH, True),
        (
            A,
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
            Effort.MAX,
            False,
        ),
        (C, {"reasoning_effort": "low"}, Effort.LOW, False),
        (R, {"reasoning": {"effort": "medium"}}, Effort.MEDIUM, False),
        (G, {"generationConfig": {"thinkingConfig": {"thinkingBudget": 2048}}}, Effort.LOW, True),
        (
            G,
            {"generationConfig": {"thinkingConfig": {"thinkingLevel": "high"}}},
            Effort.HIGH,
            False,
        ),
        (C, {}, None, False),
    ],
)
def test_what_a_request_asks(
    dialect: Dialect, body: dict[str, Any], effort: Effort | None, budget_only: bool
) -> None:
    assert requested_effort(body, dialect) == effort
    assert sets_only_budget(body, dialect) is budget_only
