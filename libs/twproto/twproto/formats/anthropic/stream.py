"""Anthropic Messages streams ⇄ IR: the watch needles, the stream decoder and the stream encoder.

The stream codecs are built on the shared bases of `twproto.formats._codec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import _json, ir
from twproto.errors import GatewayError, anthropic_stream_type
from twproto.formats._codec import DecoderBase, EncoderBase, WatchNeedles
from twproto.formats._common import (
    MALFORMED,
    as_dict,
    as_str,
    error_status,
    json_text,
    need_int,
    need_str,
    prefixed_id,
    usage_or_zero,
)
from twproto.formats.anthropic.request import STOP_FROM, STOP_TO, _tool_id
from twproto.formats.anthropic.response import decode_usage, encode_usage
from twproto.sse import SSEEvent

__all__ = (
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "new_stream_decoder",
    "new_stream_encoder",
)


# The watch path's needles: usage, the stop reason and errors come in the message_* events and
# `error`; a chunk of nothing but content_block_delta (or ping) events carries none of them.
WATCH = WatchNeedles(
    chunk_markers=(b"message_", b"error"),
    delta_starts=(b"event: content_block_delta\n", b"event: ping\n"),
    event_names=frozenset({"message_start", "message_delta", "message_stop", "error"}),
    data_needles=('"message_', '"error"'),
)


class StreamDecoder(DecoderBase):
    """Anthropic SSE events → IR stream calls.

    `feed` returns event objects; `feed_into` calls a handler directly (the translator's hot
    path); `watch` only follows usage, the stop reason and errors, parsing nothing else.
    """

    __slots__ = ("_skipped",)
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self._skipped: set[int] = set()

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            try:
                obj = _json.loads(event.data)
            except _json.JSONDecodeError:
                if event.data.strip():
                    self._drop("event (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            kind = obj.get("type") or event.event
            if kind == "content_block_delta":
                index = need_int(obj.get("index", 0))
                if index in self._skipped:
                    return
                delta = obj["delta"]
                dkind = delta.get("type")
                if dkind == "text_delta":
                    h.text(index, need_str(delta["text"]))
                elif dkind == "input_json_delta":
                    h.tool_args(index, need_str(delta["partial_json"]))
                elif dkind == "thinking_delta":
                    h.reasoning(index, need_str(delta["thinking"]))
                elif dkind == "signature_delta":
                    h.reasoning_seal(index, need_str(delta["signature"]), None, None)
                elif dkind != "citations_delta":
                    self._drop(f"delta:{dkind}")
            elif kind == "content_block_start":
                self._block_start(obj, h)
            elif kind == "content_block_stop":
                index = need_int(obj.get("index", 0))
                if index not in self._skipped:
                    h.part_stop(index)
            elif kind == "message_start":
                message = as_dict(obj.get("message"))
                usage = decode_usage(message["usage"]) if "usage" in message else None
                self.usage = usage
                h.message_start(
                    str(message.get("id", "")), str(message.get("model", "")), None, usage
                )
            elif kind == "message_delta":
                delta = as_dict(obj.get("delta"))
                if "usage" in obj:
                    self.usage = decode_usage(obj["usage"], self.usage)
                    h.usage(self.usage)
                reason = delta.get("stop_reason")
                if reason is not None:
                    self.finished = True
                    stop = self.stop_reason = STOP_FROM.get(str(reason), ir.StopReason.END_TURN)
                    h.finish(stop, as_str(delta.get("stop_sequence")))
            elif kind == "message_stop":
                self.finished = True
                h.end()
            elif kind == "error":
                err = as_dict(obj.get("error"))
                etype = str(err.get("type", "api_error"))
                self.error = ir.StreamErrorEvent(
                    message=str(err.get("message", "upstream error")),
                    type=etype,
                    status=error_status(etype),
                )
                h.error(self.error)
            elif kind != "ping":
                self._drop(f"event:{kind}")
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _block_start(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        index = need_int(obj.get("index", 0))
        block = as_dict(obj.get("content_block"))
        kind = block.get("type")
        if kind == "text":
            h.part_start(index, ir.PartKind.TEXT, None)
            if block.get("text"):
                h.text(index, need_str(block["text"]))
        elif kind == "thinking":
            h.part_start(index, ir.PartKind.REASONING, None)
            if block.get("thinking"):
                h.reasoning(index, need_str(block["thinking"]))
            if block.get("signature"):
                h.reasoning_seal(index, need_str(block["signature"]), None, None)
        elif kind == "redacted_thinking":
            h.part_start(index, ir.PartKind.REASONING, None)
            h.reasoning_seal(index, None, None, str(block.get("data", "")))
        elif kind == "tool_use":
            h.tool_call_start(
                index,
                str(block.get("id", "")),
                str(block.get("name", "")),
                ir.ToolKind.FUNCTION,
                None,
                None,
            )
            if block.get("input"):
                h.tool_args(index, json_text(block["input"]))
        else:
            self._skipped.add(index)
            self._drop(f"content:{kind}")


class StreamEncoder(EncoderBase):
    """IR stream calls → Anthropic SSE bytes; `take()` returns what is ready to send.

    `created` is not used (Anthropic messages carry no timestamp), nor `sse` (this format always
    streams as SSE).
    """

    __slots__ = (
        "_blocks",
        "_id",
        "_kinds",
        "_next",
        "_open",
        "_pending_reasoning",
        "_stop_sequence",
        "_templates",
    )

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._id = ""
        self._blocks: dict[int, int] = {}  # IR index → Anthropic block index
        self._kinds: dict[int, ir.PartKind] = {}
        self._templates: dict[int, tuple[bytes, bytes, bytes]] = {}
        self._next = 0
        self._open: int | None = None
        # A reasoning part whose block start waits for its first delta: it may turn out to be
        # redacted thinking, which is a different block type.
        self._pending_reasoning: set[int] = set()
        self._stop_sequence: str | None = None

    def _emit(self, name: bytes, obj: Any) -> None:
        self._out.append(b"event: " + name + b"\ndata: " + _json.dumps(obj) + b"\n\n")

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        self._id = prefixed_id("msg_", id)
        if usage is not None:
            self._usage = usage
        start_usage = encode_usage(usage_or_zero(usage))
        self._emit(
            b"message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self._id,
                    "type": "message",
                    "role": "assistant",
                    "model": self._model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )

    def _close_open(self) -> None:
        if self._open is not None:
            self._emit(b"content_block_stop", {"type": "content_block_stop", "index": self._open})
            self._open = None

    def _open_block(self, index: int, kind: ir.PartKind, block: dict[str, Any]) -> int:
        self._ensure_started()
        self._close_open()
        number = self._next
        self._next += 1
        self._blocks[index] = number
        self._kinds[index] = kind
        self._open = number
        prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(number).encode()
        )
        self._templates[index] = (
            prefix + b',"delta":{"type":"text_delta","text":',
            prefix + b',"delta":{"type":"thinking_delta","thinking":',
            prefix + b',"delta":{"type":"input_json_delta","partial_json":',
        )
        self._emit(
            b"content_block_start",
            {"type": "content_block_start", "index": number, "content_block": block},
        )
        return number

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        if self.ended or index in self._blocks:
            return
        if part is ir.PartKind.REASONING:
            self._pending_reasoning.add(index)
            self._kinds[index] = part
        else:
            self._open_block(index, ir.PartKind.TEXT, {"type": "text", "text": ""})

    def _flush_reasoning(self, index: int) -> None:
        self._pending_reasoning.discard(index)
        self._open_block(
            index, ir.PartKind.REASONING, {"type": "thinking", "thinking": "", "signature": ""}
        )

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        if self.ended or index in self._blocks:
            return
        self._open_block(
            index,
            ir.PartKind.TOOL_CALL,
            {"type": "tool_use", "id": _tool_id(id), "name": name, "input": {}},
        )

    def text(self, index: int, text: str) -> None:
        templates = self._templates.get(index)
        if templates is None:
            if self.ended:
                return
            self.part_start(index, ir.PartKind.TEXT, None)
            templates = self._templates[index]
        self._out.append(templates[0] + _json.dumps(text) + b"}}\n\n")

    def reasoning(self, index: int, text: str) -> None:
        if index in self._pending_reasoning:
            self._flush_reasoning(index)
        templates = self._templates.get(index)
        if templates is None:
            if self.ended:
                return
            self._flush_reasoning(index)
            templates = self._templates[index]
        if text:
            self._out.append(templates[1] + _json.dumps(text) + b"}}\n\n")

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        if self.ended:
            return
        if redacted_data is not None and index not in self._blocks:
            self._pending_reasoning.discard(index)
            self._open_block(
                index, ir.PartKind.REASONING, {"type": "redacted_thinking", "data": redacted_data}
            )
            return
        if index in self._pending_reasoning or index not in self._blocks:
            self._flush_reasoning(index)
        seal = signature or encrypted_content
        if seal:
            self._emit(
                b"content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._blocks[index],
                    "delta": {"type": "signature_delta", "signature": seal},
                },
            )

    def tool_args(self, index: int, arguments: str) -> None:
        templates = self._templates.get(index)
        if templates is None:
            return
        if arguments:
            self._out.append(templates[2] + _json.dumps(arguments) + b"}}\n\n")

    def part_stop(self, index: int) -> None:
        if index in self._pending_reasoning:
            self._flush_reasoning(index)
        number = self._blocks.get(index)
        if number is not None and number == self._open:
            self._close_open()

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        self._reason = reason
        self._stop_sequence = stop_sequence

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        for index in list(self._pending_reasoning):
            self._flush_reasoning(index)
        self._close_open()
        reason = self._reason
        if reason is None:
            has_calls = ir.PartKind.TOOL_CALL in self._kinds.values()
            reason = ir.StopReason.TOOL_USE if has_calls else ir.StopReason.END_TURN
        self._emit(
            b"message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": STOP_TO[reason], "stop_sequence": self._stop_sequence},
                "usage": encode_usage(usage_or_zero(self._usage)),
            },
        )
        self._emit(b"message_stop", {"type": "message_stop"})
        self.ended = True

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        # Only a type Anthropic documents: another format's `server_error` would read as no
        # Anthropic error at all (the upstream's own `overloaded_error` is kept).
        kind = anthropic_stream_type(err, upstream_type)
        body = {"type": "error", "error": {"type": kind, "message": err.message}}
        self._out.append(b"event: error\ndata: " + _json.dumps(body) + b"\n\n")


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
