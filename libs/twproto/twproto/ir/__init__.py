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

The types live in four modules, in the order above: `twproto.ir.parts` (the conversation and
its parts), `twproto.ir.request`, `twproto.ir.answer` (with `Usage`) and `twproto.ir.stream`;
every name is exported here, and callers spell them ``ir.Name``.
"""

from __future__ import annotations

from twproto.ir.answer import MAX_TOKEN_COUNT, Answer, ToolName, ToolNames, Usage, derive_call_id
from twproto.ir.parts import (
    Effort,
    Image,
    JSONObject,
    Message,
    Opaque,
    Part,
    PartKind,
    Reasoning,
    ReasoningLevel,
    Role,
    StopReason,
    Text,
    ToolCall,
    ToolChoiceMode,
    ToolKind,
    ToolResult,
)
from twproto.ir.request import OutputFormat, ReasoningConfig, Request, Tool, ToolChoice
from twproto.ir.stream import (
    AnswerBuilder,
    EventCollector,
    Finish,
    MessageStart,
    PartStart,
    PartStop,
    ReasoningDelta,
    ReasoningSeal,
    StreamEnd,
    StreamErrorEvent,
    StreamEvent,
    StreamHandler,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    UsageUpdate,
    answer_events,
    dispatch,
)

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
