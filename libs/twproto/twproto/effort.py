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

A refused level (docs/operations.md): an upstream answering 400 about the effort level usually
names what it accepts ("supported values are: 'low', 'medium' and 'high'").
`level_after_refusal` picks the level to resend with — the one the error names, else the listed
level nearest the one asked (so a level above every listed one gets the ceiling) — or None,
meaning "resend without an effort". A request that sets only a thinking budget
(`sets_only_budget`) is not resent: its budget is the client's own figure, and no level is
there to lower.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twproto.dialect import Dialect
from twproto.ir import Effort

# The level table and the verbs a proxy needs (twproto's facade has them), and the Gemini format's
# two model tests (`gemini_*`, which the facade leaves out). The other per-format names further
# down (`OPENAI_EFFORT`, `ANTHROPIC_EFFORT`, `GEMINI_LEVEL`, the budget limits) are what the
# format modules write on the wire: public to them, not part of the facade.
__all__ = (
    "BUDGET_EFFORT",
    "EFFORT_BUDGET",
    "budget_for_effort",
    "effort_for_budget",
    "gemini_budget_cap",
    "gemini_uses_levels",
    "level_after_refusal",
    "parse_effort",
    "requested_effort",
    "sets_only_budget",
    "without_reasoning_switches",
)

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
    """The level a thinking budget of `budget` tokens reads as (`Effort.NONE` for none)."""
    if budget <= 0:
        return Effort.NONE
    level = Effort.LOW
    for threshold, effort in BUDGET_EFFORT:
        if budget >= threshold:
            level = effort
    return level


def budget_for_effort(effort: Effort) -> int:
    """The thinking budget, in tokens, of a level (medium's for a level with no budget)."""
    return EFFORT_BUDGET.get(effort, EFFORT_BUDGET[Effort.MEDIUM])


def gemini_budget_cap(model: str) -> int:
    return GEMINI_PRO_MAX_BUDGET if "pro" in model.lower() else GEMINI_FLASH_MAX_BUDGET


def gemini_uses_levels(model: str) -> bool:
    """Gemini 3 models take ``thinkingLevel``; 2.x take ``thinkingBudget``."""
    name = model.lower().removeprefix("models/")
    return name.startswith("gemini-") and not name.startswith(("gemini-1", "gemini-2"))


# Levels from least to most effort; `Effort.NONE` is not a level one resends with.
_LEVELS = (Effort.MINIMAL, Effort.LOW, Effort.MEDIUM, Effort.HIGH, Effort.XHIGH, Effort.MAX)
_RANK = {Effort.NONE: -1, **{level: i for i, level in enumerate(_LEVELS)}}
_LEVEL_WORD = re.compile(r"(?<![a-z_])(minimal|low|medium|high|xhigh|max)(?![a-z_])")


def level_after_refusal(asked: Effort | None, message: str) -> Effort | None:
    """The level to resend with after `asked` was refused with `message`; None: without one."""
    named: list[Effort] = []
    for word in _LEVEL_WORD.findall(message.lower()):
        level = Effort(word)
        if level is not asked and level not in named:
            named.append(level)
    if not named:
        return None
    if len(named) == 1:
        return named[0]
    if asked is None or asked not in _RANK:
        return max(named, key=_RANK.__getitem__)  # the ceiling
    # The nearest listed level; between two as near, the lower one (the upstream took less).
    return min(named, key=lambda level: (abs(_RANK[level] - _RANK[asked]), _RANK[level]))


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _gemini_thinking(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    config = _dict(obj.get("generationConfig") or obj.get("generation_config"))
    return _dict(config.get("thinkingConfig") or config.get("thinking_config"))


def requested_effort(obj: Mapping[str, Any], dialect: Dialect) -> Effort | None:
    """The effort level a request body in `dialect` asks for (a budget read as its level)."""
    if dialect is Dialect.ANTHROPIC:
        level = parse_effort(_dict(obj.get("output_config")).get("effort"))
        budget = _dict(obj.get("thinking")).get("budget_tokens")
    elif dialect is Dialect.OPENAI_CHAT:
        return parse_effort(obj.get("reasoning_effort"))
    elif dialect is Dialect.OPENAI_RESPONSES:
        return parse_effort(_dict(obj.get("reasoning")).get("effort"))
    else:
        thinking = _gemini_thinking(obj)
        level = parse_effort(thinking.get("thinkingLevel") or thinking.get("thinking_level"))
        budget = thinking.get("thinkingBudget", thinking.get("thinking_budget"))
    if level is not None:
        return level
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return effort_for_budget(budget)
    return None


def sets_only_budget(obj: Mapping[str, Any], dialect: Dialect) -> bool:
    """Whether a request body asks for reasoning by a token budget alone, with no level."""
    if dialect is Dialect.ANTHROPIC:
        thinking = _dict(obj.get("thinking"))
        return (
            thinking.get("type") == "enabled"
            and "budget_tokens" in thinking
            and parse_effort(_dict(obj.get("output_config")).get("effort")) is None
        )
    if dialect is Dialect.GEMINI:
        thinking = _gemini_thinking(obj)
        has_budget = "thinkingBudget" in thinking or "thinking_budget" in thinking
        has_level = "thinkingLevel" in thinking or "thinking_level" in thinking
        return has_budget and not has_level
    return False


def without_reasoning_switches(extras: Mapping[str, Any]) -> dict[str, Any]:
    """A request's extra fields without the reasoning switches that have no IR slot.

    For reasoning turned off: the GLM-style Chat ``thinking: {type: enabled}`` switch goes, and
    so does Anthropic's ``output_config.effort`` (the rest of ``output_config`` stays).
    """
    out = {k: v for k, v in extras.items() if k != "thinking"}
    config = out.get("output_config")
    if isinstance(config, Mapping) and "effort" in config:
        rest = {k: v for k, v in config.items() if k != "effort"}
        if rest:
            out["output_config"] = rest
        else:
            del out["output_config"]
    return out
