"""Reasoning effort across formats: one table of levels, budgets and per-format names.

The formats express "how hard to think" differently: Anthropic by a thinking budget in tokens
(``thinking.budget_tokens``) or, with adaptive thinking, a level (``output_config.effort``);
OpenAI by a level (``reasoning_effort`` / ``reasoning.effort``); Gemini 2.5 by a budget
(``thinkingConfig.thinkingBudget``) and Gemini 3 by a level (``thinkingLevel``). A level maps to
a budget through `EFFORT_BUDGET`, a budget back to a level through `BUDGET_EFFORT` (the largest
level whose budget does not exceed it), so level → budget → level is the identity for the
levels every format has.

| level   | budget | OpenAI  | Anthropic effort | Gemini 3 level |
|---------|--------|---------|------------------|----------------|
| minimal | 1024   | minimal | low              | low            |
| low     | 2048   | low     | low              | low            |
| medium  | 8192   | medium  | medium           | high           |
| high    | 24576  | high    | high             | high           |
| xhigh   | 32768  | xhigh   | xhigh            | high           |
| max     | 65536  | xhigh   | max              | high           |

Claude Code's ``budget_tokens: 31999`` therefore reads as ``high``.
"""

from __future__ import annotations

from collections.abc import Mapping

from twproto.ir import Effort

__all__ = [
    "ANTHROPIC_EFFORT",
    "ANTHROPIC_MIN_BUDGET",
    "BUDGET_EFFORT",
    "EFFORT_BUDGET",
    "GEMINI_LEVEL",
    "OPENAI_EFFORT",
    "budget_for_effort",
    "effort_for_budget",
    "gemini_budget_cap",
    "gemini_uses_levels",
    "parse_effort",
]

EFFORT_BUDGET: Mapping[Effort, int] = {
    Effort.MINIMAL: 1024,
    Effort.LOW: 2048,
    Effort.MEDIUM: 8192,
    Effort.HIGH: 24576,
    Effort.XHIGH: 32768,
    Effort.MAX: 65536,
}

# Ascending (budget, level): a budget reads as the last level whose budget it reaches.
BUDGET_EFFORT: tuple[tuple[int, Effort], ...] = (
    (2048, Effort.LOW),
    (8192, Effort.MEDIUM),
    (24576, Effort.HIGH),
    (32768, Effort.XHIGH),
)

OPENAI_EFFORT: Mapping[Effort, str] = {
    Effort.NONE: "none",
    Effort.MINIMAL: "minimal",
    Effort.LOW: "low",
    Effort.MEDIUM: "medium",
    Effort.HIGH: "high",
    Effort.XHIGH: "xhigh",
    Effort.MAX: "xhigh",
}

ANTHROPIC_EFFORT: Mapping[Effort, str] = {
    Effort.MINIMAL: "low",
    Effort.LOW: "low",
    Effort.MEDIUM: "medium",
    Effort.HIGH: "high",
    Effort.XHIGH: "xhigh",
    Effort.MAX: "max",
}

GEMINI_LEVEL: Mapping[Effort, str] = {
    Effort.MINIMAL: "low",
    Effort.LOW: "low",
    Effort.MEDIUM: "high",
    Effort.HIGH: "high",
    Effort.XHIGH: "high",
    Effort.MAX: "high",
}

# Anthropic's smallest accepted thinking budget.
ANTHROPIC_MIN_BUDGET = 1024
# Gemini 2.5 budget ceilings (docs/conversion.md, "Reasoning effort": budgets are capped at the
# model's limit).
GEMINI_PRO_MAX_BUDGET = 32768
GEMINI_FLASH_MAX_BUDGET = 24576


def parse_effort(value: object) -> Effort | None:
    """A level name from any format ("xhigh", "MEDIUM"…) as an `Effort`; None if unknown."""
    if not isinstance(value, str):
        return None
    try:
        return Effort(value.lower())
    except ValueError:
        return None


def effort_for_budget(budget: int) -> Effort:
    if budget <= 0:
        return Effort.NONE
    level = Effort.LOW
    for threshold, effort in BUDGET_EFFORT:
        if budget >= threshold:
            level = effort
    return level


def budget_for_effort(effort: Effort) -> int:
    return EFFORT_BUDGET.get(effort, EFFORT_BUDGET[Effort.MEDIUM])


def gemini_budget_cap(model: str) -> int:
    return GEMINI_PRO_MAX_BUDGET if "pro" in model.lower() else GEMINI_FLASH_MAX_BUDGET


def gemini_uses_levels(model: str) -> bool:
    """Gemini 3 models take ``thinkingLevel``; 2.x take ``thinkingBudget``."""
    name = model.lower().removeprefix("models/")
    return name.startswith("gemini-") and not name.startswith(("gemini-1", "gemini-2"))
