"""A sans-IO decoder for ``application/vnd.amazon.eventstream``, bounded and split-insensitive.

Wire format
-----------

A stream is a sequence of messages, each::

    total length  uint32   the whole message, these 4 bytes and the final checksum included
    headers len   uint32   bytes of the header block
    prelude CRC   uint32   CRC-32 of the 8 bytes above
    headers       ...      name length (uint8), name (UTF-8), type byte, value — repeated
    payload       ...      total - headers - 16 bytes
    message CRC   uint32   CRC-32 of everything before it, prelude included

All integers are big-endian. The header value types are in `EventStreamHeaderType`.

Theory of operation
-------------------

`EventStreamDecoder.feed` takes bytes exactly as the network delivered them and returns the
messages they complete. Whole messages inside a chunk are read straight from it; only the
unfinished tail of a chunk is kept, so the buffer never holds more than one message (at most
`max_message_size` bytes) plus the chunk being read.

The prelude is checked as soon as its 12 bytes are there — before any of the message is kept —
so a corrupt or oversized length is refused at once instead of being waited for. Every check
happens at a fixed position of the stream, which makes the decoder split-insensitive: any
division of the same bytes gives the same messages and the same error. When a chunk completes
some messages and then reaches a fault, `feed` returns those messages and the next call
(`feed` or `end`) raises the error; after an error every call raises it again.

Runs of identical header blocks (every ``contentBlockDelta`` of a ConverseStream answer carries
the same three headers) are parsed once and then looked up, in a small bounded table; each
lookup returns the same tuple, which lets a reader of the headers skip a run of them too.

Once a prelude is checked, the decoder knows the length it waits for: smaller reads are only
appended to the held bytes until the message is whole (a stream read in pieces of a few bytes
is not parsed again at every piece). The held bytes are then copied once, so that every slice
of the message is a plain ``bytes`` slice.

Limits: a message larger than `max_message_size` (default `EVENTSTREAM_MAX_MESSAGE_SIZE`,
1 MiB) raises `EventStreamTooLarge`, as does a header block over
`EVENTSTREAM_MAX_HEADERS_SIZE` (128 KiB, the format's own limit). A bad checksum, an
impossible length, an unknown header type, a header running past its block, a duplicate header
name or text that is not UTF-8 raises `EventStreamCorrupt`; input ending inside a message
raises `EventStreamTruncated` from `end`.
"""

from __future__ import annotations

from struct import Struct
from typing import NoReturn
from zlib import crc32

from twproto.eventstream.errors import (
    EventStreamCorrupt,
    EventStreamError,
    EventStreamTooLarge,
    EventStreamTruncated,
)
from twproto.eventstream.message import (
    EventStreamHeader,
    EventStreamHeaderType,
    EventStreamMessage,
    HeaderValue,
)

__all__ = (
    "EVENTSTREAM_MAX_HEADERS_SIZE",
    "EVENTSTREAM_MAX_MESSAGE_SIZE",
    "EventStreamDecoder",
)

#: The default bound on one message (prelude, headers, payload and checksum). Bedrock's events
#: are a few hundred bytes; a whole-answer chunk of InvokeModelWithResponseStream stays far
#: below this.
EVENTSTREAM_MAX_MESSAGE_SIZE = 1 << 20
#: The format's own limit on a message's header block.
EVENTSTREAM_MAX_HEADERS_SIZE = 128 * 1024

_PRELUDE = Struct(">III")
_U32 = Struct(">I")
_I8 = Struct(">b")
_I16 = Struct(">h")
_I32 = Struct(">i")
_I64 = Struct(">q")
_U16 = Struct(">H")
_PRELUDE_LEN = 12
_MIN_MESSAGE = 16  # prelude and message checksum, no headers, no payload
# Header blocks up to this size are remembered, up to this many of them.
_CACHE_BLOCK = 512
_CACHE_ENTRIES = 64

_T = EventStreamHeaderType
_FIXED: dict[int, tuple[EventStreamHeaderType, Struct]] = {
    2: (_T.BYTE, _I8),
    3: (_T.SHORT, _I16),
    4: (_T.INTEGER, _I32),
    5: (_T.LONG, _I64),
    8: (_T.TIMESTAMP, _I64),
}


# A frozen dataclass's __init__ sets each field through object.__setattr__; writing the slots
# through their descriptors builds the same instance in about half the time (as twproto.sse does
# for its events), and a message is built for every frame of a stream.
_SLOT_HEADERS = EventStreamMessage.__dict__["headers"].__set__
_SLOT_PAYLOAD = EventStreamMessage.__dict__["payload"].__set__
_object_new = object.__new__


def _new_message(headers: tuple[EventStreamHeader, ...], payload: bytes) -> EventStreamMessage:
    message: EventStreamMessage = _object_new(EventStreamMessage)
    _SLOT_HEADERS(message, headers)
    _SLOT_PAYLOAD(message, payload)
    return message


class EventStreamDecoder:
    """Incremental decoder: `feed` bytes split anywhere, `end` at the end of input."""

    __slots__ = ("_buf", "_cache", "_consumed", "_error", "_max", "_need")

    def __init__(self, *, max_message_size: int = EVENTSTREAM_MAX_MESSAGE_SIZE) -> None:
        if max_message_size < _MIN_MESSAGE:
            raise ValueError(f"max_message_size must be at least {_MIN_MESSAGE}")
        self._max = max_message_size
        self._buf = bytearray()
        # Bytes the buffer must hold before reading it again can complete or refuse anything:
        # a prelude's 12 until one is checked, then that message's whole length. A stream read
        # in small pieces is only appended to until then, not parsed again at each piece.
        self._need = _PRELUDE_LEN
        # Stream offset of the buffer's first byte, for error messages.
        self._consumed = 0
        self._error: EventStreamError | None = None
        self._cache: dict[bytes, tuple[EventStreamHeader, ...]] = {}

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished message held until more input arrives."""
        return len(self._buf)

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[EventStreamMessage]:
        """Take the next bytes of the stream; return the messages they complete."""
        if self._error is not None:
            raise self._error
        out: list[EventStreamMessage] = []
        buf = self._buf
        if buf:
            buf += chunk
            if len(buf) < self._need:
                return out
            # One copy of the held tail and the new bytes, so that every slice below is bytes.
            data = bytes(buf)
        else:
            # Kept bytes must not change under us when a caller reuses its read buffer.
            data = chunk if type(chunk) is bytes else bytes(chunk)
        try:
            pos = self._read(data, out)
        except EventStreamError as exc:
            self._error = exc
            self._buf = bytearray()
            if out:
                return out  # raised by the next call, after these messages
            raise
        self._consumed += pos
        if pos < len(data):
            if pos or not buf:  # else the buffer holds just these bytes already
                self._buf = bytearray(data[pos:])
            rest = len(data) - pos
            self._need = _PRELUDE_LEN if rest < _PRELUDE_LEN else _U32.unpack_from(data, pos)[0]
        elif buf:
            self._buf = bytearray()
        return out

    def end(self) -> None:
        """Signal the end of input: raises if an error is pending or a message is unfinished."""
        if self._error is not None:
            raise self._error
        if self._buf:
            held = len(self._buf)
            self._buf = bytearray()
            self._error = EventStreamTruncated(
                f"event stream ended inside a message: {held} bytes of it at offset "
                f"{self._consumed}"
            )
            raise self._error

    def _read(self, data: bytes, out: list[EventStreamMessage]) -> int:
        n = len(data)
        pos = 0
        limit = self._max
        cache = self._cache
        prelude = _PRELUDE.unpack_from
        u32 = _U32.unpack_from
        append = out.append
        while n - pos >= _PRELUDE_LEN:
            total, hlen, prelude_crc = prelude(data, pos)
            if crc32(data[pos : pos + 8]) != prelude_crc:
                self._corrupt("prelude checksum does not match", pos)
            if total < _MIN_MESSAGE or hlen > total - _MIN_MESSAGE:
                self._corrupt(f"impossible lengths (total {total}, headers {hlen})", pos)
            if total > limit:
                raise EventStreamTooLarge(
                    f"event-stream message of {total} bytes at offset "
                    f"{self._consumed + pos} is larger than the limit of {limit} bytes"
                )
            if hlen > EVENTSTREAM_MAX_HEADERS_SIZE:
                raise EventStreamTooLarge(
                    f"event-stream headers of {hlen} bytes at offset {self._consumed + pos} "
                    f"are larger than the limit of {EVENTSTREAM_MAX_HEADERS_SIZE} bytes"
                )
            end = pos + total
            if end > n:
                break
            # The message checksum covers the prelude and its checksum: continued from the
            # prelude's (just checked) instead of read over those 8 bytes again.
            crc_at = end - 4
            if crc32(data[pos + 8 : crc_at], prelude_crc) != u32(data, crc_at)[0]:
                self._corrupt("message checksum does not match", pos)
            start = pos + _PRELUDE_LEN
            if hlen:
                split = start + hlen
                block = data[start:split]
                headers = cache.get(block)
                if headers is None:
                    headers = self._headers(block, pos)
                    if hlen <= _CACHE_BLOCK:
                        if len(cache) >= _CACHE_ENTRIES:
                            cache.clear()
                        cache[block] = headers
                append(_new_message(headers, data[split:crc_at]))
            else:
                append(_new_message((), data[start:crc_at]))
            pos = end
        return pos

    def _corrupt(self, what: str, pos: int) -> NoReturn:
        raise EventStreamCorrupt(f"event-stream message at offset {self._consumed + pos}: {what}")

    def _headers(self, block: bytes, at: int) -> tuple[EventStreamHeader, ...]:
        found: list[EventStreamHeader] = []
        names: set[str] = set()
        n = len(block)
        i = 0
        while i < n:
            name_len = block[i]
            i += 1
            if name_len == 0:
                self._corrupt("a header has an empty name", at)
            if i + name_len + 1 > n:
                self._corrupt("a header runs past the header block", at)
            name = self._utf8(block[i : i + name_len], at)
            i += name_len
            kind = block[i]
            i += 1
            value: HeaderValue
            if kind == 0:
                type_, value = _T.TRUE, True
            elif kind == 1:
                type_, value = _T.FALSE, False
            elif kind in _FIXED:
                type_, fmt = _FIXED[kind]
                if i + fmt.size > n:
                    self._corrupt(f"header {name!r} runs past the header block", at)
                (value,) = fmt.unpack_from(block, i)
                i += fmt.size
            elif kind == 6 or kind == 7:
                if i + 2 > n:
                    self._corrupt(f"header {name!r} runs past the header block", at)
                (length,) = _U16.unpack_from(block, i)
                i += 2
                if i + length > n:
                    self._corrupt(f"header {name!r} runs past the header block", at)
                raw = block[i : i + length]
                i += length
                if kind == 6:
                    type_, value = _T.BYTES, raw
                else:
                    type_, value = _T.STRING, self._utf8(raw, at)
            elif kind == 9:
                if i + 16 > n:
                    self._corrupt(f"header {name!r} runs past the header block", at)
                type_, value = _T.UUID, block[i : i + 16]
                i += 16
            else:
                self._corrupt(f"header {name!r} has unknown value type {kind}", at)
            if name in names:
                self._corrupt(f"header {name!r} appears twice", at)
            names.add(name)
            found.append(EventStreamHeader(name, type_, value))
        return tuple(found)

    def _utf8(self, raw: bytes, at: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self._corrupt("a header name or string is not UTF-8", at)
