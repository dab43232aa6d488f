"""A whole answer: `Usage`, `Answer`, and the tool-name mapping and call ids answers are
written with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from twproto.ir.parts import Part, StopReason, ToolKind

__all__ = (
    "MAX_TOKEN_COUNT",
    "Answer",
    "ToolName",
    "ToolNames",
    "Usage",
    "derive_call_id",
)


#: The largest token count a `Usage` holds (a billion): a hundred times the largest context
#: window, and small enough that a request's sums and its cost at any configurable price stay
#: well within 64 bits.
MAX_TOKEN_COUNT = 1_000_000_000
_USAGE_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cache_write_1h_tokens",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token usage, normalised (see the module notes): `input_tokens` excludes cached input,
    `output_tokens` includes `reasoning_tokens`.

    Each count is kept within 0–`MAX_TOKEN_COUNT`: the counts come from upstreams, and a
    negative one, or one beyond any real request's, would take the sums, costs and key limits
    made from them negative or beyond the 64-bit integers a request row stores."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    # The part of `cache_write_tokens` written for one hour (Anthropic's ``ttl: 1h``), which
    # is billed at its own rate.
    cache_write_1h_tokens: int = 0

    def __post_init__(self) -> None:
        for name in _USAGE_COUNTS:
            value = getattr(self, name)
            if not 0 <= value <= MAX_TOKEN_COUNT:
                object.__setattr__(self, name, min(max(value, 0), MAX_TOKEN_COUNT))

    @property
    def total_input_tokens(self) -> int:
        """All input tokens, cached or not (OpenAI's ``prompt_tokens``)."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        return self.total_input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """A whole answer. `created` (unix seconds) is the upstream's, or None."""

    id: str
    model: str
    parts: tuple[Part, ...]
    stop_reason: StopReason
    stop_sequence: str | None = None
    usage: Usage | None = None
    created: int | None = None
    dropped: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------
# Tool-name mapping for answers


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolName:
    """What a flattened upstream tool name stands for on the client side."""

    name: str
    namespace: str | None = None
    tool_kind: ToolKind = ToolKind.FUNCTION


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolNames:
    """Upstream tool name → client tool, for tools a request conversion had to rename.

    A Responses custom tool sent to another format becomes a function of one string, and a
    namespace's functions get flat names (``ns__fn``); the answer's calls are mapped back with
    this table so the client sees the tools it declared.
    """

    entries: tuple[tuple[str, ToolName], ...] = ()

    def lookup(self, upstream_name: str) -> ToolName | None:
        for name, target in self.entries:
            if name == upstream_name:
                return target
        return None

    def __bool__(self) -> bool:
        return bool(self.entries)


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def derive_call_id(answer_id: str, index: int) -> str:
    """A tool-call id for a format that gave none, from the answer id and the call's position.

    Only letters, digits, ``_`` and ``-`` (what Anthropic accepts in tool ids).
    """
    return f"call_{_ID_UNSAFE.sub('_', answer_id)}_{index}"
