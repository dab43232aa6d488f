"""OpenAI Responses streams ⇄ IR: the watch needles, the stream decoder and the stream encoder.

The stream codecs are built on the shared bases of `twproto.formats._codec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twproto import _json, ir
from twproto.errors import GatewayError, stream_error_event
from twproto.formats._codec import DecoderBase, EncoderBase, WatchNeedles
from twproto.formats._common import (
    MALFORMED,
    as_dict,
    as_int,
    as_str,
    custom_input,
    error_status,
    need_int,
    need_str,
    opt_int,
    prefixed_id,
    usage_or_zero,
)
from twproto.formats.openai_responses.request import DIALECT, _escape_fragment
from twproto.formats.openai_responses.response import (
    _call_item,
    _final_status,
    _item_base,
    _message_item,
    _reasoning_item,
    _response_object,
    _stop_reason,
    decode_usage,
)
from twproto.sse import SSEEvent

__all__ = (
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "new_stream_decoder",
    "new_stream_encoder",
)


# The watch path's needles: usage and the finish come in the response's terminal events, errors
# in response.failed and error; response.created is watched too, for the ids an error ending
# repeats. A chunk of one output, arguments or reasoning delta event carries none of them.
WATCH = WatchNeedles(
    chunk_markers=(
        b"response.created",
        b"response.completed",
        b"response.incomplete",
        b"response.failed",
        b"error",
    ),
    delta_starts=(
        b"event: response.output_text.delta\n",
        b"event: response.function_call_arguments.delta\n",
        b"event: response.reasoning_summary_text.delta\n",
        b"event: response.reasoning_text.delta\n",
        b"event: response.custom_tool_call_input.delta\n",
    ),
    event_names=frozenset(
        {
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
            "response.created",
        }
    ),
    data_needles=(
        '"response.completed"',
        '"response.failed"',
        '"response.incomplete"',
        '"error"',
    ),
)


class StreamDecoder(DecoderBase):
    """Responses stream events → IR stream calls; see `twproto.formats.anthropic.StreamDecoder`
    for the `feed` / `feed_into` / `watch` split."""

    __slots__ = (
        "_args_seen",
        "_custom",
        "_items",
        "_next",
        "_saw_calls",
        "_stopped",
        "_text_parts",
        "created_at",
        "response_id",
        "response_model",
    )
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.created_at: int | None = None
        self._items: dict[int, tuple[str, int]] = {}  # output_index → (item type, IR index)
        self._text_parts: dict[tuple[int, int], int] = {}
        self._custom: set[int] = set()
        self._args_seen: set[int] = set()
        self._stopped: set[int] = set()
        self._next = 0
        self._saw_calls = False

    def _new_index(self) -> int:
        index = self._next
        self._next += 1
        return index

    def _stop(self, index: int, h: ir.StreamHandler) -> None:
        if index not in self._stopped:
            self._stopped.add(index)
            h.part_stop(index)

    def _text_index(self, output_index: int, content_index: int, h: ir.StreamHandler) -> int:
        key = (output_index, content_index)
        index = self._text_parts.get(key)
        if index is None:
            index = self._text_parts[key] = self._new_index()
            h.part_start(index, ir.PartKind.TEXT, None)
        return index

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            try:
                obj = _json.loads(event.data)
            except _json.JSONDecodeError:
                if event.data.strip() and event.data.strip() != "[DONE]":
                    self._drop("event (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            kind = obj.get("type") or event.event
            if kind == "response.output_text.delta" or kind == "response.refusal.delta":
                index = self._text_index(
                    need_int(obj.get("output_index", 0)), need_int(obj.get("content_index", 0)), h
                )
                h.text(index, need_str(obj["delta"]))
            elif kind == "response.function_call_arguments.delta":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    self._args_seen.add(entry[1])
                    h.tool_args(entry[1], need_str(obj["delta"]))
            elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    h.reasoning(entry[1], need_str(obj["delta"]))
            elif kind == "response.custom_tool_call_input.delta":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None:
                    h.tool_args(entry[1], _escape_fragment(str(obj.get("delta", ""))))
            elif kind == "response.output_item.added":
                self._item_added(obj, h)
            elif kind == "response.output_item.done":
                self._item_done(obj, h)
            elif kind == "response.content_part.added":
                part = as_dict(obj.get("part"))
                index = self._text_index(
                    need_int(obj.get("output_index", 0)), need_int(obj.get("content_index", 0)), h
                )
                text = part.get("text") or part.get("refusal")
                if isinstance(text, str) and text:
                    h.text(index, text)
            elif kind == "response.content_part.done":
                key = (obj.get("output_index", 0), obj.get("content_index", 0))
                if key in self._text_parts:
                    self._stop(self._text_parts[key], h)
            elif kind == "response.reasoning_summary_part.added":
                entry = self._items.get(obj.get("output_index", 0))
                if entry is not None and as_int(obj.get("summary_index")) > 0:
                    h.reasoning(entry[1], "\n\n")
            elif kind == "response.created":
                response = as_dict(obj.get("response"))
                # Kept for an error ending written on the unchanged (watch) path: the SDK
                # refuses a response.failed naming another response.
                self.response_id = str(response.get("id", "")) or None
                self.response_model = str(response.get("model", "")) or None
                self.created_at = opt_int(response.get("created_at"))
                h.message_start(
                    str(response.get("id", "")),
                    str(response.get("model", "")),
                    opt_int(response.get("created_at")),
                    None,
                )
            elif kind in ("response.completed", "response.incomplete"):
                response = as_dict(obj.get("response"))
                for index in list(self._text_parts.values()):
                    self._stop(index, h)
                for _, index in self._items.values():
                    self._stop(index, h)
                if isinstance(response.get("usage"), Mapping):
                    self.usage = decode_usage(response["usage"])
                    h.usage(self.usage)
                self.finished = True
                self.stop_reason = _stop_reason(response, self._saw_calls)
                h.finish(self.stop_reason, None)
                h.end()
            elif kind in ("response.failed", "error"):
                if self.error is not None:
                    return
                if kind == "error":
                    err = obj.get("error") if isinstance(obj.get("error"), Mapping) else obj
                else:
                    err = as_dict(as_dict(obj.get("response")).get("error"))
                err = as_dict(err)
                code = str(err.get("code") or err.get("type") or "server_error")
                status = obj.get("status_code") or obj.get("status")
                self.error = ir.StreamErrorEvent(
                    message=str(err.get("message", "upstream error")),
                    type=code,
                    status=status
                    if isinstance(status, int) and 400 <= status <= 599
                    else error_status(code),
                )
                h.error(self.error)
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _item_added(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        item = as_dict(obj.get("item"))
        output_index = as_int(obj.get("output_index"))
        kind = str(item.get("type"))
        if kind == "message":
            self._items[output_index] = (kind, -1)
        elif kind == "reasoning":
            index = self._new_index()
            self._items[output_index] = (kind, index)
            h.part_start(index, ir.PartKind.REASONING, as_str(item.get("id")))
        elif kind in ("function_call", "custom_tool_call"):
            index = self._new_index()
            self._items[output_index] = (kind, index)
            self._saw_calls = True
            custom = kind == "custom_tool_call"
            h.tool_call_start(
                index,
                str(item.get("call_id", "")),
                str(item.get("name", "")),
                ir.ToolKind.CUSTOM if custom else ir.ToolKind.FUNCTION,
                as_str(item.get("namespace")),
                as_str(item.get("id")),
            )
            if custom:
                self._custom.add(index)
                h.tool_args(index, '{"input":"' + _escape_fragment(str(item.get("input", ""))))
            elif item.get("arguments"):
                self._args_seen.add(index)
                h.tool_args(index, str(item["arguments"]))
        else:
            self._drop(f"output:{kind}")

    def _item_done(self, obj: Mapping[str, Any], h: ir.StreamHandler) -> None:
        item = as_dict(obj.get("item"))
        entry = self._items.get(as_int(obj.get("output_index")))
        if entry is None:
            return
        kind, index = entry
        if kind == "message":
            output_index = as_int(obj.get("output_index"))
            for (oi, _), text_index in self._text_parts.items():
                if oi == output_index:
                    self._stop(text_index, h)
            return
        if index in self._stopped:
            return
        if kind == "reasoning":
            sealed = as_str(item.get("encrypted_content"))
            if sealed:
                h.reasoning_seal(index, None, sealed, None)
        elif index in self._custom:
            h.tool_args(index, '"}')
        elif index not in self._args_seen and item.get("arguments"):
            h.tool_args(index, str(item["arguments"]))
        self._stop(index, h)


class _OpenItem:
    __slots__ = (
        "call",
        "chunks",
        "delta_prefix",
        "id",
        "kind",
        "output_index",
        "seal",
        "started",
        "texts",
    )

    def __init__(self, kind: str, item_id: str, output_index: int) -> None:
        self.kind = kind
        self.id = item_id
        self.output_index = output_index
        self.chunks: list[str] = []
        self.texts: list[str] = []  # message items: the finished texts of its content parts
        self.seal: str | None = None
        self.call: ir.ToolCall | None = None
        self.started = False  # reasoning: its summary part was opened
        self.delta_prefix = b""


class StreamEncoder(EncoderBase):
    """IR stream calls → Responses SSE bytes; `take()` returns what is ready to send.

    Message and reasoning items are sequential (a new part closes the open one); tool-call items
    stay open until their own part ends, so calls whose arguments arrive interleaved (Chat
    upstreams may do that) are still delivered whole. `sse` is not used: this format always
    streams as SSE.
    """

    __slots__ = (
        "_base",
        "_calls",
        "_created",
        "_done",
        "_id",
        "_next_output",
        "_parts",
        "_seq",
        "_seq_open",
    )

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._created = created or 0
        self._seq = 0
        self._id = "resp_gateway"
        self._base = "gateway"
        self._next_output = 0
        self._done: dict[int, dict[str, Any]] = {}  # output_index → finished item
        self._seq_open: _OpenItem | None = None  # the open message or reasoning item
        self._calls: dict[int, _OpenItem] = {}  # output_index → open tool-call item
        # IR index → (item, content index within a message; -1 for other items)
        self._parts: dict[int, tuple[_OpenItem, int]] = {}

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        payload["sequence_number"] = self._seq
        self._seq += 1
        name = kind.encode()
        self._out.append(
            b"event: "
            + name
            + b'\ndata: {"type":"'
            + name
            + b'",'
            + _json.dumps(payload)[1:]
            + b"\n\n"
        )

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: ir.Usage | None
    ) -> dict[str, Any]:
        return _response_object(
            self._id, self._model, self._created, status, output, usage, self._reason
        )

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        self._id = prefixed_id("resp_", id)
        self._base = _item_base(self._id)
        if created is not None:
            self._created = created
        if usage is not None:
            self._usage = usage
        self._emit("response.created", {"response": self._response("in_progress", [], None)})
        self._emit("response.in_progress", {"response": self._response("in_progress", [], None)})

    def _new_item(self, kind: str, prefix: str) -> _OpenItem:
        self._ensure_started()
        number = self._next_output
        self._next_output += 1
        return _OpenItem(kind, f"{prefix}_{self._base}_{number}", number)

    def _item_done(self, item: _OpenItem, done: dict[str, Any]) -> None:
        self._emit("response.output_item.done", {"output_index": item.output_index, "item": done})
        self._done[item.output_index] = done

    def _finish_text(self, message: _OpenItem) -> None:
        if not message.delta_prefix:
            return
        content_index = len(message.texts) - 1
        text = "".join(message.chunks)
        message.texts[content_index] = text
        common = {
            "item_id": message.id,
            "output_index": message.output_index,
            "content_index": content_index,
        }
        self._emit("response.output_text.done", {**common, "logprobs": [], "text": text})
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        self._emit("response.content_part.done", {**common, "part": part})
        message.chunks = []
        message.delta_prefix = b""

    def _close_sequential(self) -> None:
        item = self._seq_open
        if item is None:
            return
        self._seq_open = None
        if item.kind == "message":
            self._finish_text(item)
            self._item_done(item, _message_item(item.id, item.texts, "completed"))
            return
        text = "".join(item.chunks)
        if item.started:
            common = {"item_id": item.id, "output_index": item.output_index, "summary_index": 0}
            self._emit("response.reasoning_summary_text.done", {**common, "text": text})
            self._emit(
                "response.reasoning_summary_part.done",
                {**common, "part": {"type": "summary_text", "text": text}},
            )
        self._item_done(item, _reasoning_item(item.id, text, item.seal))

    def _close_call(self, item: _OpenItem) -> None:
        self._calls.pop(item.output_index, None)
        call = item.call
        assert call is not None
        arguments = "".join(item.chunks)
        common = {"item_id": item.id, "output_index": item.output_index}
        if call.tool_kind is ir.ToolKind.CUSTOM:
            text = custom_input(arguments) if arguments else ""
            if text:
                self._emit("response.custom_tool_call_input.delta", {**common, "delta": text})
            self._emit("response.custom_tool_call_input.done", {**common, "input": text})
        else:
            self._emit("response.function_call_arguments.done", {**common, "arguments": arguments})
        self._item_done(item, _call_item(item.id, call, arguments, "completed"))

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        if self.ended or index in self._parts:
            return
        if part is ir.PartKind.REASONING:
            self._close_sequential()
            item = self._new_item("reasoning", "rs")
            if item_id and item_id.startswith("rs_"):
                item.id = item_id
            self._seq_open = item
            self._parts[index] = (item, -1)
            added = {"id": item.id, "type": "reasoning", "summary": []}
            self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": added}
            )
            return
        message = self._seq_open
        if message is None or message.kind != "message":
            self._close_sequential()
            message = self._new_item("message", "msg")
            self._seq_open = message
            self._emit(
                "response.output_item.added",
                {
                    "output_index": message.output_index,
                    "item": _message_item(message.id, [], "in_progress"),
                },
            )
        else:
            self._finish_text(message)
        content_index = len(message.texts)
        message.texts.append("")
        self._parts[index] = (message, content_index)
        message.delta_prefix = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"item_id":'
            + _json.dumps(message.id)
            + b',"output_index":'
            + str(message.output_index).encode()
            + b',"content_index":'
            + str(content_index).encode()
            + b',"logprobs":[],"delta":'
        )
        part_obj = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        self._emit(
            "response.content_part.added",
            {
                "item_id": message.id,
                "output_index": message.output_index,
                "content_index": content_index,
                "part": part_obj,
            },
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
        if self.ended or index in self._parts:
            return
        self._close_sequential()
        custom = tool_kind is ir.ToolKind.CUSTOM
        item = self._new_item("call", "ctc" if custom else "fc")
        if item_id and item_id.startswith("ctc_" if custom else "fc_"):
            item.id = item_id
        item.call = ir.ToolCall(id=id, name=name, tool_kind=tool_kind, namespace=namespace)
        self._parts[index] = (item, -1)
        self._calls[item.output_index] = item
        self._emit(
            "response.output_item.added",
            {
                "output_index": item.output_index,
                "item": _call_item(item.id, item.call, "", "in_progress"),
            },
        )
        item.delta_prefix = (
            b'event: response.function_call_arguments.delta\ndata: {"type":'
            b'"response.function_call_arguments.delta","item_id":'
            + _json.dumps(item.id)
            + b',"output_index":'
            + str(item.output_index).encode()
            + b',"delta":'
        )

    def text(self, index: int, text: str) -> None:
        entry = self._parts.get(index)
        if entry is None:
            if self.ended:
                return
            self.part_start(index, ir.PartKind.TEXT, None)
            entry = self._parts[index]
        item, content_index = entry
        if item is not self._seq_open or content_index != len(item.texts) - 1:
            self._late("text")
            return
        item.chunks.append(text)
        seq = self._seq
        self._seq += 1
        self._out.append(
            item.delta_prefix
            + _json.dumps(text)
            + b',"sequence_number":'
            + str(seq).encode()
            + b"}\n\n"
        )

    def _reasoning_item_for(self, index: int) -> _OpenItem | None:
        entry = self._parts.get(index)
        if entry is None:
            if self.ended:
                return None
            self.part_start(index, ir.PartKind.REASONING, None)
            entry = self._parts[index]
        if entry[0] is not self._seq_open:
            return None
        return entry[0]

    def reasoning(self, index: int, text: str) -> None:
        if not text:
            return
        item = self._reasoning_item_for(index)
        if item is None:
            self._late("reasoning")
            return
        common = {"item_id": item.id, "output_index": item.output_index, "summary_index": 0}
        if not item.started:
            item.started = True
            self._emit(
                "response.reasoning_summary_part.added",
                {**common, "part": {"type": "summary_text", "text": ""}},
            )
        item.chunks.append(text)
        self._emit("response.reasoning_summary_text.delta", {**common, "delta": text})

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        if redacted_data is not None:
            self._late("reasoning (redacted)")
        item = self._reasoning_item_for(index)
        seal = encrypted_content or signature
        if item is None:
            if seal:
                self._late("reasoning seal")
            return
        if seal:
            item.seal = seal

    def tool_args(self, index: int, arguments: str) -> None:
        entry = self._parts.get(index)
        if entry is None or not arguments:
            return
        item = entry[0]
        if item.output_index not in self._calls:
            self._late("tool_call arguments")
            return
        item.chunks.append(arguments)
        assert item.call is not None
        if item.call.tool_kind is ir.ToolKind.CUSTOM:
            return  # delivered whole when the call ends (see the module notes)
        seq = self._seq
        self._seq += 1
        self._out.append(
            item.delta_prefix
            + _json.dumps(arguments)
            + b',"sequence_number":'
            + str(seq).encode()
            + b"}\n\n"
        )

    def part_stop(self, index: int) -> None:
        entry = self._parts.get(index)
        if entry is None or self.ended:
            return
        item, content_index = entry
        if item.kind == "call":
            if item.output_index in self._calls:
                self._close_call(item)
        elif item is self._seq_open:
            if item.kind == "message":
                if content_index == len(item.texts) - 1:
                    self._finish_text(item)
            else:
                self._close_sequential()

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        self._close_sequential()
        for output_index in sorted(self._calls):
            self._close_call(self._calls[output_index])
        output = [self._done[i] for i in sorted(self._done)]
        if self._reason is None:
            has_calls = any(
                item.get("type") in ("function_call", "custom_tool_call") for item in output
            )
            self._reason = ir.StopReason.TOOL_USE if has_calls else ir.StopReason.END_TURN
        status = _final_status(self._reason)
        self._emit(
            f"response.{status}",
            {"response": self._response(status, output, usage_or_zero(self._usage))},
        )
        self.ended = True

    def _late(self, what: str) -> None:
        # A delta for an item already closed: Responses items cannot be reopened.
        self._drop(f"{what} after its item closed")

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        self._ensure_started()
        self._out.append(
            stream_error_event(
                DIALECT,
                err,
                response_id=self._id,
                model=self._model,
                sequence_number=self._seq,
                created_at=self._created,
            )
        )
        self._seq += 1


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
