"""The errors of the event-stream codec, each with the message code the gateway reports.

Decoding errors are about an upstream's bytes (hint 502); an encoding error is the caller's bug
(hint 500). docs/codes.md lists the codes.
"""

from __future__ import annotations

from twproto._exceptions import ProtocolError

__all__ = (
    "EventStreamCorrupt",
    "EventStreamError",
    "EventStreamTooLarge",
    "EventStreamTruncated",
)


class EventStreamError(ProtocolError):
    """The one error type of `twproto.eventstream`; raised itself only by the encoder."""

    error_status_hint = 500
    #: The message code (docs/codes.md) for this condition.
    code = "gw.internal"


class EventStreamCorrupt(EventStreamError):
    """A checksum does not match, a length is impossible, or a header cannot be read."""

    error_status_hint = 502
    code = "gw.upstream.eventstream_corrupt"


class EventStreamTooLarge(EventStreamError):
    """A message declares more bytes than the decoder's bound, or headers beyond 128 KiB."""

    error_status_hint = 502
    code = "gw.upstream.eventstream_too_large"


class EventStreamTruncated(EventStreamError):
    """The input ended inside a message."""

    error_status_hint = 502
    code = "gw.upstream.eventstream_truncated"
