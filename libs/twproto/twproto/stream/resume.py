"""Resuming a streamed answer on another upstream after it broke off mid-way.

Theory of operation
-------------------

A stream that breaks after content (cut, an in-stream error, an idle upstream) normally ends the
client's answer with an error event. With resuming on (docs/failover.md, "Resuming a broken
stream") the next upstream is asked to *continue* the answer instead, and its continuation is
spliced into the same client response. Three pure pieces do it:

* `continued_request` — the request again, plus the text the client already has: as a
  trailing assistant message (a *prefill*) for the formats that continue one (Anthropic, Chat,
  Gemini), otherwise as an earlier assistant turn followed by `CONTINUE_INSTRUCTION`.
  `refuses_prefill` recognises an upstream's 400 saying it takes no prefill.
* `OverlapTrimmer` — drops what the new upstream repeats of the text the client already has:
  the longest overlap between the end of that text and the start of the new text, if it is at
  least `MIN_REPEAT` characters or only whitespace.
* `ResumableStream` — the client's stream translator that outlives one upstream. It keeps the
  client format's encoder; each upstream stream (a *leg*) gets its own framing and decoder,
  feeding `_Splice`, which records the answer so far, swallows the later legs' message start,
  maps their parts onto the client's part numbering (the first text part continues the client's
  open text part), drops their reasoning (and any part that is neither text nor a tool call),
  trims their repeated text, and holds back an upstream's in-stream error so that a resumed
  stream never shows it.

A resume is refused (`resume_point` is None) once any part of a tool call reached the client: a
half-written call cannot be continued, and a whole one cannot be prefilled as text. A tool call
whose first event was cut off mid-event never reached the decoder, so it simply restarts on the
next leg.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from twproto import ir
from twproto.dialect import Dialect
from twproto.errors import GatewayError
from twproto.failures import Failure
from twproto.formats import StreamDecoder, StreamEncoder, new_stream_decoder, new_stream_encoder
from twproto.formats._common import gateway_error, merge_dropped
from twproto.sse import JSONArrayDecoder, SSEDecoder, SSEError, SSEEventTooLarge
from twproto.stream.hold import Released
from twproto.stream.translators import (
    DEFAULT_MAX_EVENT_BYTES,
    _Restorer,
    _UpstreamOutcome,
    new_framing,
)

__all__ = (
    "CONTINUE_INSTRUCTION",
    "MIN_REPEAT",
    "PREFILL_FORMATS",
    "OverlapTrimmer",
    "ResumableStream",
    "continued_request",
    "refuses_prefill",
    "uses_prefill",
)

#: Formats whose upstreams continue a trailing assistant message.
PREFILL_FORMATS = frozenset({Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.GEMINI})

#: The user turn that asks for a continuation where no prefill is sent.
CONTINUE_INSTRUCTION = (
    "Your previous reply was cut off. Continue it exactly where it stopped: do not repeat any of "
    "it, do not start over, add no preamble."
)

#: The shortest repeat the trimmer drops (shorter ones only when they are whitespace).
MIN_REPEAT = 6
#: How much of the client's text the trimmer compares with.
TRIM_WINDOW = 2048

_PREFILL_REFUSAL = re.compile(r"prefill|final[ `']*assistant[ `']*(?:message|content)", re.I)


def uses_prefill(target: Dialect, *, prefill: bool = True) -> bool:
    """Whether a continuation for `target` is sent as a prefill (else with the instruction)."""
    return prefill and target in PREFILL_FORMATS


def continued_request(
    req: ir.Request, text: str, target: Dialect, *, prefill: bool = True
) -> ir.Request:
    """`req` asking `target` to continue an answer that has `text` so far.

    With no text (only reasoning reached the client) the request is unchanged: a fresh answer.
    Anthropic refuses a prefill ending in whitespace, so it gets the text without it (the
    trimmer drops the whitespace the continuation repeats).
    """
    if not text:
        return req
    if uses_prefill(target, prefill=prefill):
        body = text.rstrip() if target is Dialect.ANTHROPIC else text
        if not body:
            return req
        return replace(req, messages=(*req.messages, _assistant(body)))
    instruction = ir.Message(role=ir.Role.USER, parts=(ir.Text(text=CONTINUE_INSTRUCTION),))
    return replace(req, messages=(*req.messages, _assistant(text), instruction))


def _assistant(text: str) -> ir.Message:
    return ir.Message(role=ir.Role.ASSISTANT, parts=(ir.Text(text=text),))


def refuses_prefill(failure: Failure) -> bool:
    """Whether `failure` is an upstream's 400 refusing a trailing assistant message."""
    return failure.status in (400, 422) and bool(_PREFILL_REFUSAL.search(failure.message or ""))


class OverlapTrimmer:
    """Drops the start of a continuation that repeats the end of `before`.

    `feed` takes the continuation's text piece by piece and returns what to pass on; it holds
    text back only while the repeat could still grow (what it has is found earlier in
    `before`). `flush` decides with what it has (the part ended).
    """

    __slots__ = ("_buffer", "_decided", "_tail")

    def __init__(self, before: str, *, window: int = TRIM_WINDOW) -> None:
        self._tail = before[-window:] if window > 0 else ""
        self._buffer = ""
        self._decided = not self._tail

    @property
    def decided(self) -> bool:
        return self._decided

    def feed(self, text: str) -> str:
        if self._decided:
            return text
        self._buffer += text
        tail, buffer = self._tail, self._buffer
        # A longer repeat is still possible while the text so far occurs in `tail` with more
        # of `tail` after it.
        if not buffer or (len(buffer) < len(tail) and tail.find(buffer, 0, len(tail) - 1) >= 0):
            return ""
        return self._decide()

    def flush(self) -> str:
        return "" if self._decided else self._decide()

    def _decide(self) -> str:
        self._decided = True
        tail, buffer = self._tail, self._buffer
        self._buffer = ""
        for k in range(min(len(tail), len(buffer)), 0, -1):
            head = buffer[:k]
            if (k >= MIN_REPEAT or head.isspace()) and tail.endswith(head):
                return buffer[k:]
        return buffer


class _Splice:
    """The stream handler between each leg's decoder and the client's encoder."""

    def __init__(self, encoder: StreamEncoder) -> None:
        self.encoder = encoder
        self.leg = 0
        self.sent: list[str] = []  # the answer's text as the client got it
        self.tool_seen = False
        self.open: dict[int, ir.PartKind | None] = {}  # client part → kind (None: a tool call)
        self.next_index = 0
        self.map: dict[int, int | None] = {}  # this leg's part → client part (None: dropped)
        self.resume_text: int | None = None  # the client's text part the next leg continues
        self.trimmer: OverlapTrimmer | None = None
        self.trimmed: int | None = None  # this leg's part the trimmer works on
        self.held: ir.StreamErrorEvent | None = None

    def begin_leg(self) -> None:
        """A new upstream continues the answer: close what the last one left open."""
        self.leg += 1
        self.map = {}
        self.held = None
        self.trimmed = None
        last_text = None
        for index, kind in self.open.items():
            if kind is ir.PartKind.TEXT:
                last_text = index
        for index in [i for i in self.open if i != last_text]:
            self.encoder.part_stop(index)
            del self.open[index]
        self.resume_text = last_text
        self.trimmer = OverlapTrimmer("".join(self.sent))

    def _new_part(self, index: int, kind: ir.PartKind | None) -> int:
        if self.leg == 0:
            client = index
        else:
            client = self.next_index
            self.map[index] = client
        self.next_index = max(self.next_index, client + 1)
        self.open[client] = kind
        return client

    def _flush_trimmer(self) -> None:
        if self.trimmer is not None and self.trimmed is not None:
            rest = self.trimmer.flush()
            client = self.map.get(self.trimmed)
            if rest and client is not None:
                self._text(client, rest)
        self.trimmer = None

    def _text(self, client: int, text: str) -> None:
        self.sent.append(text)
        self.encoder.text(client, text)

    # -- ir.StreamHandler ----------------------------------------------------------------------

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        if self.leg == 0:
            self.encoder.message_start(id, model, created, usage)

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        if self.leg == 0:
            self._new_part(index, part)
            self.encoder.part_start(index, part, item_id)
            return
        if part is not ir.PartKind.TEXT:
            self.map[index] = None  # a later leg's reasoning: the client has its own already
            return
        if self.trimmed is None and self.trimmer is not None:
            self.trimmed = index
        if self.resume_text is not None:
            self.map[index], self.resume_text = self.resume_text, None
            return
        client = self._new_part(index, part)
        self.encoder.part_start(client, part, item_id)

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        self._flush_trimmer()
        self.tool_seen = True
        client = self._new_part(index, None)
        self.encoder.tool_call_start(client, id, name, tool_kind, namespace, item_id)

    def text(self, index: int, text: str) -> None:
        if self.leg == 0:
            self.sent.append(text)
            self.encoder.text(index, text)
            return
        client = self.map.get(index)
        if client is None:
            return
        if index == self.trimmed and self.trimmer is not None:
            text = self.trimmer.feed(text)
            if self.trimmer.decided:
                self.trimmer = None
            if not text:
                return
        self._text(client, text)

    def reasoning(self, index: int, text: str) -> None:
        client = index if self.leg == 0 else self.map.get(index)
        if client is not None:
            self.encoder.reasoning(client, text)

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        client = index if self.leg == 0 else self.map.get(index)
        if client is not None:
            self.encoder.reasoning_seal(client, signature, encrypted_content, redacted_data)

    def tool_args(self, index: int, arguments: str) -> None:
        client = index if self.leg == 0 else self.map.get(index)
        if client is not None:
            self.encoder.tool_args(client, arguments)

    def part_stop(self, index: int) -> None:
        if index == self.trimmed:
            self._flush_trimmer()
        client = index if self.leg == 0 else self.map.get(index)
        if client is not None and client in self.open:
            del self.open[client]
            self.encoder.part_stop(client)

    def usage(self, usage: ir.Usage) -> None:
        self.encoder.usage(usage)

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        self._flush_trimmer()
        self.encoder.finish(reason, stop_sequence)

    def end(self) -> None:
        self._flush_trimmer()
        self.encoder.end()

    def error(self, error: ir.StreamErrorEvent) -> None:
        self.held = error  # written by `fail` only if the answer is not resumed


Framing = SSEDecoder | JSONArrayDecoder


class ResumableStream(_UpstreamOutcome):
    """The client's stream across upstreams: a `StreamTranslator` that can take a next leg.

    Built like `twproto.stream.translators.ConvertedStream` (also for a same-format stream, which
    is decoded and encoded again so that a later leg can be spliced in). `next_leg` starts the
    next upstream's stream; `take_over` or `feed` then read it.
    """

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
        self._client = client
        self._max_event = max_event_bytes
        self._encoder: StreamEncoder = new_stream_encoder(
            client,
            model=client_model,
            created=created,
            sse=client_sse or client is not Dialect.GEMINI,
        )
        self._splice = _Splice(self._encoder)
        self._dropped: tuple[str, ...] = ()
        self._start_leg(upstream, upstream_sse, tool_names)

    def _start_leg(
        self, upstream: Dialect, upstream_sse: bool, tool_names: ir.ToolNames | None
    ) -> None:
        self._framing: Framing = new_framing(upstream_sse, self._max_event)
        self._decoder: StreamDecoder = new_stream_decoder(upstream)
        self._handler: ir.StreamHandler = self._splice
        if tool_names:
            self._handler = _Restorer(self._splice, tool_names)
        self._broken = False
        self._too_large = False

    # -- resuming ------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The answer's text as the client has it so far."""
        return "".join(self._splice.sent)

    @property
    def resume_point(self) -> int | None:
        """Characters of text the client has, or None when the answer cannot be resumed (a
        tool call reached the client)."""
        if self._splice.tool_seen:
            return None
        return sum(len(t) for t in self._splice.sent)

    @property
    def legs(self) -> int:
        """Upstream streams spliced into this answer so far (1: not resumed)."""
        return self._splice.leg + 1

    def next_leg(
        self, upstream: Dialect, *, upstream_sse: bool = True, tool_names: ir.ToolNames | None
    ) -> None:
        """The next upstream's stream continues the answer from here."""
        self._dropped = merge_dropped(self._dropped, self._decoder.dropped)
        self._start_leg(upstream, upstream_sse, tool_names)
        self._splice.begin_leg()

    # -- StreamTranslator ----------------------------------------------------------------------

    def _decode(self, events: list[Any]) -> None:
        feed_into, handler = self._decoder.feed_into, self._handler
        for event in events:
            feed_into(event, handler)

    def feed(self, chunk: bytes) -> bytes:
        if not self._broken:
            try:
                events = self._framing.feed(chunk)
            except SSEError as exc:
                self._broken = True
                self._too_large = isinstance(exc, SSEEventTooLarge)
                events = []
            self._decode(events)
        return self._encoder.take()

    def take_over(self, released: Released) -> bytes:
        if released.framing is None:
            return self.feed(released.data)
        self._framing = released.framing
        self._decode(list(released.events))
        return self._encoder.take()

    def end(self) -> bytes:
        if not self._broken:
            try:
                events = self._framing.end()
            except SSEError as exc:
                self._broken = True
                self._too_large = isinstance(exc, SSEEventTooLarge)
                events = []
            self._decode(events)
        if self.finished and not self._encoder.ended:
            self._handler.end()
        return self._encoder.take()

    def fail(self, err: GatewayError) -> bytes:
        """The client's error ending: the upstream's own in-stream error when it sent one."""
        held = self._splice.held
        if held is not None:
            return self._encoder.take() + self._encoder.fail(gateway_error(held))
        return self._encoder.take() + self._encoder.fail(err)

    @property
    def dropped(self) -> tuple[str, ...]:
        return merge_dropped(self._dropped, self._decoder.dropped, self._encoder.dropped)
