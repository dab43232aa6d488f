"""Gemini streams ⇄ IR: the watch needles, the stream decoder and the stream encoder.

The stream codecs are built on the shared bases of `twproto.formats._codec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import _json, ir
from twproto.errors import GatewayError, error_body
from twproto.formats._codec import DecoderBase, EncoderBase, WatchNeedles
from twproto.formats._common import (
    MALFORMED,
    NULL_HANDLER,
    as_dict,
    as_str,
    error_status,
    flat_name,
    is_base64,
    json_text,
    need_str,
    parse_arguments,
)
from twproto.formats.gemini.request import DIALECT, FINISH_TO, _finish
from twproto.formats.gemini.response import decode_usage, encode_usage
from twproto.sse import SSEEvent

__all__ = (
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "new_stream_decoder",
    "new_stream_encoder",
)


# The watch path's needles: usage rides on every chunk, so the finish reason and errors are what
# the watch path parses for (the last chunk, with its finishReason, also has the final usage), and
# a blocked prompt's one chunk (``promptFeedback.blockReason``, no candidates), which ends the
# answer. Both keys end in ``Reason"``, which is searched for once: every needle is a scan of the
# whole chunk on every relayed chunk, and a chunk's text cannot hold it (a quote in text is
# escaped). Gemini's SSE events have no names; the JSON-array stream's elements are always
# followed.
WATCH = WatchNeedles(
    chunk_markers=(b'Reason"', b"error"),
    data_needles=('Reason"', '"error"'),
)


class StreamDecoder(DecoderBase):
    """Gemini stream chunks → IR stream calls. A chunk is an `SSEEvent` (``alt=sse``) or an
    already parsed element of the JSON-array stream; see `twproto.formats.anthropic.StreamDecoder`
    for the `feed` / `feed_into` / `watch` split."""

    __slots__ = (
        "_calls",
        "_id",
        "_last_usage",
        "_next",
        "_reasoning",
        "_started",
        "_text",
    )
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._id = ""
        self._next = 0
        self._text: int | None = None
        self._reasoning: int | None = None
        self._calls = 0
        self._last_usage: Any = None

    def watch(self, event: SSEEvent | Mapping[str, Any]) -> None:
        if isinstance(event, SSEEvent):
            data = event.data
            for needle in WATCH.data_needles:
                if needle in data:
                    break
            else:
                return
        # An event with a needle, or an element of the JSON-array stream (already parsed).
        self.feed_into(event, NULL_HANDLER)

    def feed_into(self, event: SSEEvent | Mapping[str, Any], h: ir.StreamHandler) -> None:
        try:
            if isinstance(event, SSEEvent):
                try:
                    obj = _json.loads(event.data)
                except _json.JSONDecodeError:
                    if event.data.strip():
                        self._drop("chunk (not JSON)")
                    return
            else:
                obj = event
            if not isinstance(obj, Mapping):
                return
            err = obj.get("error")
            if isinstance(err, Mapping):
                code = err.get("code")
                status = (
                    code
                    if isinstance(code, int) and 400 <= code <= 599
                    else error_status(as_str(err.get("status")))
                )
                self.error = ir.StreamErrorEvent(
                    message=str(err.get("message", "upstream error")),
                    type=str(err.get("status") or "INTERNAL"),
                    status=status,
                )
                h.error(self.error)
                return
            usage_raw = obj.get("usageMetadata")
            if not self._started:
                self._started = True
                self._id = str(obj.get("responseId") or "")
                usage = None
                if isinstance(usage_raw, Mapping):
                    self._last_usage = usage_raw
                    usage = self.usage = decode_usage(usage_raw)
                h.message_start(self._id, str(obj.get("modelVersion") or ""), None, usage)
            candidates = obj.get("candidates")
            candidate: Mapping[str, Any] = candidates[0] if candidates else {}
            content = candidate.get("content")
            if content:
                for part in content.get("parts") or ():
                    self._part(part, h)
            if usage_raw is not None and usage_raw != self._last_usage:
                self._last_usage = usage_raw
                self.usage = decode_usage(usage_raw)
                h.usage(self.usage)
            reason = candidate.get("finishReason")
            if reason is None and not candidates:
                block = as_dict(obj.get("promptFeedback")).get("blockReason")
                if block:
                    reason = "SAFETY"
            if reason and not self.finished:
                self._close_text(h)
                self._close_reasoning(h)
                self.finished = True
                self.stop_reason = _finish(reason, self._calls > 0)
                h.finish(self.stop_reason, None)
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _part(self, part: Any, h: ir.StreamHandler) -> None:
        if not isinstance(part, Mapping):
            return
        signature = part.get("thoughtSignature")
        text = part.get("text")
        if part.get("thought") is True:
            index = self._reasoning
            if index is None:
                self._close_text(h)
                index = self._reasoning = self._next
                self._next += 1
                h.part_start(index, ir.PartKind.REASONING, None)
            if text:
                h.reasoning(index, need_str(text))
            if signature:
                h.reasoning_seal(index, need_str(signature), None, None)
            return
        if signature:
            index = self._reasoning
            if index is None:
                self._close_text(h)
                index = self._next
                self._next += 1
                h.part_start(index, ir.PartKind.REASONING, None)
            h.reasoning_seal(index, need_str(signature), None, None)
            h.part_stop(index)
            self._reasoning = None
        if text is not None:
            if text:
                index = self._text
                if index is None:
                    self._close_reasoning(h)
                    index = self._text = self._next
                    self._next += 1
                    h.part_start(index, ir.PartKind.TEXT, None)
                h.text(index, need_str(text))
            return
        call = part.get("functionCall")
        if isinstance(call, Mapping):
            self._close_text(h)
            self._close_reasoning(h)
            index = self._next
            self._next += 1
            call_id = as_str(call.get("id")) or ir.derive_call_id(self._id, self._calls)
            self._calls += 1
            h.tool_call_start(
                index, call_id, str(call.get("name", "")), ir.ToolKind.FUNCTION, None, None
            )
            h.tool_args(index, json_text(call.get("args") or {}))
            h.part_stop(index)
            return
        self._drop("part:" + next(iter(part), "empty"))

    def _close_text(self, h: ir.StreamHandler) -> None:
        if self._text is not None:
            h.part_stop(self._text)
            self._text = None

    def _close_reasoning(self, h: ir.StreamHandler) -> None:
        if self._reasoning is not None:
            h.part_stop(self._reasoning)
            self._reasoning = None


class StreamEncoder(EncoderBase):
    """IR stream calls → Gemini stream bytes, SSE (`sse` True) or JSON-array framing.

    `created` is not used: Gemini stream chunks carry no timestamp.
    """

    __slots__ = (
        "_calls",
        "_first",
        "_id",
        "_pending",
        "_sse",
        "_tail",
        "_text_head",
        "_thought_head",
    )

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._sse = sse
        self._first = True
        self._id = ""
        self._pending: str | None = None  # a seal waiting for the next part
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._text_head = b""
        self._thought_head = b""
        self._tail = b""

    def _frame(self, body: bytes) -> None:
        if self._sse:
            self._out.append(b"data: " + body + b"\r\n\r\n")
        elif self._first:
            self._first = False
            self._out.append(b"[" + body)
        else:
            self._out.append(b",\r\n" + body)

    def _chunk(
        self, parts: list[dict[str, Any]], finish: str | None = None, usage: bool = False
    ) -> None:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish is not None:
            candidate["finishReason"] = finish
        candidate["index"] = 0
        obj: dict[str, Any] = {"candidates": [candidate]}
        if usage and self._usage is not None:
            obj["usageMetadata"] = encode_usage(self._usage)
        obj["modelVersion"] = self._model
        obj["responseId"] = self._id
        self._frame(_json.dumps(obj))

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        self._id = id
        if usage is not None:
            self._usage = usage
        self._text_head = b'{"candidates":[{"content":{"parts":[{"text":'
        self._thought_head = self._text_head
        self._tail = (
            b'}],"role":"model"},"index":0}],"modelVersion":'
            + _json.dumps(self._model)
            + b',"responseId":'
            + _json.dumps(self._id)
            + b"}"
        )

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        self._ensure_started()

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        if self.ended:
            return
        self._ensure_started()
        self._calls[index] = (id, flat_name(name, namespace), [])

    def text(self, index: int, text: str) -> None:
        if self.ended or not text:
            return
        if not self._started:
            self._ensure_started()
        if self._pending is not None:
            self._chunk([{"text": text, "thoughtSignature": self._pending}])
            self._pending = None
            return
        self._frame(self._text_head + _json.dumps(text) + self._tail)

    def reasoning(self, index: int, text: str) -> None:
        if self.ended or not text:
            return
        if not self._started:
            self._ensure_started()
        self._frame(self._thought_head + _json.dumps(text) + b',"thought":true' + self._tail)

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        seal = signature or encrypted_content
        if seal and is_base64(seal):
            self._pending = seal
        elif seal:
            self._drop("reasoning.signature (not base64)")
        if redacted_data is not None:
            self._drop("reasoning (redacted)")

    def tool_args(self, index: int, arguments: str) -> None:
        call = self._calls.get(index)
        if call is not None:
            call[2].append(arguments)

    def part_stop(self, index: int) -> None:
        call = self._calls.pop(index, None)
        if call is None or self.ended:
            return
        call_id, name, chunks = call
        args, ok = parse_arguments("".join(chunks))
        if not ok:
            self._drop("tool_call.arguments (not a JSON object)")
        part: dict[str, Any] = {"functionCall": {"id": call_id, "name": name, "args": args}}
        if self._pending is not None:
            part["thoughtSignature"] = self._pending
            self._pending = None
        self._chunk([part])

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        for index in list(self._calls):
            self.part_stop(index)
        last: dict[str, Any] = {"text": ""}
        if self._pending is not None:
            last["thoughtSignature"] = self._pending
            self._pending = None
        reason = self._reason or ir.StopReason.END_TURN
        self._chunk([last], FINISH_TO[reason], usage=True)
        if not self._sse:
            self._out.append(b"]")
        self.ended = True

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        self._frame(error_body(DIALECT, err))
        if not self._sse:
            self._out.append(b"]")


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
