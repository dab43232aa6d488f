"""twproto: what the bytes and JSON of four LLM APIs mean, with no IO.

Anthropic Messages, OpenAI Chat Completions, OpenAI Responses and Gemini: request, answer and
stream conversion through one intermediate representation, the SSE and JSON-array stream codecs,
first-content detection with the opening hold, failure classification, error bodies in each
format, paths, model listings and token estimates. Bytes and dicts go in, bytes and dicts come
out; nothing here reads a clock, opens a socket or logs (docs/library.md).

The API is tiered, as anyio's is. Here, at the top, are the verbs and types a proxy calls:
translate a request or an answer, translate a stream, hold it until its first content, build
the upstream request, decode and encode SSE, classify a failure, write an error body, the
`Dialect`, the JSON codec and the error family (`ProtocolError`, with `error_status_hint`).
Each vocabulary has a public door of its own, which exports every public name of the modules
behind it: `twproto.ir` (the intermediate representation), `twproto.formats` (the four formats),
`twproto.stream` (a streamed answer in pipeline order), `twproto.sockets` (the WebSocket APIs),
`twproto.failures` (classification and its tables), `twproto.eventstream`, `twproto.sigv4`,
`twproto.effort`, `twproto.errors`, `twproto.sse`, `twproto.paths`, and the other top-level
modules. docs/library.md, "What is where", lists them.
"""

from twproto._exceptions import (
    ClientTranslationError,
    ProtocolError,
    TranslationError,
    UpstreamTranslationError,
)
from twproto._json import (
    JSONDecodeError,
)
from twproto._json import dumps as json_dumps
from twproto._json import loads as json_loads
from twproto.dialect import (
    Dialect,
)
from twproto.errors import (
    ErrorCategory,
    GatewayError,
    error_body,
    error_for_failure,
    error_headers,
    stream_error_event,
)
from twproto.failures import (
    Failure,
    FailureKind,
    TransportFault,
    classify_response,
    classify_stream_error,
    classify_transport,
)
from twproto.formats import (
    FORMATS,
    Format,
)
from twproto.paths import (
    Operation,
    match_path,
    upstream_path,
)
from twproto.sse import (
    SSEDecoder,
    SSEError,
    SSEEvent,
    encode,
    encode_comment,
    encode_event,
)
from twproto.stream import (
    FailedBeforeContent,
    FirstContent,
    Holding,
    OpeningHold,
    Released,
    StreamTranslator,
    UpstreamStream,
    new_stream_translator,
)
from twproto.summary import (
    summarize,
)
from twproto.translate import (
    TranslatedAnswer,
    TranslatedRequest,
    translate_request,
    translate_response,
)
from twproto.upstream_request import (
    ClientCall,
    UpstreamRequest,
    UpstreamTarget,
    upstream_request,
)

__all__ = (
    "FORMATS",
    "ClientCall",
    "ClientTranslationError",
    "Dialect",
    "ErrorCategory",
    "FailedBeforeContent",
    "Failure",
    "FailureKind",
    "FirstContent",
    "Format",
    "GatewayError",
    "Holding",
    "JSONDecodeError",
    "OpeningHold",
    "Operation",
    "ProtocolError",
    "Released",
    "SSEDecoder",
    "SSEError",
    "SSEEvent",
    "StreamTranslator",
    "TranslatedAnswer",
    "TranslatedRequest",
    "TranslationError",
    "TransportFault",
    "UpstreamRequest",
    "UpstreamStream",
    "UpstreamTarget",
    "UpstreamTranslationError",
    "classify_response",
    "classify_stream_error",
    "classify_transport",
    "encode",
    "encode_comment",
    "encode_event",
    "error_body",
    "error_for_failure",
    "error_headers",
    "json_dumps",
    "json_loads",
    "match_path",
    "new_stream_translator",
    "stream_error_event",
    "summarize",
    "translate_request",
    "translate_response",
    "upstream_path",
    "upstream_request",
)
