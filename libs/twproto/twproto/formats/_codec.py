"""The half of a stream codec that every format shares, written once.

Each format module has a `StreamDecoder` (upstream events → `ir.StreamHandler` calls) and a
`StreamEncoder` (an `ir.StreamHandler` that writes the format's bytes). The two base classes
here hold what the four formats do alike:

* `DecoderBase`: the record every decoder keeps (`usage`, `finished`, `error`, `dropped`),
  `feed` (the events as objects, built from `feed_into`), and `watch`, which parses an event
  only when the format's `WatchNeedles` say it may carry usage, the finish or an error.
* `EncoderBase`: the output buffer and `take`, the error ending (`fail`, and `error` for one the
  upstream reported), the start written on demand (`_ensure_started`), and the usage and stop
  reason kept for the closing event.

A format writes only its own wire: `feed_into`, its encoder's event writers, `_write_error`.
The calls made once per chunk (`feed_into`, the encoder's `text`, `reasoning`, `tool_args`) are
the format's own methods, not hooks called from a shared method, so sharing adds no call on the
hot path; the bases declare their fields as slots, so reading them costs what it did.

`WatchNeedles` is the watch path's table, one per format (the module's ``WATCH``): what the
relayed-stream framer looks for in raw chunks (`twproto.stream.translators`) and what the decoder
looks for in an event before parsing it. A needle that also turns up in content (the word
"error" in a text delta) only costs parsing that event; a needle missing would lose the usage or
the finish, so each table lists every spelling its format's servers write.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from twproto import ir
from twproto.errors import GatewayError
from twproto.formats._common import NULL_HANDLER, gateway_error
from twproto.sse import SSEEvent

__all__ = ("DecoderBase", "EncoderBase", "WatchNeedles")


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchNeedles:
    """What the watch path of one format looks for (a same-format stream relayed unchanged).

    On raw chunks (`twproto.stream.translators`): a run of complete events containing none of
    `chunk_markers` is relayed without being parsed, and a chunk that is exactly one event
    starting with one of `delta_starts` or ending with one of `delta_ends` (a plain content
    delta) is not even searched. On one decoded event (`DecoderBase.watch`): a named event is
    parsed when its name is in `event_names`; an unnamed one, or any event where `event_names`
    is None (formats whose events carry no names), when its data starts with one of
    `data_starts` or contains one of `data_needles`.
    """

    chunk_markers: tuple[bytes, ...]
    delta_starts: tuple[bytes, ...] = ()
    delta_ends: tuple[bytes, ...] = ()
    event_names: frozenset[str] | None = None
    data_starts: tuple[str, ...] = ()
    data_needles: tuple[str, ...] = ()


class DecoderBase(ABC):
    """What every format's `StreamDecoder` shares. It is fed `SSEEvent`s; Gemini's decoder also
    takes the already parsed elements of its JSON-array stream, and widens `feed_into` and
    `watch` for them."""

    __slots__ = ("dropped", "error", "finished", "stop_reason", "usage")

    #: The format's watch table (its module's ``WATCH``).
    needles: ClassVar[WatchNeedles]

    def __init__(self) -> None:
        self.usage: ir.Usage | None = None
        self.finished = False
        # Why the answer ended, once the upstream said (its finish reason in the IR's terms).
        self.stop_reason: ir.StopReason | None = None
        self.error: ir.StreamErrorEvent | None = None
        self.dropped: list[str] = []

    @abstractmethod
    def feed_into(self, event: SSEEvent, h: ir.StreamHandler) -> None:
        """Decode one upstream event into calls on `h` (the translator's hot path)."""

    def feed(self, event: SSEEvent) -> list[ir.StreamEvent]:
        """Decode one upstream event into event objects."""
        collector = ir.EventCollector()
        self.feed_into(event, collector)
        return collector.events

    def watch(self, event: SSEEvent) -> None:
        """Follow one event of a relayed stream for its usage, finish and errors only: parsed
        when the format's `needles` say it may carry one, else passed over."""
        needles = self.needles
        name = event.event
        if name and needles.event_names is not None:
            if name in needles.event_names:
                self.feed_into(event, NULL_HANDLER)
            return
        data = event.data
        if data.startswith(needles.data_starts):
            self.feed_into(event, NULL_HANDLER)
            return
        for needle in needles.data_needles:
            if needle in data:
                self.feed_into(event, NULL_HANDLER)
                return

    def _drop(self, what: str) -> None:
        if what not in self.dropped:
            self.dropped.append(what)


class EncoderBase(ABC):
    """What every format's `StreamEncoder` shares: the output buffer, the error ending, the
    start written on demand, and the usage and stop reason kept for the closing event."""

    __slots__ = ("_model", "_out", "_reason", "_started", "_usage", "dropped", "ended")

    def __init__(self, model: str) -> None:
        self._model = model
        self._out: list[bytes] = []
        self._started = False
        self._usage: ir.Usage | None = None
        self._reason: ir.StopReason | None = None
        self.ended = False
        self.dropped: list[str] = []

    @abstractmethod
    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None: ...

    @abstractmethod
    def _write_error(self, err: GatewayError, upstream_type: str | None) -> None:
        """Append the bytes of an error ending; `upstream_type` is the error type the upstream
        reported (None for the gateway's own errors)."""

    def take(self) -> bytes:
        """The bytes ready to send (and forget them)."""
        out = self._out
        if len(out) == 1:
            return out.pop()
        data = b"".join(out)
        out.clear()
        return data

    def fail(self, err: GatewayError) -> bytes:
        """The bytes that end the client's stream with `err` (nothing if it already ended)."""
        if not self.ended:
            self._write_error(err, None)
            self.ended = True
        return self.take()

    def error(self, error: ir.StreamErrorEvent) -> None:
        """An error the upstream reported: the client's stream ends with it."""
        if not self.ended:
            self._write_error(gateway_error(error), error.type)
            self.ended = True

    def usage(self, usage: ir.Usage) -> None:
        self._usage = usage

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        self._reason = reason

    def _ensure_started(self) -> None:
        if not self._started:
            self.message_start("", self._model, None, None)

    def _drop(self, what: str) -> None:
        if what not in self.dropped:
            self.dropped.append(what)
