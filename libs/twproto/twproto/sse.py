"""Server-sent events: a bounded decoder for input split anywhere, an encoder, Gemini's JSON array.

Theory of operation
-------------------

Every streamed answer in the four API formats is SSE except one: Gemini's
``:streamGenerateContent`` without ``alt=sse`` sends a single JSON array whose elements arrive one
after another. Both decoders here take bytes exactly as the network delivered them — split at any
byte, including inside a CRLF pair or a multi-byte UTF-8 character — and give back whole events.

`SSEDecoder` works in two stages, both on whole buffers rather than byte by byte:

1. *Line ends.* WHATWG allows LF, CR and CRLF. Each incoming chunk is normalised to LF with two
   C-level ``bytes.replace`` calls. The one case a single chunk cannot decide is a chunk ending in
   CR: the CR already ends the line, and a flag remembers to drop an LF at the start of the next
   chunk (the second half of that CRLF).
2. *Events.* The normalised chunk is split on LF once. Complete lines are interpreted by the
   WHATWG field rules; the unterminated remainder waits for the next chunk. Lines stay ``bytes``
   until an event is dispatched, and the event's data is decoded once, so a multi-byte character
   split across chunks is never decoded in halves (LF cannot occur inside a UTF-8 sequence).

Chunks that hold no line end at all (a 1-byte feed, say) are only appended to a list, so feeding a
long line in tiny pieces costs linear, not quadratic, time.

Bounds. The *size of an event* is the number of bytes of all its lines (after line-end
normalisation, terminators excluded) — every line since the previous blank line, comments
included. A pending event or unterminated line larger than ``max_event_size`` raises
`SSEEventTooLarge`. The size is defined on the lines, not on how they were chunked, so whether a
stream raises never depends on where it was split.

Departures from WHATWG, chosen for a proxy:

* `SSEEvent.id` is the ``id`` field *of that event block* (``None`` if the block had none), so an
  event re-encodes to what came in. WHATWG's persistent "last event ID" is kept separately as
  `SSEDecoder.last_event_id`.
* `SSEEvent.event` is ``""`` when no ``event:`` field was given (WHATWG would say ``"message"``).
* At the end of input (`SSEDecoder.end`) a pending event that has data is **dispatched** even
  without its closing blank line, and an unterminated last line is read as if terminated.
  WHATWG discards it; an upstream that closes right after ``data: [DONE]`` without the blank line
  should not lose its last event in a gateway.
* A ``retry`` value of more than 18 digits is ignored rather than parsed into a huge integer.

As in WHATWG, a block without any ``data`` line dispatches nothing, while ``data:`` with an empty
value dispatches an event whose data is ``""``.

After an `SSEError` the decoder is spent: every later call raises again.

`JSONArrayDecoder` scans the array with compiled regular expressions that jump from one
structural character (``[ ] { } "``) to the next, tracking depth and string state (so brackets
inside strings do not count, and an escaped quote does not end a string). Each top-level element
is parsed with the shared JSON codec as soon as its closing bracket arrives.

Errors: `SSEError` (a `twproto.ProtocolError`) is the one error type of this module.
`SSEEventTooLarge` (an event or array element over the bound) and `JSONArrayError` (input that
is not a JSON array) are its subclasses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

from twproto import _json
from twproto._exceptions import ProtocolError

__all__ = (
    "JSONArrayDecoder",
    "JSONArrayError",
    "SSEDecoder",
    "SSEError",
    "SSEEvent",
    "SSEEventTooLarge",
    "encode",
    "encode_comment",
    "encode_event",
)

_BOM = b"\xef\xbb\xbf"
# More digits than this cannot be a sensible reconnection time; refusing them also keeps int()
# away from its 4300-digit conversion limit.
_MAX_RETRY_DIGITS = 18


class SSEError(ProtocolError):
    """The stream's framing is broken: the one error type of `twproto.sse`.

    A `ProtocolError` with `error_status_hint` 502: the streams twproto decodes are upstreams'
    answers. Encoding an event that cannot be framed is the caller's bug and hints 500.
    """

    error_status_hint = 502


class SSEEventTooLarge(SSEError):
    """A pending event (or JSON-array element) grew past the decoder's bound."""


class JSONArrayError(SSEError):
    """A JSON-array stream is malformed or ended before the array closed."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched server-sent event.

    `event` is ``""`` when the block had no ``event:`` field. `id` and `retry` are the fields of
    this block (``None`` when absent); see `SSEDecoder.last_event_id` for WHATWG's running id.
    """

    data: str
    event: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental WHATWG server-sent-events decoder.

    `feed` takes bytes split anywhere and returns the events completed by them; `end` flushes at
    the end of input (dispatching a final event that lacks its blank line). Raises
    `SSEEventTooLarge` when an event exceeds `max_event_size` bytes.
    """

    __slots__ = (
        "_at_start",
        "_bom_head",
        "_broken",
        "_data",
        "_event",
        "_id",
        "_max",
        "_pending",
        "_pending_len",
        "_retry",
        "_room",
        "_size",
        "_skip_lf",
        "_special",
        "last_event_id",
        "reconnection_time",
    )

    def __init__(self, *, max_event_size: int = 1 << 20) -> None:
        if max_event_size < 1:
            raise ValueError("max_event_size must be positive")
        self._max = max_event_size
        # Unterminated line, kept as a list of pieces so tiny chunks append in O(1).
        self._pending: list[bytes] = []
        self._pending_len = 0
        # The previous chunk ended in CR: an LF opening this one is the rest of a CRLF.
        self._skip_lf = False
        # A BOM is stripped only at the very start, and may itself arrive split.
        self._at_start = True
        self._bom_head = b""
        # The event being assembled.
        self._data: list[bytes] = []
        self._event = b""
        self._id: str | None = None
        self._retry: int | None = None
        self._size = 0
        # Bytes the pending line may still take: the bound minus the pending event's lines.
        self._room = max_event_size
        self._broken = False
        self._special = True  # see feed()
        #: WHATWG's "last event ID": the latest ``id`` field seen, kept across events.
        self.last_event_id = ""
        #: The latest valid ``retry`` field seen (milliseconds), if any.
        self.reconnection_time: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes of the stream; return the events they complete."""
        # One flag guards the rare states (stream start, a pending CRLF half, a failed decoder),
        # so a chunk of a few bytes costs a handful of operations.
        if self._special or type(chunk) is not bytes:
            chunk = self._prepare(chunk)
        if not chunk:
            return []
        # Membership of an int is a plain memchr; ``b"\r" in chunk`` first tries the needle as an
        # int, fails, and costs ten times more — noticeable when chunks are a few bytes each.
        if 13 in chunk:
            # A CR at the very end ends its line now; the LF that may follow is dropped later.
            if chunk[-1] == 13:
                self._skip_lf = self._special = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if 10 not in chunk:
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if self._pending_len > self._room:
                self._too_large()
            return []
        if self._pending:
            self._pending.append(chunk)
            chunk = b"".join(self._pending)
            self._pending = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        events = self._lines(lines)
        if rest:
            self._pending.append(rest)
            self._pending_len = len(rest)
            if self._pending_len > self._room:
                self._too_large()
        else:
            self._pending_len = 0
        return events

    def _prepare(self, chunk: bytes) -> bytes:
        """The slow path of `feed`: copy foreign buffers, strip a BOM, finish a CRLF."""
        if self._broken:
            raise SSEError("the decoder failed earlier")
        if type(chunk) is not bytes:
            # Kept pieces must not change under us when a caller reuses its read buffer.
            chunk = bytes(chunk)
        if not chunk:
            return chunk
        if self._at_start:
            head = self._bom_head + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._bom_head = head
                return b""
            self._at_start = False
            self._bom_head = b""
            chunk = head[3:] if head.startswith(_BOM) else head
            if not chunk:
                return chunk
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
        self._special = self._skip_lf
        return chunk

    def end(self) -> list[SSEEvent]:
        """Signal the end of input; return a final event that lacked its blank line, if any."""
        if self._broken:
            raise SSEError("the decoder failed earlier")
        lines: list[bytes] = []
        if self._bom_head:
            # Fewer than three bytes that began like a BOM: they were content after all.
            lines.append(self._bom_head)
            self._bom_head = b""
        if self._pending:
            lines.append(b"".join(self._pending))
            self._pending = []
            self._pending_len = 0
        # The empty line dispatches what is pending, as the missing blank line would have.
        lines.append(b"")
        return self._lines(lines)

    def _too_large(self) -> NoReturn:
        self._broken = self._special = True
        self._size = 0
        self._pending = []
        self._data = []
        raise SSEEventTooLarge(f"server-sent event larger than {self._max} bytes")

    def _lines(self, lines: list[bytes]) -> list[SSEEvent]:
        # The hot loop: locals instead of attributes, the two common fields tested first.
        out: list[SSEEvent] = []
        data = self._data
        event = self._event
        id_ = self._id
        retry = self._retry
        size = self._size
        limit = self._max
        for line in lines:
            if not line:
                if data:
                    raw = data[0] if len(data) == 1 else b"\n".join(data)
                    out.append(
                        _new_event(
                            raw.decode("utf-8", "replace"),
                            event.decode("utf-8", "replace") if event else "",
                            id_,
                            retry,
                        )
                    )
                    data = []
                event = b""
                id_ = None
                retry = None
                size = 0
                continue
            size += len(line)
            if size > limit:
                self._too_large()
            if line[:6] == b"data: ":
                data.append(line[6:])
                continue
            if line[:7] == b"event: ":
                event = line[7:]
                continue
            colon = line.find(b":")
            if colon == 0:
                continue  # comment
            if colon < 0:
                name = line
                value = b""
            else:
                name = line[:colon]
                value = (
                    line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
                )
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value
            elif name == b"id":
                if 0 not in value:  # an id with NUL is ignored
                    id_ = self.last_event_id = value.decode("utf-8", "replace")
            elif name == b"retry" and value.isdigit() and len(value) <= _MAX_RETRY_DIGITS:
                retry = self.reconnection_time = int(value)
            # Any other field name is ignored, as WHATWG says.
        self._data = data
        self._event = event
        self._id = id_
        self._retry = retry
        self._size = size
        self._room = limit - size
        return out


# A frozen dataclass's __init__ goes through object.__setattr__ once per field, which makes it
# the largest single cost per decoded event. Writing the slots through their descriptors builds
# an identical instance in about half the time.
_SLOT_DATA = SSEEvent.__dict__["data"].__set__
_SLOT_EVENT = SSEEvent.__dict__["event"].__set__
_SLOT_ID = SSEEvent.__dict__["id"].__set__
_SLOT_RETRY = SSEEvent.__dict__["retry"].__set__
_object_new = object.__new__


def _new_event(data: str, event: str, id_: str | None, retry: int | None) -> SSEEvent:
    ev: SSEEvent = _object_new(SSEEvent)
    _SLOT_DATA(ev, data)
    _SLOT_EVENT(ev, event)
    _SLOT_ID(ev, id_)
    _SLOT_RETRY(ev, retry)
    return ev


def _check_field(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise SSEError(f"SSE {name} cannot contain a line break: {value!r}", error_status_hint=500)


def encode_event(event: SSEEvent) -> bytes:
    """Frame one event. Line breaks in data become separate ``data:`` lines.

    SSE has no way to carry a bare CR inside data: CR and CRLF there come back as LF.
    Raises `SSEError` for an event name or id containing a line break (or an id with NUL) and
    for a negative retry.
    """
    head = b""
    if event.event:
        _check_field("event", event.event)
        head += b"event: " + event.event.encode() + b"\n"
    if event.id is not None:
        _check_field("id", event.id)
        if "\0" in event.id:
            raise SSEError("SSE id cannot contain NUL", error_status_hint=500)
        head += b"id: " + event.id.encode() + b"\n"
    if event.retry is not None:
        if event.retry < 0:
            raise SSEError("SSE retry cannot be negative", error_status_hint=500)
        head += b"retry: " + str(event.retry).encode() + b"\n"
    return head + _data_lines(event.data.encode())


def _data_lines(data: bytes) -> bytes:
    if 10 in data or 13 in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\ndata: ")
    return b"data: " + data + b"\n\n"


def encode(data: str | bytes, *, event: str | None = None) -> bytes:
    """Frame `data` (already serialised, e.g. JSON) as one event, with an optional event name.

    The fast path for relaying: bytes without line breaks are framed with two concatenations.
    """
    raw = data.encode() if isinstance(data, str) else data
    if event:
        _check_field("event", event)
        return b"event: " + event.encode() + b"\n" + _data_lines(raw)
    return _data_lines(raw)


def encode_comment(text: str) -> bytes:
    """Frame a comment (ignored by every SSE client), e.g. ``b": keep-alive\\n\\n"``."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return b"".join(b": " + line.encode() + b"\n" for line in lines) + b"\n"


# JSON-array stream scanning. Each regex jumps straight to the next byte that matters.
_NON_WS = re.compile(rb"[^ \t\r\n]")
_STRUCTURAL = re.compile(rb'[\[\]{}"]')
_IN_STRING = re.compile(rb'["\\]')
_SCALAR_END = re.compile(rb"[,\]]")

_BEFORE, _FIRST, _NEXT, _IN_VALUE, _AFTER, _DONE = range(6)
_OPEN = frozenset(b"[{")


class JSONArrayDecoder:
    """Incremental decoder for a streamed JSON array (Gemini without ``alt=sse``).

    `feed` returns each top-level element, parsed, as soon as it is complete; `end` raises
    `JSONArrayError` unless the array was closed. An element larger than `max_element_size`
    bytes raises `SSEEventTooLarge`; anything that is not a JSON array raises `JSONArrayError`.
    """

    __slots__ = ("_broken", "_buf", "_depth", "_in_str", "_max", "_pos", "_start", "_state")

    def __init__(self, *, max_element_size: int = 1 << 20) -> None:
        if max_element_size < 1:
            raise ValueError("max_element_size must be positive")
        self._max = max_element_size
        self._buf = bytearray()
        self._pos = 0  # next byte to look at
        self._start = -1  # where the pending element starts, -1 when none
        self._depth = 0
        self._in_str = False
        self._state = _BEFORE
        self._broken = False

    def feed(self, chunk: bytes) -> list[object]:
        """Take the next bytes; return the elements they complete."""
        if self._broken:
            raise SSEError("the decoder failed earlier")
        self._buf += chunk
        out: list[object] = []
        try:
            self._scan(out)
        except SSEError:
            self._broken = True
            self._buf = bytearray()
            raise
        # Drop what has been consumed so memory holds at most the pending element.
        cut = self._start if self._start >= 0 else self._pos
        if cut:
            del self._buf[:cut]
            self._pos -= cut
            if self._start >= 0:
                self._start = 0
        return out

    def end(self) -> list[object]:
        """Signal the end of input; raises `JSONArrayError` if the array is incomplete."""
        if self._broken:
            raise SSEError("the decoder failed earlier")
        if self._state != _DONE:
            self._broken = True
            raise JSONArrayError("JSON-array stream ended before the array was closed")
        return []

    def _fail(self, message: str) -> NoReturn:
        raise JSONArrayError(message)

    def _scan(self, out: list[object]) -> None:
        buf = self._buf
        n = len(buf)
        pos = self._pos
        while pos < n:
            state = self._state
            if state == _IN_VALUE:
                pos = self._scan_value(pos, n, out)
                if self._state == _IN_VALUE:
                    break  # need more input
                continue
            m = _NON_WS.search(buf, pos)
            if m is None:
                pos = n
                break
            pos = m.start()
            c = buf[pos]
            if state == _BEFORE:
                if c != 0x5B:
                    self._fail("JSON-array stream does not start with '['")
                self._state = _FIRST
                pos += 1
            elif state in (_FIRST, _NEXT):
                if c == 0x5D and state == _FIRST:
                    self._state = _DONE
                    pos += 1
                elif c in (0x5D, 0x2C, 0x7D, 0x3A):
                    self._fail(f"unexpected {chr(c)!r} where an array element should start")
                else:
                    self._start = pos
                    self._depth = 0
                    self._in_str = False
                    self._state = _IN_VALUE
            elif state == _AFTER:
                if c == 0x2C:
                    self._state = _NEXT
                elif c == 0x5D:
                    self._state = _DONE
                else:
                    self._fail(f"unexpected {chr(c)!r} after an array element")
                pos += 1
            else:
                self._fail("data after the end of the JSON array")
        self._pos = pos
        if self._start >= 0 and n - self._start > self._max:
            self._fail_size()

    def _fail_size(self) -> NoReturn:
        raise SSEEventTooLarge(f"JSON-array element larger than {self._max} bytes")

    def _scan_value(self, pos: int, n: int, out: list[object]) -> int:
        buf = self._buf
        start = self._start
        if buf[start] not in _OPEN and buf[start] != 0x22:
            # A bare number or literal: it ends at the next ',' or ']'.
            m = _SCALAR_END.search(buf, pos)
            if m is None:
                return n
            self._emit(start, m.start(), out)
            return m.start()
        depth = self._depth
        in_str = self._in_str
        while True:
            if in_str:
                m = _IN_STRING.search(buf, pos)
                if m is None:
                    pos = n
                    break
                p = m.start()
                if buf[p] == 0x5C:  # backslash: skip the escaped byte, once it is here
                    if p + 1 >= n:
                        pos = p
                        break
                    pos = p + 2
                    continue
                in_str = False
                pos = p + 1
                if depth == 0:
                    self._emit(start, pos, out)
                    return pos
                continue
            m = _STRUCTURAL.search(buf, pos)
            if m is None:
                pos = n
                break
            p = m.start()
            c = buf[p]
            pos = p + 1
            if c == 0x22:
                in_str = True
            elif c == 0x7B or c == 0x5B:
                depth += 1
            else:
                depth -= 1
                if depth <= 0:
                    self._emit(start, pos, out)
                    return pos
        self._depth = depth
        self._in_str = in_str
        return pos

    def _emit(self, start: int, stop: int, out: list[object]) -> None:
        if stop - start > self._max:
            self._fail_size()
        try:
            out.append(_json.loads(bytes(self._buf[start:stop])))
        except _json.JSONDecodeError as exc:
            raise JSONArrayError(f"malformed JSON-array element: {exc}") from None
        self._start = -1
        self._state = _AFTER
