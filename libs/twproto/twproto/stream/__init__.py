"""A streamed answer, in the order its bytes pass through twproto (docs/streams.md).

1. `hold` — which events are content, and the opening hold that keeps a stream back until the
   first of them (`OpeningHold`).
2. `upstream` — an upstream's stream from its first byte: held, then handed over to its
   translator without decoding anything twice (`UpstreamStream`).
3. `translators` — the three ways a stream reaches the client: relayed and watched, converted,
   or collected into a whole answer (`new_stream_translator`).
4. `resume` — a stream that broke off, continued on another upstream and spliced into the same
   client answer (`ResumableStream`).

Every public name of these modules is exported here (``from twproto.stream import UpstreamStream``).
"""

from twproto.stream.hold import (
    EventRole,
    FailedBeforeContent,
    Holding,
    HoldOutcome,
    OpeningHold,
    Released,
    classify_event,
    classify_payload,
)
from twproto.stream.resume import (
    CONTINUE_INSTRUCTION,
    MIN_REPEAT,
    PREFILL_FORMATS,
    OverlapTrimmer,
    ResumableStream,
    continued_request,
    refuses_prefill,
    uses_prefill,
)
from twproto.stream.translators import (
    DEFAULT_MAX_EVENT_BYTES,
    CollectedStream,
    ConvertedStream,
    RelayedStream,
    StreamTranslator,
    keepalive_comments,
    new_framing,
    new_stream_translator,
)
from twproto.stream.upstream import (
    FirstContent,
    OpeningOutcome,
    UpstreamStream,
    reported_usage,
)

__all__ = (
    "CONTINUE_INSTRUCTION",
    "DEFAULT_MAX_EVENT_BYTES",
    "MIN_REPEAT",
    "PREFILL_FORMATS",
    "CollectedStream",
    "ConvertedStream",
    "EventRole",
    "FailedBeforeContent",
    "FirstContent",
    "HoldOutcome",
    "Holding",
    "OpeningHold",
    "OpeningOutcome",
    "OverlapTrimmer",
    "RelayedStream",
    "Released",
    "ResumableStream",
    "StreamTranslator",
    "UpstreamStream",
    "classify_event",
    "classify_payload",
    "continued_request",
    "keepalive_comments",
    "new_framing",
    "new_stream_translator",
    "refuses_prefill",
    "reported_usage",
    "uses_prefill",
)
