"""Writing event-stream messages: the mock upstream's side, and the other half of round trips.

`encode_eventstream_message` frames any headers and payload; `eventstream_event` and
`eventstream_exception` write the two message shapes an AWS streaming answer is made of, with
the headers in the order AWS sends them.
"""

from __future__ import annotations

from collections.abc import Iterable
from struct import Struct
from zlib import crc32

from twproto.eventstream.decoder import EVENTSTREAM_MAX_HEADERS_SIZE
from twproto.eventstream.errors import EventStreamError
from twproto.eventstream.message import EventStreamHeader, EventStreamHeaderType

__all__ = (
    "encode_eventstream_headers",
    "encode_eventstream_message",
    "eventstream_event",
    "eventstream_exception",
)

_T = EventStreamHeaderType
_U32 = Struct(">I")
_PRELUDE = Struct(">II")
_RANGES: dict[EventStreamHeaderType, tuple[Struct, int, int]] = {
    _T.BYTE: (Struct(">b"), -(1 << 7), (1 << 7) - 1),
    _T.SHORT: (Struct(">h"), -(1 << 15), (1 << 15) - 1),
    _T.INTEGER: (Struct(">i"), -(1 << 31), (1 << 31) - 1),
    _T.LONG: (Struct(">q"), -(1 << 63), (1 << 63) - 1),
    _T.TIMESTAMP: (Struct(">q"), -(1 << 63), (1 << 63) - 1),
}
_MAX_VARIABLE = (1 << 15) - 1


def _fail(message: str) -> EventStreamError:
    return EventStreamError(f"cannot encode event-stream header: {message}")


def _header(h: EventStreamHeader) -> bytes:
    name = h.name.encode("utf-8")
    if not 1 <= len(name) <= 255:
        raise _fail(f"name {h.name!r} must be 1 to 255 bytes of UTF-8")
    head = bytes((len(name),)) + name
    t = h.type
    v = h.value
    if t is _T.TRUE or t is _T.FALSE:
        if v is not (t is _T.TRUE):
            raise _fail(f"{h.name!r}: a {t.name} header holds {t is _T.TRUE}, not {v!r}")
        return head + bytes((t,))
    if t in _RANGES:
        fmt, low, high = _RANGES[t]
        if type(v) is not int or not low <= v <= high:
            raise _fail(f"{h.name!r}: {v!r} is not a {t.name} value")
        return head + bytes((t,)) + fmt.pack(v)
    if t is _T.UUID:
        if type(v) is not bytes or len(v) != 16:
            raise _fail(f"{h.name!r}: a UUID is 16 bytes")
        return head + bytes((t,)) + v
    if t is _T.STRING:
        if type(v) is not str:
            raise _fail(f"{h.name!r}: a STRING header holds str")
        raw = v.encode("utf-8")
    elif t is _T.BYTES:
        if type(v) is not bytes:
            raise _fail(f"{h.name!r}: a BYTES header holds bytes")
        raw = v
    else:
        raise _fail(f"{h.name!r}: unknown type {t!r}")
    if len(raw) > _MAX_VARIABLE:
        raise _fail(f"{h.name!r}: value longer than {_MAX_VARIABLE} bytes")
    return head + bytes((t,)) + len(raw).to_bytes(2, "big") + raw


def encode_eventstream_headers(headers: Iterable[EventStreamHeader]) -> bytes:
    """The header block for `headers`, in the order given; names must be unique."""
    seen: set[str] = set()
    parts = []
    for h in headers:
        if h.name in seen:
            raise _fail(f"{h.name!r} appears twice")
        seen.add(h.name)
        parts.append(_header(h))
    block = b"".join(parts)
    if len(block) > EVENTSTREAM_MAX_HEADERS_SIZE:
        raise _fail(f"the header block is larger than {EVENTSTREAM_MAX_HEADERS_SIZE} bytes")
    return block


def encode_eventstream_message(headers: Iterable[EventStreamHeader], payload: bytes) -> bytes:
    """One framed message: prelude, its checksum, headers, payload, message checksum."""
    block = encode_eventstream_headers(headers)
    total = 16 + len(block) + len(payload)
    if total > 0xFFFFFFFF:
        raise EventStreamError("cannot encode an event-stream message of 4 GiB or more")
    prelude = _PRELUDE.pack(total, len(block))
    head = prelude + _U32.pack(crc32(prelude))
    body = head + block + payload
    return body + _U32.pack(crc32(body))


_JSON = "application/json"


def eventstream_event(event_type: str, payload: bytes, *, content_type: str = _JSON) -> bytes:
    """An ``event`` message (``contentBlockDelta``, ``chunk``…) as AWS frames it."""
    return encode_eventstream_message(
        (
            EventStreamHeader.string(":event-type", event_type),
            EventStreamHeader.string(":content-type", content_type),
            EventStreamHeader.string(":message-type", "event"),
        ),
        payload,
    )


def eventstream_exception(
    exception_type: str, payload: bytes, *, content_type: str = _JSON
) -> bytes:
    """An ``exception`` message (``throttlingException``…) as AWS frames it; `payload` is
    usually ``{"message": "..."}``."""
    return encode_eventstream_message(
        (
            EventStreamHeader.string(":exception-type", exception_type),
            EventStreamHeader.string(":content-type", content_type),
            EventStreamHeader.string(":message-type", "exception"),
        ),
        payload,
    )
