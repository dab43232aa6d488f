"""Streamed answers, upstream bytes in and client bytes out: the three stream translators.

Theory of operation
-------------------

Upstream bytes → SSE events (or Gemini JSON-array elements) → the upstream format's
`StreamDecoder` → the client's side → client bytes. What the client's side is makes three
translators, one class each, all with the `StreamTranslator` interface; `new_stream_translator`
picks one:

* `RelayedStream` — the client speaks the upstream's format and framing and asked for a stream:
  each chunk is returned **unchanged** (the same object) and the decoder only *watches* it,
  parsing just the events that carry usage, the stop reason or an error. A small framer
  (`_Watcher`) finds event boundaries by their blank line and lets chunks that hold one plain
  delta event, or no marker of an interesting one, through without SSE-decoding them; what it
  looks for is the upstream format's ``WATCH`` table (`twproto.formats.WatchNeedles`). The one
  exception (`hide_usage_chunk`): a Chat stream whose upstream the gateway asked for usage the
  client did not ask for loses its usage-only chunk (``"choices":[]``); to cut it out whole, an
  event that a chunk leaves incomplete waits for the chunk that completes it.
* `ConvertedStream` — another format (or the same one renamed for an alias): the decoder calls
  the client format's `StreamEncoder` directly; no event objects are built per chunk.
* `CollectedStream` — the client wanted a whole answer: the decoder fills an
  `ir.AnswerBuilder`, and `end` returns the whole JSON body.

A stream's ending: `end` is called when the upstream body ends. If the upstream's terminal event
(or, for Gemini and Chat without ``[DONE]``, its finish reason) was seen, `end` returns the
client's closing bytes; otherwise `finished` is False and the caller ends the client's stream
with `fail`, which writes the error ending the client's SDK understands. Read `finished` after
`end`: an upstream that closes without the last blank line completes its last event only then.
An error the upstream reports inside its stream is converted as it arrives and ends the client's
stream; it is also kept in `error`.

A translator can start from scratch (`feed` from the first byte) or take over from the opening
hold (`take_over`): the hold has already decoded the opening events and hands over those events
and its decoder, so the held bytes are not decoded a second time (`twproto.stream.upstream`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twproto import _json, ir
from twproto.dialect import Dialect
from twproto.errors import GatewayError, error_body, stream_error_event
from twproto.formats import (
    StreamDecoder,
    StreamEncoder,
    get,
    new_stream_decoder,
    new_stream_encoder,
)
from twproto.formats._common import gateway_error, merge_dropped
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEError, SSEEventTooLarge
from twproto.stream._events import last_event_end, without_usage_only
from twproto.stream.hold import Released

__all__ = (
    "DEFAULT_MAX_EVENT_BYTES",
    "CollectedStream",
    "ConvertedStream",
    "RelayedStream",
    "StreamTranslator",
    "keepalive_comments",
    "new_framing",
    "new_stream_translator",
)

Framing = SSEDecoder | JSONArrayDecoder

# The default bound on one upstream event (an SSE event, a Gemini array element), which is the
# memory one stream may hold at once. A Responses stream's closing events repeat the whole answer
# (``response.output_text.done``, ``response.completed``), so the bound is the largest answer
# that comes through whole; an event over it ends the stream (`StreamTranslator.too_large`).
DEFAULT_MAX_EVENT_BYTES = 64 << 20


def new_framing(sse: bool, max_event_bytes: int) -> Framing:
    """The decoder of an upstream stream's framing, events bounded by `max_event_bytes`."""
    if sse:
        return SSEDecoder(max_event_size=max_event_bytes)
    return JSONArrayDecoder(max_element_size=max_event_bytes)


class StreamTranslator(Protocol):
    """Upstream stream bytes → client bytes; what the three translators have in common."""

    def feed(self, chunk: bytes) -> bytes:
        """Take the next upstream bytes; return the client bytes to send now."""
        ...

    def take_over(self, released: Released) -> bytes:
        """Start from what the opening hold released; return the client bytes for it."""
        ...

    def end(self) -> bytes:
        """The upstream body ended: the client's closing bytes."""
        ...

    def fail(self, err: GatewayError) -> bytes:
        """The bytes that end the client's stream with `err`."""
        ...

    @property
    def usage(self) -> ir.Usage | None: ...

    @property
    def broken(self) -> bool: ...

    @property
    def too_large(self) -> bool: ...

    @property
    def stop_reason(self) -> ir.StopReason | None: ...

    @property
    def finished(self) -> bool: ...

    @property
    def error(self) -> ir.StreamErrorEvent | None: ...

    @property
    def dropped(self) -> tuple[str, ...]: ...


def keepalive_comments(client: Dialect) -> bool:
    """Whether a `client` stream may carry SSE comments (``: keep-alive``) before its first
    event. Gemini clients get none: their stream may be a JSON array, which has no place for
    one, and google-genai reads the SSE form with the same expectations."""
    return client is not Dialect.GEMINI


def new_stream_translator(
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
    hide_usage_chunk: bool = False,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> StreamTranslator:
    """The translator from an `upstream` stream to what a `client` asked for.

    `upstream_sse` False: the upstream sends Gemini's JSON-array stream. `client_stream` False:
    the client wants a whole answer (`feed` returns nothing, `end` the whole JSON body).
    `client_sse` False: the client is a Gemini client without ``alt=sse``. `relay_unchanged`
    False: a same-format stream is decoded and encoded again instead of being relayed as it
    came, so the answer names `client_model` (an alias sent another model name upstream).
    `hide_usage_chunk`: a relayed Chat stream leaves out its usage-only chunk
    (`twproto.translate.TranslatedRequest.hide_usage_chunk`). `max_event_bytes` bounds one
    upstream event (`DEFAULT_MAX_EVENT_BYTES`); past it the stream is `broken` and `too_large`.
    """
    if not upstream_sse and upstream is not Dialect.GEMINI:
        raise ValueError("only Gemini streams without SSE framing")
    client_sse = client_sse or client is not Dialect.GEMINI
    if relay_unchanged and client_stream and upstream is client and upstream_sse == client_sse:
        return RelayedStream(
            upstream,
            client_model=client_model,
            sse=upstream_sse,
            created=created,
            hide_usage_chunk=hide_usage_chunk and upstream is Dialect.OPENAI_CHAT,
            max_event_bytes=max_event_bytes,
        )
    if client_stream:
        return ConvertedStream(
            upstream,
            client,
            client_model=client_model,
            upstream_sse=upstream_sse,
            client_sse=client_sse,
            tool_names=tool_names,
            created=created,
            max_event_bytes=max_event_bytes,
        )
    return CollectedStream(
        upstream,
        client,
        client_model=client_model,
        upstream_sse=upstream_sse,
        tool_names=tool_names,
        created=created,
        max_event_bytes=max_event_bytes,
    )


class _UpstreamOutcome:
    """What a translator reports of the upstream's stream: its usage, a broken framing, its
    proper end, an in-stream error. Read from `_decoder` and `_broken`, which the class that
    takes this in keeps (`_Translator`, and `twproto.stream.resume.ResumableStream` across legs)."""

    __slots__ = ()
    _decoder: StreamDecoder
    _broken: bool
    _too_large: bool

    @property
    def usage(self) -> ir.Usage | None:
        """The latest (cumulative) usage the upstream reported."""
        return self._decoder.usage

    @property
    def broken(self) -> bool:
        """Whether the upstream's stream framing broke (an oversized event, a bad JSON array)."""
        return self._broken

    @property
    def too_large(self) -> bool:
        """Whether the framing broke on an event over the bound (`max_event_bytes`)."""
        return self._too_large

    @property
    def stop_reason(self) -> ir.StopReason | None:
        """Why the upstream's answer ended, once it said (its finish reason)."""
        return self._decoder.stop_reason

    @property
    def finished(self) -> bool:
        """Whether the upstream's proper terminal event (or finish reason) was seen."""
        return self._decoder.finished and self._decoder.error is None and not self.broken

    @property
    def error(self) -> ir.StreamErrorEvent | None:
        """An error the upstream reported inside its stream (already sent on to the client)."""
        return self._decoder.error


class _Translator(_UpstreamOutcome):
    """The upstream side every translator shares: framing, the format's decoder, the record."""

    __slots__ = (
        "_broken",
        "_client",
        "_client_model",
        "_created",
        "_decoder",
        "_framing",
        "_max_event",
        "_too_large",
    )

    def __init__(
        self,
        upstream: Dialect,
        client: Dialect,
        *,
        client_model: str,
        upstream_sse: bool,
        created: int | None,
        max_event_bytes: int,
    ) -> None:
        self._client = client
        self._client_model = client_model
        self._created = created
        self._max_event = max_event_bytes
        self._framing: Framing = new_framing(upstream_sse, max_event_bytes)
        self._decoder: StreamDecoder = new_stream_decoder(upstream)
        self._broken = False
        self._too_large = False

    def _events(self, chunk: bytes, final: bool) -> list[Any]:
        try:
            return self._framing.end() if final else self._framing.feed(chunk)
        except SSEError as exc:
            self._broken = True
            self._too_large = isinstance(exc, SSEEventTooLarge)
            return []

    @property
    def dropped(self) -> tuple[str, ...]:
        """What the conversion could not carry (upstream parts, client-format limits)."""
        return merge_dropped(self._decoder.dropped, [])


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


class _Watcher:
    """The watch path's framing: finds complete events by their blank line and SSE-decodes only
    the runs of events that contain a marker. Bytes after the last blank line wait as a list of
    pieces (so a long event arriving in tiny chunks costs linear time). A stream with CR line
    ends (Gemini's CRLF) is handed to a full `SSEDecoder` for good."""

    __slots__ = (
        "_ends_lf",
        "_markers",
        "_max",
        "_pending",
        "_prefixes",
        "_size",
        "_sse",
        "_suffixes",
        "_watch",
        "broken",
        "too_large",
    )

    def __init__(self, decoder: StreamDecoder, dialect: Dialect, max_event_bytes: int) -> None:
        needles = get(dialect).WATCH
        self._watch = decoder.watch
        self._markers = needles.chunk_markers
        self._prefixes = needles.delta_starts
        self._suffixes = needles.delta_ends
        self._pending: list[bytes] = []  # what follows the last complete event
        self._size = 0
        self._ends_lf = False  # the pending bytes end with LF (a blank line may straddle)
        self._sse: SSEDecoder | None = None
        self._max = max_event_bytes  # the bound on one event, and so on the pending bytes
        self.broken = False
        self.too_large = False

    def _failed(self, exc: SSEError) -> None:
        self.broken = True
        self.too_large = isinstance(exc, SSEEventTooLarge)

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
            events = SSEDecoder(max_event_size=self._max).feed(complete)
        except SSEError as exc:
            self._failed(exc)
            return
        for event in events:
            self._watch(event)

    def _feed_slow(self, chunk: bytes) -> None:
        if self.broken:
            return
        if self._sse is not None:
            try:
                events = self._sse.feed(chunk)
            except SSEError as exc:
                self._failed(exc)
                return
            for event in events:
                self._watch(event)
            return
        if 13 in chunk:
            self._sse = SSEDecoder(max_event_size=self._max)
            data = b"".join(self._pending) + chunk
            self._pending = []
            self._feed_slow(data)
            return
        if chunk.find(b"\n\n") < 0 and not (self._ends_lf and chunk[:1] == b"\n"):
            self._pending.append(chunk)
            self._size += len(chunk)
            self._ends_lf = chunk[-1:] == b"\n"
            if self._size > self._max:
                self.broken = self.too_large = True
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

    def take_over(self, held: bytes, framing: SSEDecoder, *, ended: bool) -> None:
        """Continue after `held`, whose complete events `framing` has already decoded."""
        if ended or 13 in held:
            # CR line ends, or nothing more to come: the decoder itself reads on.
            self._sse = framing
            return
        rest = held[held.rfind(b"\n\n") + 2 :]
        if rest:
            self._pending = [rest]
            self._size = len(rest)
            self._ends_lf = rest[-1:] == b"\n"

    def end(self) -> None:
        if self.broken:
            return
        try:
            if self._sse is not None:
                events = self._sse.end()
            else:
                rest = b"".join(self._pending)
                decoder = SSEDecoder(max_event_size=self._max)
                events = decoder.feed(rest) + decoder.end() if rest.strip() else []
        except SSEError as exc:
            self._failed(exc)
            return
        for event in events:
            self._watch(event)


class RelayedStream(_Translator):
    """Same format and framing: the upstream's bytes go to the client unchanged, watched.
    `hide_usage_chunk` (Chat): all but the usage-only chunk (module docstring)."""

    __slots__ = (
        "_hide",
        "_last_sequence",
        "_relayed",
        "_sequence_tail",
        "_tail",
        "_track_sequence",
        "_usage_seen",
        "_watcher",
    )

    def __init__(
        self,
        dialect: Dialect,
        *,
        client_model: str,
        sse: bool = True,
        created: int | None = None,
        hide_usage_chunk: bool = False,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(
            dialect,
            dialect,
            client_model=client_model,
            upstream_sse=sse,
            created=created,
            max_event_bytes=max_event_bytes,
        )
        self._hide = hide_usage_chunk and sse
        self._tail = b""  # hiding: the incomplete event a chunk ended with, not yet relayed
        self._usage_seen: ir.Usage | None = None  # hiding: the usage already looked for
        # An error ending continues a Responses stream's sequence numbers.
        self._track_sequence = dialect is Dialect.OPENAI_RESPONSES
        self._last_sequence = -1
        self._sequence_tail = b""
        self._watcher = _Watcher(self._decoder, dialect, max_event_bytes) if sse else None
        self._relayed = False

    def feed(self, chunk: bytes) -> bytes:
        """Take the next upstream bytes; return them, the client bytes to send now."""
        if self._track_sequence and chunk:
            self._note_sequence(chunk)
        if self._watcher is not None:
            if chunk:
                self._watcher.feed(chunk)
                # Hiding: a chunk that ends its events and brought no usage goes out as it came.
                if self._hide and (
                    self._tail
                    or self._decoder.usage is not self._usage_seen
                    or not chunk.endswith(b"\n\n")
                ):
                    return self._hiding(chunk)
        elif chunk:
            self._relayed = True
            if not self._broken:
                watch = self._decoder.watch
                for event in self._events(chunk, False):
                    watch(event)
        return chunk

    def take_over(self, released: Released) -> bytes:
        """Start from what the opening hold released: its bytes go out as they came."""
        held, framing = released.data, released.framing
        if framing is None:
            return self.feed(held)
        if self._track_sequence and held:
            self._note_sequence(held)
        watch = self._decoder.watch
        for event in released.events:
            watch(event)
        ended = released.reason == "end"
        if self._watcher is not None:
            assert isinstance(framing, SSEDecoder)
            self._watcher.take_over(held, framing, ended=ended)
            if self._hide and held:
                return self._hiding(held)
        else:
            self._framing = framing
            self._relayed = self._relayed or bool(held)
        return held

    def end(self) -> bytes:
        """The upstream body ended; the client already has every byte (hiding: but the last
        event, when it came without its blank line and the stream ended properly)."""
        if self._watcher is not None:
            self._watcher.end()
        elif not self._broken:
            for event in self._events(b"", True):
                self._decoder.watch(event)
        tail = self._tail
        if not tail or not self.finished:
            return b""  # a tail of a stream that did not end properly goes out with `fail`
        self._tail = b""
        if self._decoder.usage is not self._usage_seen:
            self._usage_seen = self._decoder.usage
            return without_usage_only(tail)
        return tail

    def _hiding(self, chunk: bytes) -> bytes:
        """`chunk` as the client gets it while the usage-only chunk is hidden: after the
        incomplete event held from before, up to its own last complete event, without a
        usage-only event (looked for only when the watcher has just read usage)."""
        if self._tail:
            chunk = self._tail + chunk
            self._tail = b""
        if not chunk.endswith(b"\n\n"):
            cut = last_event_end(chunk)
            self._tail = chunk[cut:]
            chunk = chunk[:cut]
        usage = self._decoder.usage
        if usage is not self._usage_seen:
            self._usage_seen = usage
            return without_usage_only(chunk)
        return chunk

    def fail(self, err: GatewayError) -> bytes:
        """The bytes that end the client's stream with `err`, after the upstream's own so far."""
        if self._client is Dialect.GEMINI and self._watcher is None:
            opener = b",\r\n" if self._relayed else b"["
            return opener + error_body(self._client, err) + b"]"
        # Hiding: the incomplete event held back goes out first, as it would have unhidden.
        tail, self._tail = self._tail, b""
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
        return tail + b"\n\n" + stream_error_event(self._client, err)

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

    @property
    def broken(self) -> bool:
        """Whether the upstream's stream framing broke (an oversized event, a bad JSON array)."""
        return self._broken or (self._watcher is not None and self._watcher.broken)

    @property
    def too_large(self) -> bool:
        """Whether the framing broke on an event over the bound (`max_event_bytes`)."""
        return self._too_large or (self._watcher is not None and self._watcher.too_large)


class _Decoding(_Translator):
    """A translator that decodes every event into a handler (an encoder or a builder)."""

    __slots__ = ("_feed_into", "_framing_feed", "_handler")

    def _connect(self, handler: ir.StreamHandler, tool_names: ir.ToolNames | None) -> None:
        self._handler = _Restorer(handler, tool_names) if tool_names else handler
        self._feed_into = self._decoder.feed_into
        self._framing_feed: Callable[[bytes], list[Any]] = self._framing.feed

    def _decode(self, chunk: bytes) -> None:
        if self._broken:
            return
        try:
            events = self._framing_feed(chunk)
        except SSEError as exc:
            self._broken = True
            self._too_large = isinstance(exc, SSEEventTooLarge)
            return
        feed_into = self._feed_into
        handler = self._handler
        for event in events:
            feed_into(event, handler)

    def _take_over(self, released: Released) -> None:
        framing = released.framing
        if framing is None:
            self._decode(released.data)
            return
        self._framing = framing
        self._framing_feed = framing.feed
        feed_into = self._feed_into
        handler = self._handler
        for event in released.events:
            feed_into(event, handler)

    def _flush(self) -> None:
        if not self._broken:
            for event in self._events(b"", True):
                self._feed_into(event, self._handler)


class ConvertedStream(_Decoding):
    """Decoded and encoded again as the client's stream (another format, or another model
    name)."""

    __slots__ = ("_encoder",)

    def __init__(
        self,
        upstream: Dialect,
        client: Dialect,
        *,
        client_model: str,
        upstream_sse: bool = True,
        client_sse: bool = True,
        tool_names: ir.ToolNames | None = None,
        created: int | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(
            upstream,
            client,
            client_model=client_model,
            upstream_sse=upstream_sse,
            created=created,
            max_event_bytes=max_event_bytes,
        )
        self._encoder: StreamEncoder = new_stream_encoder(
            client, model=client_model, created=created, sse=client_sse
        )
        self._connect(self._encoder, tool_names)

    def feed(self, chunk: bytes) -> bytes:
        """Take the next upstream bytes; return the client bytes to send now."""
        self._decode(chunk)
        return self._encoder.take()

    def take_over(self, released: Released) -> bytes:
        """Start from what the opening hold released; return the client bytes for it."""
        self._take_over(released)
        return self._encoder.take()

    def end(self) -> bytes:
        """The upstream body ended: the client's closing bytes."""
        self._flush()
        decoder = self._decoder
        if decoder.finished and decoder.error is None and not self._encoder.ended:
            self._handler.end()
        return self._encoder.take()

    def fail(self, err: GatewayError) -> bytes:
        """The bytes that end the client's stream with `err`."""
        return self._encoder.fail(err)

    @property
    def dropped(self) -> tuple[str, ...]:
        """What the conversion could not carry (upstream parts, client-format limits)."""
        return merge_dropped(self._decoder.dropped, self._encoder.dropped)


class CollectedStream(_Decoding):
    """Decoded into a whole answer for a client that did not ask for a stream."""

    __slots__ = ("_builder",)

    def __init__(
        self,
        upstream: Dialect,
        client: Dialect,
        *,
        client_model: str,
        upstream_sse: bool = True,
        tool_names: ir.ToolNames | None = None,
        created: int | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(
            upstream,
            client,
            client_model=client_model,
            upstream_sse=upstream_sse,
            created=created,
            max_event_bytes=max_event_bytes,
        )
        self._builder = ir.AnswerBuilder()
        self._connect(self._builder, tool_names)

    def feed(self, chunk: bytes) -> bytes:
        """Take the next upstream bytes; nothing goes to the client before the end."""
        self._decode(chunk)
        return b""

    def take_over(self, released: Released) -> bytes:
        """Start from what the opening hold released; nothing goes to the client yet."""
        self._take_over(released)
        return b""

    def end(self) -> bytes:
        """The upstream body ended: the whole answer, or the upstream's error, as JSON."""
        self._flush()
        decoder = self._decoder
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
        """The error body that answers the client instead."""
        return error_body(self._client, err)
