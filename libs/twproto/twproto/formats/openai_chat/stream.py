"""OpenAI Chat Completions streams ⇄ IR: the watch needles, the stream decoder and the stream
encoder.

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
    custom_input,
    error_status,
    flat_name,
    json_text,
    need_str,
    opt_int,
    prefixed_id,
)
from twproto.formats.openai_chat.request import DIALECT, FINISH_TO, _finish
from twproto.formats.openai_chat.response import decode_usage, encode_usage
from twproto.sse import SSEEvent

__all__ = (
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "new_stream_decoder",
    "new_stream_encoder",
)


# The watch path's needles. Chat events have no names: usage, the finish reason and errors are
# found in the data (servers write JSON with and without spaces), and the end is ``[DONE]``. A
# chunk that ends like a plain delta chunk (``"finish_reason":null``, no usage) carries none.
WATCH = WatchNeedles(
    chunk_markers=(
        b'"finish_reason":"',
        b'"finish_reason": "',
        b'"usage":{',
        b'"usage": {',
        b"error",
        b"[DONE]",
    ),
    delta_ends=(
        b'"finish_reason":null}]}\n\n',
        b'"finish_reason":null}],"usage":null}\n\n',
    ),
    data_starts=("[DONE]",),
    data_needles=(
        '"usage":{',
        '"usage": {',
        '"error"',
        '"finish_reason":"',
        '"finish_reason": "',
    ),
)


class StreamDecoder(DecoderBase):
    """Chat chunks (SSE events) → IR stream calls; see `twproto.formats.anthropic.StreamDecoder`
    for the `feed` / `feed_into` / `watch` split."""

    __slots__ = (
        "_created",
        "_id",
        "_next",
        "_reasoning",
        "_started",
        "_text",
        "_tool_ids",
        "_tools",
    )
    needles = WATCH

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._id = ""
        self._created: int | None = None
        self._next = 0
        self._text: int | None = None
        self._reasoning: int | None = None
        self._tools: dict[int, int] = {}  # Chat tool-call index → IR index
        self._tool_ids: dict[str, int] = {}  # call id → Chat tool-call index

    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        try:
            data = event.data
            if data[:6] == "[DONE]":
                if not self.finished:
                    self._close(h)
                    self.finished = True
                    stop = ir.StopReason.TOOL_USE if self._tools else ir.StopReason.END_TURN
                    self.stop_reason = stop
                    h.finish(stop, None)
                h.end()
                return
            try:
                obj = _json.loads(data)
            except _json.JSONDecodeError:
                if data.strip():
                    self._drop("chunk (not JSON)")
                return
            if not isinstance(obj, dict):
                return
            if obj.get("error"):
                err = obj["error"]
                if isinstance(err, Mapping):
                    etype = str(err.get("type") or err.get("code") or "api_error")
                    code = err.get("code")
                    status = (
                        code
                        if isinstance(code, int) and 400 <= code <= 599
                        # OpenAI's rate limits say `type: tokens` / `requests`; the code says 429.
                        else error_status(etype, error_status(str(code) if code else None))
                    )
                    message = str(err.get("message", "upstream error"))
                else:
                    etype, status, message = "api_error", 500, str(err)
                self.error = ir.StreamErrorEvent(message=message, type=etype, status=status)
                h.error(self.error)
                return
            if not self._started:
                self._started = True
                self._id = str(obj.get("id", ""))
                self._created = opt_int(obj.get("created"))
                h.message_start(self._id, str(obj.get("model", "")), self._created, None)
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                delta = choice.get("delta")
                if delta:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if reasoning and reasoning.__class__ is str:
                        index = self._reasoning
                        if index is None:
                            self._stop_text(h)
                            index = self._reasoning = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.REASONING, None)
                        h.reasoning(index, reasoning)
                    content = delta.get("content")
                    if content and content.__class__ is str:
                        index = self._text
                        if index is None:
                            self._stop_reasoning(h)
                            index = self._text = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.TEXT, None)
                        h.text(index, content)
                    refusal = delta.get("refusal")
                    if refusal and isinstance(refusal, str):
                        self._drop("refusal (as text)")
                        index = self._text
                        if index is None:
                            index = self._text = self._next
                            self._next += 1
                            h.part_start(index, ir.PartKind.TEXT, None)
                        h.text(index, refusal)
                    calls = delta.get("tool_calls")
                    if calls:
                        self._tool_deltas(calls, h)
                reason = choice.get("finish_reason")
                if reason and not self.finished:
                    self._close(h)
                    self.finished = True
                    self.stop_reason = _finish(reason, bool(self._tools))
                    h.finish(self.stop_reason, None)
            usage = obj.get("usage")
            if usage:
                self.usage = decode_usage(usage)
                h.usage(self.usage)
        except MALFORMED:
            # A value of the wrong JSON type somewhere in the event: skip the event.
            self._drop("event (malformed)")

    def _tool_deltas(self, calls: list[Any], h: ir.StreamHandler) -> None:
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            call_id = call.get("id")
            number = call.get("index")
            if not isinstance(number, int):
                # Servers that omit the index: an id names the call; without one, a delta
                # continues the latest call.
                if call_id and call_id in self._tool_ids:
                    number = self._tool_ids[call_id]
                elif call_id or not self._tools:
                    number = len(self._tools)
                else:
                    number = max(self._tools)
            function = call.get("function") or {}
            name = function.get("name") or ""
            index = self._tools.get(number)
            if index is None:
                self._stop_text(h)
                self._stop_reasoning(h)
                index = self._tools[number] = self._next
                self._next += 1
                call_id = str(call_id or ir.derive_call_id(self._id, number))
                self._tool_ids[call_id] = number
                h.tool_call_start(
                    index,
                    call_id,
                    need_str(name),
                    ir.ToolKind.FUNCTION,
                    None,
                    None,
                )
            arguments = function.get("arguments")
            if arguments:
                h.tool_args(
                    index, arguments if isinstance(arguments, str) else json_text(arguments)
                )

    def _stop_text(self, h: ir.StreamHandler) -> None:
        if self._text is not None:
            h.part_stop(self._text)
            self._text = None

    def _stop_reasoning(self, h: ir.StreamHandler) -> None:
        if self._reasoning is not None:
            h.part_stop(self._reasoning)
            self._reasoning = None

    def _close(self, h: ir.StreamHandler) -> None:
        self._stop_reasoning(h)
        self._stop_text(h)
        for index in self._tools.values():
            h.part_stop(index)


class StreamEncoder(EncoderBase):
    """IR stream calls → Chat chunk SSE bytes; `take()` returns what is ready to send.

    `sse` is not used: this format always streams as SSE.
    """

    __slots__ = ("_args", "_created", "_custom", "_head", "_tail", "_tools")

    def __init__(self, *, model: str, created: int | None = None, sse: bool = True) -> None:
        super().__init__(model)
        self._created = created or 0
        self._head = b""
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._tools: dict[int, int] = {}  # IR index → Chat tool index
        self._args: dict[int, bytes] = {}  # IR index → argument-delta prefix
        self._custom: dict[int, tuple[str, str, list[str]]] = {}  # buffered custom calls

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self._started or self.ended:
            return
        self._started = True
        if created is not None:
            self._created = created
        if usage is not None:
            self._usage = usage
        self._head = (
            b'data: {"id":'
            + _json.dumps(prefixed_id("chatcmpl-", id))
            + b',"object":"chat.completion.chunk","created":'
            + str(self._created).encode()
            + b',"model":'
            + _json.dumps(self._model)
            + b',"choices":[{"index":0,"delta":'
        )
        self._out.append(self._head + b'{"role":"assistant","content":""}' + self._tail)

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
        if self.ended or index in self._tools:
            return
        self._ensure_started()
        number = self._tools[index] = len(self._tools)
        if tool_kind is ir.ToolKind.CUSTOM and not namespace:
            self._custom[index] = (id, name, [])
            return
        call = {
            "index": number,
            "id": id,
            "type": "function",
            "function": {"name": flat_name(name, namespace), "arguments": ""},
        }
        self._out.append(self._head + _json.dumps({"tool_calls": [call]}) + self._tail)
        self._args[index] = (
            self._head
            + b'{"tool_calls":[{"index":'
            + str(number).encode()
            + b',"function":{"arguments":'
        )

    def text(self, index: int, text: str) -> None:
        if self.ended:
            return
        if not self._started:
            self._ensure_started()
        self._out.append(self._head + b'{"content":' + _json.dumps(text) + b"}" + self._tail)

    def reasoning(self, index: int, text: str) -> None:
        if self.ended or not text:
            return
        if not self._started:
            self._ensure_started()
        self._out.append(
            self._head + b'{"reasoning_content":' + _json.dumps(text) + b"}" + self._tail
        )

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        self._drop("reasoning.signature")

    def tool_args(self, index: int, arguments: str) -> None:
        prefix = self._args.get(index)
        if prefix is not None:
            if arguments and not self.ended:
                self._out.append(prefix + _json.dumps(arguments) + b"}}]}" + self._tail)
            return
        custom = self._custom.get(index)
        if custom is not None:
            custom[2].append(arguments)

    def part_stop(self, index: int) -> None:
        custom = self._custom.pop(index, None)
        if custom is None or self.ended:
            return
        call_id, name, chunks = custom
        call = {
            "index": self._tools[index],
            "id": call_id,
            "type": "custom",
            "custom": {"name": name, "input": custom_input("".join(chunks))},
        }
        self._out.append(self._head + _json.dumps({"tool_calls": [call]}) + self._tail)

    def end(self) -> None:
        if self.ended:
            return
        self._ensure_started()
        for index in list(self._custom):
            self.part_stop(index)
        reason = self._reason
        if reason is None:
            reason = ir.StopReason.TOOL_USE if self._tools else ir.StopReason.END_TURN
        closing = (
            self._head
            + b'{},"logprobs":null,"finish_reason":"'
            + FINISH_TO[reason].encode()
            + b'"}]'
        )
        if self._usage is not None:
            closing += b',"usage":' + _json.dumps(encode_usage(self._usage))
        self._out.append(closing + b"}\n\ndata: [DONE]\n\n")
        self.ended = True

    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        self._out.append(stream_error_event(DIALECT, err))


# The `Format` factories: a fresh decoder for one streamed answer in this format, and a fresh
# encoder writing this format's stream for a client that asked for `model`.
new_stream_decoder = StreamDecoder
new_stream_encoder = StreamEncoder
