"""A request: its tools, tool choice, reasoning and output settings, and `Request` itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from twproto.dialect import Dialect
from twproto.ir.parts import Effort, JSONObject, Message, Text, ToolChoiceMode, ToolKind

__all__ = (
    "OutputFormat",
    "ReasoningConfig",
    "Request",
    "Tool",
    "ToolChoice",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A tool the model may call.

    For `ToolKind.FUNCTION`, `parameters` is a JSON Schema. For `ToolKind.CUSTOM`, `format` is
    the Responses input format (grammar). For `ToolKind.BUILTIN`, `raw` is the tool as its
    `dialect` wrote it and `name` its type.
    """

    name: str
    description: str | None = None
    parameters: JSONObject | None = None
    kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    namespace_description: str | None = None
    strict: bool | None = None
    format: JSONObject | None = None
    raw: JSONObject | None = None
    dialect: Dialect | None = None
    cache_control: JSONObject | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolChoice:
    mode: ToolChoiceMode
    name: str | None = None
    namespace: str | None = None

    def __post_init__(self) -> None:
        if (self.mode is ToolChoiceMode.NAMED) != (self.name is not None):
            raise ValueError("a tool name is given exactly when the mode is NAMED")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningConfig:
    """What the client asked of reasoning.

    `enabled` False means explicitly off. `adaptive` is Anthropic's ``thinking: adaptive``
    (the model decides how long to think). `effort` and `budget_tokens` may both be set; an
    encoder uses what its format has and derives the other from the effort table.
    `summary` is Responses' summary setting; `include_thoughts` Gemini's.
    """

    enabled: bool = True
    adaptive: bool = False
    effort: Effort | None = None
    budget_tokens: int | None = None
    summary: str | None = None
    include_thoughts: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputFormat:
    """Structured output: ``json_object`` (any JSON) or ``json_schema`` with `schema`."""

    type: str
    name: str | None = None
    schema: JSONObject | None = None
    strict: bool | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A generation request, format-neutral.

    `origin` is the format the request was decoded from; `extras` are that format's top-level
    fields with no IR slot, re-emitted only by the same format's encoder. `dropped` names what
    the decoder could not carry at all.
    """

    model: str
    messages: tuple[Message, ...]
    system: tuple[Text, ...] = ()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    max_output_tokens: int | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    parallel_tool_calls: bool | None = None
    user: str | None = None
    metadata: JSONObject | None = None
    cache_key: str | None = None
    store: bool | None = None
    output_format: OutputFormat | None = None
    origin: Dialect | None = None
    extras: JSONObject = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
