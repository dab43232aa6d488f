"""Gemini generateContent / streamGenerateContent ⇄ IR.

Theory of operation
-------------------

Gemini requests carry neither the model nor the stream flag (both are in the URL path), so
`decode_request` leaves them empty and the caller fills them in; `encode_request` takes the model
only to pick model-specific settings. Field names are accepted in both the REST camelCase and
the proto snake_case the API also takes.

Function calls have no ids in Gemini's older answers and requests. Decoding a request, a call
without one gets ``call_<content>_<part>`` and the ``functionResponse`` that answers it (the next
one with that name) gets the same id; decoding an answer, ids derive from the response id and the
call's position (`ir.derive_call_id`), identically for a stream and a whole answer. Encoding,
ids are left out (Gemini pairs calls and responses by name and order) and a response names its
function by looking the call id up in the conversation.

Thought signatures: Gemini seals its reasoning in a ``thoughtSignature`` on the part *after* the
thoughts (a text or function-call part). The IR keeps every seal on a `Reasoning` part: the
decoder puts the signature on the reasoning part just before that part, or on an empty
reasoning part of its own, so an Anthropic client receives it as a thinking block's signature
and a Responses client as ``encrypted_content`` — and both replay it. The encoder attaches a
reasoning part's seal to the next part it writes (or to an empty text part). Gemini 3 refuses a
replayed function call without a signature; for calls that never had one (they came from
another format) the encoder writes Google's documented placeholder
``skip_thought_signature_validator``.

Schemas: tool parameters and response schemas go through `_schema.sanitize_schema`; the
keywords removed are reported once per request.

Streams: every chunk is a whole ``GenerateContentResponse``; the decoder opens, extends and
closes IR parts as the kind of consecutive parts changes. Gemini has no end event: the final
chunk carries ``finishReason`` and usage, and the stream ends when the body does. The encoder
writes SSE (``data: {…}\\r\\n\\r\\n``) or the JSON-array framing (``[{…}``, ``,\\r\\n{…}``, ``]``);
text deltas use a prebuilt byte template, a function call is written whole when it ends, and an
error is an ``{"error": {...}}`` object (an array element in the array framing).
"""

from __future__ import annotations

from twproto.formats.gemini.request import DIALECT, decode_request, encode_request
from twproto.formats.gemini.response import (
    decode_response,
    decode_usage,
    encode_response,
    encode_usage,
)
from twproto.formats.gemini.stream import (
    WATCH,
    StreamDecoder,
    StreamEncoder,
    new_stream_decoder,
    new_stream_encoder,
)

__all__ = (
    "DIALECT",
    "WATCH",
    "StreamDecoder",
    "StreamEncoder",
    "decode_request",
    "decode_response",
    "decode_usage",
    "encode_request",
    "encode_response",
    "encode_usage",
    "new_stream_decoder",
    "new_stream_encoder",
)
