"""What one event-stream message holds: typed headers and a payload.

A header keeps its wire type next to its value, because the same Python value has several
encodings (an ``int`` may be a byte, a short, an integer, a long or a timestamp) and the encoder
must write back exactly what the decoder read. Values are plain Python: ``bool`` for the two
boolean types, ``int`` for the four integer types and for timestamps (milliseconds since the
epoch), ``bytes`` for byte arrays and UUIDs (16 bytes), ``str`` for strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = (
    "EVENTSTREAM_CONTENT_TYPE",
    "EventStreamHeader",
    "EventStreamHeaderType",
    "EventStreamMessage",
)

#: The media type of an HTTP body framed as event-stream messages.
EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"

HeaderValue = bool | int | bytes | str


class EventStreamHeaderType(IntEnum):
    """The header value types of the wire format, by their type byte."""

    TRUE = 0
    FALSE = 1
    BYTE = 2  # int8
    SHORT = 3  # int16
    INTEGER = 4  # int32
    LONG = 5  # int64
    BYTES = 6  # up to 32767 bytes
    STRING = 7  # UTF-8, up to 32767 bytes
    TIMESTAMP = 8  # int64 milliseconds since the epoch
    UUID = 9  # 16 bytes


@dataclass(frozen=True, slots=True)
class EventStreamHeader:
    """One header: a name (1–255 bytes of UTF-8), its wire type and its value."""

    name: str
    type: EventStreamHeaderType
    value: HeaderValue

    @classmethod
    def string(cls, name: str, value: str) -> EventStreamHeader:
        """The common case: a string header such as ``:event-type``."""
        return cls(name, EventStreamHeaderType.STRING, value)


@dataclass(frozen=True, slots=True)
class EventStreamMessage:
    """One decoded message: its headers in wire order and its payload."""

    headers: tuple[EventStreamHeader, ...]
    payload: bytes

    def header(self, name: str) -> HeaderValue | None:
        """The value of the header `name` (names are unique in a message), or None."""
        for h in self.headers:
            if h.name == name:
                return h.value
        return None

    def _text(self, name: str) -> str | None:
        value = self.header(name)
        return value if isinstance(value, str) else None

    @property
    def message_type(self) -> str | None:
        """``:message-type``: ``event``, ``exception`` or ``error``."""
        return self._text(":message-type")

    @property
    def event_type(self) -> str | None:
        """``:event-type`` of an event (``contentBlockDelta``, ``chunk``…)."""
        return self._text(":event-type")

    @property
    def exception_type(self) -> str | None:
        """``:exception-type`` of an exception (``throttlingException``…)."""
        return self._text(":exception-type")

    @property
    def content_type(self) -> str | None:
        """``:content-type`` of the payload (``application/json``)."""
        return self._text(":content-type")
