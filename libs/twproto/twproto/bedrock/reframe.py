"""InvokeModelWithResponseStream's answer, read back as the Anthropic SSE stream it carries.

Bedrock frames an Anthropic model's stream as AWS event-stream messages: each ``chunk`` event's
payload is ``{"bytes": "<base64>"}``, and the decoded bytes are one Anthropic stream event's
JSON, exactly as the Anthropic API writes it in its ``data:`` line. `InvokeStreamReframer`
writes each as that SSE event again (``event: <type>`` and ``data: <the decoded bytes>``,
unchanged), so the opening hold, the relay to an Anthropic client and the conversion to the
other formats read a Bedrock stream as an Anthropic upstream's stream: the least change for an
Anthropic client, and one code path for the rest.

An ``exception`` (or ``error``) message becomes Anthropic's in-stream ``error`` event, its
``error.type`` the Anthropic type of the same failure kind (`classify_eventstream_message`):
before first content the hold fails over on it as on any upstream error; after, the client's
stream ends with it. A framing fault (a bad checksum, an oversized message) is an ``api_error``
event, after which nothing more is read. Input that ends inside a message adds nothing: the
Anthropic stream then lacks its ``message_stop`` and the caller ends it as a broken stream.
"""

from __future__ import annotations

import binascii
from typing import Protocol

from twproto import _json, ir
from twproto.errors import GatewayError
from twproto.eventstream.classify import classify_eventstream_message
from twproto.eventstream.decoder import EVENTSTREAM_MAX_MESSAGE_SIZE, EventStreamDecoder
from twproto.eventstream.errors import EventStreamError, EventStreamTruncated
from twproto.eventstream.message import EventStreamHeader, HeaderValue
from twproto.failures import FailureKind
from twproto.stream.hold import Released
from twproto.stream.translators import StreamTranslator

__all__ = (
    "FAILURE_ANTHROPIC_TYPES",
    "EventStreamTranslator",
    "InvokeStreamReframer",
    "Reframer",
    "anthropic_error_event",
    "pending_fault",
)

#: The Anthropic error type a client's SDK reads for each failure kind (its own classification
#: of the event then agrees with the exception's).
FAILURE_ANTHROPIC_TYPES: dict[FailureKind, str] = {
    FailureKind.RATE_LIMITED: "rate_limit_error",
    FailureKind.QUOTA_USED_UP: "rate_limit_error",
    FailureKind.OVERLOADED: "overloaded_error",
    FailureKind.SERVER: "api_error",
    FailureKind.CONTEXT_OVERFLOW: "invalid_request_error",
    FailureKind.CLIENT_ERROR: "invalid_request_error",
    FailureKind.AUTH_REJECTED: "authentication_error",
    FailureKind.MODEL_UNAVAILABLE: "not_found_error",
}

_TYPE_PREFIX = b'{"type":"'


def anthropic_error_event(kind: str, message: str) -> bytes:
    """Anthropic's in-stream ``error`` event of type `kind`, as SSE bytes."""
    data = _json.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"


class InvokeStreamReframer:
    """Event-stream bytes in (split anywhere), Anthropic SSE bytes out. Sans-IO; `now` dates
    the classification of an exception frame (a quota's reset)."""

    __slots__ = ("_decoder", "_done", "_seen", "_seen_types")

    def __init__(self, *, max_message_size: int = EVENTSTREAM_MAX_MESSAGE_SIZE) -> None:
        self._decoder = EventStreamDecoder(max_message_size=max_message_size)
        self._done = False
        self._seen: tuple[EventStreamHeader, ...] | None = None
        self._seen_types: tuple[HeaderValue | None, HeaderValue | None] = (None, None)

    def feed(self, chunk: bytes, *, now: float = 0.0) -> bytes:
        """The SSE bytes for the messages `chunk` completes."""
        if self._done:
            return b""
        try:
            messages = self._decoder.feed(chunk)
        except EventStreamError as exc:
            self._done = True
            return anthropic_error_event("api_error", f"Bedrock event stream: {exc}")
        out: list[bytes] = []
        for message in messages:
            headers = message.headers
            if headers is self._seen:
                kind, name = self._seen_types
            else:
                # One pass over the (three) headers. The decoder hands out the same tuple for
                # every message with the same header block, so a stream's run of chunks pays
                # it once.
                kind = name = None
                for header in headers:
                    if header.name == ":message-type":
                        kind = header.value
                    elif header.name == ":event-type":
                        name = header.value
                self._seen = headers
                self._seen_types = (kind, name)
            if kind == "event":
                if name != "chunk":
                    continue  # Bedrock sends only chunks; anything else carries no event
                out.append(self._chunk(message.payload))
                continue
            failure = classify_eventstream_message(message, now=now)
            if failure is None:
                continue
            kind = FAILURE_ANTHROPIC_TYPES.get(failure.kind, "api_error")
            out.append(
                anthropic_error_event(kind, failure.message or message.exception_type or "error")
            )
            self._done = True  # AWS sends nothing after an exception
            break
        return b"".join(out)

    def _chunk(self, payload: bytes) -> bytes:
        try:
            encoded = _json.loads(payload)["bytes"]
            # base64.b64decode(validate=True) without its argument checks in Python.
            data = binascii.a2b_base64(encoded, strict_mode=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            self._done = True
            return anthropic_error_event(
                "api_error", "Bedrock event stream: a chunk without its bytes"
            )
        # The event's name is its JSON's "type", which Anthropic writes first.
        if data.startswith(_TYPE_PREFIX):
            end = data.find(b'"', len(_TYPE_PREFIX))
            name = data[len(_TYPE_PREFIX) : end] if end > 0 else b""
        else:
            try:
                parsed = _json.loads(data)
                found = parsed.get("type") if isinstance(parsed, dict) else None
            except ValueError:
                found = None
            name = found.encode() if isinstance(found, str) else b"message"
        return b"event: " + name + b"\ndata: " + data + b"\n\n"

    def end(self) -> bytes:
        """The input ended: nothing more to write (a message cut short is left out), but for
        a framing fault found after the last messages were handed out."""
        if self._done:
            return b""
        self._done = True
        pending = pending_fault(self._decoder)
        if pending is not None:
            return anthropic_error_event("api_error", f"Bedrock event stream: {pending}")
        return b""


def pending_fault(decoder: EventStreamDecoder) -> EventStreamError | None:
    """At the end of input: the framing fault `decoder` found but has not raised yet (it hands
    out the messages before a fault first, and raises at the next call). Input that merely ends
    inside a message is not one: the stream is then cut, which its reader notices itself."""
    try:
        decoder.end()
    except EventStreamTruncated:
        return None
    except EventStreamError as exc:
        return exc
    return None


class Reframer(Protocol):
    """What reads a Bedrock event stream back as Anthropic SSE: `InvokeStreamReframer`, and
    ConverseStream's (`twproto.bedrock.converse.ConverseStreamReframer`)."""

    def feed(self, chunk: bytes, *, now: float = 0.0) -> bytes: ...

    def end(self) -> bytes: ...


class EventStreamTranslator:
    """A `StreamTranslator` for a Bedrock stream: the Anthropic translator `inner` fed through
    an `InvokeStreamReframer` (the hold before it was fed the same way)."""

    __slots__ = ("_inner", "_reframer")

    def __init__(self, inner: StreamTranslator, reframer: Reframer) -> None:
        self._inner = inner
        self._reframer = reframer

    def feed(self, chunk: bytes) -> bytes:
        data = self._reframer.feed(chunk)
        return self._inner.feed(data) if data else b""

    def take_over(self, released: Released) -> bytes:
        return self._inner.take_over(released)

    def end(self) -> bytes:
        tail = self._reframer.end()
        out = self._inner.feed(tail) if tail else b""
        return out + self._inner.end()

    def fail(self, err: GatewayError) -> bytes:
        return self._inner.fail(err)

    @property
    def usage(self) -> ir.Usage | None:
        return self._inner.usage

    @property
    def broken(self) -> bool:
        return self._inner.broken

    @property
    def too_large(self) -> bool:
        return self._inner.too_large

    @property
    def stop_reason(self) -> ir.StopReason | None:
        return self._inner.stop_reason

    @property
    def finished(self) -> bool:
        return self._inner.finished

    @property
    def error(self) -> ir.StreamErrorEvent | None:
        return self._inner.error

    @property
    def dropped(self) -> tuple[str, ...]:
        return self._inner.dropped
