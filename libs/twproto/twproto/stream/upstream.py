"""An upstream's streamed answer, from its first byte: held until first content, then translated.

Until the first content the gateway may still move the request to another upstream without the
client noticing, so the stream is held (`twproto.stream.hold.OpeningHold`; docs/streams.md).
Once the hold releases, the stream belongs to the client: `UpstreamStream` builds the
translator for it and hands the hold's work over — the held bytes, the events the hold already
decoded and its decoder — so nothing is decoded twice. That is wsproto's handshake handing its
connection over: the caller feeds `UpstreamStream` until `FirstContent` and then feeds the
`translator` it carries, for the rest of the stream.

`feed` returns `Holding` (nothing decisive yet), `FirstContent` (send `data` once the answer is
committed, then feed `translator`) or `FailedBeforeContent` (the client has seen nothing; the
request may move on). `end` returns `FirstContent` for a stream whose only decisive event came
with its end (call the translator's `end` next), or `FailedBeforeContent`.
"""

from __future__ import annotations

from dataclasses import dataclass

from twproto import ir
from twproto.bedrock.converse.stream import ConverseStreamReframer
from twproto.bedrock.reframe import EventStreamTranslator, InvokeStreamReframer, Reframer
from twproto.dialect import Dialect
from twproto.stream.hold import (
    FailedBeforeContent,
    Holding,
    HoldOutcome,
    OpeningHold,
    Released,
)
from twproto.stream.resume import ResumableStream
from twproto.stream.translators import (
    DEFAULT_MAX_EVENT_BYTES,
    StreamTranslator,
    new_stream_translator,
)

__all__ = ("FirstContent", "OpeningOutcome", "UpstreamStream", "reported_usage")


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstContent:
    """The hold released: `data` are the client's bytes for everything held; every later
    upstream byte goes to `translator`."""

    data: bytes
    translator: StreamTranslator


OpeningOutcome = Holding | FirstContent | FailedBeforeContent


class UpstreamStream:
    """One upstream stream's opening, for a client that asked for a stream.

    `upstream_sse` False: the upstream sends Gemini's JSON array; `client_sse` False: so does
    the client want it. `tool_names` maps flattened tool names back; `created` is the answer's
    timestamp where the client format has one. `relay_unchanged` False decodes and encodes a
    same-format stream again, to name `client_model` (an alias). `resumable` True reads the
    answer with a `twproto.stream.resume.ResumableStream`, which another upstream may continue;
    `continuing` is such a stream this upstream continues (its opening is held the same way,
    and the same stream object is handed back at first content). `hide_usage_chunk`: a relayed
    Chat stream leaves out the usage-only chunk the client did not ask for
    (`twproto.translate.TranslatedRequest.hide_usage_chunk`). `eventstream` True: the upstream
    is Bedrock's InvokeModelWithResponseStream, whose event-stream bytes are read back as the
    Anthropic SSE they carry (`twproto.bedrock.InvokeStreamReframer`) before anything else sees
    them; such a stream is not resumable (its translator is not a `ResumableStream`). With
    `converse` too, it is ConverseStream's, read back as the Anthropic SSE of the same answer
    (`twproto.bedrock.converse.ConverseStreamReframer`). `max_event_bytes` bounds one upstream
    event, held or translated (`twproto.stream.translators.DEFAULT_MAX_EVENT_BYTES`).
    """

    __slots__ = (
        "_client",
        "_client_model",
        "_client_sse",
        "_continuing",
        "_created",
        "_hide_usage_chunk",
        "_hold",
        "_max_event",
        "_reframer",
        "_relay_unchanged",
        "_resumable",
        "_tool_names",
        "_upstream",
        "_upstream_sse",
    )

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
        relay_unchanged: bool = True,
        resumable: bool = False,
        continuing: ResumableStream | None = None,
        hide_usage_chunk: bool = False,
        eventstream: bool = False,
        converse: bool = False,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self._reframer: Reframer | None = None
        if eventstream:
            self._reframer = (
                ConverseStreamReframer(model=client_model) if converse else InvokeStreamReframer()
            )
        if eventstream:
            resumable = False
            continuing = None
        self._hide_usage_chunk = hide_usage_chunk
        self._resumable = resumable
        self._continuing = continuing
        self._upstream = upstream
        self._client = client
        self._client_model = client_model
        self._upstream_sse = upstream_sse
        self._client_sse = client_sse
        self._tool_names = tool_names
        self._created = created
        self._relay_unchanged = relay_unchanged
        self._max_event = max_event_bytes
        self._hold = OpeningHold(upstream, sse=upstream_sse, max_event_size=max_event_bytes)

    @property
    def held_bytes(self) -> int:
        """Bytes received and held so far."""
        return self._hold.held_bytes

    def feed(self, chunk: bytes, *, now: float) -> OpeningOutcome:
        """Take the next upstream bytes (`now`, epoch seconds, dates a quota reset)."""
        if self._reframer is not None:
            chunk = self._reframer.feed(chunk, now=now)
        return self._decide(self._hold.feed(chunk, now=now))

    def end(self, *, now: float) -> FirstContent | FailedBeforeContent:
        """The upstream body ended before the hold released."""
        if self._reframer is not None:
            tail = self._reframer.end()
            if tail:
                fed = self._decide(self._hold.feed(tail, now=now))
                if not isinstance(fed, Holding):
                    return fed
        outcome = self._decide(self._hold.end(now=now))
        assert not isinstance(outcome, Holding)  # the hold decides at the end
        return outcome

    def _decide(self, outcome: HoldOutcome) -> OpeningOutcome:
        if not isinstance(outcome, Released):
            return outcome
        translator: StreamTranslator
        if self._continuing is not None:
            translator = self._continuing
            self._continuing.next_leg(
                self._upstream, upstream_sse=self._upstream_sse, tool_names=self._tool_names
            )
            return FirstContent(data=translator.take_over(outcome), translator=translator)
        if self._resumable:
            translator = ResumableStream(
                self._upstream,
                self._client,
                client_model=self._client_model,
                upstream_sse=self._upstream_sse,
                client_sse=self._client_sse,
                tool_names=self._tool_names,
                created=self._created,
                max_event_bytes=self._max_event,
            )
            return FirstContent(data=translator.take_over(outcome), translator=translator)
        translator = new_stream_translator(
            self._upstream,
            self._client,
            client_model=self._client_model,
            upstream_sse=self._upstream_sse,
            client_sse=self._client_sse,
            tool_names=self._tool_names,
            created=self._created,
            relay_unchanged=self._relay_unchanged,
            hide_usage_chunk=self._hide_usage_chunk,
            max_event_bytes=self._max_event,
        )
        if self._reframer is not None:
            translator = EventStreamTranslator(translator, self._reframer)
        return FirstContent(data=translator.take_over(outcome), translator=translator)


def reported_usage(
    dialect: Dialect, data: bytes, *, sse: bool = True, eventstream: bool = False
) -> ir.Usage | None:
    """The usage an upstream reported in the stream bytes `data` (e.g. the opening events of an
    attempt that ended before content, such as Anthropic's ``message_start``): tokens it may bill
    although its attempt failed or was cancelled. None when the bytes report none or cannot be
    read. `eventstream`: the bytes are Bedrock's event stream around the `dialect` stream."""
    if eventstream:
        reframer = InvokeStreamReframer()
        data = reframer.feed(data) + reframer.end()
    watcher = new_stream_translator(
        dialect, dialect, client_model="", upstream_sse=sse, client_sse=sse
    )
    watcher.feed(data)
    watcher.end()
    return watcher.usage
