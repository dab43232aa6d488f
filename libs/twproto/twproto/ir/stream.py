"""Streams: the events, the `StreamHandler` decoders call, `EventCollector` and `dispatch`
between the two, and `AnswerBuilder`, which turns a stream into an `Answer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias

from twproto.ir.answer import Answer, Usage
from twproto.ir.parts import Part, PartKind, Reasoning, StopReason, Text, ToolCall, ToolKind

__all__ = (
    "AnswerBuilder",
    "EventCollector",
    "Finish",
    "MessageStart",
    "PartStart",
    "PartStop",
    "ReasoningDelta",
    "ReasoningSeal",
    "StreamEnd",
    "StreamErrorEvent",
    "StreamEvent",
    "StreamHandler",
    "TextDelta",
    "ToolArgsDelta",
    "ToolCallStart",
    "UsageUpdate",
    "answer_events",
    "dispatch",
)


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
