"""The conversation: roles, stop reasons and reasoning levels, the parts a message is made of
(`Text`, `Image`, `ToolCall`, `ToolResult`, `Reasoning`, `Opaque`) and `Message`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, TypeAlias

from twproto.dialect import Dialect

__all__ = (
    "Effort",
    "Image",
    "JSONObject",
    "Message",
    "Opaque",
    "Part",
    "PartKind",
    "Reasoning",
    "ReasoningLevel",
    "Role",
    "StopReason",
    "Text",
    "ToolCall",
    "ToolChoiceMode",
    "ToolKind",
    "ToolResult",
)


JSONObject: TypeAlias = dict[str, Any]


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    # An instruction inside the conversation (Chat/Responses system or developer messages after
    # the first turn; Claude Code's {role: "system"} message). Formats with only a top-level
    # system prompt fold it in there.
    SYSTEM = "system"


class PartKind(StrEnum):
    TEXT = "text"
    IMAGE = "image"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    REASONING = "reasoning"
    OPAQUE = "opaque"


class ToolKind(StrEnum):
    FUNCTION = "function"
    # Responses' free-form tool: one string in, no JSON schema. Other formats see a function
    # taking ``{"input": string}``; the IR keeps tool-call arguments in that JSON form too.
    CUSTOM = "custom"
    # A provider-hosted tool (web search, code execution…) only its own format understands.
    BUILTIN = "builtin"


class ToolChoiceMode(StrEnum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    NAMED = "named"


class StopReason(StrEnum):
    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"
    TOOL_USE = "tool_use"
    STOP_SEQUENCE = "stop_sequence"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    PAUSE = "pause"
    ERROR = "error"
    OTHER = "other"


class ReasoningLevel(StrEnum):
    """A reasoning level a routing rule sets (``set.reasoning``, docs/configuration.md).

    `OFF` removes reasoning from a request; the others change the effort of a request that
    already reasons and never turn reasoning on (docs/conversion.md, "Reasoning effort").
    Each level other than `OFF` has the `Effort` of the same name.
    """

    OFF = "off"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


class Effort(StrEnum):
    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


# ----------------------------------------------------------------------------------------------
# Parts


@dataclass(frozen=True, slots=True, kw_only=True)
class Text:
    """Plain text. `cache_control` is Anthropic's prompt-cache marker, kept where it was."""

    kind: ClassVar[PartKind] = PartKind.TEXT
    text: str
    cache_control: JSONObject | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """An image given by URL or inline base64 `data` with its `media_type`."""

    kind: ClassVar[PartKind] = PartKind.IMAGE
    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    detail: str | None = None
    cache_control: JSONObject | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.data is None):
            raise ValueError("an image has exactly one of url and data")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A call the model made. `arguments` is JSON text of an object.

    `namespace` is set for Responses namespace tools; `item_id` is the Responses output item id
    (distinct from the call id).
    """

    kind: ClassVar[PartKind] = PartKind.TOOL_CALL
    id: str
    name: str
    arguments: str = "{}"
    tool_kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    item_id: str | None = None
    cache_control: JSONObject | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """The result of a tool call, sent back by the client.

    `structured` keeps a JSON object result as given (Gemini ``functionResponse.response``);
    `content` always has its text form. `name` is the called tool's name where the format
    carries it (Gemini needs it).
    """

    kind: ClassVar[PartKind] = PartKind.TOOL_RESULT
    call_id: str
    content: tuple[Text | Image, ...] = ()
    is_error: bool = False
    name: str | None = None
    structured: JSONObject | None = None
    cache_control: JSONObject | None = None

    @property
    def text(self) -> str:
        """The text parts joined (images left out)."""
        return "".join(p.text for p in self.content if isinstance(p, Text))


@dataclass(frozen=True, slots=True, kw_only=True)
class Reasoning:
    """Reasoning (thinking) the model did.

    `signature` is Anthropic's thinking signature or Gemini's ``thoughtSignature``;
    `encrypted_content` and `item_id` are a Responses reasoning item's; `redacted_data` is an
    Anthropic ``redacted_thinking`` block. The seals are opaque: they only mean something to
    the upstream (account) that made them.
    """

    kind: ClassVar[PartKind] = PartKind.REASONING
    text: str = ""
    signature: str | None = None
    encrypted_content: str | None = None
    item_id: str | None = None
    redacted_data: str | None = None

    @property
    def seal(self) -> str | None:
        """Whichever opaque seal the part has (formats have one slot for it)."""
        return self.signature or self.encrypted_content


@dataclass(frozen=True, slots=True, kw_only=True)
class Opaque:
    """A part only `dialect` understands (a document block, a server-tool result…), as raw JSON."""

    kind: ClassVar[PartKind] = PartKind.OPAQUE
    dialect: Dialect
    raw: JSONObject


Part: TypeAlias = Text | Image | ToolCall | ToolResult | Reasoning | Opaque


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
