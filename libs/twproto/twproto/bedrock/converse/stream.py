"""ConverseStream's answer: event-stream messages → IR stream calls, and back out as the
Anthropic SSE stream the gateway's stream machinery reads.

Each event is one event-stream message whose ``:event-type`` names it and whose payload is its
JSON (bedrock-runtime's ``ConverseStreamOutput``):

* ``messageStart`` ``{"role": "assistant"}`` — the answer begins;
* ``contentBlockStart`` ``{"contentBlockIndex": i, "start": {"toolUse": {"toolUseId",
  "name"}}}`` — only tool calls announce themselves; a text or reasoning block begins with its
  first delta;
* ``contentBlockDelta`` ``{"contentBlockIndex": i, "delta": ...}`` with ``text``,
  ``toolUse: {"input": <partial JSON>}`` or ``reasoningContent`` (``text``, ``signature``,
  ``redactedContent``);
* ``contentBlockStop`` ``{"contentBlockIndex": i}``;
* ``messageStop`` ``{"stopReason": ...}``, then ``metadata`` ``{"usage": {"inputTokens",
  "outputTokens", "cacheReadInputTokens", ...}, "metrics": {"latencyMs"}}``, the last event.

`ConverseStreamDecoder` turns each event into calls on an `ir.StreamHandler`; it is fed whole
messages, so it is split-insensitive whenever its event-stream decoder is.
`ConverseStreamReframer` runs the two with twproto's Anthropic stream encoder as the handler:
event-stream bytes in, Anthropic SSE bytes out, so the opening hold, the relay and every
conversion read a ConverseStream upstream as an Anthropic upstream (as `InvokeStreamReframer`
does for InvokeModelWithResponseStream). An exception frame (``throttlingException``…) becomes
Anthropic's ``error`` event of the same failure kind, a framing fault an ``api_error`` event.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twproto import _json, ir
from twproto.bedrock.converse.response import CONVERSE_STOP_REASONS, decode_converse_usage
from twproto.bedrock.reframe import FAILURE_ANTHROPIC_TYPES, anthropic_error_event, pending_fault
from twproto.eventstream.classify import classify_eventstream_message
from twproto.eventstream.decoder import EVENTSTREAM_MAX_MESSAGE_SIZE, EventStreamDecoder
from twproto.eventstream.errors import EventStreamError
from twproto.eventstream.message import EventStreamHeader, EventStreamMessage
from twproto.formats import anthropic

__all__ = ("ConverseStreamDecoder", "ConverseStreamReframer", "converse_message_id")

_TEXT, _REASONING, _TOOL = 1, 2, 3


def converse_message_id(seed: bytes) -> str:
    """An Anthropic-style message id for an answer that has none (Converse names none)."""
    return "msg_bdrk_" + hashlib.blake2s(seed, digest_size=12).hexdigest()


class ConverseStreamDecoder:
    """ConverseStream events (whole messages) → `ir.StreamHandler` calls. `finished` once
    ``messageStop`` came; `usage` from ``metadata``."""

    __slots__ = ("_id", "_model", "_open", "_started", "finished", "usage")

    def __init__(self, *, id: str, model: str) -> None:
        self._id = id
        self._model = model
        self._open: dict[int, int] = {}
        self._started = False
        self.finished = False
        self.usage: ir.Usage | None = None

    def feed_event(self, event_type: str | None, payload: bytes, h: ir.StreamHandler) -> bool:
        """One event into calls on `h`; True once the answer is complete (``metadata``)."""
        obj: Any = _json.loads(payload)
        if not isinstance(obj, dict):
            raise ValueError(f"a {event_type} event that is not a JSON object")
        if not self._started:
            self._started = True
            h.message_start(self._id, self._model, None, None)
        if event_type == "contentBlockDelta":
            self._delta(int(obj["contentBlockIndex"]), obj["delta"], h)
        elif event_type == "contentBlockStart":
            index = int(obj["contentBlockIndex"])
            use = obj.get("start", {}).get("toolUse")
            if isinstance(use, dict):
                self._open[index] = _TOOL
                h.tool_call_start(
                    index,
                    str(use.get("toolUseId", "")),
                    str(use.get("name", "")),
                    ir.ToolKind.FUNCTION,
                    None,
                    None,
                )
        elif event_type == "contentBlockStop":
            index = int(obj["contentBlockIndex"])
            if self._open.pop(index, None) is not None:
                h.part_stop(index)
        elif event_type == "messageStop":
            self._close_all(h)
            reason = CONVERSE_STOP_REASONS.get(str(obj.get("stopReason")), ir.StopReason.END_TURN)
            h.finish(reason, None)
            self.finished = True
        elif event_type == "metadata":
            if "usage" in obj:
                self.usage = decode_converse_usage(obj["usage"])
                h.usage(self.usage)
            return self.finished
        # messageStart, and event types added later: nothing more to say
        return False

    def _delta(self, index: int, delta: Any, h: ir.StreamHandler) -> None:
        if "text" in delta:
            if index not in self._open:
                self._open[index] = _TEXT
                h.part_start(index, ir.PartKind.TEXT, None)
            h.text(index, str(delta["text"]))
        elif "toolUse" in delta:
            h.tool_args(index, str(delta["toolUse"].get("input", "")))
        elif "reasoningContent" in delta:
            content = delta["reasoningContent"]
            if index not in self._open:
                self._open[index] = _REASONING
                h.part_start(index, ir.PartKind.REASONING, None)
            if "text" in content:
                h.reasoning(index, str(content["text"]))
            if "signature" in content:
                h.reasoning_seal(index, str(content["signature"]), None, None)
            if "redactedContent" in content:
                h.reasoning_seal(index, None, None, str(content["redactedContent"]))

    def _close_all(self, h: ir.StreamHandler) -> None:
        for index in list(self._open):
            del self._open[index]
            h.part_stop(index)


class ConverseStreamReframer:
    """Event-stream bytes of a ConverseStream answer in (split anywhere), the Anthropic SSE
    stream of the same answer out, naming `model`. Sans-IO; `now` dates the classification of
    an exception frame and seeds the message id."""

    __slots__ = ("_decoder", "_done", "_encoder", "_events", "_model", "_seen", "_seen_types")

    def __init__(self, *, model: str, max_message_size: int = EVENTSTREAM_MAX_MESSAGE_SIZE) -> None:
        self._decoder = EventStreamDecoder(max_message_size=max_message_size)
        self._encoder = anthropic.new_stream_encoder(model=model)
        self._events: ConverseStreamDecoder | None = None
        self._model = model
        self._done = False
        self._seen: tuple[EventStreamHeader, ...] | None = None
        self._seen_types: tuple[str | None, str | None] = (None, None)

    @property
    def usage(self) -> ir.Usage | None:
        """The usage the answer reported so far."""
        return self._events.usage if self._events is not None else None

    def feed(self, chunk: bytes, *, now: float = 0.0) -> bytes:
        """The SSE bytes for the messages `chunk` completes."""
        if self._done:
            return b""
        try:
            messages = self._decoder.feed(chunk)
        except EventStreamError as exc:
            return self._fail("api_error", f"Bedrock event stream: {exc}")
        encoder = self._encoder
        for message in messages:
            headers = message.headers
            if headers is self._seen:
                kind, event_type = self._seen_types
            else:
                # The decoder hands out one tuple for a run of identical header blocks (every
                # contentBlockDelta's), so the run pays this once.
                kind, event_type = message.message_type, message.event_type
                self._seen, self._seen_types = headers, (kind, event_type)
            if kind != "event":
                return self._exception(message, now)
            if self._events is None:
                seed = repr(now).encode() + message.payload
                self._events = ConverseStreamDecoder(
                    id=converse_message_id(seed), model=self._model
                )
            try:
                complete = self._events.feed_event(event_type, message.payload, encoder)
            except (ValueError, KeyError, TypeError, AttributeError):
                return self._fail(
                    "api_error", f"Bedrock event stream: a malformed {event_type} event"
                )
            if complete:
                encoder.end()
                self._done = True
                break
        return encoder.take()

    def end(self) -> bytes:
        """The input ended: an answer whose ``messageStop`` came but not its ``metadata`` is
        ended here; one cut before that is left open (the caller ends it as broken)."""
        if self._done:
            return b""
        pending = pending_fault(self._decoder)
        if pending is not None:
            return self._fail("api_error", f"Bedrock event stream: {pending}")
        self._done = True
        if self._events is not None and self._events.finished:
            self._encoder.end()
        return self._encoder.take()

    def _exception(self, message: EventStreamMessage, now: float) -> bytes:
        failure = classify_eventstream_message(message, now=now)
        if failure is None:
            return self._fail("api_error", "Bedrock event stream: an unexpected message")
        kind = FAILURE_ANTHROPIC_TYPES.get(failure.kind, "api_error")
        return self._fail(kind, failure.message or message.exception_type or "error")

    def _fail(self, kind: str, message: str) -> bytes:
        self._done = True  # AWS sends nothing after an exception
        return self._encoder.take() + anthropic_error_event(kind, message)
