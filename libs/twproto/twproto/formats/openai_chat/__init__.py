"""OpenAI Chat Completions (``POST /v1/chat/completions``) ⇄ IR.

Theory of operation
-------------------

Requests: leading ``system``/``developer`` messages become `Request.system`, later ones
`Role.SYSTEM` messages in place. ``tool`` messages become `ToolResult` parts of a user message
(consecutive ones share it), which is how the other formats group them. Reasoning replayed by
DeepSeek-style servers (``reasoning_content``) becomes a `Reasoning` part; the GLM-style
``thinking: {type: enabled|disabled}`` switch turns reasoning on or off. ``reasoning_effort``
maps through the effort table.

Encoding: a request converted to Chat always asks for ``stream_options.include_usage`` when it
streams (usage is otherwise absent from a Chat stream) and writes the output limit as
``max_completion_tokens`` (what OpenAI's reasoning models require). Reasoning parts are not sent
to another format's Chat upstream: plain Chat has no field for them and some servers refuse
unknown message fields. ``user`` longer than 64 characters (Claude Code's JSON ``user_id``) is
dropped rather than refused by the API.

Answers and streams: ``reasoning_content`` / ``reasoning`` deltas are reasoning, ``refusal`` is
text with stop reason refusal; a ``stop`` finish after tool calls reads as tool use (some
servers say ``stop``). Tool-call deltas are keyed by their ``index``; a call without an id gets
one derived from the chunk id and that index. The encoder writes one chunk per delta from
prebuilt byte templates (only the delta's own JSON is serialised per chunk), closes with one
chunk carrying ``finish_reason`` *and* ``usage`` (which SDKs read from any chunk, and which
clients that index ``choices[0]`` can still read), then ``data: [DONE]``. A mid-stream error is a
chunk ``{"error": {...}}``, which the OpenAI SDK raises.
"""

from __future__ import annotations

from twproto.formats.openai_chat.request import DIALECT, decode_request, encode_request
from twproto.formats.openai_chat.response import (
    decode_response,
    decode_usage,
    encode_response,
    encode_usage,
)
from twproto.formats.openai_chat.stream import (
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
