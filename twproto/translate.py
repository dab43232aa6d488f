"""Conversion between API formats, bytes in and bytes out: requests, whole answers, streams.

Theory of operation
-------------------

This module composes the per-format converters of `twproto.formats` through the IR; it is
usable on its own as a library (no IO, no clock, no randomness).

Requests (`translate_request`): between different formats the body is decoded to an
`ir.Request` and encoded again; between the same format it passes through **byte for byte**,
except that a different ``model`` (or ``stream``) is written into the top-level field in place,
leaving every other byte alone. Gemini bodies carry neither (they are in the URL): the caller
passes them. A request converted to Anthropic without an output limit gets
``default_max_tokens`` (the caller passes the model's output limit; `DEFAULT_MAX_TOKENS`
otherwise). The result names what the conversion dropped and, in `TranslatedRequest.tool_names`,
how tool names were flattened, which the answer's conversion needs to map calls back.

Whole answers (`translate_response`): decoded and re-encoded naming the model the client asked
for; same format: only the model field changes.

Streams (`StreamTranslator`): upstream bytes → SSE events (or JSON-array elements) → the
upstream format's `StreamDecoder` → the client format's `StreamEncoder` (or an
`ir.AnswerBuilder` when the client wanted a whole answer) → client bytes. The decoder calls the
encoder's methods directly; no event objects are built per chunk. When both sides speak the
same format and framing, the chunk is returned **unchanged** (the same object) and the decoder
only *watches* it: it parses just the events that carry usage, the stop reason or an error. A
small framer (`_Watcher`) finds event boundaries by their blank line and lets chunks that hold
one plain delta event, or no marker of an interesting one, through without SSE-decoding them.

A stream's ending: `end` is called when the upstream body ends. If the upstream's terminal event
(or, for Gemini and Chat without ``[DONE]``, its finish reason) was seen, `end` returns the
client's closing bytes; otherwise `finished` is False and the caller ends the client's stream
with `fail`, which writes the error ending the client's SDK understands. Read `finished` after
`end`: an upstream that closes without the last blank line completes its last event only then.
An error the upstream reports inside its stream is converted as it arrives and ends the client's
stream; it is also kept in `error`. The server holds a stream until its first content before
feeding it here, so nothing is held in this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from twproto import _json, ir
from twproto._exceptions import (
    ClientTranslationError,
    TranslationError,
    UpstreamTranslationError,
)
from twproto.dialect import Dialect
from twproto.errors import GatewayError, error_body, stream_error_event
from twproto.formats import (
    StreamDecoder,
    StreamEncoder,
    get,
    new_stream_decoder,
    new_stream_encoder,
)
from twproto.formats._common import (
    MALFORMED,
    NULL_HANDLER,
    gateway_error,
    merge_dropped,
    tool_names_for,
)
from twproto.formats._effort import budget_for_effort, parse_effort, without_reasoning_switches
from twproto.formats.anthropic import DEFAULT_MAX_TOKENS
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEError

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ClientTranslationError",
    "StreamTranslator",
    "TranslatedAnswer",
    "TranslatedRequest",
    "TranslationError",
    "UpstreamTranslationError",
    "answer_to_stream",
    "translate_request",
    "translate_response",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TranslatedRequest:
    """A request body ready for the upstream.

    `tool_names` maps tool names the conversion flattened back to the client's tools; pass it
    to `translate_response` / `StreamTranslator` for the answer.
    """

    body: bytes
    stream: bool
    model: str
    dropped: tuple[str, ...] = ()
    tool_names: ir.ToolNames = field(default_factory=ir.ToolNames)


@dataclass(frozen=True, slots=True, kw_only=True)
class TranslatedAnswer:
    """A whole answer in the client's format, with what the gateway records about it."""

    body: bytes
    usage: ir.Usage | None
    stop_reason: ir.StopReason
    dropped: tuple[str, ...] = ()


# The top-level field that names the model in each format's bodies.
_MODEL_FIELD = {
    Dialect.ANTHROPIC: "model",
    Dialect.OPENAI_CHAT: "model",
    Dialect.OPENAI_RESPONSES: "model",
    Dialect.GEMINI: "modelVersion",
}


def _parse_object(body: bytes, error: type[TranslationError]) -> dict[str, Any]:
    try:
        obj = _json.loads(body)
    except _json.JSONDecodeError as exc:
        raise error(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise error("body is not a JSON object")
    return obj


# ----------------------------------------------------------------------------------------------
# In-place edits of top-level fields

_STRUCTURAL = re.compile(rb'["{}\[\],]')
_STRING_END = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)
_WS = re.compile(rb"[ \t\r\n]*")


def _top_level_spans(body: bytes, keys: set[str]) -> dict[str, tuple[int, int]]:
    """Byte spans of the values of top-level `keys` in the JSON object `body` (already known to
    parse). Stops as soon as every key was found."""
    spans: dict[str, tuple[int, int]] = {}
    pos = body.index(b"{") + 1
    depth = 1
    n = len(body)
    expect_key = True
    current: str | None = None
    value_start = -1
    while pos < n and depth > 0:
        m = _STRUCTURAL.search(body, pos)
        if m is None:
            break
        p = m.start()
        c = body[p]
        if c == 0x22:  # a string
            end_match = _STRING_END.match(body, p + 1)
            end = end_match.end() if end_match else n
            if depth == 1 and expect_key:
                current = _json.loads(body[p:end])
                colon = body.index(b":", end)
                value_start = _WS.match(body, colon + 1).end()  # type: ignore[union-attr]
                expect_key = False
                pos = value_start
                continue
            pos = end
            continue
        if c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
            if depth == 0 and current is not None and not expect_key:
                if current in keys:
                    spans[current] = (value_start, len(body[:p].rstrip()))
                break
        elif c == 0x2C and depth == 1:
            if current is not None and not expect_key and current in keys:
                spans[current] = (value_start, len(body[:p].rstrip()))
                if len(spans) == len(keys):
                    break
            expect_key = True
            current = None
        pos = p + 1
    return spans


def _set_top_level(body: bytes, changes: dict[str, Any]) -> bytes:
    """`body` with the top-level `changes` written in, every other byte kept."""
    spans = _top_level_spans(body, set(changes))
    edits = sorted(
        ((spans[key], _json.dumps(value)) for key, value in changes.items() if key in spans),
        reverse=True,
    )
    out = body
    for (start, stop), value in edits:
        out = out[:start] + value + out[stop:]
    missing = [key for key in changes if key not in spans]
    if missing:
        brace = out.index(b"{") + 1
        empty = out[brace:].lstrip().startswith(b"}")
        inserted = b",".join(_json.dumps(key) + b":" + _json.dumps(changes[key]) for key in missing)
        out = out[:brace] + inserted + (b"" if empty else b",") + out[brace:]
    return out


# ----------------------------------------------------------------------------------------------
# Requests and whole answers


def translate_request(
    body: bytes,
    source: Dialect,
    target: Dialect,
    *,
    model: str | None = None,
    stream: bool | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_tokens: int | None = None,
    reasoning: ir.ReasoningLevel | None = None,
    drop_sealed_reasoning: bool = False,
) -> TranslatedRequest:
    """Convert a client's request body in `source` format to `target` format.

    `model` / `stream` override the body's (and are required for Gemini sources, whose body has
    neither). `default_max_tokens` fills a missing output limit for an Anthropic target.
    `max_tokens` and `reasoning` are a routing rule's ``set`` (SPEC §6, §13): the output limit
    to use, and a reasoning level (``off``, ``low`` … ``max``) that changes the effort of a
    request that already reasons, or with ``off`` removes reasoning; it never turns it on. With
    either set, a same-format body is rewritten through the IR instead of passed through.
    `drop_sealed_reasoning` leaves out reasoning parts that carry a seal (signature, encrypted
    content, redacted data): an upstream on another account refuses them (SPEC §14); their
    removal is recorded in `dropped`.
    Raises `ClientTranslationError` (400) for a body that is not a JSON object.
    """
    obj = _parse_object(body, ClientTranslationError)
    rewrite = max_tokens is not None or reasoning is not None or drop_sealed_reasoning
    if source is target and not rewrite:
        if target is Dialect.GEMINI:
            return TranslatedRequest(body=body, stream=bool(stream), model=model or "")
        body_model = obj.get("model")
        body_stream = obj.get("stream") is True
        changes: dict[str, Any] = {}
        if model is not None and model != body_model:
            changes["model"] = model
        if stream is not None and stream != body_stream:
            changes["stream"] = stream
        return TranslatedRequest(
            body=_set_top_level(body, changes) if changes else body,
            stream=body_stream if stream is None else stream,
            model=model if model is not None else str(body_model or ""),
        )
    try:
        req = get(source).decode_request(obj)
        req = replace(
            req,
            model=model if model is not None else req.model,
            stream=req.stream if stream is None else stream,
        )
        if max_tokens is not None:
            req = replace(req, max_output_tokens=max_tokens)
        if reasoning is not None:
            req = replace(req, reasoning=_set_reasoning(req.reasoning, reasoning))
            if reasoning is ir.ReasoningLevel.OFF:
                req = replace(req, extras=without_reasoning_switches(req.extras))
                if target is Dialect.ANTHROPIC:
                    req = replace(req, reasoning=None)  # no thinking field at all (SPEC §13)
        if drop_sealed_reasoning:
            req = _without_sealed_reasoning(req)
        if target is Dialect.ANTHROPIC and req.max_output_tokens is None:
            req = replace(req, max_output_tokens=default_max_tokens)
        encoded, dropped = get(target).encode_request(req, model=req.model)
    except MALFORMED as exc:
        raise ClientTranslationError(f"request body has an unexpected shape: {exc!r}") from None
    return TranslatedRequest(
        body=_json.dumps(encoded),
        stream=req.stream,
        model=req.model,
        dropped=merge_dropped(req.dropped, dropped),
        tool_names=tool_names_for(req.tools, target),
    )


def _without_sealed_reasoning(req: ir.Request) -> ir.Request:
    messages = []
    removed = 0
    for message in req.messages:
        parts = tuple(
            p
            for p in message.parts
            if not (isinstance(p, ir.Reasoning) and (p.seal is not None or p.redacted_data))
        )
        removed += len(message.parts) - len(parts)
        if parts:
            messages.append(replace(message, parts=parts))
    if not removed:
        return req
    return replace(
        req, messages=tuple(messages), dropped=(*req.dropped, "reasoning:sealed_for_account")
    )


def _set_reasoning(
    current: ir.ReasoningConfig | None, level: ir.ReasoningLevel
) -> ir.ReasoningConfig | None:
    """A rule's reasoning level applied to what the client asked (SPEC §13)."""
    if level is ir.ReasoningLevel.OFF:
        return None if current is None else ir.ReasoningConfig(enabled=False)
    if current is None or not current.enabled:
        return current  # a level never turns reasoning on
    effort = parse_effort(level)
    if effort is None:
        raise ValueError(f"unknown reasoning level {level!r}")
    budget = budget_for_effort(effort) if current.budget_tokens is not None else None
    return replace(current, effort=effort, budget_tokens=budget)


def _decode_answer(obj: dict[str, Any], upstream: Dialect) -> ir.Answer:
    try:
        return get(upstream).decode_response(obj)
    except MALFORMED as exc:
        raise UpstreamTranslationError(f"answer has an unexpected shape: {exc!r}") from None


def _restore_call(call: ir.ToolCall, names: ir.ToolNames) -> ir.ToolCall:
    target = names.lookup(call.name)
    if target is None:
        return call
    return replace(call, name=target.name, namespace=target.namespace, tool_kind=target.tool_kind)


def _restore_answer(answer: ir.Answer, names: ir.ToolNames | None) -> ir.Answer:
    if not names:
        return answer
    parts = tuple(
        _restore_call(p, names) if isinstance(p, ir.ToolCall) else p for p in answer.parts
    )
    return replace(answer, parts=parts)


def translate_response(
    body: bytes,
    upstream: Dialect,
    client: Dialect,
    *,
    client_model: str,
    tool_names: ir.ToolNames | None = None,
    created: int | None = None,
) -> TranslatedAnswer:
    """Convert an upstream's whole answer to the client's format, naming `client_model`.

    `created` (unix seconds) is used where the client format needs a timestamp the upstream
    did not give. Raises `UpstreamTranslationError` (502) for a body that is not a JSON object.
    """
    obj = _parse_object(body, UpstreamTranslationError)
    answer = _decode_answer(obj, upstream)
    if upstream is client:
        field = _MODEL_FIELD[client]
        out = body
        if obj.get(field) != client_model:
            out = _set_top_level(body, {field: client_model})
        return TranslatedAnswer(body=out, usage=answer.usage, stop_reason=answer.stop_reason)
    answer = _restore_answer(answer, tool_names)
    dropped: list[str] = list(answer.dropped)
    try:
        encoded = get(client).encode_response(
            answer, model=client_model, dropped=dropped, created=created
        )
    except MALFORMED as exc:
        raise UpstreamTranslationError(f"answer could not be converted: {exc!r}") from None
    return TranslatedAnswer(
        body=_json.dumps(encoded),
        usage=answer.usage,
        stop_reason=answer.stop_reason,
        dropped=merge_dropped(dropped),
    )


def answer_to_stream(
    body: bytes,
    upstream: Dialect,
    client: Dialect,
    *,
    client_model: str,
    client_sse: bool = True,
    tool_names: ir.ToolNames | None = None,
    created: int | None = None,
) -> bytes:
    """A whole upstream answer as a complete stream in the client's format (whole→stream)."""
    answer = _restore_answer(
        _decode_answer(_parse_object(body, UpstreamTranslationError), upstream), tool_names
    )
    encoder = new_stream_encoder(client, model=client_model, created=created, sse=client_sse)
    ir.answer_events(answer, encoder)
    return encoder.take()


# ----------------------------------------------------------------------------------------------
# Streams


class _Restorer:
    """Maps flattened tool names back on their way from decoder to encoder."""

    __slots__ = ("_inner", "_names")

    def __init__(self, inner: ir.StreamHandler, names: ir.ToolNames) -> None:
        self._inner = inner
        self._names = names

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        self._inner.message_start(id, model, created, usage)

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        self._inner.part_start(index, part, item_id)

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        target = self._names.lookup(name)
        if target is not None:
            name, namespace, tool_kind = target.name, target.namespace, target.tool_kind
        self._inner.tool_call_start(index, id, name, tool_kind, namespace, item_id)

    def text(self, index: int, text: str) -> None:
        self._inner.text(index, text)

    def reasoning(self, index: int, text: str) -> None:
        self._inner.reasoning(index, text)

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        self._inner.reasoning_seal(index, signature, encrypted_content, redacted_data)

    def tool_args(self, index: int, arguments: str) -> None:
        self._inner.tool_args(index, arguments)

    def part_stop(self, index: int) -> None:
        self._inner.part_stop(index)

    def usage(self, usage: ir.Usage) -> None:
        self._inner.usage(usage)

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        self._inner.finish(reason, stop_sequence)

    def end(self) -> None:
        self._inner.end()

    def error(self, error: ir.StreamErrorEvent) -> None:
        self._inner.error(error)


# Bytes that any event the watch path needs (usage, the finish, an error) contains, per
# format. A chunk with none of them is relayed without being parsed; a false positive (the word
# "error" in a text delta) only costs parsing that chunk.
_WATCH_MARKERS: dict[Dialect, tuple[bytes, ...]] = {
    Dialect.ANTHROPIC: (b"message_", b"error"),
    Dialect.OPENAI_CHAT: (
        b'"finish_reason":"',
        b'"finish_reason": "',
        b'"usage":{',
        b'"usage": {',
        b"error",
        b"[DONE]",
    ),
    Dialect.OPENAI_RESPONSES: (
        b"response.created",
        b"response.completed",
        b"response.incomplete",
        b"response.failed",
        b"error",
    ),
    Dialect.GEMINI: (b"finishReason", b"error"),
}
# A chunk holding exactly one event that starts (event name) or ends (Chat, which names no
# events) like a plain content delta cannot carry usage, a finish or an error: skipped without
# scanning for markers at all.
_WATCH_DELTA_PREFIXES: dict[Dialect, tuple[bytes, ...]] = {
    Dialect.ANTHROPIC: (b"event: content_block_delta\n", b"event: ping\n"),
    Dialect.OPENAI_CHAT: (),
    Dialect.OPENAI_RESPONSES: (
        b"event: response.output_text.delta\n",
        b"event: response.function_call_arguments.delta\n",
        b"event: response.reasoning_summary_text.delta\n",
        b"event: response.reasoning_text.delta\n",
        b"event: response.custom_tool_call_input.delta\n",
    ),
    Dialect.GEMINI: (),
}
_WATCH_DELTA_SUFFIXES: dict[Dialect, tuple[bytes, ...]] = {
    Dialect.ANTHROPIC: (),
    Dialect.OPENAI_CHAT: (
        b'"finish_reason":null}]}\n\n',
        b'"finish_reason":null}],"usage":null}\n\n',
    ),
    Dialect.OPENAI_RESPONSES: (),
    Dialect.GEMINI: (),
}
_MAX_PENDING = 1 << 20


class _Watcher:
    """The watch path's framing: finds complete events by their blank line and SSE-decodes only
    the runs of events that contain a marker. Bytes after the last blank line wait as a list of
    pieces (so a long event arriving in tiny chunks costs linear time). A stream with CR line
    ends (Gemini's CRLF) is handed to a full `SSEDecoder` for good."""

    __slots__ = (
        "_ends_lf",
        "_markers",
        "_pending",
        "_prefixes",
        "_size",
        "_sse",
        "_suffixes",
        "_watch",
        "broken",
    )

    def __init__(self, decoder: StreamDecoder, dialect: Dialect) -> None:
        self._watch = decoder.watch
        self._markers = _WATCH_MARKERS[dialect]
        self._prefixes = _WATCH_DELTA_PREFIXES[dialect]
        self._suffixes = _WATCH_DELTA_SUFFIXES[dialect]
        self._pending: list[bytes] = []  # what follows the last complete event
        self._size = 0
        self._ends_lf = False  # the pending bytes end with LF (a blank line may straddle)
        self._sse: SSEDecoder | None = None
        self.broken = False

    def feed(self, chunk: bytes) -> None:
        # The common case first: nothing pending, no CR, the chunk ends events. (bytes.rfind and
        # .find are several times cheaper than `in` with a bytes needle; 13 is CR.)
        cut = chunk.rfind(b"\n\n")
        if cut < 0 or self._pending or self._sse is not None or self.broken or 13 in chunk:
            self._feed_slow(chunk)
            return
        cut += 2
        if cut != len(chunk):
            rest = chunk[cut:]
            self._pending = [rest]
            self._size = len(rest)
            self._ends_lf = rest[-1:] == b"\n"
        elif chunk.find(b"\n\n") == cut - 2 and (
            chunk.startswith(self._prefixes) or chunk.endswith(self._suffixes)
        ):
            return
        find = chunk.find
        for marker in self._markers:
            if find(marker, 0, cut) >= 0:
                self._parse(chunk[:cut])
                return

    def _parse(self, complete: bytes) -> None:
        try:
            events = SSEDecoder().feed(complete)
        except SSEError:
            self.broken = True
            return
        for event in events:
            self._watch(event)

    def _feed_slow(self, chunk: bytes) -> None:
        if self.broken:
            return
        if self._sse is not None:
            try:
                events = self._sse.feed(chunk)
            except SSEError:
                self.broken = True
                return
            for event in events:
                self._watch(event)
            return
        if 13 in chunk:
            self._sse = SSEDecoder()
            data = b"".join(self._pending) + chunk
            self._pending = []
            self._feed_slow(data)
            return
        if chunk.find(b"\n\n") < 0 and not (self._ends_lf and chunk[:1] == b"\n"):
            self._pending.append(chunk)
            self._size += len(chunk)
            self._ends_lf = chunk[-1:] == b"\n"
            if self._size > _MAX_PENDING:
                self.broken = True
                self._pending = []
            return
        self._pending.append(chunk)
        data = b"".join(self._pending)
        cut = data.rfind(b"\n\n") + 2
        rest = data[cut:]
        self._pending = [rest] if rest else []
        self._size = len(rest)
        self._ends_lf = rest[-1:] == b"\n"
        find = data.find
        for marker in self._markers:
            if find(marker, 0, cut) >= 0:
                self._parse(data[:cut])
                return

    def end(self) -> None:
        if self.broken:
            return
        try:
            if self._sse is not None:
                events = self._sse.end()
            else:
                rest = b"".join(self._pending)
                decoder = SSEDecoder()
                events = decoder.feed(rest) + decoder.end() if rest.strip() else []
        except SSEError:
            self.broken = True
            return
        for event in events:
            self._watch(event)


class StreamTranslator:
    """Upstream stream bytes → client bytes (see the module notes).

    `upstream_sse` False: the upstream sends Gemini's JSON-array stream. `client_stream` False:
    the client wants a whole answer (`feed` returns nothing, `end` the whole JSON body).
    `client_sse` False: the client is a Gemini client without ``alt=sse``.
    `relay_unchanged` False: a same-format stream is decoded and encoded again instead of being
    relayed as it came, so the answer names `client_model` (an alias sent another model name
    upstream).
    """

    __slots__ = (
        "_array",
        "_broken",
        "_builder",
        "_client",
        "_client_model",
        "_client_sse",
        "_created",
        "_decoder",
        "_encoder",
        "_feed_into",
        "_framing_feed",
        "_handler",
        "_last_sequence",
        "_relayed",
        "_sequence_tail",
        "_sse",
        "_track_sequence",
        "_watch",
        "_watcher",
    )

    def __init__(
        self,
        upstream: Dialect,
        client: Dialect,
        *,
        client_model: str,
        upstream_sse: bool = True,
        client_stream: bool = True,
        client_sse: bool = True,
        tool_names: ir.ToolNames | None = None,
        created: int | None = None,
        relay_unchanged: bool = True,
    ) -> None:
        if not upstream_sse and upstream is not Dialect.GEMINI:
            raise ValueError("only Gemini streams without SSE framing")
        self._client = client
        self._client_sse = client_sse or client is not Dialect.GEMINI
        self._created = created
        self._sse: SSEDecoder | None = None
        self._array: JSONArrayDecoder | None = None
        self._framing_feed: Callable[[bytes], list[Any]]
        if upstream_sse:
            self._sse = SSEDecoder()
            self._framing_feed = self._sse.feed
        else:
            self._array = JSONArrayDecoder()
            self._framing_feed = self._array.feed
        self._decoder: StreamDecoder = new_stream_decoder(upstream)
        self._feed_into = self._decoder.feed_into
        self._watch = (
            relay_unchanged
            and client_stream
            and upstream is client
            and upstream_sse == self._client_sse
        )
        self._track_sequence = self._watch and client is Dialect.OPENAI_RESPONSES
        self._last_sequence = -1
        self._sequence_tail = b""
        self._watcher: _Watcher | None = None
        if self._watch and upstream_sse:
            self._watcher = _Watcher(self._decoder, upstream)
        self._encoder: StreamEncoder | None = None
        self._builder: ir.AnswerBuilder | None = None
        handler: ir.StreamHandler
        if self._watch:
            handler = NULL_HANDLER
        elif client_stream:
            self._encoder = new_stream_encoder(
                client, model=client_model, created=created, sse=self._client_sse
            )
            handler = self._encoder
        else:
            self._builder = ir.AnswerBuilder()
            handler = self._builder
        if tool_names and not self._watch:
            handler = _Restorer(handler, tool_names)
        self._handler = handler
        self._client_model = client_model
        self._relayed = False
        self._broken = False

    # -- feeding ---------------------------------------------------------------------------

    def _events(self, chunk: bytes, final: bool) -> list[Any]:
        try:
            if self._sse is not None:
                return self._sse.end() if final else self._sse.feed(chunk)
            assert self._array is not None
            return self._array.end() if final else self._array.feed(chunk)
        except SSEError:
            self._broken = True
            return []

    def feed(self, chunk: bytes) -> bytes:
        """Take the next upstream bytes; return the client bytes to send now."""
        if self._watch:
            if self._track_sequence and chunk:
                self._note_sequence(chunk)
            if self._watcher is not None:
                if chunk:
                    self._watcher.feed(chunk)
            elif chunk:
                self._relayed = True
                if not self._broken:
                    watch = self._decoder.watch
                    for event in self._events(chunk, False):
                        watch(event)
            return chunk
        if self._broken:
            return b""
        try:
            events = self._framing_feed(chunk)
        except SSEError:
            self._broken = True
            return b""
        feed_into = self._feed_into
        handler = self._handler
        for event in events:
            feed_into(event, handler)
        if self._encoder is not None:
            return self._encoder.take()
        return b""

    def end(self) -> bytes:
        """The upstream body ended: the client's closing bytes (see the module notes)."""
        if self._watch:
            if self._watcher is not None:
                self._watcher.end()
            elif not self._broken:
                for event in self._events(b"", True):
                    self._decoder.watch(event)
            return b""
        if not self._broken:
            for event in self._events(b"", True):
                self._feed_into(event, self._handler)
        decoder = self._decoder
        if self._encoder is not None:
            if decoder.finished and decoder.error is None and not self._encoder.ended:
                self._handler.end()
            return self._encoder.take()
        assert self._builder is not None
        if decoder.error is not None:
            return error_body(self._client, gateway_error(decoder.error))
        if not decoder.finished:
            return b""
        answer = self._builder.answer()
        return _json.dumps(
            get(self._client).encode_response(
                answer, model=self._client_model, dropped=[], created=self._created
            )
        )

    def fail(self, err: GatewayError) -> bytes:
        """The bytes that end the client's stream with `err` (the error body for a client that
        wanted a whole answer)."""
        if self._encoder is not None:
            return self._encoder.fail(err)
        if self._builder is not None:
            return error_body(self._client, err)
        # The watch path: the client has the upstream's own bytes so far.
        if self._client is Dialect.GEMINI and not self._client_sse:
            opener = b",\r\n" if self._relayed else b"["
            return opener + error_body(self._client, err) + b"]"
        # An event cut off mid-way would swallow the error event, so a blank line ends whatever
        # was pending first (after a complete event it is an empty line, which SSE ignores).
        if self._track_sequence:
            decoder = self._decoder
            return b"\n\n" + stream_error_event(
                self._client,
                err,
                response_id=getattr(decoder, "response_id", None) or "resp_gateway_error",
                model=getattr(decoder, "response_model", None) or self._client_model,
                created_at=getattr(decoder, "created_at", None) or self._created or 0,
                sequence_number=self._last_sequence + 1,
            )
        return b"\n\n" + stream_error_event(self._client, err)

    def _note_sequence(self, chunk: bytes) -> None:
        # The last sequence_number relayed, so an error ending continues the numbering. The
        # tail of the previous chunk is searched too: the field may straddle two chunks.
        window = self._sequence_tail + chunk
        self._sequence_tail = window[-40:]
        at = window.rfind(b'"sequence_number":')
        if at < 0:
            return
        digits = window[at + 18 : at + 40].lstrip(b" ")
        end = 0
        while end < len(digits) and 48 <= digits[end] <= 57:
            end += 1
        if end:
            self._last_sequence = int(digits[:end])

    # -- what the gateway records -------------------------------------------------------------

    @property
    def usage(self) -> ir.Usage | None:
        """The latest (cumulative) usage the upstream reported."""
        return self._decoder.usage

    @property
    def broken(self) -> bool:
        """Whether the upstream's stream framing broke (an oversized event, a bad JSON array)."""
        return self._broken or (self._watcher is not None and self._watcher.broken)

    @property
    def finished(self) -> bool:
        """Whether the upstream's proper terminal event (or finish reason) was seen."""
        return self._decoder.finished and self._decoder.error is None and not self.broken

    @property
    def error(self) -> ir.StreamErrorEvent | None:
        """An error the upstream reported inside its stream (already sent on to the client)."""
        return self._decoder.error

    @property
    def dropped(self) -> tuple[str, ...]:
        """What the conversion could not carry (upstream parts, client-format limits)."""
        encoder_dropped = self._encoder.dropped if self._encoder is not None else []
        return merge_dropped(self._decoder.dropped, encoder_dropped)
