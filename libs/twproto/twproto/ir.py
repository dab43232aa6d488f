"""The intermediate representation every API format converts through.

Theory of operation
-------------------

Four API formats (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, Gemini
generateContent) each get one decoder into these types and one encoder out of them, per
direction: requests, whole answers and streams. Any client format then works against any
upstream format with 2×4 converters instead of 4×4.

*Requests* (`Request`) hold a system prompt, a conversation of `Message` objects made of parts
(`Text`, `Image`, `ToolCall`, `ToolResult`, `Reasoning`, `Opaque`), tool definitions, sampling
settings and reasoning settings. Whatever a decoder could not express in the IR is either kept
in `Request.extras` (top-level fields the *same* format can re-emit, tagged with
`Request.origin`) or named in `Request.dropped`. A part or tool that only its own format
understands travels as `Opaque` / `ToolKind.BUILTIN` with its raw JSON; encoders for other
formats drop it and say so. Nothing is lost silently: every conversion returns what it dropped.

*Whole answers* (`Answer`) are a list of parts, a normalised `StopReason` and a `Usage`.

*Usage* is normalised so that the four formats' accounting can be compared: `input_tokens` is
the **uncached** input, `cache_read_tokens` and `cache_write_tokens` are the cached parts, and
`output_tokens` includes reasoning (`reasoning_tokens` says how much of it). Anthropic's
``input_tokens=60, cache_read_input_tokens=40`` and OpenAI's ``prompt_tokens=100,
cached_tokens=40`` are the same `Usage`.

*Streams* are a sequence of events. So that the hot path (one upstream chunk → one client
chunk) allocates as little as possible, stream decoders do not build event objects: they call
the methods of a `StreamHandler` (the stream encoder of the client's format, or an
`AnswerBuilder` that accumulates a whole answer). The event dataclasses (`TextDelta`,
`ToolCallStart`, …) are the same calls reified, for tests and library users: `EventCollector`
turns calls into events and `dispatch` turns events back into calls.

Stream rules every decoder follows and every encoder may rely on:

* `MessageStart` comes first (encoders synthesise one if it does not).
* Every part is opened (`PartStart` for text and reasoning, `ToolCallStart` for tool calls)
  before its deltas, under an ``index`` unique within the stream; indices are the decoder's
  own numbering, and each encoder maps them to its format's numbering.
* Parts may overlap (Chat can interleave parallel tool calls); a delta for a part that an
  encoder already had to close is still delivered under that part's index.
* `Finish` carries the stop reason; `UsageUpdate` carries *cumulative* usage and may come
  before or after `Finish`. `StreamEnd` means the upstream's own terminal event arrived; a
  format without one (Gemini) ends when the caller says the body ended.
* `StreamErrorEvent` ends the stream with an error.

Tool-call ids are kept as the upstream sent them. Where a format has none (Gemini), ids are
derived from the answer id and the call's position (`derive_call_id`), never drawn at random,
so a stream and the same answer whole give the same ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeAlias

from twproto.dialect import Dialect

__all__ = (
    "MAX_TOKEN_COUNT",
    "Answer",
    "AnswerBuilder",
    "Effort",
    "EventCollector",
    "Finish",
    "Image",
    "JSONObject",
    "Message",
    "MessageStart",
    "Opaque",
    "OutputFormat",
    "Part",
    "PartKind",
    "PartStart",
    "PartStop",
    "Reasoning",
    "ReasoningConfig",
    "ReasoningDelta",
    "ReasoningLevel",
    "ReasoningSeal",
    "Request",
    "Role",
    "StopReason",
    "StreamEnd",
    "StreamErrorEvent",
    "StreamEvent",
    "StreamHandler",
    "Text",
    "TextDelta",
    "Tool",
    "ToolArgsDelta",
    "ToolCall",
    "ToolCallStart",
    "ToolChoice",
    "ToolChoiceMode",
    "ToolKind",
    "ToolName",
    "ToolNames",
    "ToolResult",
    "Usage",
    "UsageUpdate",
    "answer_events",
    "derive_call_id",
    "dispatch",
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


# ----------------------------------------------------------------------------------------------
# Tools and settings


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


# ----------------------------------------------------------------------------------------------
# Answers


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


# ----------------------------------------------------------------------------------------------
# Stream events


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageStart:
    id: str
    model: str
    created: int | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartStart:
    """A text or reasoning part opens (`item_id`: a Responses reasoning item's id)."""

    index: int
    part: PartKind
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStart:
    index: int
    id: str
    name: str
    tool_kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningSeal:
    """A reasoning part's opaque seal (signature, encrypted content or redacted data)."""

    index: int
    signature: str | None = None
    encrypted_content: str | None = None
    redacted_data: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolArgsDelta:
    index: int
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PartStop:
    index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageUpdate:
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    reason: StopReason
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamErrorEvent:
    """An error the upstream reported inside its stream.

    `type` is the upstream's error type or code string; `status` the HTTP status it
    corresponds to (best guess from the type).
    """

    message: str
    type: str = "api_error"
    status: int = 500


StreamEvent: TypeAlias = (
    MessageStart
    | PartStart
    | ToolCallStart
    | TextDelta
    | ReasoningDelta
    | ReasoningSeal
    | ToolArgsDelta
    | PartStop
    | UsageUpdate
    | Finish
    | StreamEnd
    | StreamErrorEvent
)


class StreamHandler(Protocol):
    """Receives a stream's events as calls (see the module notes)."""

    def message_start(
        self, id: str, model: str, created: int | None, usage: Usage | None
    ) -> None: ...

    def part_start(self, index: int, part: PartKind, item_id: str | None) -> None: ...

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None: ...

    def text(self, index: int, text: str) -> None: ...

    def reasoning(self, index: int, text: str) -> None: ...

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None: ...

    def tool_args(self, index: int, arguments: str) -> None: ...

    def part_stop(self, index: int) -> None: ...

    def usage(self, usage: Usage) -> None: ...

    def finish(self, reason: StopReason, stop_sequence: str | None) -> None: ...

    def end(self) -> None: ...

    def error(self, error: StreamErrorEvent) -> None: ...


class EventCollector:
    """A `StreamHandler` that records the calls as event objects in `events`."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    def message_start(self, id: str, model: str, created: int | None, usage: Usage | None) -> None:
        self.events.append(MessageStart(id=id, model=model, created=created, usage=usage))

    def part_start(self, index: int, part: PartKind, item_id: str | None) -> None:
        self.events.append(PartStart(index=index, part=part, item_id=item_id))

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        self.events.append(
            ToolCallStart(
                index=index,
                id=id,
                name=name,
                tool_kind=tool_kind,
                namespace=namespace,
                item_id=item_id,
            )
        )

    def text(self, index: int, text: str) -> None:
        self.events.append(TextDelta(index=index, text=text))

    def reasoning(self, index: int, text: str) -> None:
        self.events.append(ReasoningDelta(index=index, text=text))

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        self.events.append(
            ReasoningSeal(
                index=index,
                signature=signature,
                encrypted_content=encrypted_content,
                redacted_data=redacted_data,
            )
        )

    def tool_args(self, index: int, arguments: str) -> None:
        self.events.append(ToolArgsDelta(index=index, arguments=arguments))

    def part_stop(self, index: int) -> None:
        self.events.append(PartStop(index=index))

    def usage(self, usage: Usage) -> None:
        self.events.append(UsageUpdate(usage=usage))

    def finish(self, reason: StopReason, stop_sequence: str | None) -> None:
        self.events.append(Finish(reason=reason, stop_sequence=stop_sequence))

    def end(self) -> None:
        self.events.append(StreamEnd())

    def error(self, error: StreamErrorEvent) -> None:
        self.events.append(error)


def dispatch(event: StreamEvent, handler: StreamHandler) -> None:
    """Deliver one event object to `handler` as the matching call."""
    if isinstance(event, TextDelta):
        handler.text(event.index, event.text)
    elif isinstance(event, ToolArgsDelta):
        handler.tool_args(event.index, event.arguments)
    elif isinstance(event, ReasoningDelta):
        handler.reasoning(event.index, event.text)
    elif isinstance(event, MessageStart):
        handler.message_start(event.id, event.model, event.created, event.usage)
    elif isinstance(event, PartStart):
        handler.part_start(event.index, event.part, event.item_id)
    elif isinstance(event, ToolCallStart):
        handler.tool_call_start(
            event.index, event.id, event.name, event.tool_kind, event.namespace, event.item_id
        )
    elif isinstance(event, ReasoningSeal):
        handler.reasoning_seal(
            event.index, event.signature, event.encrypted_content, event.redacted_data
        )
    elif isinstance(event, PartStop):
        handler.part_stop(event.index)
    elif isinstance(event, UsageUpdate):
        handler.usage(event.usage)
    elif isinstance(event, Finish):
        handler.finish(event.reason, event.stop_sequence)
    elif isinstance(event, StreamEnd):
        handler.end()
    else:
        handler.error(event)


def answer_events(answer: Answer, handler: StreamHandler) -> None:
    """Play a whole answer to `handler` as a stream (the whole→stream path)."""
    handler.message_start(answer.id, answer.model, answer.created, answer.usage)
    for index, part in enumerate(answer.parts):
        if isinstance(part, Text):
            handler.part_start(index, PartKind.TEXT, None)
            if part.text:
                handler.text(index, part.text)
            handler.part_stop(index)
        elif isinstance(part, Reasoning):
            handler.part_start(index, PartKind.REASONING, part.item_id)
            if part.text:
                handler.reasoning(index, part.text)
            if part.signature or part.encrypted_content or part.redacted_data:
                handler.reasoning_seal(
                    index, part.signature, part.encrypted_content, part.redacted_data
                )
            handler.part_stop(index)
        elif isinstance(part, ToolCall):
            handler.tool_call_start(
                index, part.id, part.name, part.tool_kind, part.namespace, part.item_id
            )
            handler.tool_args(index, part.arguments)
            handler.part_stop(index)
        # Images, tool results and opaque parts do not occur in answers a stream can carry.
    if answer.usage is not None:
        handler.usage(answer.usage)
    handler.finish(answer.stop_reason, answer.stop_sequence)
    handler.end()


class _PartBuffer:
    __slots__ = ("call", "chunks", "item_id", "kind", "seal_enc", "seal_red", "seal_sig")

    def __init__(self, kind: PartKind, item_id: str | None, call: ToolCall | None) -> None:
        self.kind = kind
        self.item_id = item_id
        self.call = call
        self.chunks: list[str] = []
        self.seal_sig: str | None = None
        self.seal_enc: str | None = None
        self.seal_red: str | None = None


class AnswerBuilder:
    """A `StreamHandler` that accumulates a stream into a whole `Answer` (stream→whole).

    `answer()` may be called at any point; parts appear in the order they were opened.
    `error` holds the stream's error event, if one arrived.
    """

    __slots__ = (
        "_created",
        "_id",
        "_model",
        "_order",
        "_parts",
        "_stop_reason",
        "_stop_sequence",
        "_usage",
        "ended",
        "error_event",
    )

    def __init__(self) -> None:
        self._id = ""
        self._model = ""
        self._created: int | None = None
        self._parts: dict[int, _PartBuffer] = {}
        self._order: list[int] = []
        self._usage: Usage | None = None
        self._stop_reason: StopReason | None = None
        self._stop_sequence: str | None = None
        self.ended = False
        self.error_event: StreamErrorEvent | None = None

    def _part(self, index: int, kind: PartKind) -> _PartBuffer:
        buf = self._parts.get(index)
        if buf is None:
            buf = self._parts[index] = _PartBuffer(kind, None, None)
            self._order.append(index)
        return buf

    def message_start(self, id: str, model: str, created: int | None, usage: Usage | None) -> None:
        self._id = id
        self._model = model
        self._created = created
        if usage is not None:
            self._usage = usage

    def part_start(self, index: int, part: PartKind, item_id: str | None) -> None:
        self._part(index, part).item_id = item_id

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        self._part(index, PartKind.TOOL_CALL).call = ToolCall(
            id=id, name=name, tool_kind=tool_kind, namespace=namespace, item_id=item_id
        )

    def text(self, index: int, text: str) -> None:
        self._part(index, PartKind.TEXT).chunks.append(text)

    def reasoning(self, index: int, text: str) -> None:
        self._part(index, PartKind.REASONING).chunks.append(text)

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        buf = self._part(index, PartKind.REASONING)
        if signature is not None:
            buf.seal_sig = (buf.seal_sig or "") + signature
        if encrypted_content is not None:
            buf.seal_enc = encrypted_content
        if redacted_data is not None:
            buf.seal_red = redacted_data

    def tool_args(self, index: int, arguments: str) -> None:
        self._part(index, PartKind.TOOL_CALL).chunks.append(arguments)

    def part_stop(self, index: int) -> None:
        pass

    def usage(self, usage: Usage) -> None:
        self._usage = usage

    def finish(self, reason: StopReason, stop_sequence: str | None) -> None:
        self._stop_reason = reason
        self._stop_sequence = stop_sequence

    def end(self) -> None:
        self.ended = True

    def error(self, error: StreamErrorEvent) -> None:
        self.error_event = error

    @property
    def finished(self) -> bool:
        return self._stop_reason is not None

    def answer(self) -> Answer:
        """The answer as accumulated so far."""
        parts: list[Part] = []
        has_calls = False
        for index in self._order:
            buf = self._parts[index]
            joined = "".join(buf.chunks)
            if buf.kind is PartKind.TEXT:
                parts.append(Text(text=joined))
            elif buf.kind is PartKind.REASONING:
                parts.append(
                    Reasoning(
                        text=joined,
                        signature=buf.seal_sig,
                        encrypted_content=buf.seal_enc,
                        item_id=buf.item_id,
                        redacted_data=buf.seal_red,
                    )
                )
            elif buf.call is not None:
                has_calls = True
                call = buf.call
                parts.append(
                    ToolCall(
                        id=call.id,
                        name=call.name,
                        arguments=joined or "{}",
                        tool_kind=call.tool_kind,
                        namespace=call.namespace,
                        item_id=call.item_id,
                    )
                )
        reason = self._stop_reason
        if reason is None:
            reason = StopReason.TOOL_USE if has_calls else StopReason.END_TURN
        return Answer(
            id=self._id,
            model=self._model,
            parts=tuple(parts),
            stop_reason=reason,
            stop_sequence=self._stop_sequence,
            usage=self._usage,
            created=self._created,
        )
