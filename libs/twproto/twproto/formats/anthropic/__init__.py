"""Anthropic Messages (``POST /v1/messages``) ⇄ IR.

Theory of operation
-------------------

Requests: ``system`` (a string or text blocks with ``cache_control``) becomes `Request.system`;
messages keep their blocks as parts. A ``{role: "system"}`` message inside ``messages`` (Claude
Code sends one for model names it does not know) is a `Role.SYSTEM` message; encoding to
Anthropic folds every such message into the top-level ``system`` after the real system prompt,
which is where the API without the beta accepts it. ``thinking`` (enabled with a budget,
adaptive, disabled) and ``output_config.effort`` become `ReasoningConfig`. Top-level fields the
IR has no slot for (``context_management``, ``container``, ``mcp_servers``…) travel in
`Request.extras` and are re-emitted only to Anthropic.

Encoding from another format: a request without ``max_tokens`` gets `DEFAULT_MAX_TOKENS` (the
translator passes the model's real limit); thinking is turned on with a budget from the effort
table, clamped below ``max_tokens`` (OpenAI counts reasoning inside its output limit, so does
Anthropic) and left off, recorded, when ``max_tokens`` cannot hold the minimum budget; with
thinking on, ``temperature``/``top_k`` are dropped because the API refuses them. Thinking blocks
go out only with a signature (the API refuses unsigned ones); a Responses reasoning item's
``encrypted_content`` serves as the signature, so a Codex conversation served by Anthropic
keeps its reasoning. Tool-use ids are reduced to the characters the API accepts, the same way
for a call and its result.

Streams: the decoder maps ``content_block_*`` events one to one (Anthropic's block index is the
IR index); ``message_start`` and ``message_delta`` carry usage (cumulative: the delta's fields
override). The encoder writes the same events; it keeps one block open at a time, as the API
does, and writes ``message_delta`` + ``message_stop`` when the stream ends, with the final usage
and stop reason. Mid-stream errors are ``event: error``.
"""

from __future__ import annotations

from twproto.formats.anthropic.request import (
    DEFAULT_MAX_TOKENS,
    DIALECT,
    decode_request,
    encode_request,
)
from twproto.formats.anthropic.response import (
    decode_response,
    decode_usage,
    encode_response,
    encode_usage,
)
from twproto.formats.anthropic.stream import (
    WATCH,
    StreamDecoder,
    StreamEncoder,
    new_stream_decoder,
    new_stream_encoder,
)

__all__ = (
    "DEFAULT_MAX_TOKENS",
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
