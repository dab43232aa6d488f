"""AWS event streams (``application/vnd.amazon.eventstream``): Bedrock's streamed answers.

A sans-IO decoder, split-insensitive and bounded (`EventStreamDecoder`), the encoder the mock
upstream writes with, and the classification of exception frames into the failure kinds of
`twproto.failures`. docs/bedrock.md describes the format, the limits and the message codes.
"""

from twproto.eventstream.classify import classify_eventstream_message
from twproto.eventstream.decoder import (
    EVENTSTREAM_MAX_HEADERS_SIZE,
    EVENTSTREAM_MAX_MESSAGE_SIZE,
    EventStreamDecoder,
)
from twproto.eventstream.encoder import (
    encode_eventstream_headers,
    encode_eventstream_message,
    eventstream_event,
    eventstream_exception,
)
from twproto.eventstream.errors import (
    EventStreamCorrupt,
    EventStreamError,
    EventStreamTooLarge,
    EventStreamTruncated,
)
from twproto.eventstream.message import (
    EVENTSTREAM_CONTENT_TYPE,
    EventStreamHeader,
    EventStreamHeaderType,
    EventStreamMessage,
)

__all__ = (
    "EVENTSTREAM_CONTENT_TYPE",
    "EVENTSTREAM_MAX_HEADERS_SIZE",
    "EVENTSTREAM_MAX_MESSAGE_SIZE",
    "EventStreamCorrupt",
    "EventStreamDecoder",
    "EventStreamError",
    "EventStreamHeader",
    "EventStreamHeaderType",
    "EventStreamMessage",
    "EventStreamTooLarge",
    "EventStreamTruncated",
    "classify_eventstream_message",
    "encode_eventstream_headers",
    "encode_eventstream_message",
    "eventstream_event",
    "eventstream_exception",
)
